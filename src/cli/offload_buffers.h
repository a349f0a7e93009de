// What the offload buffers of a config cost in pinned RAM, and whether the
// pools are large enough: shared by `zinf config-check` and `zinf plan`
// (which checks the configs it writes with it).
//
// Thread-safety: a plain function.
#pragma once

#include <cstdint>
#include <optional>
#include <string>
#include <vector>

#include "zinf/config.h"
#include "zinf/status.h"

namespace zinf::cli {

// Appends to `lines` what the offload buffers cost in pinned RAM and why,
// one line each; returns kInvalidArgument listing the errors of buffer
// pools too small for the optimizer pipeline or the prefetch window.
// `params` is the model's parameter count when known; each of `world`
// ranks holds 1/world of it.
Status ExplainOffloadBuffers(const Config& c, std::optional<int64_t> params, int world, std::vector<std::string>& lines);

}  // namespace zinf::cli
