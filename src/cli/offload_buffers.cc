// What the offload buffers of a config cost (offload_buffers.h): shared by
// `zinf config-check` and `zinf plan`.
#include "cli/offload_buffers.h"

#include <cstdio>
#include <string>

#include "core/units.h"
#include "model/hf_checkpoint.h"
#include "model/plan.h"
#include "swap/optimizer_swapper.h"

namespace zinf::cli {
namespace {

// The optimizer's tier: its pipeline (nvme) or resident state (cpu).
// `shard`: elements of a rank's shard, 0 when unknown.
void ExplainOptimizer(const Config& c, const zero3::BufferPlan* plan, int64_t shard, std::vector<std::string>& lines) {
  const ZeroConfig& z = c.zero;
  const OffloadOptimizerConfig& o = z.offload_optimizer;
  if (o.device == OffloadDevice::kNvme) {
    swap::OptimizerSwapperOptions so =
        plan ? plan->optimizer : swap::OptimizerSwapperOptionsFromConfig(z, shard > 0 ? shard : z.sub_group_size);
    so.gradients_in_store = true;  // as the engine does on NVMe (BufferPlan): 4 arrays per sub-group
    if (!plan) {
      // The plan fitted its pipeline already (BufferPlan::fitted); without it, fit here.
      const std::string fit = zero3::FitOptimizerPipeline(so);
      if (!fit.empty()) lines.push_back("fitted: " + fit);
    }
    const int64_t uses = plan ? plan->optimizer_pipeline.buffer_count : swap::OptimizerSwapper::PoolBuffers(so);
    const int64_t bytes =
        plan ? plan->optimizer_pipeline.buffer_bytes : swap::OptimizerSwapper::RequiredBufferBytes(so, 4096);
    const int in_flight = 1 + int{so.pipeline_read} + int{so.pipeline_write};
    const int64_t slots = uses / 4;
    const int64_t ahead = slots - 1 - int64_t{so.pipeline_write};
    lines.push_back("offload_optimizer (nvme): buffer_count " + std::to_string(o.buffer_count) +
                    "; the pipeline pins " + std::to_string(uses) + " buffers of " + FormatBytes(bytes) +
                    " (one fp32 sub-group of " + FormatCount(so.sub_group_elems) +
                    " elements) = " + FormatBytes(uses * bytes) + ": 4 arrays (master, m, v, gradient) x " +
                    std::to_string(slots) + " sub-group(s) in flight (" +
                    (in_flight == 1 ? "no pipelining"
                                    : (so.pipeline_read ? "read " + std::to_string(ahead) + " ahead" : std::string()) +
                                          (so.pipeline_read && so.pipeline_write ? ", " : "") +
                                          (so.pipeline_write ? "write behind" : "")) +
                    ")");
  } else if (o.device == OffloadDevice::kCpu) {
    const std::string total = plan ? " = " +
                                         FormatBytes(aio::PinnedPool::MappedBytes(plan->optimizer_resident) +
                                                     aio::PinnedPool::MappedBytes(plan->grad_accumulator)) +
                                         " per rank"
                              : shard > 0 ? " = " + FormatBytes(16 * shard) + " per rank"
                                          : std::string(" (give --params or --model for a total)");
    lines.push_back("offload_optimizer (cpu): fp32 master, m and v resident in " +
                    std::string(o.pin_memory ? "pinned" : "pageable") +
                    " RAM, and the fp32 gradient accumulator in pinned RAM: 16 B per parameter of the shard" + total);
  }
}

// The parameters' tier: the swapper's buffers (nvme) or the resident shard (cpu).
void ExplainParams(const Config& c, const zero3::BufferPlan* plan, int64_t shard, std::vector<std::string>& lines) {
  const ZeroConfig& z = c.zero;
  const OffloadParamConfig& p = z.offload_param;
  if (p.device == OffloadDevice::kNvme) {
    if (plan) {
      const aio::PinnedPoolOptions& b = plan->param_swap_buffers;
      lines.push_back("offload_param (nvme): " + std::to_string(b.buffer_count) + " pinned buffers of " +
                      FormatCount(plan->param_swapper.buffer_elems) + " " + std::to_string(8 * plan->param_elem_bytes) +
                      "-bit elements (buffer_size " + FormatCount(p.buffer_size) + ", at most the largest shard) = " +
                      FormatBytes(aio::PinnedPool::MappedBytes(b)) + "; released shards stay in them, up to " +
                      "max_in_cpu " + FormatCount(p.max_in_cpu) + " elements");
    } else {
      const int64_t buffers_bytes = p.buffer_count * p.buffer_size * 2;
      lines.push_back("offload_param (nvme): " + std::to_string(p.buffer_count) + " pinned buffers of buffer_size " +
                      FormatCount(p.buffer_size) + " 16-bit elements = " + FormatBytes(buffers_bytes) +
                      "; released shards cached up to max_in_cpu " + FormatCount(p.max_in_cpu) +
                      " elements = " + FormatBytes(p.max_in_cpu * 2) +
                      "; with a shard larger than buffer_size the buffers are re-cut to hold a shard each");
    }
    if (p.buffer_count * p.buffer_size < z.stage3_prefetch_bucket_size) {
      // Not an error: a prefetch that finds every buffer busy stops, and the
      // next Acquire reads the shard (GatherCache::Prefetch).
      lines.push_back("offload_param: buffer_count " + std::to_string(p.buffer_count) + " x buffer_size " +
                      FormatCount(p.buffer_size) + " elements hold less than the prefetch window " +
                      "(stage3_prefetch_bucket_size " + FormatCount(z.stage3_prefetch_bucket_size) +
                      " elements): prefetching stops at what the buffers hold; raise buffer_count or buffer_size " +
                      "to prefetch the whole window");
    }
  } else if (p.device == OffloadDevice::kCpu) {
    const std::string total =
        plan        ? " = " + FormatBytes(aio::PinnedPool::MappedBytes(plan->param_home_host)) + " per rank"
        : shard > 0 ? " = " + FormatBytes(2 * shard) + " per rank"
                    : std::string();
    lines.push_back("offload_param (cpu): 16-bit parameters resident in " +
                    std::string(p.pin_memory ? "pinned" : "pageable") + " RAM: 2 B per parameter of the shard" + total);
  }
}

}  // namespace

void ExplainOffloadBuffers(const Config& c, const zero3::BufferPlan* plan, std::optional<int64_t> params, int world,
                           std::vector<std::string>& lines) {
  const int64_t shard = params ? (*params + world - 1) / world : 0;
  ExplainOptimizer(c, plan, shard, lines);
  ExplainParams(c, plan, shard, lines);
  if (plan) {
    for (const std::string& f : plan->fitted) lines.push_back("fitted: " + f);
  }
}

void AppendBufferItems(const std::string& title, const std::vector<zero3::BufferItem>& items,
                       std::vector<std::string>& lines) {
  std::string totals;
  for (zero3::BufferTier t : {zero3::BufferTier::kDevice, zero3::BufferTier::kPinned, zero3::BufferTier::kPageable,
                              zero3::BufferTier::kNvme}) {
    int64_t sum = 0;
    for (const zero3::BufferItem& it : items) sum += it.tier == t ? it.bytes : 0;
    totals += (totals.empty() ? "" : ", ") + std::string(zero3::BufferTierName(t)) + " " + FormatBytes(sum);
  }
  lines.push_back(title + ": " + totals);
  for (const zero3::BufferItem& it : items) {
    char head[64];
    std::snprintf(head, sizeof(head), "  %-8s %10s  ", std::string(zero3::BufferTierName(it.tier)).c_str(),
                  FormatBytes(it.bytes).c_str());
    lines.push_back(head + it.what + (it.transient ? " [start-up]" : ""));
  }
}

StatusOr<ModelChoice> ModelFromFlag(const std::string& flag, const std::string& value, int seq_len, int vocab) {
  ModelChoice c;
  if (model::IsHfModelDir(value)) {
    // The shapes are what matter here: a folder with a config.json and no
    // weights (one to train --from-config) plans as well.
    ZINF_ASSIGN_OR_RETURN(model::ModelSource source,
                          model::ResolveModel(value, seq_len, /*from_config=*/!model::HasHfWeights(value)));
    c.model = source.model;
    c.description = source.description;
    return c;
  }
  auto builtin = model::LoadGptConfig(value);
  if (builtin.ok()) {
    c.model = *builtin;
    if (seq_len > 0) c.model.seq_len = seq_len;
    c.description = value;
    return c;
  }
  if (builtin.status().code() != StatusCode::kNotFound) return builtin.status().WithContext(flag);
  ZINF_ASSIGN_OR_RETURN(int64_t count, model::ParseParameterCount(value));
  ZINF_ASSIGN_OR_RETURN(c.model, model::GptConfigForParameterCount(count, seq_len > 0 ? seq_len : 2048, vocab));
  c.description = value + " (derived shape: C = cbrt(128 P / 12) rounded to 128, head size 128)";
  return c;
}

}  // namespace zinf::cli
