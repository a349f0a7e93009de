// zinf: the command line. Subcommands register themselves (see command.h).
#include <cstdio>
#include <string>
#include <vector>

#include "cli/command.h"

namespace {

int PrintHelp(FILE* out) {
  std::fprintf(out,
               "zinf: ZeRO-3 offload engine (parameters and optimizer state on GPU, CPU RAM and NVMe)\n\n"
               "usage: zinf COMMAND [options]    (zinf COMMAND --help for a command's options)\n\n"
               "commands:\n");
  for (const auto& [name, cmd] : zinf::cli::Commands()) {
    std::fprintf(out, "  %-16s %s\n", name.c_str(), cmd.summary.c_str());
  }
  return out == stdout ? 0 : 2;
}

// "zinf data --help" (or "zinf data", "zinf data frob"): args[0] names a group
// of commands ("data encode", "data info", ...) but no command of its own.
// Lists the group's commands: exit 0 when help was asked for, 2 otherwise.
// Returns -1 when no registered command starts with the word args[0].
int PrintGroupHelp(const std::vector<std::string>& args) {
  const std::string prefix = args[0] + " ";
  std::vector<const zinf::cli::Command*> group;
  for (const auto& [name, cmd] : zinf::cli::Commands()) {
    if (name.rfind(prefix, 0) == 0) group.push_back(&cmd);
  }
  if (group.empty()) return -1;
  bool help = false;
  for (size_t i = 1; i < args.size(); ++i) help |= args[i] == "--help" || args[i] == "-h";
  FILE* out = help ? stdout : stderr;
  if (!help && args.size() > 1) {
    std::fprintf(out, "zinf: unknown command \"%s %s\"\n\n", args[0].c_str(), args[1].c_str());
  }
  std::fprintf(out, "usage: zinf %s SUBCOMMAND [options]    (zinf %s SUBCOMMAND --help for its options)\n\n",
               args[0].c_str(), args[0].c_str());
  std::fprintf(out, "%s commands:\n", args[0].c_str());
  for (const zinf::cli::Command* cmd : group)
    std::fprintf(out, "  %-16s %s\n", cmd->name.c_str(), cmd->summary.c_str());
  return help ? 0 : 2;
}

}  // namespace

int main(int argc, char** argv) {
  // Line-buffered stdout, so results and stderr progress interleave in order.
  std::setvbuf(stdout, nullptr, _IOLBF, 0);
  std::vector<std::string> args(argv + 1, argv + argc);
  if (args.empty()) return PrintHelp(stderr);
  if (args[0] == "help" || args[0] == "--help" || args[0] == "-h") return PrintHelp(stdout);

  // Longest registered name that prefixes the arguments.
  const zinf::cli::Command* best = nullptr;
  size_t best_words = 0;
  for (const auto& [name, cmd] : zinf::cli::Commands()) {
    std::vector<std::string> words;
    size_t start = 0, space;
    while ((space = name.find(' ', start)) != std::string::npos) {
      words.push_back(name.substr(start, space - start));
      start = space + 1;
    }
    words.push_back(name.substr(start));
    if (words.size() > args.size() || words.size() <= best_words) continue;
    bool match = true;
    for (size_t i = 0; i < words.size(); ++i) match &= words[i] == args[i];
    if (match) {
      best = &cmd;
      best_words = words.size();
    }
  }
  if (best == nullptr) {
    if (int code = PrintGroupHelp(args); code >= 0) return code;
    std::fprintf(stderr, "zinf: unknown command \"%s\"\n\n", args[0].c_str());
    return PrintHelp(stderr);
  }
  std::vector<std::string> rest(args.begin() + static_cast<long>(best_words), args.end());
  for (const std::string& a : rest) {
    if (a == "--help" || a == "-h") {
      std::printf("usage: zinf %s\n", best->usage.c_str());
      return 0;
    }
  }
  return best->run(rest);
}
