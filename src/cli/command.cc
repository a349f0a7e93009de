#include "cli/command.h"

#include <cmath>
#include <cstdio>
#include <cstdlib>

namespace zinf::cli {

namespace {
std::map<std::string, Command>& Registry() {
  static auto* commands = new std::map<std::string, Command>();
  return *commands;
}
}  // namespace

bool RegisterCommand(Command command) {
  std::string name = command.name;
  return Registry().emplace(std::move(name), std::move(command)).second;
}

const std::map<std::string, Command>& Commands() { return Registry(); }

StatusOr<Flags> Flags::Parse(const std::vector<std::string>& args, std::set<std::string> value_flags,
                             std::set<std::string> switches) {
  Flags f;
  for (size_t i = 0; i < args.size(); ++i) {
    const std::string& a = args[i];
    if (a.size() < 3 || a.rfind("--", 0) != 0) {
      f.positionals_.push_back(a);
      continue;
    }
    std::string name = a.substr(2), value;
    bool has_value = false;
    if (size_t eq = name.find('='); eq != std::string::npos) {
      value = name.substr(eq + 1);
      name = name.substr(0, eq);
      has_value = true;
    }
    if (switches.count(name)) {
      if (has_value) return Status::InvalidArgument("--" + name + " takes no value");
      f.switches_.insert(name);
    } else if (value_flags.count(name)) {
      if (!has_value) {
        if (i + 1 >= args.size()) return Status::InvalidArgument("--" + name + " needs a value");
        value = args[++i];
      }
      f.values_.emplace(name, value);
    } else {
      return Status::InvalidArgument("unknown option --" + name);
    }
  }
  return f;
}

std::optional<std::string> Flags::Get(const std::string& name) const {
  auto range = values_.equal_range(name);
  if (range.first == range.second) return std::nullopt;
  return std::prev(range.second)->second;  // the last one wins
}

std::vector<std::string> Flags::GetAll(const std::string& name) const {
  std::vector<std::string> out;
  auto range = values_.equal_range(name);
  for (auto it = range.first; it != range.second; ++it) out.push_back(it->second);
  return out;
}

std::string Flags::GetOr(const std::string& name, const std::string& fallback) const {
  return Get(name).value_or(fallback);
}

StatusOr<int64_t> Flags::GetInt(const std::string& name, int64_t fallback) const {
  auto v = Get(name);
  if (!v) return fallback;
  auto n = ParseSize(*v);
  if (!n.ok()) return n.status().WithContext("--" + name);
  return n;
}

StatusOr<double> Flags::GetDouble(const std::string& name, double fallback) const {
  auto v = Get(name);
  if (!v) return fallback;
  char* end = nullptr;
  double d = std::strtod(v->c_str(), &end);
  if (v->empty() || end != v->c_str() + v->size() || !std::isfinite(d))
    return Status::InvalidArgument("--" + name + ": expected a number, got \"" + *v + "\"");
  return d;
}

StatusOr<DeviceOptions::Choice> ParseDeviceChoice(const std::string& s) {
  if (s == "auto") return DeviceOptions::Choice::kAuto;
  if (s == "cuda") return DeviceOptions::Choice::kCuda;
  if (s == "host") return DeviceOptions::Choice::kHost;
  return Status::InvalidArgument("--device must be auto, cuda or host, got '" + s + "'");
}

StatusOr<int64_t> ParseSize(const std::string& text) {
  if (text.empty()) return Status::InvalidArgument("expected a size, got an empty string");
  std::string num = text;
  double mult = 1;
  char last = static_cast<char>(std::toupper(static_cast<unsigned char>(text.back())));
  if (last == 'K' || last == 'M' || last == 'G' || last == 'T') {
    mult = last == 'K' ? 1024.0 : last == 'M' ? 1048576.0 : last == 'G' ? 1073741824.0 : 1099511627776.0;
    num.pop_back();
    if (!num.empty() && (num.back() == 'i' || num.back() == 'I')) num.pop_back();
  }
  char* end = nullptr;
  double d = std::strtod(num.c_str(), &end);
  if (num.empty() || end != num.c_str() + num.size() || !std::isfinite(d) || d < 0)
    return Status::InvalidArgument("expected a size like 4096, 1e9, 4K, 1M or 2G, got \"" + text + "\"");
  d *= mult;
  if (d != std::floor(d) || d > 9.2e18)
    return Status::InvalidArgument("expected a whole number of bytes or elements, got \"" + text + "\"");
  return static_cast<int64_t>(d);
}

int Fail(const std::string& command, const Status& status, int code) {
  std::fprintf(stderr, "zinf %s: %s\n", command.c_str(), status.ToString().c_str());
  return code;
}

}  // namespace zinf::cli
