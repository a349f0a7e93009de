#include "swap/optimizer_swapper.h"

#include <algorithm>
#include <cstring>

#include "core/check.h"
#include "core/units.h"

namespace zinf::swap {
namespace {

constexpr const char* kArrayNames[] = {"master", "exp_avg", "exp_avg_sq", "grad"};

}  // namespace

OptimizerSwapperOptions OptimizerSwapperOptionsFromConfig(const ZeroConfig& zero, int64_t total_elems) {
  OptimizerSwapperOptions o;
  o.total_elems = total_elems;
  o.sub_group_elems = zero.sub_group_size;
  o.device = zero.offload_optimizer.device;
  o.pipeline_read = zero.offload_optimizer.pipeline_read;
  o.pipeline_write = zero.offload_optimizer.pipeline_write;
  o.store.paths = zero.offload_optimizer.nvme_paths;
  o.store.file_prefix = "zinf-optim";
  o.pin_memory = zero.offload_optimizer.pin_memory;
  o.gradients_in_store = false;
  o.buffer_count = zero.offload_optimizer.buffer_count;
  return o;
}

int64_t OptimizerSwapper::RequiredBuffers(const OptimizerSwapperOptions& options) {
  if (options.device != OffloadDevice::kNvme) return 0;
  return ArraysOf(options) * (1 + int64_t{options.pipeline_read} + int64_t{options.pipeline_write});
}

int64_t OptimizerSwapper::PoolBuffers(const OptimizerSwapperOptions& options) {
  const int64_t need = RequiredBuffers(options);
  if (!options.pipeline_read) return need;
  const int64_t arrays = ArraysOf(options);
  return std::max(need, options.buffer_count / arrays * arrays);
}

int64_t OptimizerSwapper::RequiredBufferBytes(const OptimizerSwapperOptions& options, int64_t alignment_bytes) {
  const int64_t elems = std::min(options.sub_group_elems, options.total_elems);
  return AlignUp(elems * int64_t{sizeof(float)}, alignment_bytes);
}

int64_t OptimizerSwapper::NumSubGroups(const OptimizerSwapperOptions& options) {
  return (options.total_elems + options.sub_group_elems - 1) / options.sub_group_elems;
}

aio::PinnedPoolOptions OptimizerSwapper::ResidentPoolOptions(const OptimizerSwapperOptions& options) {
  aio::PinnedPoolOptions po;
  po.buffer_count = options.device == OffloadDevice::kCpu ? ArraysOf(options) * NumSubGroups(options) : 0;
  po.buffer_bytes = RequiredBufferBytes(options, 4096);
  po.alignment_bytes = 4096;
  po.pin = options.pin_memory;
  po.name = "optimizer state (cpu)";
  return po;
}

int64_t OptimizerSwapper::sub_group_elems(int64_t k) const {
  return std::min(options_.sub_group_elems, options_.total_elems - sub_group_begin(k));
}

StatusOr<std::unique_ptr<OptimizerSwapper>> OptimizerSwapper::Create(const OptimizerSwapperOptions& options,
                                                                     aio::IoEngine* engine, aio::PinnedPool* pool) {
  if (options.total_elems <= 0) {
    return Status::InvalidArgument("optimizer swapper: total_elems must be > 0, got " +
                                   std::to_string(options.total_elems));
  }
  if (options.sub_group_elems <= 0) {
    return Status::InvalidArgument("zero_optimization.sub_group_size: expected > 0, got " +
                                   std::to_string(options.sub_group_elems));
  }
  if (options.device != OffloadDevice::kCpu && options.device != OffloadDevice::kNvme) {
    return Status::InvalidArgument("offload_optimizer.device: the optimizer swapper needs cpu or nvme, got " +
                                   std::string(OffloadDeviceName(options.device)));
  }
  if (options.step_slice_elems <= 0 || options.step_slice_elems % optim::kChunkElems != 0) {
    return Status::InvalidArgument("optimizer swapper: step_slice_elems must be a positive multiple of " +
                                   std::to_string(optim::kChunkElems) + ", got " +
                                   std::to_string(options.step_slice_elems));
  }
  std::unique_ptr<OptimizerSwapper> s(new OptimizerSwapper(options));
  s->num_sub_groups_ = NumSubGroups(options);
  const int64_t groups = s->num_sub_groups_;

  if (options.device == OffloadDevice::kCpu) {
    const aio::PinnedPoolOptions po = ResidentPoolOptions(options);
    ZINF_ASSIGN_OR_RETURN(s->resident_pool_, aio::PinnedPool::Create(po));
    s->resident_.reserve(static_cast<size_t>(po.buffer_count));
    for (int64_t i = 0; i < po.buffer_count; ++i) {
      ZINF_ASSIGN_OR_RETURN(aio::PinnedBuffer b, s->resident_pool_->TryAcquire());
      s->resident_.push_back(std::move(b));
    }
    return s;
  }

  if (engine == nullptr || pool == nullptr) {
    return Status::InvalidArgument("optimizer swapper: offload_optimizer.device nvme needs an I/O engine and a pool");
  }
  const int64_t need_count = RequiredBuffers(options);
  const int64_t need_bytes = RequiredBufferBytes(options, options.store.alignment_bytes);
  std::string pipeline = options.pipeline_read && options.pipeline_write ? "pipeline_read and pipeline_write"
                         : options.pipeline_read                         ? "pipeline_read"
                         : options.pipeline_write                        ? "pipeline_write"
                                                                         : "no pipelining";
  if (pool->buffer_count() < need_count) {
    return Status::InvalidArgument(
        "offload_optimizer.buffer_count: the pinned pool has " + std::to_string(pool->buffer_count()) +
        " buffers, but the optimizer step with " + pipeline + " keeps " + std::to_string(need_count / s->arrays()) +
        " sub-group(s) in flight and needs " + std::to_string(need_count) + " buffers of " + FormatBytes(need_bytes) +
        (options.gradients_in_store ? " (master, m, v and gradient per sub-group)"
                                    : " (master, m and v per sub-group)"));
  }
  if (pool->buffer_bytes() < need_bytes) {
    return Status::InvalidArgument("zero_optimization.sub_group_size: a sub-group of " +
                                   std::to_string(std::min(options.sub_group_elems, options.total_elems)) +
                                   " fp32 elements needs pinned buffers of " + FormatBytes(need_bytes) +
                                   "; the pool's hold " + FormatBytes(pool->buffer_bytes()));
  }
  if (pool->alignment_bytes() % options.store.alignment_bytes != 0) {
    return Status::InvalidArgument("optimizer swapper: pinned pool alignment " +
                                   std::to_string(pool->alignment_bytes()) + " is below the swap alignment " +
                                   std::to_string(options.store.alignment_bytes));
  }

  std::vector<TensorSpec> tensors;
  tensors.reserve(static_cast<size_t>(groups * s->arrays()));
  for (int64_t k = 0; k < groups; ++k) {
    for (int a = 0; a < s->arrays(); ++a) {
      tensors.push_back({options.prefix + "." + kArrayNames[a] + "." + std::to_string(k),
                         s->sub_group_elems(k) * int64_t{sizeof(float)}, 4});
    }
  }
  ZINF_ASSIGN_OR_RETURN(s->store_, SwapStore::Create(engine, std::move(tensors), options.store));
  // Whole sub-groups of what the pool holds, up to PoolBuffers.
  const int64_t lease_count = std::min(pool->buffer_count(), PoolBuffers(options)) / s->arrays() * s->arrays();
  s->slots_.resize(static_cast<size_t>(lease_count / s->arrays()));
  for (Slot& slot : s->slots_) {
    for (int a = 0; a < s->arrays(); ++a) {
      aio::PinnedBuffer& b = slot.buffers[static_cast<size_t>(a)];
      auto lease = pool->TryAcquire(need_bytes);
      if (!lease.ok()) {
        return lease.status().WithContext("leasing the optimizer pipeline's " + std::to_string(lease_count) +
                                          " buffers");
      }
      b = std::move(lease).value();
    }
  }
  return s;
}

OptimizerSwapper::~OptimizerSwapper() { Drain(Status::Ok()).IgnoreError(); }

StatusOr<std::vector<BlobRef>> OptimizerSwapper::CheckpointBlobs(BlobUse use) {
  DropPrefetch();  // reads of the state a load replaces, or slot 0's buffers WriteZeros uses
  if (use == BlobUse::kSave) ZINF_RETURN_IF_ERROR(WriteZeros());
  std::vector<BlobRef> blobs;
  blobs.reserve(static_cast<size_t>(num_sub_groups_ * 3));
  for (int64_t k = 0; k < num_sub_groups_; ++k) {
    for (int a : {kMaster, kExpAvg, kExpAvgSq}) {
      std::string name = std::string(kArrayNames[a]) + "." + std::to_string(k);
      if (store_) {
        blobs.push_back(BlobRef::Swap(std::move(name), store_.get(), Tensor(a, k)));
      } else {
        auto* bytes = reinterpret_cast<std::byte*>(Resident(a, k));
        blobs.push_back(
            BlobRef::Ram(std::move(name), std::span<std::byte>(bytes, static_cast<size_t>(sub_group_elems(k) * 4))));
      }
    }
  }
  return blobs;
}

void OptimizerSwapper::Restored() { std::fill(zero_.begin(), zero_.end(), false); }

float* OptimizerSwapper::Resident(int array, int64_t k) const {
  return reinterpret_cast<float*>(resident_[static_cast<size_t>(k * arrays() + array)].data());
}

// ---------------------------------------------------------------------------
// Whole-array copies (initialisation, gradients, inspection)

Status OptimizerSwapper::CopyIn(int array, const float* src) {
  DropPrefetch();  // the state changes, and slot 0's buffers are used below
  for (int64_t k = 0; k < num_sub_groups_; ++k) {
    const int64_t n = sub_group_elems(k);
    const size_t bytes = static_cast<size_t>(n) * sizeof(float);
    if (!store_) {
      if (src != nullptr) {
        std::memcpy(Resident(array, k), src + sub_group_begin(k), bytes);
      } else {
        std::memset(Resident(array, k), 0, bytes);
      }
      continue;
    }
    // Round-robin over slot 0's buffers: up to arrays() writes in flight.
    Slot& slot = slots_[0];
    const size_t b = static_cast<size_t>(k % arrays());
    if (slot.writes[b].valid()) {
      Status w = store_->Wait(slot.writes[b]);
      slot.writes[b] = {};
      if (!w.ok()) return Drain(w);
    }
    char* buf = slot.buffers[b].data();
    const int64_t padded = store_->PaddedBytes(static_cast<int64_t>(bytes));
    if (src != nullptr) {
      std::memcpy(buf, src + sub_group_begin(k), bytes);
      std::memset(buf + bytes, 0, static_cast<size_t>(padded) - bytes);
    } else {
      std::memset(buf, 0, static_cast<size_t>(padded));
    }
    auto h = store_->SwapOut(Tensor(array, k), buf);
    if (!h.ok()) return Drain(h.status());
    slot.writes[b] = *h;
  }
  return Drain(Status::Ok());
}

Status OptimizerSwapper::WriteZeros() {
  if (std::find(zero_.begin(), zero_.end(), true) == zero_.end()) return Status::Ok();
  DropPrefetch();  // slot 0's buffers are used below
  ZINF_RETURN_IF_ERROR(Drain(Status::Ok()));
  char* buf = slots_[0].buffers[0].data();
  std::memset(buf, 0, static_cast<size_t>(store_->PaddedBytes(sub_group_elems(0) * int64_t{sizeof(float)})));
  for (int64_t k = 0; k < num_sub_groups_; ++k) {
    for (int a = 0; a < arrays(); ++a) {
      if (!Zero(a, k)) continue;
      ZINF_ASSIGN_OR_RETURN(SwapHandle h, store_->SwapOut(Tensor(a, k), buf));
      ZINF_RETURN_IF_ERROR(store_->Wait(h));
      SetZero(a, k, false);
    }
  }
  return Status::Ok();
}

Status OptimizerSwapper::CopyOut(int array, float* dst) {
  DropPrefetch();  // slot 0's buffers are used below
  for (int64_t k = 0; k < num_sub_groups_; ++k) {
    const size_t bytes = static_cast<size_t>(sub_group_elems(k)) * sizeof(float);
    if (!store_) {
      std::memcpy(dst + sub_group_begin(k), Resident(array, k), bytes);
      continue;
    }
    if (Zero(array, k)) {
      std::memset(dst + sub_group_begin(k), 0, bytes);
      continue;
    }
    char* buf = slots_[0].buffers[0].data();
    ZINF_ASSIGN_OR_RETURN(SwapHandle h, store_->SwapIn(Tensor(array, k), buf));
    ZINF_RETURN_IF_ERROR(store_->Wait(h));
    std::memcpy(dst + sub_group_begin(k), buf, bytes);
  }
  return Status::Ok();
}

Status OptimizerSwapper::ReadMaster(int64_t begin, int64_t count, const MasterSink& sink) {
  if (begin < 0 || count < 0 || begin > options_.total_elems - count) {
    return Status::InvalidArgument("optimizer swapper: ReadMaster range [" + std::to_string(begin) + ", +" +
                                   std::to_string(count) + ") outside " + std::to_string(options_.total_elems));
  }
  if (count == 0) return Status::Ok();
  DropPrefetch();  // slot 0's buffers are used below
  const int64_t first = begin / options_.sub_group_elems;
  const int64_t last = (begin + count - 1) / options_.sub_group_elems;
  auto hand_over = [&](int64_t k, const float* src) {  // sub-group k's part of the range
    const int64_t lo = std::max(begin, sub_group_begin(k));
    const int64_t hi = std::min(begin + count, sub_group_begin(k) + sub_group_elems(k));
    sink(lo - begin, src + (lo - sub_group_begin(k)), hi - lo);
  };
  if (!store_) {
    for (int64_t k = first; k <= last; ++k) hand_over(k, Resident(kMaster, k));
    return Status::Ok();
  }
  // Two of slot 0's buffers in turn (every slot has one per array, each a
  // sub-group's size): sub-group k + 1 is read while k is handed over. No
  // write is out of them (every writer drains before it returns): made sure.
  ZINF_RETURN_IF_ERROR(FinishWrite(slots_[0]));
  const std::array<char*, 2> buffers = {slots_[0].buffers[kMaster].data(), slots_[0].buffers[kExpAvg].data()};
  // One read is in flight at a time, the one waited for next.
  ZINF_ASSIGN_OR_RETURN(SwapHandle read, store_->SwapIn(Tensor(kMaster, first), buffers[0]));
  for (int64_t k = first; k <= last; ++k) {
    const size_t at = static_cast<size_t>(k - first) % 2;
    ZINF_RETURN_IF_ERROR(store_->Wait(read));
    if (k < last) {
      ZINF_ASSIGN_OR_RETURN(read, store_->SwapIn(Tensor(kMaster, k + 1), buffers[1 - at]));
    }
    hand_over(k, reinterpret_cast<const float*>(buffers[at]));
  }
  return Status::Ok();
}

Status OptimizerSwapper::ReadMaster(int64_t begin, int64_t count, float* dst) {
  return ReadMaster(begin, count, [dst](int64_t at, const float* src, int64_t n) {
    std::memcpy(dst + at, src, static_cast<size_t>(n) * sizeof(float));
  });
}

Status OptimizerSwapper::WriteMaster(int64_t begin, int64_t count, const float* src) {
  if (begin < 0 || count < 0 || begin > options_.total_elems - count) {
    return Status::InvalidArgument("optimizer swapper: WriteMaster range [" + std::to_string(begin) + ", +" +
                                   std::to_string(count) + ") outside " + std::to_string(options_.total_elems));
  }
  if (count == 0) return Status::Ok();
  DropPrefetch();  // the state changes, and slot 0's buffers are used below
  ZINF_RETURN_IF_ERROR(Drain(Status::Ok()));
  master_set_.resize(static_cast<size_t>(num_sub_groups_), false);
  const int64_t first = begin / options_.sub_group_elems;
  const int64_t last = (begin + count - 1) / options_.sub_group_elems;
  for (int64_t k = first; k <= last; ++k) {
    const int64_t k0 = sub_group_begin(k), n = sub_group_elems(k);
    const int64_t lo = std::max(begin, k0), hi = std::min(begin + count, k0 + n);
    const bool whole = lo == k0 && hi == k0 + n;
    const bool set = master_set_[static_cast<size_t>(k)];
    float* buf = store_ ? reinterpret_cast<float*>(slots_[0].buffers[0].data()) : Resident(kMaster, k);
    const size_t bytes = static_cast<size_t>(store_ ? store_->PaddedBytes(n * 4) : n * 4);
    if (!whole && set && store_) {
      ZINF_ASSIGN_OR_RETURN(SwapHandle h, store_->SwapIn(Tensor(kMaster, k), buf));
      ZINF_RETURN_IF_ERROR(store_->Wait(h));
    } else if (!set || store_) {
      std::memset(buf, 0, bytes);  // unset elements (and a swap buffer's padding) are zero
    }
    std::memcpy(buf + (lo - k0), src + (lo - begin), static_cast<size_t>(hi - lo) * sizeof(float));
    if (store_) {
      ZINF_ASSIGN_OR_RETURN(SwapHandle h, store_->SwapOut(Tensor(kMaster, k), buf));
      ZINF_RETURN_IF_ERROR(store_->Wait(h));
    }
    master_set_[static_cast<size_t>(k)] = true;
  }
  return Status::Ok();
}

Status OptimizerSwapper::ZeroMoments() {
  if (!store_) {
    ZINF_RETURN_IF_ERROR(CopyIn(kExpAvg, nullptr));
    ZINF_RETURN_IF_ERROR(CopyIn(kExpAvgSq, nullptr));
    return options_.gradients_in_store ? CopyIn(kGrad, nullptr) : Status::Ok();
  }
  // Reads under way would bring the old values; writes under way land
  // before the marks' first memset (StartRead finishes a slot's writes).
  DropPrefetch();
  zero_.resize(static_cast<size_t>(num_sub_groups_ * arrays()), false);
  for (int64_t k = 0; k < num_sub_groups_; ++k) {
    for (int a : {kExpAvg, kExpAvgSq}) SetZero(a, k, true);
  }
  // A stored gradient is written out: GradientWindow accumulates into the
  // store's tensor itself, reading what is there.
  return options_.gradients_in_store ? CopyIn(kGrad, nullptr) : Status::Ok();
}

int64_t OptimizerSwapper::StepStateBytes() const {
  if (!store_) return 0;
  int64_t bytes = 0;
  for (int64_t k = 0; k < num_sub_groups_; ++k) {
    const int64_t arrays_read = 1 + int64_t{!Zero(kExpAvg, k)} + int64_t{!Zero(kExpAvgSq, k)};
    bytes += sub_group_elems(k) * int64_t{sizeof(float)} * (arrays_read + 3);
  }
  return bytes;
}

Status OptimizerSwapper::Initialize(const float* master) {
  if (master == nullptr) return Status::InvalidArgument("optimizer swapper: Initialize needs master weights");
  ZINF_RETURN_IF_ERROR(CopyIn(kMaster, master));
  master_set_.assign(static_cast<size_t>(num_sub_groups_), true);
  return ZeroMoments();
}

Status OptimizerSwapper::SetGradients(const float* grads) {
  if (grads == nullptr) return Status::InvalidArgument("optimizer swapper: SetGradients needs gradients");
  if (!options_.gradients_in_store) {
    return Status::FailedPrecondition("optimizer swapper: the gradient is not stored here; Step takes it");
  }
  return CopyIn(kGrad, grads);
}

Status OptimizerSwapper::ReadState(float* master, float* exp_avg, float* exp_avg_sq, float* grads) {
  if (grads != nullptr && !options_.gradients_in_store) {
    return Status::FailedPrecondition("optimizer swapper: the gradient is not stored here");
  }
  float* dst[kArrays] = {master, exp_avg, exp_avg_sq, grads};
  for (int a = 0; a < arrays(); ++a) {
    if (dst[a] != nullptr) ZINF_RETURN_IF_ERROR(CopyOut(a, dst[a]));
  }
  return Status::Ok();
}

// ---------------------------------------------------------------------------
// The pipelined step

Status OptimizerSwapper::StartRead(Slot& slot, int64_t k, bool with_grad) {
  ZINF_RETURN_IF_ERROR(FinishWrite(slot));  // the slot's last sub-group must be on disk first
  slot.sub_group = k;
  for (int a = 0; a < arrays(); ++a) {
    if (a == kGrad && !with_grad) continue;
    if (Zero(a, k)) {  // nothing on disk to read
      std::memset(slot.buffers[static_cast<size_t>(a)].data(), 0,
                  static_cast<size_t>(store_->PaddedBytes(sub_group_elems(k) * int64_t{sizeof(float)})));
      continue;
    }
    auto h = store_->SwapIn(Tensor(a, k), slot.buffers[static_cast<size_t>(a)].data());
    if (!h.ok()) {
      // No half-started slot: EnsureRead would take it for one under way.
      FinishRead(slot).IgnoreError();
      return h.status();
    }
    slot.reads[static_cast<size_t>(a)] = *h;
  }
  return Status::Ok();
}

Status OptimizerSwapper::EnsureRead(Slot& slot, int64_t k, bool with_grad) {
  with_grad = with_grad && options_.gradients_in_store;
  if (slot.sub_group == k && slot.reads[kMaster].valid()) {
    if (!with_grad || slot.reads[kGrad].valid()) return Status::Ok();
    // Prefetched without the gradient, which may have changed since.
    ZINF_ASSIGN_OR_RETURN(slot.reads[kGrad], store_->SwapIn(Tensor(kGrad, k), slot.buffers[kGrad].data()));
    return Status::Ok();
  }
  return StartRead(slot, k, with_grad);
}

Status OptimizerSwapper::PrefetchStep() {
  if (!store_) return Status::Ok();
  // One sub-group per slot: before a Step no write holds any of them, and
  // Step's EnsureRead finds each one under way when it gets there.
  const int64_t ahead = static_cast<int64_t>(slots_.size());
  for (int64_t k = 0; k < std::min(ahead, num_sub_groups_); ++k) {
    Slot& slot = SlotOf(k);
    if (slot.sub_group == k && slot.reads[kMaster].valid()) continue;  // under way
    ZINF_RETURN_IF_ERROR(StartRead(slot, k, /*with_grad=*/false));
  }
  return Status::Ok();
}

void OptimizerSwapper::DropPrefetch() {
  for (Slot& slot : slots_) FinishRead(slot).IgnoreError();
}

Status OptimizerSwapper::FinishRead(Slot& slot) {
  Status first;
  for (SwapHandle& h : slot.reads) {
    if (!h.valid()) continue;
    Status s = store_->Wait(h);
    h = {};
    if (first.ok()) first = s;
  }
  return first;
}

Status OptimizerSwapper::StartWrite(Slot& slot) {
  for (int a : {kMaster, kExpAvg, kExpAvgSq}) {
    ZINF_ASSIGN_OR_RETURN(slot.writes[static_cast<size_t>(a)],
                          store_->SwapOut(Tensor(a, slot.sub_group), slot.buffers[static_cast<size_t>(a)].data()));
    SetZero(a, slot.sub_group, false);
  }
  return Status::Ok();
}

Status OptimizerSwapper::FinishWrite(Slot& slot) {
  Status first;
  for (SwapHandle& h : slot.writes) {
    if (!h.valid()) continue;
    Status s = store_->Wait(h);
    h = {};
    if (first.ok()) first = s;
  }
  return first;
}

Status OptimizerSwapper::Drain(Status first) {
  for (Slot& slot : slots_) {
    Status r = FinishRead(slot);
    Status w = FinishWrite(slot);
    if (first.ok()) first = r;
    if (first.ok()) first = w;
  }
  return first;
}

Status OptimizerSwapper::Step(const optim::CpuAdam& adam, const optim::AdamStepArgs& args, const StepIo& io) {
  if (options_.gradients_in_store == (io.grads != nullptr)) {
    return Status::InvalidArgument(options_.gradients_in_store
                                       ? "optimizer step: the gradient is stored here; StepIo::grads must be null"
                                       : "optimizer step: StepIo::grads must hold the gradient");
  }
  if (io.params_ring_elems > 0 && io.params_ring_elems < options_.total_elems &&
      io.params_ring_elems % options_.sub_group_elems != 0) {
    return Status::InvalidArgument("optimizer step: a parameter ring of " + std::to_string(io.params_ring_elems) +
                                   " elements is not a multiple of the sub-group size " +
                                   std::to_string(options_.sub_group_elems));
  }
  const bool nvme = store_ != nullptr;
  const int64_t read_ahead =
      options_.pipeline_read ? static_cast<int64_t>(slots_.size()) - 1 - int64_t{options_.pipeline_write} : 0;
  auto held = [&](int64_t k) -> const float* {
    return options_.gradients_in_store && io.held_grads ? io.held_grads(k) : nullptr;
  };
  Status s;
  int64_t current = 0;  // for the error message
  for (int64_t k = 0; s.ok() && k < num_sub_groups_; ++k) {
    current = k;
    // Reads: sub-group k (unless already under way: read ahead, or
    // PrefetchStep), then the next ones ahead of use, as far as the slots
    // not holding k or (pipeline_write) k-1 reach. A gradient the caller
    // holds is not read.
    const float* held_k = held(k);
    if (nvme) s = EnsureRead(SlotOf(k), k, held_k == nullptr);
    for (int64_t j = k + 1; s.ok() && nvme && j <= k + read_ahead && j < num_sub_groups_; ++j) {
      s = EnsureRead(SlotOf(j), j, held(j) == nullptr);
    }
    if (s.ok() && nvme) s = FinishRead(SlotOf(k));
    if (!s.ok()) break;

    optim::AdamSpan span;
    span.n = sub_group_elems(k);
    if (nvme) {
      Slot& slot = SlotOf(k);
      span.params = reinterpret_cast<float*>(slot.buffers[kMaster].data());
      span.exp_avg = reinterpret_cast<float*>(slot.buffers[kExpAvg].data());
      span.exp_avg_sq = reinterpret_cast<float*>(slot.buffers[kExpAvgSq].data());
      if (options_.gradients_in_store) span.grads = slot.buffers[kGrad].data();
    } else {
      span.params = Resident(kMaster, k);
      span.exp_avg = Resident(kExpAvg, k);
      span.exp_avg_sq = Resident(kExpAvgSq, k);
      if (options_.gradients_in_store) span.grads = Resident(kGrad, k);
    }
    if (held_k != nullptr) span.grads = held_k;
    if (!options_.gradients_in_store) span.grads = io.grads + sub_group_begin(k);
    span.grad_dtype = ElementType::kF32;
    const bool copy_master = io.params != nullptr && io.params_dtype == ElementType::kF32;
    const int64_t out = io.params_ring_elems > 0 ? sub_group_begin(k) % io.params_ring_elems : sub_group_begin(k);
    if (io.params != nullptr && !copy_master) {
      span.params16 = static_cast<char*>(io.params) + out * 2;
      span.params16_dtype = io.params_dtype;
    }
    for (int64_t at = 0; s.ok() && at < span.n; at += options_.step_slice_elems) {
      const optim::AdamSpan slice = optim::SubSpan(span, at, std::min(options_.step_slice_elems, span.n - at));
      s = io.no_decay != nullptr ? adam.UpdateMasked(slice, args, sub_group_begin(k) + at, *io.no_decay)
                                 : adam.Update(slice, args);
      if (s.ok() && copy_master) {
        std::memcpy(static_cast<float*>(io.params) + out + at, slice.params,
                    static_cast<size_t>(slice.n) * sizeof(float));
      }
      if (s.ok() && io.on_stepped) s = io.on_stepped(sub_group_begin(k) + at + slice.n);
    }
    if (!s.ok()) break;

    // Writes: k goes back while k+1 runs (pipeline_write), or now.
    if (nvme) s = StartWrite(SlotOf(k));
    if (s.ok() && nvme && !options_.pipeline_write) s = FinishWrite(SlotOf(k));
    if (s.ok() && io.on_sub_group) s = io.on_sub_group(k);
  }
  s = Drain(s);
  if (!s.ok()) {
    return s.WithContext("optimizer step " + std::to_string(args.step) + ", sub-group " + std::to_string(current) +
                         " of " + std::to_string(num_sub_groups_));
  }
  return Status::Ok();
}

}  // namespace zinf::swap
