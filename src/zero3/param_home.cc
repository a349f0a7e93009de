// The three homes of the working parameters (param_home.h).
#include "zero3/param_home.h"

#include <chrono>
#include <cstring>
#include <vector>

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
// A block's copy to the device reads the swapper's pinned buffer on the
// stream, so the buffer stays acquired until an event recorded after the
// copy has passed (copying_): the driving thread never waits for the copy
// itself, only, when every buffer is held that way, for the oldest one.
class NvmeParamHome final : public HomeBase {
 public:
  NvmeParamHome(const ParamHomeOptions& o, std::unique_ptr<swap::ParamSwapper> swapper)
      : HomeBase(o), swapper_(std::move(swapper)) {}
  ~NvmeParamHome() override {
    for (Copying& c : copying_) c.done->Synchronize().IgnoreError();
  }

  Status WriteAll(const char* params) override {
    ZINF_RETURN_IF_ERROR(ReleaseCopied(/*wait=*/true));
    for (BlockId b = 0; b < part_.num_blocks(); ++b) ZINF_RETURN_IF_ERROR(swapper_->Store(b, params + Offset(b)));
    return swapper_->Flush();
  }
  Status WriteBlock(BlockId b, const char* src) override {
    ZINF_RETURN_IF_ERROR(ReleaseCopied(/*wait=*/false, b));  // a shard is stored only when not acquired
    return WithBuffer([&] { return swapper_->Store(b, src); });
  }
  Status Flush() override {
    Status copies = ReleaseCopied(/*wait=*/true);
    Status writes = swapper_->Flush();
    return copies.ok() ? writes : copies;
  }
  Status CopyToDevice(BlockId b, char* dst) override {
    ZINF_RETURN_IF_ERROR(ReleaseCopied(/*wait=*/false));
    char* src = nullptr;
    ZINF_RETURN_IF_ERROR(WithBuffer([&]() -> Status {
      const auto t0 = Clock::now();
      StatusOr<char*> acquired = swapper_->Acquire(b);
      counters_.nvme_wait_ns += NanosSince(t0);
      if (acquired.ok()) src = *acquired;
      return acquired.status();
    }));
    Status s = stream_.CopyAsync(dst, src, ShardBytes(b), CopyDirection::kHostToDevice);
    StatusOr<std::unique_ptr<Event>> done = s.ok() ? stream_.Record() : StatusOr<std::unique_ptr<Event>>(s);
    if (!done.ok()) {  // the copy may be queued: the buffer is free once the stream has run
      Status sync = stream_.Synchronize();
      Status r = swapper_->Release(b, /*dirty=*/false);
      ZINF_RETURN_IF_ERROR(done.status());
      ZINF_RETURN_IF_ERROR(sync);
      return r;
    }
    copying_.push_back({b, std::move(*done)});
    counters_.h2d_bytes += static_cast<int64_t>(ShardBytes(b));
    return Status::Ok();
  }
  Status Prefetch(BlockId b) override {
    ZINF_RETURN_IF_ERROR(ReleaseCopied(/*wait=*/false));
    return swapper_->Prefetch(b);
  }
  bool reads_ahead() const override { return true; }
  int64_t nvme_read_bytes() const override { return swapper_->stats().read_bytes; }
  int64_t nvme_write_bytes() const override { return swapper_->stats().write_bytes; }

 private:
  struct Copying {
    BlockId block;
    std::unique_ptr<Event> done;  // recorded after the copy
  };

  // fn, a swapper call that takes a buffer, again after each wait for the
  // oldest queued copy while every buffer is held by one (a failed call
  // changes nothing).
  template <typename F>
  Status WithBuffer(F&& fn) {
    Status s = fn();
    while (s.code() == StatusCode::kResourceExhausted && !copying_.empty()) {
      Copying oldest = std::move(copying_.front());
      copying_.erase(copying_.begin());
      const auto t0 = Clock::now();
      ZINF_RETURN_IF_ERROR(Retire(oldest));
      counters_.fetch_wait_ns += NanosSince(t0);
      s = fn();
    }
    return s;
  }
  // Releases the shards whose copies have run; with `wait`, every one, and
  // with `block` >= 0, block's (waiting for them). The first error.
  Status ReleaseCopied(bool wait, BlockId block = -1) {
    Status first;
    for (auto it = copying_.begin(); it != copying_.end();) {
      if (!wait && it->block != block && !it->done->Finished()) {
        ++it;
        continue;
      }
      Status s = Retire(*it);
      if (first.ok()) first = s;
      it = copying_.erase(it);
    }
    return first;
  }
  // Waits for c's copy and releases its shard.
  Status Retire(Copying& c) {
    Status s = c.done->Synchronize();
    Status r = swapper_->Release(c.block, /*dirty=*/false);
    return s.ok() ? r : s;
  }

  std::unique_ptr<swap::ParamSwapper> swapper_;
  std::vector<Copying> copying_;  // in stream order
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
