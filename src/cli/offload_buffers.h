// What the offload buffers of a config cost, and whether the pools are large
// enough: shared by `zinf config-check` and `zinf plan` (which checks the
// configs it writes with it). The figures are zero3::BufferPlan's when the
// model is known, and the swappers' own formulas per sub-group or buffer
// when it is not.
//
// Thread-safety: plain functions.
#pragma once

#include <cstdint>
#include <optional>
#include <string>
#include <vector>

#include "model/gpt.h"
#include "zero3/buffer_plan.h"
#include "zinf/config.h"
#include "zinf/status.h"

namespace zinf::cli {

// Appends to `lines` what the offload buffers cost in pinned RAM and why,
// one line each, and what was fitted to the buffers the config gives
// ("fitted: ...", zero3::FitOptimizerPipeline / FitParamBuffers). Nothing
// here is an error: buffers the engine cannot run with are MakeBufferPlan's
// errors, and parameter buffers smaller than the prefetch window only limit
// prefetching (a line says so). `plan`: the model's buffer plan when known
// (its windows are printed), else null. `params` is the model's parameter
// count when known; each of `world` ranks holds 1/world of it.
void ExplainOffloadBuffers(const Config& c, const zero3::BufferPlan* plan, std::optional<int64_t> params, int world,
                           std::vector<std::string>& lines);

// Appends `title` with the totals per tier, then one line per item
// ("  pinned    384.20 MiB  what"; transient items marked [start-up]).
void AppendBufferItems(const std::string& title, const std::vector<zero3::BufferItem>& items,
                       std::vector<std::string>& lines);

// The model of a --model flag: a built-in name or a model JSON file, else a
// parameter count ("7B", "1.3e9") turned into a GPT shape
// (model::GptConfigForParameterCount with `seq_len` and `vocab`).
// `description` says which. kInvalidArgument names the flag.
struct ModelChoice {
  model::GptConfig model;
  std::string description;
};
StatusOr<ModelChoice> ModelFromFlag(const std::string& flag, const std::string& value, int seq_len, int vocab);

}  // namespace zinf::cli
