// DeepSpeed JSON -> Config.
//
// The parser walks the document once with a Section per JSON object. A
// Section remembers which keys were read; whatever is left over is either a
// DeepSpeed key zinf knows but does not act on (reported as ignored) or an
// unknown key (an error, with the closest known key as a hint). Every error
// is collected, so one run of `zinf config-check` shows them all.
#include "zinf/config.h"

#include <algorithm>
#include <cerrno>
#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <fstream>
#include <initializer_list>
#include <iterator>
#include <limits>
#include <map>
#include <optional>
#include <set>
#include <sstream>

#include <nlohmann/json.hpp>

#include "core/check.h"

namespace zinf {

using nlohmann::json;

std::string_view OffloadDeviceName(OffloadDevice d) {
  switch (d) {
    case OffloadDevice::kNone: return "none";
    case OffloadDevice::kCpu: return "cpu";
    case OffloadDevice::kNvme: return "nvme";
  }
  return "?";
}
std::string_view OptimizerTypeName(OptimizerType t) { return t == OptimizerType::kAdam ? "Adam" : "AdamW"; }
std::string_view SchedulerTypeName(SchedulerType t) {
  switch (t) {
    case SchedulerType::kNone: return "none";
    case SchedulerType::kWarmupLR: return "WarmupLR";
    case SchedulerType::kWarmupDecayLR: return "WarmupDecayLR";
    case SchedulerType::kWarmupCosineLR: return "WarmupCosineLR";
  }
  return "?";
}
std::string_view WarmupTypeName(WarmupType t) { return t == WarmupType::kLog ? "log" : "linear"; }

namespace {

constexpr int64_t kMaxInt = std::numeric_limits<int64_t>::max();

// Reading the JSON text. nlohmann's DOM parser lets a repeated key overwrite
// the first ("lr": 3e-4, "lr": 3e-1 would train at 0.3), and its errors name
// neither the key nor, for a number like 1e400, the line. DuplicateKeySax
// builds the same DOM while recording every key's place, so a repeated key and
// a parse error can be named by JSON path, line and column.

// 1-based line and column (in bytes) of a byte offset into `text`.
std::string LineColumn(std::string_view text, size_t offset) {
  offset = std::min(offset, text.size());
  const std::string_view before = text.substr(0, offset);
  const size_t line = 1 + static_cast<size_t>(std::count(before.begin(), before.end(), '\n'));
  const size_t line_start = before.rfind('\n');
  const size_t column = offset - (line_start == std::string_view::npos ? 0 : line_start + 1) + 1;
  return "line " + std::to_string(line) + ", column " + std::to_string(column);
}

// One byte of the text as an error shows it: 'x', or its code when unprintable.
std::string DescribeByte(char c) {
  const auto byte = static_cast<unsigned char>(c);
  if (byte >= 0x20 && byte < 0x7f) return std::string("'") + c + "'";
  char code[16];
  std::snprintf(code, sizeof code, "byte 0x%02X", byte);
  return code;
}

// An input iterator over the text that remembers the last character the
// parser read: nlohmann gives key() no position, but when key() is called the
// last character read is the key's closing quote.
class TrackingIterator {
 public:
  using iterator_category = std::input_iterator_tag;
  using value_type = char;
  using difference_type = std::ptrdiff_t;
  using pointer = const char*;
  using reference = const char&;

  TrackingIterator(const char* p, const char** last_read) : p_(p), last_read_(last_read) {}
  const char& operator*() const {
    *last_read_ = p_;
    return *p_;
  }
  TrackingIterator& operator++() {
    ++p_;
    return *this;
  }
  TrackingIterator operator++(int) {
    TrackingIterator before = *this;
    ++p_;
    return before;
  }
  bool operator==(const TrackingIterator& other) const { return p_ == other.p_; }
  bool operator!=(const TrackingIterator& other) const { return p_ != other.p_; }

 private:
  const char* p_;
  const char** last_read_;
};

class DuplicateKeySax : public nlohmann::detail::json_sax_dom_parser<json> {
  using Base = nlohmann::detail::json_sax_dom_parser<json>;

 public:
  DuplicateKeySax(json& root, std::string_view text, const char** last_read)
      : Base(root, /*allow_exceptions=*/false), text_(text), last_read_(last_read) {}

  // "a repeated key" messages, in the order found.
  const std::vector<std::string>& duplicates() const { return duplicates_; }
  // The parse error, when the parser gave one.
  const std::optional<std::string>& error() const { return error_; }

  bool null() { return Element() && Base::null(); }
  bool boolean(bool v) { return Element() && Base::boolean(v); }
  bool number_integer(number_integer_t v) { return Element() && Base::number_integer(v); }
  bool number_unsigned(number_unsigned_t v) { return Element() && Base::number_unsigned(v); }
  bool number_float(number_float_t v, const string_t& s) { return Element() && Base::number_float(v, s); }
  bool string(string_t& v) { return Element() && Base::string(v); }
  bool start_object(size_t n) {
    Element();
    frames_.push_back(Frame{});
    return Base::start_object(n);
  }
  bool end_object() {
    frames_.pop_back();
    return Base::end_object();
  }
  bool start_array(size_t n) {
    Element();
    frames_.emplace_back().is_array = true;
    return Base::start_array(n);
  }
  bool end_array() {
    frames_.pop_back();
    return Base::end_array();
  }

  bool key(string_t& k) {
    const size_t offset = KeyOffset();
    Frame& frame = frames_.back();
    frame.name = k;
    const auto [first, inserted] = frame.keys.emplace(k, offset);
    if (!inserted) {
      duplicates_.push_back(Path() + ": duplicate key at " + LineColumn(text_, offset) + " (first at " +
                            LineColumn(text_, first->second) + "); give each key once");
    }
    return Base::key(k);
  }

  // `position` is how many characters the parser had read; the error is at
  // the last of them, or for a number out of range, at the number's start.
  template <class Exception>
  bool parse_error(size_t position, const std::string& last_token, const Exception& ex) {
    std::string what = ex.what();
    // Drop nlohmann's "[json.exception...] parse error at line 1, column 2: ":
    // the place is given below, counted the same way for every error.
    if (const size_t column = what.find(", column "); column != std::string::npos) {
      what = what.substr(std::min(what.size(), what.find(": ", column) + 2));
    } else if (const size_t bracket = what.find("] "); bracket != std::string::npos) {
      what = what.substr(bracket + 2);
    }
    size_t offset = position > 0 ? position - 1 : 0;
    std::string found;
    if (ex.id == 406) {  // number overflow: the parser has read just past the number
      offset = position >= last_token.size() ? position - last_token.size() : 0;
      found = "'" + last_token + "'";
      what = "the number is out of range for a double";
    } else if (offset >= text_.size()) {
      found = "the end of the text";
    } else if (text_[offset] == '\0') {  // nlohmann reads a NUL as the end of input
      found = "a NUL byte";
      what = "a JSON text cannot hold a NUL byte (inside a string, write \\u0000)";
    } else {
      found = DescribeByte(text_[offset]);
    }
    const std::string path = Path();
    error_ = "not valid JSON at " + LineColumn(text_, offset) + (path.empty() ? "" : " (in " + path + ")") +
             ": found " + found + ": " + what;
    return Base::parse_error(position, last_token, ex);
  }

 private:
  struct Frame {
    bool is_array = false;
    std::string name;                    // the current key, or "[index]" in an array
    size_t next_index = 0;               // arrays: the next element's index
    std::map<std::string, size_t> keys;  // objects: each key and the offset of its opening quote
  };

  // A value starts: in an array, it is the next element.
  bool Element() {
    if (!frames_.empty() && frames_.back().is_array) {
      frames_.back().name = "[" + std::to_string(frames_.back().next_index++) + "]";
    }
    return true;
  }

  // The JSON path of the current value, as Section names keys ("a.b[2].c").
  std::string Path() const {
    std::string path;
    for (const Frame& f : frames_) {
      if (f.name.empty()) break;
      if (!path.empty() && !f.is_array) path += '.';
      path += f.name;
    }
    return path;
  }

  // The offset of the opening quote of the key just read. The last character
  // read is its closing quote; inside a string a quote is always escaped, so
  // the opening quote is the nearest one before it not preceded by an odd
  // number of backslashes.
  size_t KeyOffset() const {
    const size_t close = static_cast<size_t>(*last_read_ - text_.data());
    for (size_t i = close; i-- > 0;) {
      if (text_[i] != '"') continue;
      size_t backslashes = 0;
      while (backslashes < i && text_[i - 1 - backslashes] == '\\') ++backslashes;
      if (backslashes % 2 == 0) return i;
    }
    return close;
  }

  std::string_view text_;
  const char** last_read_;
  std::vector<Frame> frames_;
  std::vector<std::string> duplicates_;
  std::optional<std::string> error_;
};

std::string Describe(const json& v) {
  if (v.is_string()) return "\"" + v.get<std::string>() + "\"";
  if (v.is_boolean()) return v.get<bool>() ? "true" : "false";
  if (v.is_null()) return "null";
  if (v.is_object()) return "an object";
  if (v.is_array()) return "a list";
  return v.dump();
}

size_t EditDistance(std::string_view a, std::string_view b) {
  std::vector<size_t> prev(b.size() + 1), cur(b.size() + 1);
  for (size_t j = 0; j <= b.size(); ++j) prev[j] = j;
  for (size_t i = 1; i <= a.size(); ++i) {
    cur[0] = i;
    for (size_t j = 1; j <= b.size(); ++j) {
      cur[j] = std::min({prev[j] + 1, cur[j - 1] + 1, prev[j - 1] + (a[i - 1] != b[j - 1])});
    }
    std::swap(prev, cur);
  }
  return prev[b.size()];
}

bool IsAuto(const json& v) { return v.is_string() && v.get<std::string>() == "auto"; }

// Shared state of one parse.
struct Parse {
  std::vector<std::string> errors;
  Config* config;
};

// One JSON object being read.
class Section {
 public:
  Section(Parse& p, const json* obj, std::string path) : p_(p), obj_(obj), path_(std::move(path)) {}

  // A nested object; a missing key gives an empty section.
  Section Child(const char* key) {
    const json* v = Take(key);
    if (v != nullptr && !v->is_object() && !v->is_null()) {
      Error(key, "expected an object, got " + Describe(*v));
      v = nullptr;
    }
    if (v != nullptr && v->is_null()) v = nullptr;
    return Section(p_, v, Path(key));
  }
  bool Has(const char* key) const { return obj_ != nullptr && obj_->contains(key); }
  const std::string& path() const { return path_; }

  void Bool(const char* key, bool& out, bool allow_auto = false) {
    const json* v = Take(key);
    if (v == nullptr) return;
    if (IsAuto(*v)) return allow_auto ? MarkAuto(key) : RejectAuto(key);
    if (v->is_boolean()) {
      out = v->get<bool>();
    } else if (v->is_string() && (v->get<std::string>() == "true" || v->get<std::string>() == "false")) {
      out = v->get<std::string>() == "true";
    } else {
      Error(key, "expected true or false, got " + Describe(*v));
    }
  }

  // Integers may be written 1e9, "5e8", 1000000000.0; they must be whole.
  // Returns true when a number was read (false for missing, "auto" or error).
  bool Int(const char* key, int64_t& out, int64_t min, int64_t max = kMaxInt, bool allow_auto = false) {
    const json* v = Take(key);
    if (v == nullptr) return false;
    if (IsAuto(*v)) {
      allow_auto ? MarkAuto(key) : RejectAuto(key);
      return false;
    }
    // A JSON integer is taken exactly: through a double, 2^53 + 1 would
    // silently become 2^53 and INT64_MAX would be refused as 2^63.
    if (v->is_number_integer()) {
      // nlohmann stores every non-negative literal as unsigned.
      bool fits;
      if (v->is_number_unsigned()) {
        const uint64_t u = v->get<uint64_t>();
        fits = u <= static_cast<uint64_t>(max) && (min <= 0 || u >= static_cast<uint64_t>(min));
      } else {
        const int64_t i = v->get<int64_t>();
        fits = i >= min && i <= max;
      }
      if (!fits) {
        Error(key, "expected " + IntRange(min, max) + ", got " + Describe(*v));
        return false;
      }
      out = v->get<int64_t>();
      return true;
    }
    double d = 0;
    // 2^63 itself does not fit in int64 (and INT64_MAX rounds up to it as a double).
    if (!ToNumber(*v, d) || std::floor(d) != d || d < static_cast<double>(min) || d > static_cast<double>(max) ||
        d >= 0x1p63) {
      Error(key, "expected " + IntRange(min, max) + ", got " + Describe(*v));
      return false;
    }
    out = static_cast<int64_t>(d);
    return true;
  }
  void Int(const char* key, int& out, int64_t min, int64_t max) {
    int64_t v = out;
    if (Int(key, v, min, max)) out = static_cast<int>(v);
  }

  void Double(const char* key, double& out, double min, double max, bool min_open = false, bool allow_auto = false) {
    const json* v = Take(key);
    if (v == nullptr) return;
    if (IsAuto(*v)) return allow_auto ? MarkAuto(key) : RejectAuto(key);
    double d = 0;
    if (!ToNumber(*v, d) || !std::isfinite(d) || d < min || d > max || (min_open && d == min)) {
      std::ostringstream want;
      want << "expected a number " << (min_open ? "> " : ">= ") << min;
      if (max < std::numeric_limits<double>::max()) want << " and <= " << max;
      Error(key, want.str() + ", got " + Describe(*v));
      return;
    }
    out = d;
  }

  void String(const char* key, std::string& out) {
    const json* v = Take(key);
    if (v == nullptr || v->is_null()) return;
    if (!v->is_string()) {
      Error(key, "expected a string, got " + Describe(*v));
      return;
    }
    out = v->get<std::string>();
  }

  // One of `names` (case-insensitive); returns the index or -1.
  int Enum(const char* key, std::initializer_list<const char*> names, int current) {
    const json* v = Take(key);
    if (v == nullptr) return current;
    if (v->is_string()) {
      std::string s = v->get<std::string>();
      int i = 0;
      for (const char* n : names) {
        if (strcasecmp(s.c_str(), n) == 0) return i;
        ++i;
      }
    }
    std::string list;
    for (const char* n : names) list += (list.empty() ? "" : ", ") + std::string(n);
    Error(key, "expected one of " + list + ", got " + Describe(*v));
    return current;
  }

  // A path or a list of paths.
  void Paths(const char* key, std::vector<std::string>& out) {
    const json* v = Take(key);
    if (v == nullptr || v->is_null()) return;
    std::vector<std::string> paths;
    auto add = [&](const json& e) {
      if (!e.is_string() || e.get<std::string>().empty()) {
        Error(key, "expected a path or a list of paths, got " + Describe(e));
        return false;
      }
      paths.push_back(e.get<std::string>());
      return true;
    };
    if (v->is_array()) {
      if (v->empty()) Error(key, "expected at least one path, got an empty list");
      for (const json& e : *v) {
        if (!add(e)) return;
      }
    } else if (!add(*v)) {
      return;
    }
    out = std::move(paths);
  }

  // Raw access for keys with a shape of their own (optimizer betas).
  const json* TakeRaw(const char* key) { return Take(key); }
  // Records `key` (read by TakeRaw) as "auto", for ResolveAuto.
  void MarkAuto(const char* key) { p_.config->auto_keys.push_back(Path(key)); }

  void Error(const std::string& key, const std::string& what) { p_.errors.push_back(Path(key) + ": " + what); }

  // Every key not read: DeepSpeed keys in `ignored` are recorded, the rest are
  // errors. Call once, after reading the section.
  void Finish(std::initializer_list<const char*> ignored = {}) {
    if (obj_ == nullptr) return;
    for (auto it = obj_->begin(); it != obj_->end(); ++it) {
      const std::string& k = it.key();
      if (seen_.count(k)) continue;
      bool is_ignored = false;
      for (const char* i : ignored) is_ignored |= (k == i);
      if (is_ignored) {
        p_.config->ignored_keys.push_back(Path(k));
        continue;
      }
      std::string hint;
      size_t best = std::max<size_t>(3, k.size() / 3 + 1);  // closer than this is a hint
      for (const std::string& s : known_) {
        size_t d = EditDistance(k, s);
        if (d < best) {
          best = d;
          hint = s;
        }
      }
      Error(k, hint.empty() ? "unknown key" : "unknown key (did you mean \"" + hint + "\"?)");
    }
  }

 private:
  std::string Path(const std::string& key) const { return path_.empty() ? key : path_ + "." + key; }

  const json* Take(const char* key) {
    known_.insert(key);
    if (obj_ == nullptr) return nullptr;
    auto it = obj_->find(key);
    if (it == obj_->end()) return nullptr;
    seen_.insert(key);
    p_.config->given_keys.push_back(Path(key));
    return &*it;
  }

  void RejectAuto(const char* key) {
    Error(key,
          "\"auto\" cannot be worked out by zinf for this key (DeepSpeed leaves it to the "
          "HuggingFace Trainer); give a value");
  }

  static bool ToNumber(const json& v, double& out) {
    if (v.is_number()) {
      out = v.get<double>();
      return true;
    }
    if (!v.is_string()) return false;
    const std::string s = v.get<std::string>();
    if (s.empty()) return false;
    errno = 0;
    char* end = nullptr;
    out = std::strtod(s.c_str(), &end);
    return errno == 0 && end == s.c_str() + s.size() && std::isfinite(out);
  }

  static std::string IntRange(int64_t min, int64_t max) {
    if (min == 1 && max == kMaxInt) return "a positive integer";
    if (min == 0 && max == kMaxInt) return "a non-negative integer";
    if (max == kMaxInt) return "an integer >= " + std::to_string(min);
    return "an integer from " + std::to_string(min) + " to " + std::to_string(max);
  }

  Parse& p_;
  const json* obj_;
  std::string path_;
  std::set<std::string> seen_;
  std::set<std::string> known_;
};

OffloadDevice ReadOffloadDevice(Section& s, OffloadDevice current) {
  return static_cast<OffloadDevice>(s.Enum("device", {"none", "cpu", "nvme"}, static_cast<int>(current)));
}

void ParseFp16(Section s, Fp16Config& c) {
  s.Bool("enabled", c.enabled, /*allow_auto=*/true);
  s.Double("loss_scale", c.loss_scale, 0.0, std::numeric_limits<double>::max());
  s.Int("initial_scale_power", c.initial_scale_power, 0, 64);
  s.Int("loss_scale_window", c.loss_scale_window, 1, std::numeric_limits<int>::max());
  s.Int("hysteresis", c.hysteresis, 1, std::numeric_limits<int>::max());
  s.Bool("consecutive_hysteresis", c.consecutive_hysteresis);
  s.Double("min_loss_scale", c.min_loss_scale, 0.0, std::numeric_limits<double>::max(), /*min_open=*/true);
  s.Finish({"auto_cast", "fp16_master_weights_and_grads"});
}

void ParseBf16(Section s, Bf16Config& c) {
  s.Bool("enabled", c.enabled, /*allow_auto=*/true);
  s.Finish({"immediate_grad_update", "check_grad_overflow"});
}

void ParseOptimizer(Section s, OptimizerConfig& c) {
  if (!s.Has("type")) {
    if (s.Has("params")) s.Error("type", "missing: the optimizer needs a type (Adam or AdamW)");
  }
  const json* type = s.TakeRaw("type");
  bool adamw = true;
  if (type != nullptr) {
    std::string t = type->is_string() ? type->get<std::string>() : "";
    if (strcasecmp(t.c_str(), "adam") == 0) {
      c.type = OptimizerType::kAdam;
      adamw = false;
    } else if (strcasecmp(t.c_str(), "adamw") == 0) {
      c.type = OptimizerType::kAdamW;
    } else if (type->is_string() &&
               (strcasecmp(t.c_str(), "cpuadam") == 0 || strcasecmp(t.c_str(), "fusedadam") == 0)) {
      c.type = OptimizerType::kAdam;
      adamw = false;
    } else {
      s.Error("type", "expected Adam or AdamW (zinf's CPU optimizer), got " + Describe(*type));
    }
  }
  Section params = s.Child("params");
  // The HF Trainer fills these four from its TrainingArguments (ResolveAuto).
  params.Double("lr", c.lr, 0.0, std::numeric_limits<double>::max(), false, /*allow_auto=*/true);
  if (const json* betas = params.TakeRaw("betas"); betas != nullptr && IsAuto(*betas)) {
    params.MarkAuto("betas");
  } else if (betas != nullptr) {
    bool ok = betas->is_array() && betas->size() == 2 && (*betas)[0].is_number() && (*betas)[1].is_number();
    if (ok) {
      double b1 = (*betas)[0].get<double>(), b2 = (*betas)[1].get<double>();
      ok = b1 >= 0 && b1 < 1 && b2 >= 0 && b2 < 1;
      if (ok) {
        c.beta1 = b1;
        c.beta2 = b2;
      }
    }
    if (!ok)
      params.Error("betas", "expected two numbers in [0, 1), got " + Describe(*betas) +
                                (betas->is_array() ? " " + betas->dump() : ""));
  }
  params.Double("eps", c.eps, 0.0, 1.0, /*min_open=*/true, /*allow_auto=*/true);
  params.Double("weight_decay", c.weight_decay, 0.0, std::numeric_limits<double>::max(), false, /*allow_auto=*/true);
  c.adam_w_mode = adamw ? true : c.adam_w_mode;
  bool w_mode = c.adam_w_mode;
  params.Bool("adam_w_mode", w_mode);
  if (adamw && !w_mode)
    params.Error("adam_w_mode", "AdamW always uses decoupled weight decay; use type Adam for L2 decay");
  c.adam_w_mode = w_mode;
  params.Bool("bias_correction", c.bias_correction);
  if (const json* ams = params.TakeRaw("amsgrad")) {
    if (!ams->is_boolean()) {
      params.Error("amsgrad", "expected true or false, got " + Describe(*ams));
    } else if (ams->get<bool>()) {
      params.Error("amsgrad", "AMSGrad is not supported by zinf's CPU Adam; set it to false");
    }
  }
  params.Finish({"torch_adam", "fused", "foreach", "capturable"});
  s.Finish();
}

void ParseScheduler(Section s, SchedulerConfig& c) {
  if (!s.Has("type")) {
    if (s.Has("params")) s.Error("type", "missing: the scheduler needs a type");
    s.Finish();
    return;
  }
  const json* type = s.TakeRaw("type");
  std::string t = type->is_string() ? type->get<std::string>() : "";
  if (t == "WarmupLR") {
    c.type = SchedulerType::kWarmupLR;
  } else if (t == "WarmupDecayLR") {
    c.type = SchedulerType::kWarmupDecayLR;
  } else if (t == "WarmupCosineLR") {
    c.type = SchedulerType::kWarmupCosineLR;
  } else if (t == "OneCycle" || t == "LRRangeTest") {
    s.Error("type", "\"" + t + "\" is not supported by zinf; use WarmupLR, WarmupDecayLR or WarmupCosineLR");
  } else {
    s.Error("type", "expected WarmupLR, WarmupDecayLR or WarmupCosineLR, got " + Describe(*type));
  }
  Section params = s.Child("params");
  bool cosine = c.type == SchedulerType::kWarmupCosineLR;
  if (!cosine) {
    params.Double("warmup_min_lr", c.warmup_min_lr, 0.0, std::numeric_limits<double>::max(), false, true);
    params.Double("warmup_max_lr", c.warmup_max_lr, 0.0, std::numeric_limits<double>::max(), false, true);
  } else {
    params.Double("warmup_min_ratio", c.warmup_min_ratio, 0.0, 1.0);
    params.Double("cos_min_ratio", c.cos_min_ratio, 0.0, 1.0);
  }
  params.Int("warmup_num_steps", c.warmup_num_steps, 0, kMaxInt, /*allow_auto=*/true);
  c.warmup_type =
      static_cast<WarmupType>(params.Enum("warmup_type", {"log", "linear"}, static_cast<int>(c.warmup_type)));
  bool needs_total = c.type == SchedulerType::kWarmupDecayLR || cosine;
  if (needs_total) {
    bool auto_total = params.Has("total_num_steps");
    bool got = params.Int("total_num_steps", c.total_num_steps, 1, kMaxInt, /*allow_auto=*/true);
    if (!auto_total) params.Error("total_num_steps", std::string("required by ") + t);
    (void)got;
  }
  params.Finish({"last_batch_iteration"});
  s.Finish();
}

void ParseAio(Section s, AioConfig& c) {
  s.Int("block_size", c.block_size, 512, int64_t{1} << 30);
  if (c.block_size % 512 != 0)
    s.Error("block_size", "must be a multiple of 512 bytes for O_DIRECT, got " + std::to_string(c.block_size));
  s.Int("queue_depth", c.queue_depth, 1, 4096);
  s.Int("thread_count", c.thread_count, 1, 256, /*allow_auto=*/true);
  s.Bool("single_submit", c.single_submit);
  s.Bool("overlap_events", c.overlap_events);
  s.Finish({"intra_op_parallelism", "use_gds"});
}

void ParseMonitor(Section s, MonitorConfig& c) {
  s.Bool("enabled", c.enabled);
  s.String("output_path", c.output_path);
  s.String("job_name", c.job_name);
  if (c.job_name.empty() || c.job_name.find('/') != std::string::npos) {
    s.Error("job_name", "expected a folder name (not empty, no '/'), got \"" + c.job_name + "\"");
  }
  s.Finish();
}

void ParseZero(Section s, ZeroConfig& z) {
  s.Int("stage", z.stage, 0, 3);
  bool overlap_given = s.Has("overlap_comm");
  s.Bool("overlap_comm", z.overlap_comm);
  if (!overlap_given) z.overlap_comm = z.stage == 3;
  s.Bool("contiguous_gradients", z.contiguous_gradients);
  s.Int("reduce_bucket_size", z.reduce_bucket_size, 1, kMaxInt, true);
  s.Int("allgather_bucket_size", z.allgather_bucket_size, 1, kMaxInt, true);
  s.Int("sub_group_size", z.sub_group_size, 1, kMaxInt);
  s.Int("stage3_prefetch_bucket_size", z.stage3_prefetch_bucket_size, 0, kMaxInt, true);
  s.Int("stage3_param_persistence_threshold", z.stage3_param_persistence_threshold, 0, kMaxInt, true);
  s.Int("stage3_max_live_parameters", z.stage3_max_live_parameters, 0, kMaxInt);
  s.Int("stage3_max_reuse_distance", z.stage3_max_reuse_distance, 0, kMaxInt);
  s.Bool("stage3_gather_16bit_weights_on_model_save", z.stage3_gather_16bit_weights_on_model_save);

  Section op = s.Child("offload_param");
  OffloadParamConfig& p = z.offload_param;
  p.device = ReadOffloadDevice(op, p.device);
  op.Paths("nvme_path", p.nvme_paths);
  op.Bool("pin_memory", p.pin_memory);
  op.Int("buffer_count", p.buffer_count, 1);
  op.Int("buffer_size", p.buffer_size, 1);
  op.Int("max_in_cpu", p.max_in_cpu, 0);
  op.Finish();

  Section oo = s.Child("offload_optimizer");
  OffloadOptimizerConfig& o = z.offload_optimizer;
  o.device = ReadOffloadDevice(oo, o.device);
  oo.Paths("nvme_path", o.nvme_paths);
  oo.Bool("pin_memory", o.pin_memory);
  oo.Int("buffer_count", o.buffer_count, 1);
  oo.Bool("fast_init", o.fast_init);
  oo.Bool("pipeline_read", o.pipeline_read);
  oo.Bool("pipeline_write", o.pipeline_write);
  oo.Double("ratio", o.ratio, 0.0, 1.0, /*min_open=*/true);
  if (o.ratio != 1.0) oo.Error("ratio", "partial offload (ratio < 1) is not supported by zinf yet; use 1.0");
  oo.Finish({"pipeline"});

  // Rules that tie keys together.
  if (p.device == OffloadDevice::kNvme && p.nvme_paths.empty())
    op.Error("nvme_path", "required when device is \"nvme\"");
  if (o.device == OffloadDevice::kNvme && o.nvme_paths.empty())
    oo.Error("nvme_path", "required when device is \"nvme\"");
  if (p.device != OffloadDevice::kNone && z.stage != 3)
    op.Error("device", "parameter offload needs zero_optimization.stage 3, got stage " + std::to_string(z.stage));
  if (o.device == OffloadDevice::kNvme && z.stage != 3)
    oo.Error("device",
             "optimizer offload to nvme needs zero_optimization.stage 3, got stage " + std::to_string(z.stage));
  if (o.device == OffloadDevice::kCpu && z.stage == 0)
    oo.Error("device", "optimizer offload needs zero_optimization.stage 1, 2 or 3, got stage 0");

  s.Finish({"allgather_partitions",
            "reduce_scatter",
            "round_robin_gradients",
            "load_from_fp32_weights",
            "elastic_checkpoint",
            "ignore_unused_parameters",
            "legacy_stage1",
            "cpu_offload",
            "cpu_offload_params",
            "cpu_offload_use_pin_memory",
            "stage3_gather_fp16_weights_on_model_save",
            "memory_efficient_linear",
            "zero_hpz_partition_size",
            "zero_quantized_weights",
            "zero_quantized_gradients",
            "mics_shard_size",
            "mics_hierarchical_params_gather",
            "use_multi_rank_bucket_allreduce",
            "stage3_use_all_reduce_for_fetch_params",
            "model_persistence_threshold",
            "log_trace_cache_warnings",
            "module_granularity_threshold",
            "use_all_reduce_for_fetch_params",
            "prefetch_bucket_size",
            "param_persistence_threshold",
            "max_live_parameters",
            "max_reuse_distance"});
}

}  // namespace

std::string_view IgnoredKeyReason(std::string_view path) {
  if (path == "wandb" || path == "comet") {
    return "a network service; zinf writes the tensorboard and csv_monitor files instead";
  }
  return {};
}

StatusOr<Config> ParseConfig(std::string_view json_text, std::string source) {
  json doc;
  const char* last_read = json_text.data();
  DuplicateKeySax sax(doc, json_text, &last_read);
  try {
    const char* begin = json_text.data();
    json::sax_parse(TrackingIterator(begin, &last_read), TrackingIterator(begin + json_text.size(), &last_read), &sax,
                    json::input_format_t::json, /*strict=*/true, /*ignore_comments=*/true);
  } catch (const json::exception& e) {  // none expected: DuplicateKeySax reports errors without throwing
    return Status::InvalidArgument(source + ": not valid JSON: " + e.what());
  }
  if (sax.error()) return Status::InvalidArgument(source + ": " + *sax.error());
  if (!doc.is_object()) return Status::InvalidArgument(source + ": expected a JSON object at the top level");

  Config config;
  config.source = source;
  // A repeated key is an error with the others: the DOM kept the last value.
  Parse p{sax.duplicates(), &config};
  Section root(p, &doc, "");

  config.batch_given[0] = root.Int("train_batch_size", config.train_batch_size, 1, kMaxInt, true);
  config.batch_given[1] =
      root.Int("train_micro_batch_size_per_gpu", config.train_micro_batch_size_per_gpu, 1, kMaxInt, true);
  config.batch_given[2] = root.Int("gradient_accumulation_steps", config.gradient_accumulation_steps, 1, kMaxInt, true);
  root.Double("gradient_clipping", config.gradient_clipping, 0.0, std::numeric_limits<double>::max(), false, true);
  root.Int("steps_per_print", config.steps_per_print, 1);
  root.Bool("wall_clock_breakdown", config.wall_clock_breakdown);
  ParseFp16(root.Child("fp16"), config.fp16);
  ParseBf16(root.Child("bf16"), config.bf16);
  // DeepSpeed accepts "bfloat16" as an alias of "bf16".
  if (root.Has("bfloat16")) {
    if (root.Has("bf16")) root.Error("bfloat16", "give either bf16 or its alias bfloat16, not both");
    ParseBf16(root.Child("bfloat16"), config.bf16);
    // Recorded under the canonical name, so ConfigToJson prints one bf16 section.
    for (std::string& key : config.auto_keys) {
      if (key == "bfloat16.enabled") key = "bf16.enabled";
    }
  }
  if (root.Has("optimizer")) ParseOptimizer(root.Child("optimizer"), config.optimizer);
  if (root.Has("scheduler")) ParseScheduler(root.Child("scheduler"), config.scheduler);
  ParseZero(root.Child("zero_optimization"), config.zero);
  ParseAio(root.Child("aio"), config.aio);
  ParseMonitor(root.Child("tensorboard"), config.tensorboard);
  ParseMonitor(root.Child("csv_monitor"), config.csv_monitor);
  Section ac = root.Child("activation_checkpointing");
  ac.Bool("cpu_checkpointing", config.activation_checkpointing.cpu_checkpointing);
  ac.Finish({"partition_activations", "contiguous_memory_optimization", "number_checkpoints",
             "synchronize_checkpoint_boundary", "profile"});

  if (config.fp16.enabled && config.bf16.enabled) root.Error("fp16.enabled", "fp16 and bf16 cannot both be enabled");

  root.Finish({"prescale_gradients",
               "gradient_predivide_factor",
               "sparse_gradients",
               "zero_allow_untested_optimizer",
               "zero_force_ds_cpu_optimizer",
               "communication_data_type",
               "seq_parallel_communication_data_type",
               "flops_profiler",
               "wandb",
               "comet",
               "amp",
               "dump_state",
               "memory_breakdown",
               "checkpoint",
               "data_efficiency",
               "curriculum_learning",
               "elasticity",
               "autotuning",
               "compression_training",
               "data_types",
               "pipeline",
               "timers",
               "comms_logger",
               "load_universal_checkpoint",
               "disable_allgather",
               "sparse_attention",
               "zero_optimization_stage",
               "eigenvalue",
               "progressive_layer_drop",
               "quantize_training",
               "graph_harvesting",
               "use_node_local_storage",
               "aio_use_gds",
               "weight_quantization",
               "nebula",
               "hybrid_engine",
               "compile",
               "monitor_config",
               "train_micro_batch_size",
               "mixed_precision"});

  if (!p.errors.empty()) {
    std::string msg = source + ": " + std::to_string(p.errors.size()) + " error(s) in config";
    for (const std::string& e : p.errors) msg += "\n  " + e;
    return Status::InvalidArgument(std::move(msg));
  }
  return config;
}

StatusOr<Config> LoadConfigFile(const std::string& path) {
  std::ifstream in(path, std::ios::binary);
  if (!in) return ErrnoStatus(errno, "open config", path);
  std::stringstream buf;
  buf << in.rdbuf();
  if (in.bad()) return ErrnoStatus(errno, "read config", path);
  return ParseConfig(buf.str(), path);
}

namespace {

bool Contains(const std::vector<std::string>& v, std::string_view s) {
  return std::find(v.begin(), v.end(), s) != v.end();
}

// a * b, or nullopt when it does not fit in an int64.
std::optional<int64_t> Mul(int64_t a, int64_t b) {
  int64_t r = 0;
  if (__builtin_mul_overflow(a, b, &r)) return std::nullopt;
  return r;
}

}  // namespace

namespace {

// Formats a number as ConfigToJson prints it.
std::string JsonNumber(double v) { return json(v).dump(); }
std::string JsonNumber(int64_t v) { return std::to_string(v); }

// One run of ResolveAuto: the config, what it knows, what it found.
struct Resolver {
  Config& c;
  const AutoContext& ctx;
  std::vector<std::string>& errors;
  std::vector<AutoResolution>* out;

  bool IsAutoKey(std::string_view key) const { return Contains(c.auto_keys, key); }
  bool Given(std::string_view key) const { return Contains(c.given_keys, key); }
  void Record(const std::string& key, std::string from, std::string value, std::string rule) {
    if (out != nullptr) out->push_back({key, std::move(from), std::move(value), std::move(rule)});
  }

  // A key the HF Trainer fills from one TrainingArgument: "auto" takes the
  // flag's value or HF's default; a flag fills a key the file left out and
  // must agree with one it set (`file_key`, when the file sets `key` as a
  // part of it). Returns whether `field` was set here.
  template <typename T>
  bool Fill(const std::string& key, T& field, const std::optional<T>& flag, const char* flag_name, T hf_default,
            const char* hf_name, const std::string& file_key = "") {
    if (IsAutoKey(key)) {
      field = flag.value_or(hf_default);
      Record(key, "auto", JsonNumber(field),
             flag ? std::string(flag_name) : "HF TrainingArguments default " + std::string(hf_name));
      return true;
    }
    if (!flag) return false;
    if (Given(file_key.empty() ? key : file_key)) {
      if (field != *flag) {
        errors.push_back(key + ": the config sets " + JsonNumber(field) + " but " + flag_name + " is " +
                         JsonNumber(*flag) + " (the HF Trainer refuses such a mismatch too); set the key to \"auto\" " +
                         "to take the flag, or drop the flag");
      }
      return false;
    }
    Record(key, "default " + JsonNumber(field), JsonNumber(*flag), flag_name);
    field = *flag;
    return true;
  }

  // Micro-batch and accumulation first: the batch rule derives from them.
  void BatchArgs() {
    const TrainerArgs& a = ctx.trainer;
    if (Fill("train_micro_batch_size_per_gpu", c.train_micro_batch_size_per_gpu, a.micro_batch, "--micro-batch",
             int64_t{8}, "per_device_train_batch_size")) {
      c.batch_given[1] = true;
    }
    if (Fill("gradient_accumulation_steps", c.gradient_accumulation_steps, a.grad_accum, "--grad-accum", int64_t{1},
             "gradient_accumulation_steps")) {
      c.batch_given[2] = true;
    }
  }

  void OptimizerArgs() {
    const TrainerArgs& a = ctx.trainer;
    OptimizerConfig& o = c.optimizer;
    Fill("optimizer.params.lr", o.lr, a.lr, "--lr", 5e-5, "learning_rate");
    const std::string betas = "optimizer.params.betas";
    if (IsAutoKey(betas)) {
      o.beta1 = a.adam_beta1.value_or(0.9);
      o.beta2 = a.adam_beta2.value_or(0.999);
      std::string rule;
      if (a.adam_beta1 || a.adam_beta2) {
        rule = std::string(a.adam_beta1 ? "--adam-beta1" : "HF default adam_beta1") + ", " +
               (a.adam_beta2 ? "--adam-beta2" : "HF default adam_beta2");
      } else {
        rule = "HF TrainingArguments defaults adam_beta1, adam_beta2";
      }
      Record(betas, "auto", json({o.beta1, o.beta2}).dump(), rule);
    } else {
      // Each beta alone against its half of the pair.
      Fill(betas + "[0]", o.beta1, a.adam_beta1, "--adam-beta1", 0.9, "adam_beta1", betas);
      Fill(betas + "[1]", o.beta2, a.adam_beta2, "--adam-beta2", 0.999, "adam_beta2", betas);
    }
    Fill("optimizer.params.eps", o.eps, a.adam_epsilon, "--adam-epsilon", 1e-8, "adam_epsilon");
    Fill("optimizer.params.weight_decay", o.weight_decay, a.weight_decay, "--weight-decay", 0.0, "weight_decay");
    Fill("gradient_clipping", c.gradient_clipping, a.max_grad_norm, "--max-grad-norm", 1.0, "max_grad_norm");
  }

  void SchedulerArgs() {
    SchedulerConfig& s = c.scheduler;
    const TrainerArgs& a = ctx.trainer;
    if (s.type == SchedulerType::kNone) {
      if (a.warmup_steps) {
        errors.push_back(
            "scheduler: --warmup-steps needs a scheduler to warm up; add one (WarmupLR, WarmupDecayLR "
            "or WarmupCosineLR)");
      }
      return;
    }
    if (IsAutoKey("scheduler.params.warmup_min_lr")) {
      s.warmup_min_lr = 0.0;
      Record("scheduler.params.warmup_min_lr", "auto", JsonNumber(s.warmup_min_lr), "the HF Trainer's 0");
    }
    if (s.type != SchedulerType::kWarmupCosineLR) {
      const std::string key = "scheduler.params.warmup_max_lr";
      if (IsAutoKey(key)) {
        s.warmup_max_lr = c.optimizer.lr;
        Record(key, "auto", JsonNumber(s.warmup_max_lr), "optimizer.params.lr");
      } else {
        Fill(key, s.warmup_max_lr, a.lr, "--lr", 0.0, "learning_rate");
      }
    }
    Fill("scheduler.params.warmup_num_steps", s.warmup_num_steps, a.warmup_steps, "--warmup-steps", int64_t{0},
         "warmup_steps");
  }

  // The keys whose rules are zinf's own (DeepSpeed's "auto" that the HF
  // Trainer fills from the model or the run): buckets, steps, precision, aio.
  void OtherKeys() {
    static const std::set<std::string> kTrainerKeys = {"train_batch_size",
                                                       "train_micro_batch_size_per_gpu",
                                                       "gradient_accumulation_steps",
                                                       "optimizer.params.lr",
                                                       "optimizer.params.betas",
                                                       "optimizer.params.eps",
                                                       "optimizer.params.weight_decay",
                                                       "gradient_clipping",
                                                       "scheduler.params.warmup_min_lr",
                                                       "scheduler.params.warmup_max_lr",
                                                       "scheduler.params.warmup_num_steps"};
    for (const std::string& key : c.auto_keys) {
      if (kTrainerKeys.count(key)) continue;  // done above
      auto need_hidden = [&](int64_t& field, auto&& rule, const char* text) {
        if (!ctx.hidden_size) {
          errors.push_back(key +
                           ": \"auto\" is worked out from the model's hidden size, which is not known here "
                           "(give a number, or pass the model)");
          return;
        }
        field = rule(*ctx.hidden_size);
        Record(key, "auto", JsonNumber(field), std::string(text) + ", hidden size " + std::to_string(*ctx.hidden_size));
      };
      if (key == "zero_optimization.reduce_bucket_size") {
        need_hidden(
            c.zero.reduce_bucket_size, [](int64_t h) { return h * h; }, "hidden_size^2");
      } else if (key == "zero_optimization.allgather_bucket_size") {
        need_hidden(
            c.zero.allgather_bucket_size, [](int64_t h) { return h * h; }, "hidden_size^2");
      } else if (key == "zero_optimization.stage3_prefetch_bucket_size") {
        need_hidden(
            c.zero.stage3_prefetch_bucket_size,
            [](int64_t h) { return static_cast<int64_t>(0.9 * double(h) * double(h)); }, "0.9 * hidden_size^2");
      } else if (key == "zero_optimization.stage3_param_persistence_threshold") {
        need_hidden(
            c.zero.stage3_param_persistence_threshold, [](int64_t h) { return 10 * h; }, "10 * hidden_size");
      } else if (key == "scheduler.params.total_num_steps") {
        if (ctx.total_steps) {
          c.scheduler.total_num_steps = *ctx.total_steps;
          Record(key, "auto", JsonNumber(c.scheduler.total_num_steps), "the run's step count, --steps");
        } else {
          errors.push_back(key +
                           ": \"auto\" takes the run's step count, which is not known here (give a number, or "
                           "--steps)");
        }
      } else if (key == "fp16.enabled") {
        c.fp16.enabled = false;
        Record(key, "auto", "false", "fp16 is off unless the config turns it on");
      } else if (key == "bf16.enabled") {
        c.bf16.enabled = !c.fp16.enabled;
        Record(key, "auto", c.bf16.enabled ? "true" : "false", "bf16 is on unless fp16 is enabled");
      } else if (key == "aio.thread_count") {
        std::set<std::string> paths(c.zero.offload_param.nvme_paths.begin(), c.zero.offload_param.nvme_paths.end());
        paths.insert(c.zero.offload_optimizer.nvme_paths.begin(), c.zero.offload_optimizer.nvme_paths.end());
        // At most 256 rings, the most ParseConfig accepts for the key.
        c.aio.thread_count = std::clamp<int64_t>(static_cast<int64_t>(paths.size()), 1, 256);
        Record(key, "auto", JsonNumber(c.aio.thread_count), "one ring per distinct nvme path");
      } else {
        errors.push_back(key + ": \"auto\" is not supported for this key; give a value");
      }
    }
  }
};

// DeepSpeed's batch rule train = micro * accum * world over the keys given.
void ResolveBatch(Config& c, int64_t world, std::vector<std::string>& errors) {
  bool t = c.batch_given[0], m = c.batch_given[1], a = c.batch_given[2];
  int64_t& train = c.train_batch_size;
  int64_t& micro = c.train_micro_batch_size_per_gpu;
  int64_t& accum = c.gradient_accumulation_steps;
  // Each key goes up to INT64_MAX, so the products are checked: nullopt is
  // a product past INT64_MAX, which no train_batch_size equals or divides.
  const std::optional<int64_t> micro_world = Mul(micro, world), accum_world = Mul(accum, world);
  if (t && m && a) {
    const std::optional<int64_t> all = micro_world ? Mul(*micro_world, accum) : std::nullopt;
    if (!all || train != *all) {
      errors.push_back("train_batch_size: " + std::to_string(train) + " != train_micro_batch_size_per_gpu (" +
                       std::to_string(micro) + ") * gradient_accumulation_steps (" + std::to_string(accum) +
                       ") * world size (" + std::to_string(world) + ")");
    }
  } else if (t && m) {
    if (!micro_world || train % *micro_world != 0) {
      errors.push_back("train_batch_size: " + std::to_string(train) +
                       " is not divisible by train_micro_batch_size_per_gpu (" + std::to_string(micro) +
                       ") * world size (" + std::to_string(world) + ")");
    } else {
      accum = train / *micro_world;
    }
  } else if (t && a) {
    if (!accum_world || train % *accum_world != 0) {
      errors.push_back("train_batch_size: " + std::to_string(train) +
                       " is not divisible by gradient_accumulation_steps (" + std::to_string(accum) +
                       ") * world size (" + std::to_string(world) + ")");
    } else {
      micro = train / *accum_world;
    }
  } else if (t) {
    accum = 1;
    if (train % world != 0) {
      errors.push_back("train_batch_size: " + std::to_string(train) + " is not divisible by the world size (" +
                       std::to_string(world) + ")");
    } else {
      micro = train / world;
    }
  } else {
    if (!m) micro = 1;
    if (!a) accum = 1;
    const std::optional<int64_t> mw = Mul(micro, world);
    const std::optional<int64_t> all = mw ? Mul(*mw, accum) : std::nullopt;
    if (all) {
      train = *all;
    } else {
      errors.push_back("train_batch_size: train_micro_batch_size_per_gpu (" + std::to_string(micro) +
                       ") * gradient_accumulation_steps (" + std::to_string(accum) + ") * world size (" +
                       std::to_string(world) + ") is over 2^63 - 1");
    }
  }
}

}  // namespace

Status ResolveAuto(Config& c, const AutoContext& ctx, std::vector<AutoResolution>* resolutions) {
  std::vector<std::string> errors;
  const int64_t world = ctx.world_size;
  if (world < 1) return Status::InvalidArgument("world size must be >= 1");
  if (ctx.hidden_size &&
      (*ctx.hidden_size < 1 || !Mul(*ctx.hidden_size, *ctx.hidden_size) || !Mul(*ctx.hidden_size, 10))) {
    return Status::InvalidArgument("hidden size must be from 1 to 3037000499 (its square is a bucket size), got " +
                                   std::to_string(*ctx.hidden_size));
  }
  if (ctx.total_steps && *ctx.total_steps < 1) {
    return Status::InvalidArgument("the run's step count must be >= 1, got " + std::to_string(*ctx.total_steps));
  }

  Resolver r{c, ctx, errors, resolutions};
  r.BatchArgs();
  const bool train_auto = r.IsAutoKey("train_batch_size");
  ResolveBatch(c, world, errors);
  if (train_auto && errors.empty()) {
    r.Record("train_batch_size", "auto", JsonNumber(c.train_batch_size),
             "micro " + std::to_string(c.train_micro_batch_size_per_gpu) + " x accumulation " +
                 std::to_string(c.gradient_accumulation_steps) + " x world " + std::to_string(world));
  }
  r.OptimizerArgs();
  r.SchedulerArgs();
  r.OtherKeys();
  if (!errors.empty()) {
    std::string msg = c.source + ": " + std::to_string(errors.size()) + " error(s) resolving config";
    for (const std::string& e : errors) msg += "\n  " + e;
    return Status::InvalidArgument(std::move(msg));
  }
  c.auto_keys.clear();
  c.batch_given[0] = c.batch_given[1] = c.batch_given[2] = true;
  return Status::Ok();
}

namespace {

json ConfigJson(const Config& c) {
  auto paths = [](const std::vector<std::string>& v) -> json {
    if (v.empty()) return nullptr;
    if (v.size() == 1) return v[0];
    return v;
  };
  json j;
  j["train_batch_size"] = c.train_batch_size;
  j["train_micro_batch_size_per_gpu"] = c.train_micro_batch_size_per_gpu;
  j["gradient_accumulation_steps"] = c.gradient_accumulation_steps;
  j["gradient_clipping"] = c.gradient_clipping;
  j["steps_per_print"] = c.steps_per_print;
  j["wall_clock_breakdown"] = c.wall_clock_breakdown;
  j["fp16"] = {{"enabled", c.fp16.enabled},
               {"loss_scale", c.fp16.loss_scale},
               {"initial_scale_power", c.fp16.initial_scale_power},
               {"loss_scale_window", c.fp16.loss_scale_window},
               {"hysteresis", c.fp16.hysteresis},
               {"consecutive_hysteresis", c.fp16.consecutive_hysteresis},
               {"min_loss_scale", c.fp16.min_loss_scale}};
  j["bf16"] = {{"enabled", c.bf16.enabled}};
  const OptimizerConfig& o = c.optimizer;
  j["optimizer"] = {{"type", OptimizerTypeName(o.type)},
                    {"params",
                     {{"lr", o.lr},
                      {"betas", {o.beta1, o.beta2}},
                      {"eps", o.eps},
                      {"weight_decay", o.weight_decay},
                      {"adam_w_mode", o.adam_w_mode},
                      {"bias_correction", o.bias_correction}}}};
  const SchedulerConfig& s = c.scheduler;
  if (s.type != SchedulerType::kNone) {
    json params = {{"warmup_num_steps", s.warmup_num_steps}, {"warmup_type", WarmupTypeName(s.warmup_type)}};
    if (s.type == SchedulerType::kWarmupCosineLR) {
      params["warmup_min_ratio"] = s.warmup_min_ratio;
      params["cos_min_ratio"] = s.cos_min_ratio;
    } else {
      params["warmup_min_lr"] = s.warmup_min_lr;
      params["warmup_max_lr"] = s.warmup_max_lr;
    }
    if (s.type != SchedulerType::kWarmupLR) params["total_num_steps"] = s.total_num_steps;
    j["scheduler"] = {{"type", SchedulerTypeName(s.type)}, {"params", params}};
  }
  const ZeroConfig& z = c.zero;
  j["zero_optimization"] = {{"stage", z.stage},
                            {"overlap_comm", z.overlap_comm},
                            {"contiguous_gradients", z.contiguous_gradients},
                            {"reduce_bucket_size", z.reduce_bucket_size},
                            {"allgather_bucket_size", z.allgather_bucket_size},
                            {"sub_group_size", z.sub_group_size},
                            {"stage3_prefetch_bucket_size", z.stage3_prefetch_bucket_size},
                            {"stage3_param_persistence_threshold", z.stage3_param_persistence_threshold},
                            {"stage3_max_live_parameters", z.stage3_max_live_parameters},
                            {"stage3_max_reuse_distance", z.stage3_max_reuse_distance},
                            {"stage3_gather_16bit_weights_on_model_save", z.stage3_gather_16bit_weights_on_model_save},
                            {"offload_param",
                             {{"device", OffloadDeviceName(z.offload_param.device)},
                              {"nvme_path", paths(z.offload_param.nvme_paths)},
                              {"pin_memory", z.offload_param.pin_memory},
                              {"buffer_count", z.offload_param.buffer_count},
                              {"buffer_size", z.offload_param.buffer_size},
                              {"max_in_cpu", z.offload_param.max_in_cpu}}},
                            {"offload_optimizer",
                             {{"device", OffloadDeviceName(z.offload_optimizer.device)},
                              {"nvme_path", paths(z.offload_optimizer.nvme_paths)},
                              {"pin_memory", z.offload_optimizer.pin_memory},
                              {"buffer_count", z.offload_optimizer.buffer_count},
                              {"fast_init", z.offload_optimizer.fast_init},
                              {"pipeline_read", z.offload_optimizer.pipeline_read},
                              {"pipeline_write", z.offload_optimizer.pipeline_write},
                              {"ratio", z.offload_optimizer.ratio}}}};
  j["aio"] = {{"block_size", c.aio.block_size},
              {"queue_depth", c.aio.queue_depth},
              {"thread_count", c.aio.thread_count},
              {"single_submit", c.aio.single_submit},
              {"overlap_events", c.aio.overlap_events}};
  for (const auto& [name, m] : {std::pair{"tensorboard", &c.tensorboard}, std::pair{"csv_monitor", &c.csv_monitor}}) {
    j[name] = {{"enabled", m->enabled}, {"output_path", m->output_path}, {"job_name", m->job_name}};
  }
  j["activation_checkpointing"] = {{"cpu_checkpointing", c.activation_checkpointing.cpu_checkpointing}};
  // Keys still "auto" are shown as such, so a reader sees what is pending.
  for (const std::string& key : c.auto_keys) {
    json* node = &j;
    std::string rest = key;
    size_t dot;
    while ((dot = rest.find('.')) != std::string::npos) {
      node = &(*node)[rest.substr(0, dot)];
      rest = rest.substr(dot + 1);
    }
    (*node)[rest] = "auto";
  }
  return j;
}

// Removes from `j` what equals `defaults`, except the keys in `keep` (paths
// relative to the top; a section's "type" must stay, since a section given
// without one is an error); objects left empty go too.
void DropDefaults(json& j, const json& defaults, const std::string& path, const std::vector<std::string>& keep) {
  for (auto it = j.begin(); it != j.end();) {
    const std::string key = path.empty() ? it.key() : path + "." + it.key();
    const bool kept = std::find(keep.begin(), keep.end(), key) != keep.end();
    const auto d = defaults.find(it.key());
    if (!kept && d != defaults.end()) {
      if (it->is_object() && d->is_object()) {
        DropDefaults(*it, *d, key, keep);
        if (it->empty()) {
          it = j.erase(it);
          continue;
        }
      } else if (it->dump() == d->dump()) {  // as printed: -0.0 is not 0.0
        it = j.erase(it);
        continue;
      }
    }
    ++it;
  }
}

}  // namespace

std::string ConfigToJson(const Config& c, int indent) { return ConfigJson(c).dump(indent); }

std::string ConfigChangesToJson(const Config& c, int indent) {
  json j = ConfigJson(c);
  // What a key left out becomes: ParseConfig's defaults, "auto" included,
  // at the config's own stage (which is always written), since some
  // defaults follow it (overlap_comm is on for stage 3 unless set).
  const StatusOr<Config> parsed_defaults =
      ParseConfig("{\"zero_optimization\": {\"stage\": " + std::to_string(c.zero.stage) + "}}", "defaults");
  ZINF_CHECK(parsed_defaults.ok());
  const json defaults = ConfigJson(*parsed_defaults);
  DropDefaults(j, defaults, "",
               {"zero_optimization.stage", "zero_optimization.offload_param.device",
                "zero_optimization.offload_optimizer.device", "optimizer.type", "scheduler.type",
                "train_micro_batch_size_per_gpu", "gradient_accumulation_steps"});
  return j.dump(indent);
}

}  // namespace zinf
