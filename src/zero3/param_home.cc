// The three homes of the working parameters (param_home.h).
#include "zero3/param_home.h"

#include <chrono>
#include <cstring>

#include "aio/io_engine.h"
#include "core/units.h"
#include "device/device.h"
#include "swap/param_swapper.h"
#include "zero3/buffer_plan.h"
#include "zero3/host_window.h"
#include "zero3/partitioner.h"

namespace zinf::zero3 {
namespace {

using Clock = std::chrono::steady_clock;

// What every home needs: where a block's shard sits, and the engine's stream.
class HomeBase : public ParamHome {
 protected:
  explicit HomeBase(const ParamHomeOptions& o)
      : part_(*o.partitioner), es_(o.plan->param_elem_bytes), stream_(*o.stream), counters_(*o.counters) {}

  int64_t Offset(BlockId b) const { return part_.layout(b).rank_offset * es_; }
  size_t ShardBytes(BlockId b) const { return static_cast<size_t>(part_.layout(b).shard_numel * es_); }
  size_t TotalBytes() const { return static_cast<size_t>(part_.total_shard_numel() * es_); }

  const Partitioner& part_;
  const int64_t es_;
  Stream& stream_;
  EngineCounters& counters_;
};

// offload_param none: the rank shard in device memory.
class DeviceParamHome final : public HomeBase {
 public:
  DeviceParamHome(const ParamHomeOptions& o, void* home) : HomeBase(o), device_(*o.device), home_(home) {}
  ~DeviceParamHome() override { device_.Free(home_); }

  Status WriteAll(const char* params) override {
    ZINF_RETURN_IF_ERROR(stream_.CopyAsync(home_, params, TotalBytes(), CopyDirection::kHostToDevice));
    counters_.h2d_bytes += static_cast<int64_t>(TotalBytes());
    return stream_.Synchronize();
  }
  Status WriteBlock(BlockId b, const char* src) override {
    // Stream order puts the copy before any fetch from the home.
    ZINF_RETURN_IF_ERROR(stream_.CopyAsync(home() + Offset(b), src, ShardBytes(b), CopyDirection::kHostToDevice));
    counters_.h2d_bytes += static_cast<int64_t>(ShardBytes(b));
    return Status::Ok();
  }
  Status CopyToDevice(BlockId b, char* dst) override {
    return stream_.CopyAsync(dst, home() + Offset(b), ShardBytes(b), CopyDirection::kDeviceToDevice);
  }
  bool writes_on_stream() const override { return true; }

 private:
  char* home() const { return static_cast<char*>(home_); }
  Device& device_;
  void* home_;
};

// offload_param cpu: the rank shard in host RAM.
class PinnedParamHome final : public HomeBase {
 public:
  PinnedParamHome(const ParamHomeOptions& o, HostWindow home) : HomeBase(o), home_(std::move(home)) {}

  Status WriteAll(const char* params) override {
    std::memcpy(home_.data(), params, TotalBytes());
    return Status::Ok();
  }
  Status WriteBlock(BlockId b, const char* src) override {
    std::memcpy(home_.data() + Offset(b), src, ShardBytes(b));
    return Status::Ok();
  }
  char* resident() override { return home_.data(); }
  Status CopyToDevice(BlockId b, char* dst) override {
    ZINF_RETURN_IF_ERROR(stream_.CopyAsync(dst, home_.data() + Offset(b), ShardBytes(b), CopyDirection::kHostToDevice));
    counters_.h2d_bytes += static_cast<int64_t>(ShardBytes(b));
    return Status::Ok();
  }

 private:
  HostWindow home_;
};

// offload_param nvme: one ParamSwapper shard per block (shard id = block id).
class NvmeParamHome final : public HomeBase {
 public:
  NvmeParamHome(const ParamHomeOptions& o, std::unique_ptr<swap::ParamSwapper> swapper)
      : HomeBase(o), swapper_(std::move(swapper)) {}

  Status WriteAll(const char* params) override {
    for (BlockId b = 0; b < part_.num_blocks(); ++b) ZINF_RETURN_IF_ERROR(swapper_->Store(b, params + Offset(b)));
    return swapper_->Flush();
  }
  Status WriteBlock(BlockId b, const char* src) override { return swapper_->Store(b, src); }
  Status Flush() override { return swapper_->Flush(); }
  Status CopyToDevice(BlockId b, char* dst) override {
    const auto t0 = Clock::now();
    ZINF_ASSIGN_OR_RETURN(char* src, swapper_->Acquire(b));
    counters_.nvme_wait_ns += NanosSince(t0);
    Status s = stream_.CopyAsync(dst, src, ShardBytes(b), CopyDirection::kHostToDevice);
    if (s.ok()) s = stream_.Synchronize();  // the swapper's buffer is reused after Release
    Status r = swapper_->Release(b, /*dirty=*/false);
    ZINF_RETURN_IF_ERROR(s);
    ZINF_RETURN_IF_ERROR(r);
    counters_.h2d_bytes += static_cast<int64_t>(ShardBytes(b));
    return Status::Ok();
  }
  Status Prefetch(BlockId b) override { return swapper_->Prefetch(b); }
  bool reads_ahead() const override { return true; }
  int64_t nvme_read_bytes() const override { return swapper_->stats().read_bytes; }
  int64_t nvme_write_bytes() const override { return swapper_->stats().write_bytes; }

 private:
  std::unique_ptr<swap::ParamSwapper> swapper_;
};

StatusOr<std::unique_ptr<ParamHome>> CreateNvmeHome(const ParamHomeOptions& o) {
  const Partitioner& part = *o.partitioner;
  swap::ParamSwapperOptions so = o.plan->param_swapper;
  so.store.file_prefix += "-r" + std::to_string(part.rank());
  so.store.run_id = o.run_id;
  std::vector<swap::ParamShardSpec> shards;
  for (BlockId b = 0; b < part.num_blocks(); ++b) {
    shards.push_back({(*o.specs)[static_cast<size_t>(b)].name, part.layout(b).shard_numel});
  }
  auto swapper = swap::ParamSwapper::Create(so, o.io, shards);
  if (!swapper.ok()) return swapper.status().WithContext(swap::NvmePathContext("offload_param", so.store.paths));
  return std::unique_ptr<ParamHome>(new NvmeParamHome(o, std::move(swapper).value()));
}

}  // namespace

StatusOr<std::unique_ptr<ParamHome>> CreateParamHome(const ParamHomeOptions& o) {
  const BufferPlan& plan = *o.plan;
  switch (plan.param_home) {
    case OffloadDevice::kNvme: return CreateNvmeHome(o);
    case OffloadDevice::kCpu: {
      ZINF_ASSIGN_OR_RETURN(HostWindow home, HostWindow::Create(plan.param_home_host));
      return std::unique_ptr<ParamHome>(new PinnedParamHome(o, std::move(home)));
    }
    case OffloadDevice::kNone: {
      ZINF_ASSIGN_OR_RETURN(void* home, o.device->Allocate(static_cast<size_t>(plan.param_home_device_bytes)));
      return std::unique_ptr<ParamHome>(new DeviceParamHome(o, home));
    }
  }
  return Status::InvalidArgument("zero_optimization.offload_param.device: unknown value");
}

}  // namespace zinf::zero3
