// zinf config-check FILE: the resolved config, or every error in it.
#include <cstdio>

#include <algorithm>
#include <optional>
#include <string>
#include <vector>

#include "cli/command.h"
#include "cli/offload_buffers.h"
#include "zinf/config.h"

namespace zinf::cli {
namespace {

int Run(const std::vector<std::string>& args) {
  auto flags = Flags::Parse(args, {"world-size", "hidden-size", "steps", "params"});
  if (!flags.ok()) return Fail("config-check", flags.status(), 2);
  if (flags->positionals().size() != 1) {
    return Fail("config-check", Status::InvalidArgument("expected one config file"), 2);
  }
  const std::string& path = flags->positionals()[0];
  auto config = LoadConfigFile(path);
  if (!config.ok()) {
    std::fprintf(stderr, "%s\n", config.status().message().c_str());
    return 1;
  }
  for (const std::string& key : config->ignored_keys) {
    std::fprintf(stderr, "note: %s is a DeepSpeed key that zinf does not act on; ignored\n", key.c_str());
  }
  AutoContext ctx;
  auto world = flags->GetInt("world-size", 1);
  auto hidden = flags->GetInt("hidden-size", 0);
  auto steps = flags->GetInt("steps", 0);
  auto params = flags->GetInt("params", 0);
  for (const auto* s : {&world, &hidden, &steps, &params}) {
    if (!s->ok()) return Fail("config-check", s->status(), 2);
  }
  if (*world < 1 || *world > (1 << 20)) {
    return Fail("config-check",
                Status::InvalidArgument("--world-size: expected 1..1048576 ranks, got " + std::to_string(*world)), 2);
  }
  ctx.world_size = static_cast<int>(*world);
  if (*hidden > 0) ctx.hidden_size = *hidden;
  if (*steps > 0) ctx.total_steps = *steps;
  Config resolved = *config;
  Status st = ResolveAuto(resolved, ctx);
  if (!st.ok()) {
    std::fprintf(stderr, "%s\n", st.message().c_str());
    return 1;
  }
  std::vector<std::string> lines;
  st = ExplainOffloadBuffers(resolved, *params > 0 ? std::optional<int64_t>(*params) : std::nullopt, ctx.world_size, lines);
  for (const std::string& line : lines) std::fprintf(stderr, "note: %s\n", line.c_str());
  if (!st.ok()) {
    std::fprintf(stderr, "%s\n", st.message().c_str());
    return 1;
  }
  std::printf("%s\n", ConfigToJson(resolved).c_str());
  std::fprintf(stderr, "%s: OK\n", path.c_str());
  return 0;
}

ZINF_COMMAND({"config-check", "parse a DeepSpeed-style config; print it resolved or list its errors",
              "config-check FILE [--world-size N] [--hidden-size H] [--steps N] [--params N]\n"
              "  Prints the config with every default filled in, or every error (exit 1), and explains\n"
              "  what the offload buffers cost in pinned RAM; a buffer pool too small for the optimizer\n"
              "  pipeline or the prefetch window is an error.\n"
              "  --world-size, --hidden-size and --steps resolve batch keys and \"auto\" values;\n"
              "  --params (the model's parameter count) turns per-parameter costs into totals.",
              Run});

}  // namespace
}  // namespace zinf::cli
