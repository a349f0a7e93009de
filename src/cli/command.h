// The `zinf` command line: subcommands register themselves.
//
// Each subcommand lives in its own file (src/cli/cmd_*.cc, perf/*.cc) and
// registers with ZINF_COMMAND at static-initialisation time; main() picks the
// longest registered name that prefixes argv ("bench aio" before "bench").
// Commands print to stdout (results) and stderr (progress, errors) and return
// the process exit code: 0 ok, 1 failure, 2 usage error.
#pragma once

#include <functional>
#include <map>
#include <optional>
#include <set>
#include <string>
#include <vector>

#include "device/device.h"
#include "zinf/status.h"

namespace zinf::cli {

struct Command {
  std::string name;     // "bench aio"
  std::string summary;  // one line for `zinf help`
  std::string usage;    // full help text, shown by `zinf NAME --help`
  std::function<int(const std::vector<std::string>& args)> run;
};

bool RegisterCommand(Command command);
const std::map<std::string, Command>& Commands();

#define ZINF_CLI_CONCAT_INNER(a, b) a##b
#define ZINF_CLI_CONCAT(a, b) ZINF_CLI_CONCAT_INNER(a, b)
#define ZINF_COMMAND(...) \
  static const bool ZINF_CLI_CONCAT(zinf_command_registered_, __LINE__) = ::zinf::cli::RegisterCommand(__VA_ARGS__)

// Flags: `--name value`, `--name=value`, bare `--switch`, and positionals.
// Each command declares the flags it knows; anything else is a usage error.
class Flags {
 public:
  // `value_flags` take a value; `switches` do not.
  static StatusOr<Flags> Parse(const std::vector<std::string>& args, std::set<std::string> value_flags,
                               std::set<std::string> switches = {});

  bool Has(const std::string& name) const { return values_.count(name) > 0 || switches_.count(name) > 0; }
  std::optional<std::string> Get(const std::string& name) const;
  // All values of a flag given several times (--nvme a --nvme b).
  std::vector<std::string> GetAll(const std::string& name) const;
  std::string GetOr(const std::string& name, const std::string& fallback) const;
  // Integers accept 1e9 and binary suffixes: 4K, 1M, 2G (powers of 1024).
  StatusOr<int64_t> GetInt(const std::string& name, int64_t fallback) const;
  StatusOr<double> GetDouble(const std::string& name, double fallback) const;
  const std::vector<std::string>& positionals() const { return positionals_; }

 private:
  std::multimap<std::string, std::string> values_;
  std::set<std::string> switches_;
  std::vector<std::string> positionals_;
};

// Parses "4K", "1M", "2G", "1e9", "512" (suffixes are powers of 1024).
StatusOr<int64_t> ParseSize(const std::string& text);

// The value of --device: "auto", "cuda" or "host" (kInvalidArgument naming
// the flag otherwise).
StatusOr<DeviceOptions::Choice> ParseDeviceChoice(const std::string& s);

// Prints "zinf NAME: message" to stderr and returns `code`.
int Fail(const std::string& command, const Status& status, int code = 1);

}  // namespace zinf::cli
