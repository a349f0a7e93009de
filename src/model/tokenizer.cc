// Tokenizers (tokenizer.h): byte-level BPE from tokenizer.json on PCRE2 and
// ICU, SentencePiece through its library.
//
// The BPE follows the reference implementation's observable behaviour, not
// its code: a word's symbols are its characters (one outside the
// vocabulary becomes its <0xNN> byte tokens with byte_fallback, else
// unk_token); the pair with the lowest merge rank (the leftmost among
// equals) is merged until no pair has a rank; with ignore_merges a word
// that is itself in the vocabulary is one token. Words repeat a lot in
// text, so the ids of short ones are cached.
#include "model/tokenizer.h"

#define PCRE2_CODE_UNIT_WIDTH 8
#include <pcre2.h>
#include <sentencepiece_processor.h>
#include <unicode/normalizer2.h>
#include <unicode/unistr.h>

#include <algorithm>
#include <array>
#include <limits>
#include <map>
#include <nlohmann/json.hpp>
#include <optional>
#include <queue>
#include <unordered_map>

#include "core/fs.h"

namespace zinf::model {
namespace {

using Json = nlohmann::json;

// GPT-2's pre-tokenizer regex (what ByteLevel with use_regex splits by).
constexpr char kGpt2Pattern[] = R"('s|'t|'re|'ve|'m|'ll|'d| ?\p{L}+| ?\p{N}+| ?[^\s\p{L}\p{N}]+|\s+(?!\S)|\s+)";

StatusOr<std::string> ReadWholeFile(const std::string& path) {
  std::string text;
  FILE* f = std::fopen(path.c_str(), "rb");
  if (f == nullptr) return ErrnoStatus(errno, "open", path);
  char buf[1 << 16];
  size_t n;
  while ((n = std::fread(buf, 1, sizeof(buf), f)) > 0) text.append(buf, n);
  const bool failed = std::ferror(f) != 0;
  std::fclose(f);
  if (failed) return Status::IoError("read " + path + " failed");
  return text;
}

StatusOr<Json> ReadJsonFile(const std::string& path) {
  ZINF_ASSIGN_OR_RETURN(std::string text, ReadWholeFile(path));
  Json j = Json::parse(text, nullptr, /*allow_exceptions=*/false);
  if (j.is_discarded()) return Status::InvalidArgument(path + ": not valid JSON");
  return j;
}

// GPT-2's byte-to-character table: printable Latin-1 bytes stand for
// themselves, the others for U+0100 onwards in byte order, so every byte
// string becomes a printable string.
const std::array<std::string, 256>& ByteChars() {
  static const std::array<std::string, 256> table = [] {
    std::array<std::string, 256> t;
    int next = 256;
    for (int b = 0; b < 256; ++b) {
      const bool printable = (b >= '!' && b <= '~') || (b >= 0xA1 && b <= 0xAC) || (b >= 0xAE && b <= 0xFF);
      const int cp = printable ? b : next++;
      if (cp < 0x80) {
        t[static_cast<size_t>(b)] = std::string(1, static_cast<char>(cp));
      } else {
        t[static_cast<size_t>(b)] = {static_cast<char>(0xC0 | (cp >> 6)), static_cast<char>(0x80 | (cp & 0x3F))};
      }
    }
    return t;
  }();
  return table;
}

size_t Utf8Length(unsigned char lead) {
  if (lead < 0x80) return 1;
  if ((lead >> 5) == 0x6) return 2;
  if ((lead >> 4) == 0xE) return 3;
  return 4;
}

// A compiled PCRE2 pattern (UTF, UCP: Unicode classes) with its match data.
class Regex {
 public:
  static StatusOr<std::unique_ptr<Regex>> Compile(const std::string& pattern, const std::string& where) {
    int error = 0;
    PCRE2_SIZE offset = 0;
    pcre2_code* code = pcre2_compile(reinterpret_cast<PCRE2_SPTR>(pattern.data()), pattern.size(),
                                     PCRE2_UTF | PCRE2_UCP, &error, &offset, nullptr);
    if (code == nullptr) {
      PCRE2_UCHAR msg[256];
      pcre2_get_error_message(error, msg, sizeof(msg));
      return Status::InvalidArgument(where + ": regex does not compile at offset " + std::to_string(offset) + ": " +
                                     reinterpret_cast<const char*>(msg));
    }
    pcre2_jit_compile(code, PCRE2_JIT_COMPLETE);  // faster when there is a JIT; the interpreter otherwise
    auto r = std::unique_ptr<Regex>(new Regex);
    r->code_ = code;
    r->match_ = pcre2_match_data_create_from_pattern(code, nullptr);
    return r;
  }
  ~Regex() {
    pcre2_match_data_free(match_);
    pcre2_code_free(code_);
  }

  // Cuts `text` into the matches and the stretches between them (HF's
  // Split behavior "Isolated"), appending the pieces to `out`. The text was
  // checked as UTF-8 before.
  Status SplitIsolated(std::string_view text, std::vector<std::string>& out) const {
    size_t last = 0, at = 0;
    while (at <= text.size()) {
      const int rc = pcre2_match(code_, reinterpret_cast<PCRE2_SPTR>(text.data()), text.size(), at, PCRE2_NO_UTF_CHECK,
                                 match_, nullptr);
      if (rc == PCRE2_ERROR_NOMATCH) break;
      if (rc < 0) return Status::Internal("regex match failed with PCRE2 error " + std::to_string(rc));
      const PCRE2_SIZE* ov = pcre2_get_ovector_pointer(match_);
      const size_t begin = ov[0], end = ov[1];
      if (begin > last) out.emplace_back(text.substr(last, begin - last));
      if (end > begin) {
        out.emplace_back(text.substr(begin, end - begin));
        last = end;
        at = end;
      } else {  // an empty match: step over one character
        if (begin >= text.size()) break;
        at = begin + Utf8Length(static_cast<unsigned char>(text[begin]));
      }
    }
    if (last < text.size()) out.emplace_back(text.substr(last));
    return Status::Ok();
  }

 private:
  Regex() = default;
  pcre2_code* code_ = nullptr;
  pcre2_match_data* match_ = nullptr;
};

// kInvalidArgument naming the byte offset of the first bad UTF-8 sequence:
// PCRE2 checks a subject in UTF mode before matching it.
Status CheckUtf8(std::string_view text) {
  static pcre2_code* const code = [] {
    int error = 0;
    PCRE2_SIZE offset = 0;
    return pcre2_compile(reinterpret_cast<PCRE2_SPTR>("\\A"), 2, PCRE2_UTF, &error, &offset, nullptr);
  }();
  pcre2_match_data* md = pcre2_match_data_create(1, nullptr);
  const int rc = pcre2_match(code, reinterpret_cast<PCRE2_SPTR>(text.data()), text.size(), 0, 0, md, nullptr);
  const size_t bad = pcre2_get_startchar(md);
  pcre2_match_data_free(md);
  if (rc >= 0 || rc == PCRE2_ERROR_NOMATCH) return Status::Ok();
  PCRE2_UCHAR msg[256];
  pcre2_get_error_message(rc, msg, sizeof(msg));
  return Status::InvalidArgument("text is not UTF-8 at byte " + std::to_string(bad) + ": " +
                                 reinterpret_cast<const char*>(msg));
}

struct AddedToken {
  std::string content;
  uint32_t id = 0;
  bool lstrip = false, rstrip = false, special = false;
};

// One normalizer step, applied to each stretch of text between added
// tokens.
struct NormStep {
  enum class Kind { kNfc, kPrepend, kReplace } kind = Kind::kNfc;
  std::string from, to;  // Prepend: `to` before a non-empty text; Replace: every `from` by `to`
};

// One pre-tokenizer step.
struct PreStep {
  std::unique_ptr<Regex> split;  // Split (Isolated) by this regex; null: a ByteLevel or Metaspace step
  bool add_prefix_space = false;
  // Metaspace (SentencePiece's convention): spaces become `metaspace`,
  // which is put in front of a piece that does not start with it (always,
  // or only for the piece at the text's start), and with metaspace_split
  // every occurrence starts a new piece.
  std::string metaspace;  // empty: not a Metaspace step
  enum class Prepend { kNever, kFirst, kAlways } prepend = Prepend::kAlways;
  bool metaspace_split = true;
};

std::string ReplaceAll(std::string_view text, const std::string& from, const std::string& to) {
  std::string out;
  size_t at = 0;
  for (size_t hit; (hit = text.find(from, at)) != std::string_view::npos; at = hit + from.size()) {
    out.append(text.substr(at, hit - at));
    out += to;
  }
  out.append(text.substr(at));
  return out;
}

// HF's name of a byte token: <0x41>, upper-case digits.
std::string ByteTokenName(unsigned char b) {
  static constexpr char kHex[] = "0123456789ABCDEF";
  return std::string("<0x") + kHex[b >> 4] + kHex[b & 0xF] + ">";
}

class BpeTokenizer final : public Tokenizer {
 public:
  static constexpr size_t kMaxCachedWords = size_t{1} << 20;
  static constexpr size_t kMaxCachedWordBytes = 256;
  static StatusOr<std::unique_ptr<Tokenizer>> Load(const std::string& json_path, const std::string& config_path,
                                                   const std::string& eos);
  StatusOr<std::vector<uint32_t>> Encode(std::string_view text) override;
  int64_t vocab_size() const override { return vocab_size_; }

 private:
  Status ParseModel(const Json& model, const std::string& where);
  Status ParseNormalizer(const Json& norm, const std::string& where);
  Status ParsePreTokenizer(const Json& pre, const std::string& where);
  Status ParseMetaspace(const Json& pre, const std::string& where);
  Status ParseAddedTokens(const Json& added, const std::string& where);
  Status FindEos(const Json& tok, const std::string& config_path, const std::string& eos, const std::string& where);
  std::optional<uint32_t> IdOf(const std::string& token) const;
  // The ids of one text stretch free of added tokens; `at_start`: it
  // begins the text (Metaspace's prepend_scheme "first").
  Status EncodePlain(std::string_view text, bool at_start, std::vector<uint32_t>& out);
  Status Normalize(std::string& text) const;
  // The ids of one pre-tokenized word (already byte-mapped when byte-level).
  Status EncodeWord(const std::string& word, std::vector<uint32_t>& out);
  // The symbols the merges start from (see EncodeWord).
  Status InitialSymbols(const std::string& word, std::vector<std::string>& symbols) const;
  void MergeAll(std::vector<std::string>& symbols) const;

  std::unordered_map<std::string, uint32_t> vocab_;
  std::unordered_map<std::string, int> merge_rank_;  // "a\xFFb" -> rank (\xFF never occurs in UTF-8)
  std::vector<AddedToken> added_;
  std::vector<PreStep> steps_;
  std::vector<NormStep> norms_;
  bool byte_level_ = false;
  bool ignore_merges_ = false;
  bool byte_fallback_ = false;
  bool fuse_unk_ = false;
  std::optional<std::string> unk_token_;
  std::optional<uint32_t> unk_;
  int64_t vocab_size_ = 0;
  std::unordered_map<std::string, std::vector<uint32_t>> cache_;
};

Status BpeTokenizer::ParseModel(const Json& model, const std::string& where) {
  if (!model.is_object() || model.value("type", "") != "BPE") {
    return Status::InvalidArgument(where + ": model.type must be \"BPE\" (byte-level BPE), got " +
                                   (model.is_object() && model.contains("type") ? model["type"].dump() : "none"));
  }
  for (const char* key : {"continuing_subword_prefix", "end_of_word_suffix"}) {
    if (model.contains(key) && model[key].is_string() && !model[key].get<std::string>().empty()) {
      return Status::InvalidArgument(where + ": model." + key + " is not supported");
    }
  }
  if (model.contains("dropout") && !model["dropout"].is_null() && model["dropout"].get<double>() != 0.0) {
    return Status::InvalidArgument(where + ": model.dropout is not supported (encoding must be deterministic)");
  }
  byte_fallback_ = model.value("byte_fallback", false);
  fuse_unk_ = model.value("fuse_unk", false);
  ignore_merges_ = model.value("ignore_merges", false);
  const Json& vocab = model.value("vocab", Json());
  if (!vocab.is_object()) return Status::InvalidArgument(where + ": model.vocab must be an object");
  for (const auto& [token, id] : vocab.items()) {
    if (!id.is_number_unsigned()) return Status::InvalidArgument(where + ": model.vocab[" + token + "] is not an id");
    vocab_[token] = id.get<uint32_t>();
    vocab_size_ = std::max<int64_t>(vocab_size_, id.get<int64_t>() + 1);
  }
  const Json& merges = model.value("merges", Json::array());
  if (!merges.is_array()) return Status::InvalidArgument(where + ": model.merges must be an array");
  int rank = 0;
  for (const Json& m : merges) {
    std::string a, b;
    if (m.is_string()) {
      const std::string s = m.get<std::string>();
      const size_t space = s.find(' ');
      if (space == std::string::npos) {
        return Status::InvalidArgument(where + ": model.merges[" + std::to_string(rank) + "] \"" + s +
                                       "\" is not two tokens");
      }
      a = s.substr(0, space);
      b = s.substr(space + 1);
    } else if (m.is_array() && m.size() == 2 && m[0].is_string() && m[1].is_string()) {
      a = m[0].get<std::string>();
      b = m[1].get<std::string>();
    } else {
      return Status::InvalidArgument(where + ": model.merges[" + std::to_string(rank) + "] is not a pair");
    }
    merge_rank_.emplace(a + '\xFF' + b, rank++);
  }
  if (model.contains("unk_token") && model["unk_token"].is_string()) {
    unk_token_ = model["unk_token"].get<std::string>();
    unk_ = IdOf(*unk_token_);  // none: an error when needed, as in HF
  }
  return Status::Ok();
}

Status BpeTokenizer::ParseNormalizer(const Json& norm, const std::string& where) {
  if (norm.is_null()) return Status::Ok();
  const std::string type = norm.is_object() ? norm.value("type", "") : "";
  if (type == "Sequence") {
    for (const Json& n : norm.value("normalizers", Json::array())) ZINF_RETURN_IF_ERROR(ParseNormalizer(n, where));
    return Status::Ok();
  }
  NormStep step;
  if (type == "NFC") {
    step.kind = NormStep::Kind::kNfc;
  } else if (type == "Prepend" && norm.contains("prepend") && norm["prepend"].is_string()) {
    step.kind = NormStep::Kind::kPrepend;
    step.to = norm["prepend"].get<std::string>();
  } else if (type == "Replace" && norm.contains("content") && norm["content"].is_string()) {
    const Json& pattern = norm.value("pattern", Json());
    if (!pattern.is_object() || !pattern.contains("String") || !pattern["String"].is_string() ||
        pattern["String"].get<std::string>().empty()) {
      return Status::InvalidArgument(where + ": normalizer Replace with pattern " + pattern.dump() +
                                     " is not supported (only a non-empty pattern.String)");
    }
    step.kind = NormStep::Kind::kReplace;
    step.from = pattern["String"].get<std::string>();
    step.to = norm["content"].get<std::string>();
  } else {
    return Status::InvalidArgument(where + ": normalizer " + norm.dump() +
                                   " is not supported (null, NFC, Prepend, Replace with a String, Sequence)");
  }
  norms_.push_back(std::move(step));
  return Status::Ok();
}

Status BpeTokenizer::ParseMetaspace(const Json& pre, const std::string& where) {
  PreStep step;
  step.metaspace = pre.value("replacement", "\u2581");
  if (step.metaspace.empty() || Utf8Length(static_cast<unsigned char>(step.metaspace[0])) != step.metaspace.size()) {
    return Status::InvalidArgument(where + ": pre_tokenizer Metaspace replacement must be one character");
  }
  // Older files say add_prefix_space instead of prepend_scheme.
  const std::string scheme = pre.contains("prepend_scheme")
                                 ? pre.value("prepend_scheme", "")
                                 : (pre.value("add_prefix_space", true) ? "always" : "never");
  if (scheme == "always") {
    step.prepend = PreStep::Prepend::kAlways;
  } else if (scheme == "first") {
    step.prepend = PreStep::Prepend::kFirst;
  } else if (scheme == "never") {
    step.prepend = PreStep::Prepend::kNever;
  } else {
    return Status::InvalidArgument(where + ": pre_tokenizer Metaspace prepend_scheme \"" + scheme +
                                   "\" is not supported (always, first, never)");
  }
  step.metaspace_split = pre.value("split", true);
  steps_.push_back(std::move(step));
  return Status::Ok();
}

Status BpeTokenizer::ParsePreTokenizer(const Json& pre, const std::string& where) {
  if (pre.is_null()) return Status::Ok();
  const std::string type = pre.value("type", "");
  if (type == "Sequence") {
    for (const Json& p : pre.value("pretokenizers", Json::array())) ZINF_RETURN_IF_ERROR(ParsePreTokenizer(p, where));
    return Status::Ok();
  }
  if (type == "ByteLevel") {
    byte_level_ = true;
    PreStep step;
    step.add_prefix_space = pre.value("add_prefix_space", false);
    if (pre.value("use_regex", true)) {
      ZINF_ASSIGN_OR_RETURN(step.split, Regex::Compile(kGpt2Pattern, where + ": ByteLevel"));
    }
    steps_.push_back(std::move(step));
    return Status::Ok();
  }
  if (type == "Metaspace") return ParseMetaspace(pre, where);
  if (type == "Split") {
    if (pre.value("behavior", "") != "Isolated" || pre.value("invert", false)) {
      return Status::InvalidArgument(where + ": pre_tokenizer Split with behavior " + pre.value("behavior", "?") +
                                     (pre.value("invert", false) ? " inverted" : "") +
                                     " is not supported (only Isolated)");
    }
    const Json& pattern = pre.value("pattern", Json());
    std::string regex;
    if (pattern.contains("Regex")) {
      regex = pattern["Regex"].get<std::string>();
    } else if (pattern.contains("String")) {
      regex = "\\Q" + pattern["String"].get<std::string>() + "\\E";
    } else {
      return Status::InvalidArgument(where + ": pre_tokenizer Split needs pattern.Regex or pattern.String");
    }
    PreStep step;
    ZINF_ASSIGN_OR_RETURN(step.split, Regex::Compile(regex, where + ": pre_tokenizer Split"));
    steps_.push_back(std::move(step));
    return Status::Ok();
  }
  return Status::InvalidArgument(where + ": pre_tokenizer type \"" + type +
                                 "\" is not supported (ByteLevel, Split, Metaspace, Sequence)");
}

Status BpeTokenizer::ParseAddedTokens(const Json& added, const std::string& where) {
  if (added.is_null()) return Status::Ok();
  if (!added.is_array()) return Status::InvalidArgument(where + ": added_tokens must be an array");
  for (const Json& a : added) {
    AddedToken t;
    t.content = a.value("content", "");
    if (t.content.empty() || !a.contains("id"))
      return Status::InvalidArgument(where + ": an added token lacks content or id");
    t.id = a["id"].get<uint32_t>();
    t.lstrip = a.value("lstrip", false);
    t.rstrip = a.value("rstrip", false);
    t.special = a.value("special", false);
    vocab_size_ = std::max<int64_t>(vocab_size_, static_cast<int64_t>(t.id) + 1);
    added_.push_back(std::move(t));
  }
  // Longest first: at one position the longest content wins.
  std::stable_sort(added_.begin(), added_.end(),
                   [](const AddedToken& x, const AddedToken& y) { return x.content.size() > y.content.size(); });
  return Status::Ok();
}

std::optional<uint32_t> BpeTokenizer::IdOf(const std::string& token) const {
  for (const AddedToken& a : added_) {
    if (a.content == token) return a.id;
  }
  auto it = vocab_.find(token);
  if (it != vocab_.end()) return it->second;
  return std::nullopt;
}

// A token's name in tokenizer_config.json: a string or {"content": ...}.
std::string TokenName(const Json& j) {
  if (j.is_string()) return j.get<std::string>();
  if (j.is_object() && j.contains("content") && j["content"].is_string()) return j["content"].get<std::string>();
  return "";
}

Status BpeTokenizer::FindEos(const Json& tok, const std::string& config_path, const std::string& eos,
                             const std::string& where) {
  std::string name = eos, from = "--eos";
  if (name.empty() && !config_path.empty()) {
    ZINF_ASSIGN_OR_RETURN(Json config, ReadJsonFile(config_path));
    if (config.is_object() && config.contains("eos_token")) {
      name = TokenName(config["eos_token"]);
      from = config_path + ": eos_token";
    }
  }
  if (name.empty()) {
    // A special token the template appends after the sequence ($A).
    const Json& post = tok.value("post_processor", Json());
    std::vector<Json> processors;
    if (post.is_object() && post.value("type", "") == "Sequence") {
      for (const Json& p : post.value("processors", Json::array())) processors.push_back(p);
    } else if (post.is_object()) {
      processors.push_back(post);
    }
    for (const Json& p : processors) {
      if (p.value("type", "") != "TemplateProcessing") continue;
      const Json& single = p.value("single", Json::array());
      bool after_sequence = false;
      for (const Json& piece : single) {
        if (piece.contains("Sequence")) after_sequence = true;
        if (after_sequence && piece.contains("SpecialToken")) {
          name = piece["SpecialToken"].value("id", "");
          from = where + ": post_processor template";
        }
      }
    }
  }
  if (name.empty() && IdOf("<|endoftext|>")) {
    name = "<|endoftext|>";
    from = where + ": added token <|endoftext|>";
  }
  if (name.empty()) {
    return Status::InvalidArgument(where +
                                   ": no end-of-sequence token (no tokenizer_config.json eos_token, no "
                                   "post-processor template ending in one, no <|endoftext|>); give --eos TOKEN");
  }
  const std::optional<uint32_t> id = IdOf(name);
  if (!id) return Status::InvalidArgument(from + ": end-of-sequence token \"" + name + "\" is not in the vocabulary");
  eos_id_ = *id;
  eos_token_ = name;
  return Status::Ok();
}

StatusOr<std::unique_ptr<Tokenizer>> BpeTokenizer::Load(const std::string& json_path, const std::string& config_path,
                                                        const std::string& eos) {
  ZINF_ASSIGN_OR_RETURN(Json tok, ReadJsonFile(json_path));
  if (!tok.is_object()) return Status::InvalidArgument(json_path + ": not a JSON object");
  auto t = std::unique_ptr<BpeTokenizer>(new BpeTokenizer);
  ZINF_RETURN_IF_ERROR(t->ParseNormalizer(tok.value("normalizer", Json()), json_path));
  ZINF_RETURN_IF_ERROR(t->ParseAddedTokens(tok.value("added_tokens", Json()), json_path));
  ZINF_RETURN_IF_ERROR(t->ParseModel(tok.value("model", Json()), json_path));
  ZINF_RETURN_IF_ERROR(t->ParsePreTokenizer(tok.value("pre_tokenizer", Json()), json_path));
  ZINF_RETURN_IF_ERROR(t->FindEos(tok, config_path, eos, json_path));
  t->description_ = std::string(t->byte_level_ ? "byte-level " : "") + "BPE" +
                    (t->byte_fallback_ ? " with byte fallback" : "") + " (" + json_path + ")";
  return std::unique_ptr<Tokenizer>(std::move(t));
}

// HF's BPE, before merging: a character in the vocabulary is a symbol;
// one outside it is its bytes' <0xNN> tokens with byte_fallback (when the
// vocabulary has all of them), else unk_token, consecutive ones fused into
// one with fuse_unk. HF places a pending unk_token only when the next
// character in the vocabulary (or the word's end) comes, after any byte
// tokens in between: mirrored, so that the ids come in its order.
Status BpeTokenizer::InitialSymbols(const std::string& word, std::vector<std::string>& symbols) const {
  bool pending = false;  // an unk_token not yet placed
  for (size_t i = 0; i < word.size();) {
    const size_t n = std::min(Utf8Length(static_cast<unsigned char>(word[i])), word.size() - i);
    std::string c = word.substr(i, n);
    i += n;
    if (vocab_.count(c) != 0) {
      if (pending) symbols.push_back(*unk_token_);
      pending = false;
      symbols.push_back(std::move(c));
      continue;
    }
    if (byte_fallback_) {
      std::vector<std::string> bytes;
      for (const char b : c) {
        std::string name = ByteTokenName(static_cast<unsigned char>(b));
        if (vocab_.count(name) == 0) break;
        bytes.push_back(std::move(name));
      }
      if (bytes.size() == c.size()) {
        symbols.insert(symbols.end(), bytes.begin(), bytes.end());
        continue;
      }
    }
    if (!unk_) {
      return Status::InvalidArgument("tokenizer: \"" + c + "\" is not in the vocabulary and there is no unk_token" +
                                     (unk_token_ ? " in it (\"" + *unk_token_ + "\")" : std::string()));
    }
    if (pending && !fuse_unk_) symbols.push_back(*unk_token_);
    pending = true;
  }
  if (pending) symbols.push_back(*unk_token_);
  return Status::Ok();
}

// Merges the pair of the lowest rank, the leftmost among equals, until none
// is left, as HF does it: a queue of candidate pairs; a candidate is still
// good when its pair now merges into the same token.
void BpeTokenizer::MergeAll(std::vector<std::string>& symbols) const {
  struct Candidate {
    int rank;
    size_t pos;
    std::string merged;
  };
  auto after = [](const Candidate& x, const Candidate& y) {
    return x.rank != y.rank ? x.rank > y.rank : x.pos > y.pos;
  };
  std::priority_queue<Candidate, std::vector<Candidate>, decltype(after)> queue(after);
  const size_t n = symbols.size();
  constexpr size_t kNone = std::numeric_limits<size_t>::max();
  std::vector<size_t> prev(n), next(n);
  std::vector<bool> gone(n, false);
  for (size_t i = 0; i < n; ++i) {
    prev[i] = i == 0 ? kNone : i - 1;
    next[i] = i + 1 == n ? kNone : i + 1;
  }
  auto rank_of = [&](size_t a, size_t b) {
    auto it = merge_rank_.find(symbols[a] + '\xFF' + symbols[b]);
    return it == merge_rank_.end() ? -1 : it->second;
  };
  auto offer = [&](size_t a) {
    if (a == kNone || next[a] == kNone) return;
    const int rank = rank_of(a, next[a]);
    if (rank >= 0) queue.push({rank, a, symbols[a] + symbols[next[a]]});
  };
  for (size_t i = 0; i + 1 < n; ++i) offer(i);
  while (!queue.empty()) {
    const Candidate top = queue.top();
    queue.pop();
    const size_t right = next[top.pos];
    if (gone[top.pos] || right == kNone) continue;
    if (rank_of(top.pos, right) < 0 || symbols[top.pos].size() + symbols[right].size() != top.merged.size() ||
        symbols[top.pos] + symbols[right] != top.merged) {
      continue;  // stale: the pair changed since
    }
    symbols[top.pos] = top.merged;
    gone[right] = true;
    next[top.pos] = next[right];
    if (next[top.pos] != kNone) prev[next[top.pos]] = top.pos;
    offer(prev[top.pos]);
    offer(top.pos);
  }
  size_t kept = 0;
  for (size_t i = 0; i < n; ++i) {
    if (gone[i]) continue;
    if (kept != i) symbols[kept] = std::move(symbols[i]);
    ++kept;
  }
  symbols.resize(kept);
}

Status BpeTokenizer::EncodeWord(const std::string& word, std::vector<uint32_t>& out) {
  if (auto hit = cache_.find(word); hit != cache_.end()) {
    out.insert(out.end(), hit->second.begin(), hit->second.end());
    return Status::Ok();
  }
  std::vector<uint32_t> ids;
  auto whole = vocab_.find(word);
  if (ignore_merges_ && whole != vocab_.end()) {
    ids.push_back(whole->second);
  } else {
    std::vector<std::string> symbols;
    ZINF_RETURN_IF_ERROR(InitialSymbols(word, symbols));
    MergeAll(symbols);
    for (const std::string& s : symbols) {
      auto it = vocab_.find(s);
      if (it != vocab_.end()) {
        ids.push_back(it->second);
      } else if (unk_token_ && s == *unk_token_) {
        ids.push_back(*unk_);  // an added token only
      } else {
        return Status::InvalidArgument("tokenizer: the merges make \"" + s + "\", which is not in the vocabulary");
      }
    }
  }
  out.insert(out.end(), ids.begin(), ids.end());
  // Bounded: a corpus's distinct words may be many, and without a
  // pre-tokenizer a word is a whole stretch of text (not worth keeping).
  if (word.size() > kMaxCachedWordBytes) return Status::Ok();
  if (cache_.size() >= kMaxCachedWords) cache_.clear();
  cache_.emplace(word, std::move(ids));
  return Status::Ok();
}

Status BpeTokenizer::Normalize(std::string& text) const {
  for (const NormStep& n : norms_) {
    if (n.kind == NormStep::Kind::kPrepend) {
      if (!text.empty()) text.insert(0, n.to);
    } else if (n.kind == NormStep::Kind::kReplace) {
      text = ReplaceAll(text, n.from, n.to);
    } else {
      UErrorCode err = U_ZERO_ERROR;
      const icu::Normalizer2* nfc = icu::Normalizer2::getNFCInstance(err);
      if (U_FAILURE(err)) return Status::Internal(std::string("ICU NFC normalizer: ") + u_errorName(err));
      const icu::UnicodeString u = nfc->normalize(
          icu::UnicodeString::fromUTF8(icu::StringPiece(text.data(), static_cast<int32_t>(text.size()))), err);
      if (U_FAILURE(err)) return Status::Internal(std::string("ICU NFC normalizer: ") + u_errorName(err));
      text.clear();
      u.toUTF8String(text);
    }
  }
  return Status::Ok();
}

// A Metaspace step on `pieces` (see PreStep); pieces[0] begins the text
// when `at_start`.
std::vector<std::string> Metaspace(const PreStep& step, const std::vector<std::string>& pieces, bool at_start) {
  std::vector<std::string> out;
  const std::string& rep = step.metaspace;
  for (size_t k = 0; k < pieces.size(); ++k) {
    std::string p = ReplaceAll(pieces[k], " ", rep);
    const bool prepend =
        step.prepend == PreStep::Prepend::kAlways || (step.prepend == PreStep::Prepend::kFirst && at_start && k == 0);
    if (prepend && p.compare(0, rep.size(), rep) != 0) p.insert(0, rep);
    if (!step.metaspace_split) {
      out.push_back(std::move(p));
      continue;
    }
    // Each replacement starts a piece (HF's MergedWithNext).
    size_t begin = 0;
    for (size_t hit = p.find(rep, 1); hit != std::string::npos; hit = p.find(rep, hit + rep.size())) {
      out.push_back(p.substr(begin, hit - begin));
      begin = hit;
    }
    out.push_back(p.substr(begin));
  }
  return out;
}

Status BpeTokenizer::EncodePlain(std::string_view text, bool at_start, std::vector<uint32_t>& out) {
  if (text.empty()) return Status::Ok();
  std::string normalized(text);
  ZINF_RETURN_IF_ERROR(Normalize(normalized));
  std::vector<std::string> pieces = {std::move(normalized)};
  for (const PreStep& step : steps_) {
    if (!step.metaspace.empty()) {
      pieces = Metaspace(step, pieces, at_start);
      continue;
    }
    if (step.add_prefix_space) {
      for (std::string& p : pieces) {
        if (p.empty() || p[0] != ' ') p.insert(p.begin(), ' ');
      }
    }
    if (!step.split) continue;
    std::vector<std::string> next;
    for (const std::string& p : pieces) ZINF_RETURN_IF_ERROR(step.split->SplitIsolated(p, next));
    pieces = std::move(next);
  }
  const auto& chars = ByteChars();
  for (const std::string& p : pieces) {
    if (!byte_level_) {
      ZINF_RETURN_IF_ERROR(EncodeWord(p, out));
      continue;
    }
    std::string mapped;
    for (char c : p) mapped += chars[static_cast<unsigned char>(c)];
    ZINF_RETURN_IF_ERROR(EncodeWord(mapped, out));
  }
  return Status::Ok();
}

bool IsSpace(char c) { return c == ' ' || c == '\t' || c == '\n' || c == '\r' || c == '\v' || c == '\f'; }

StatusOr<std::vector<uint32_t>> BpeTokenizer::Encode(std::string_view text) {
  ZINF_RETURN_IF_ERROR(CheckUtf8(text));
  std::vector<uint32_t> out;
  size_t done = 0;
  // Where each added token next occurs at or after `done` (found again only
  // once `done` passes it: one scan of the text per token, not per match).
  std::vector<size_t> next(added_.size(), 0);
  for (size_t i = 0; i < added_.size(); ++i) next[i] = text.find(added_[i].content);
  while (done <= text.size()) {
    // The leftmost added token from `done` (the longest at that position).
    size_t best = std::string_view::npos;
    const AddedToken* hit = nullptr;
    for (size_t i = 0; i < added_.size(); ++i) {
      if (next[i] != std::string_view::npos && next[i] < done) next[i] = text.find(added_[i].content, done);
      if (next[i] < best) {
        best = next[i];
        hit = &added_[i];
      }
    }
    if (hit == nullptr) {
      ZINF_RETURN_IF_ERROR(EncodePlain(text.substr(done), done == 0, out));
      break;
    }
    size_t begin = best, end = best + hit->content.size();
    if (hit->lstrip) {
      while (begin > done && IsSpace(text[begin - 1])) --begin;
    }
    if (hit->rstrip) {
      while (end < text.size() && IsSpace(text[end])) ++end;
    }
    ZINF_RETURN_IF_ERROR(EncodePlain(text.substr(done, begin - done), done == 0, out));
    out.push_back(hit->id);
    done = end;
  }
  return out;
}

// SentencePiece through its own library.
class SentencePieceTokenizer final : public Tokenizer {
 public:
  static StatusOr<std::unique_ptr<Tokenizer>> Load(const std::string& model_path, const std::string& config_path,
                                                   const std::string& eos) {
    auto t = std::unique_ptr<SentencePieceTokenizer>(new SentencePieceTokenizer);
    const auto st = t->sp_.Load(model_path);
    if (!st.ok()) return Status::InvalidArgument(model_path + ": not a SentencePiece model: " + st.ToString());
    std::string name = eos;
    if (name.empty() && !config_path.empty()) {
      ZINF_ASSIGN_OR_RETURN(Json config, ReadJsonFile(config_path));
      if (config.is_object() && config.contains("eos_token")) name = TokenName(config["eos_token"]);
    }
    if (name.empty()) {
      if (t->sp_.eos_id() < 0) return Status::InvalidArgument(model_path + ": the model has no eos piece; give --eos");
      name = t->sp_.IdToPiece(t->sp_.eos_id());
    }
    const int id = t->sp_.PieceToId(name);
    if (id < 0 || (id == t->sp_.unk_id() && name != t->sp_.IdToPiece(t->sp_.unk_id()))) {
      return Status::InvalidArgument(model_path + ": end-of-sequence token \"" + name + "\" is not in the vocabulary");
    }
    t->eos_id_ = static_cast<uint32_t>(id);
    t->eos_token_ = name;
    t->description_ = "SentencePiece (" + model_path + ")";
    return std::unique_ptr<Tokenizer>(std::move(t));
  }

  StatusOr<std::vector<uint32_t>> Encode(std::string_view text) override {
    ZINF_RETURN_IF_ERROR(CheckUtf8(text));
    std::vector<int> ids;
    const auto st = sp_.Encode(std::string(text), &ids);
    if (!st.ok()) return Status::Internal("SentencePiece encode: " + st.ToString());
    return std::vector<uint32_t>(ids.begin(), ids.end());
  }
  int64_t vocab_size() const override { return sp_.GetPieceSize(); }

 private:
  sentencepiece::SentencePieceProcessor sp_;
};

}  // namespace

StatusOr<std::unique_ptr<Tokenizer>> Tokenizer::Load(const std::string& path, const std::string& eos) {
  if (!PathExists(path)) return Status::NotFound("tokenizer " + path + ": no such file or folder");
  std::string json_path = path, dir = ParentPath(path);
  const bool is_dir = ListDirectory(path).ok();
  if (is_dir) {
    dir = path;
    const std::string sp = JoinPath(path, "tokenizer.model");
    const std::string config = JoinPath(path, "tokenizer_config.json");
    if (PathExists(sp)) return SentencePieceTokenizer::Load(sp, PathExists(config) ? config : "", eos);
    json_path = JoinPath(path, "tokenizer.json");
    if (!PathExists(json_path)) {
      return Status::NotFound("tokenizer " + path + ": the folder has neither tokenizer.model nor tokenizer.json");
    }
  }
  const std::string config = JoinPath(dir.empty() ? "." : dir, "tokenizer_config.json");
  return BpeTokenizer::Load(json_path, PathExists(config) ? config : "", eos);
}

}  // namespace zinf::model
