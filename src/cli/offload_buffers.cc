// What the offload buffers of a config cost (offload_buffers.h): shared by
// `zinf config-check` and `zinf plan`.
#include "cli/offload_buffers.h"

#include <string>

#include "core/units.h"
#include "swap/optimizer_swapper.h"

namespace zinf::cli {

Status ExplainOffloadBuffers(const Config& c, std::optional<int64_t> params, int world, std::vector<std::string>& lines) {
  std::vector<std::string> errors;
  const ZeroConfig& z = c.zero;
  const OffloadParamConfig& p = z.offload_param;
  const OffloadOptimizerConfig& o = z.offload_optimizer;
  const std::optional<int64_t> shard =
      params ? std::optional<int64_t>((*params + world - 1) / world) : std::nullopt;

  if (o.device == OffloadDevice::kNvme) {
    swap::OptimizerSwapperOptions so = swap::OptimizerSwapperOptionsFromConfig(z, shard.value_or(z.sub_group_size));
    const int64_t need = swap::OptimizerSwapper::RequiredBuffers(so);
    const int64_t uses = swap::OptimizerSwapper::PoolBuffers(so);
    const int64_t bytes = swap::OptimizerSwapper::RequiredBufferBytes(so, 4096);
    const int in_flight = 1 + int{o.pipeline_read} + int{o.pipeline_write};
    const int64_t slots = uses / 3;
    const int64_t ahead = slots - 1 - int64_t{o.pipeline_write};
    lines.push_back("offload_optimizer (nvme): buffer_count " + std::to_string(o.buffer_count) +
                    "; the pipeline pins " + std::to_string(uses) + " buffers of " + FormatBytes(bytes) +
                    " (one fp32 sub-group of " + FormatCount(so.sub_group_elems) + " elements) = " +
                    FormatBytes(uses * bytes) + ": 3 arrays (master, m, v; the gradient is in RAM) x " +
                    std::to_string(slots) + " sub-group(s) in flight (" +
                    (in_flight == 1 ? "no pipelining" :
                     (o.pipeline_read ? "read " + std::to_string(ahead) + " ahead" : std::string()) +
                         (o.pipeline_read && o.pipeline_write ? ", " : "") + (o.pipeline_write ? "write behind" : "")) +
                    ")");
    if (o.buffer_count < need) {
      errors.push_back("zero_optimization.offload_optimizer.buffer_count: " + std::to_string(o.buffer_count) +
                       " is too few for the optimizer pipeline, which holds 3 fp32 arrays of " +
                       std::to_string(in_flight) + " sub-group(s) at once; set it to at least " +
                       std::to_string(need) + " (" + FormatBytes(need * bytes) +
                       " pinned), or lower sub_group_size, or turn off pipeline_read/pipeline_write");
    }
  } else if (o.device == OffloadDevice::kCpu) {
    lines.push_back("offload_optimizer (cpu): fp32 master, m and v resident in " +
                    std::string(o.pin_memory ? "pinned" : "pageable") +
                    " RAM, and the fp32 gradient accumulator in pinned RAM: 16 B per parameter of the shard" +
                    (shard ? " = " + FormatBytes(16 * *shard) + " per rank" : " (give --params for a total)"));
  }

  if (p.device == OffloadDevice::kNvme) {
    const int64_t buffers_bytes = p.buffer_count * p.buffer_size * 2;
    lines.push_back("offload_param (nvme): " + std::to_string(p.buffer_count) + " pinned buffers of buffer_size " +
                    FormatCount(p.buffer_size) + " 16-bit elements = " + FormatBytes(buffers_bytes) +
                    "; released shards cached up to max_in_cpu " + FormatCount(p.max_in_cpu) + " elements = " +
                    FormatBytes(p.max_in_cpu * 2) + "; a shard larger than buffer_size is refused at start");
    if (p.buffer_count * p.buffer_size < z.stage3_prefetch_bucket_size) {
      errors.push_back("zero_optimization.offload_param.buffer_count: " + std::to_string(p.buffer_count) +
                       " buffers of " + FormatCount(p.buffer_size) + " elements cannot hold the prefetch window (" +
                       "stage3_prefetch_bucket_size " + FormatCount(z.stage3_prefetch_bucket_size) +
                       " elements); raise buffer_count or buffer_size, or lower stage3_prefetch_bucket_size");
    }
  } else if (p.device == OffloadDevice::kCpu) {
    lines.push_back("offload_param (cpu): 16-bit parameters resident in " +
                    std::string(p.pin_memory ? "pinned" : "pageable") + " RAM: 2 B per parameter of the shard" +
                    (shard ? " = " + FormatBytes(2 * *shard) + " per rank" : ""));
  }
  if (errors.empty()) return Status::Ok();
  std::string msg = c.source + ": " + std::to_string(errors.size()) + " error(s) in the offload buffers";
  for (const std::string& e : errors) msg += "\n  " + e;
  return Status::InvalidArgument(std::move(msg));
}

}  // namespace zinf::cli
