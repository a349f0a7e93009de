// The ZeRO-3 engine (include/zinf/engine.h): tiers, gathers, gradient
// accumulation and the optimizer step, glued from the layers below.
//
// Buffers are sized once, at Create, from the partition: the device holds a
// gathered block per live block (allocated at fetch, freed at eviction:
// their number is bounded by max_live, not by the model) plus one gradient
// flat buffer and one gradient shard buffer of the largest block; pinned
// RAM holds the fp32 gradient accumulator, the new-parameter buffer the
// optimizer writes into, and a staging buffer for gradient shards.
//
// The optimizer step overlaps the next forward pass. Step() computes the
// global gradient norm, then hands the sub-group walk (Adam, the optimizer
// state's NVMe reads and writes) to a worker thread and returns. The shard
// is laid out in block order, which is the forward's order, so the first
// blocks' new parameters are ready first: a block is "stale" until the
// worker has stepped the sub-groups covering its shard range, and the
// driving thread writes its new parameters home (RefreshHome) when a fetch
// needs it, waiting only if the worker has not got that far. Prefetches
// stop at the first block not yet stepped. Everything that reads or writes
// the optimizer state or the gradient accumulator (ReduceGradients, Step,
// checkpoints, GetMasterParameters) first waits for the whole update
// (FinishUpdate), which is also where an error from the worker surfaces.
#include "zinf/engine.h"

#include <algorithm>
#include <chrono>
#include <cmath>
#include <cerrno>
#include <cstdio>
#include <cstdlib>
#include <condition_variable>
#include <cstring>
#include <mutex>
#include <system_error>
#include <thread>
#include <unordered_map>

#include "aio/io_engine.h"
#include "aio/pinned_pool.h"
#include "comm/communicator.h"
#include "comm/mpi_communicator.h"
#include "comm/nccl_communicator.h"
#include "core/crc32c.h"
#include "core/log.h"
#include "core/units.h"
#include "device/device.h"
#include "optim/array_ops.h"
#include "optim/cpu_adam.h"
#include "optim/grad_clip.h"
#include "optim/isa.h"
#include "optim/loss_scaler.h"
#include "optim/lr_schedule.h"
#include "optim/thread_pool.h"
#include "swap/checkpoint.h"
#include "swap/optimizer_swapper.h"
#include "swap/param_swapper.h"
#include "zero3/partitioner.h"
#include "zero3/prefetch_coordinator.h"

namespace zinf {

int64_t TensorSpec::numel() const {
  int64_t n = 1;
  for (int64_t d : shape) n *= d;
  return n;
}

namespace {

using Clock = std::chrono::steady_clock;

int64_t NanosSince(Clock::time_point t0) {
  return std::chrono::duration_cast<std::chrono::nanoseconds>(Clock::now() - t0).count();
}

// "zero_optimization.<section>.nvme_path [a, b]": names the config key in
// errors about the swap files (a path that is a file, read-only, full).
std::string NvmePathContext(const char* section, const std::vector<std::string>& paths) {
  std::string list;
  for (const std::string& p : paths) list += (list.empty() ? "" : ", ") + p;
  return std::string("swap files on zero_optimization.") + section + ".nvme_path [" + list + "]";
}

StatusOr<std::unique_ptr<aio::PinnedPool>> OnePinnedBuffer(int64_t bytes, bool pin, const std::string& name) {
  aio::PinnedPoolOptions o;
  o.buffer_count = 1;
  o.buffer_bytes = std::max<int64_t>(bytes, 4096);
  o.pin = pin;
  o.huge_pages = false;
  o.name = name;
  return aio::PinnedPool::Create(o);
}

}  // namespace

struct Engine::Impl {
  struct BlockState {
    void* full = nullptr;                 // gathered block on the device (padded_numel elements)
    std::unique_ptr<Event> ready;         // recorded after its gather
    bool persistent = false;
    bool prefetched = false;              // gathered ahead, not yet acquired
    int holds = 0;
    bool params_set = false;
    bool stale = false;                   // home holds the parameters from before the update in flight
    swap::ParamSwapper::ShardId shard_id = -1;
  };

  // The optimizer update running on a worker thread (see the file comment).
  struct Update {
    std::thread worker;
    std::mutex mu;
    std::condition_variable cv;
    int64_t stepped_elems = 0;  // guarded by mu: new_params holds [0, stepped_elems)
    bool done = false;          // guarded by mu
    Status status;              // guarded by mu: the worker's result
  };

  Config config;
  EngineOptions options;
  std::vector<BlockSpec> specs;
  ElementType param_type = ElementType::kBf16;
  int64_t param_es = 2;   // bytes per working parameter
  int64_t grad_es = 4;    // bytes per gradient element

  std::unique_ptr<Device> owned_device;
  Device* device = nullptr;
  std::unique_ptr<comm::Communicator> owned_host_comm;
  std::unique_ptr<comm::Communicator> owned_device_comm;
  comm::Communicator* host_comm = nullptr;
  comm::Communicator* device_comm = nullptr;
  std::unique_ptr<Stream> stream;

  std::unique_ptr<zero3::Partitioner> partitioner;
  std::unique_ptr<zero3::PrefetchCoordinator> coordinator;
  std::vector<BlockState> blocks;
  int64_t max_live_elems = 0;

  // Tiers. `io` is options.io_engine when given, else owned_io.
  std::unique_ptr<aio::IoEngine> owned_io;
  aio::IoEngine* io = nullptr;
  std::unique_ptr<swap::ParamSwapper> param_swapper;     // offload_param nvme
  std::unique_ptr<aio::PinnedPool> param_home_pool;      // offload_param cpu
  aio::PinnedBuffer param_home;
  void* param_home_device = nullptr;                     // offload_param none
  std::unique_ptr<aio::PinnedPool> optim_pool;           // optimizer pipeline (nvme)
  std::unique_ptr<swap::OptimizerSwapper> optimizer;

  // Host buffers.
  std::unique_ptr<aio::PinnedPool> accum_pool, new_params_pool, staging_pool;
  aio::PinnedBuffer accum, new_params, staging;
  std::vector<float> init_master;  // until the first Acquire
  bool committed = false;

  // Device gradient buffers.
  void* grad_flat = nullptr;
  void* grad_shard = nullptr;

  // Optimizer.
  std::unique_ptr<optim::ThreadPool> threads;
  std::unique_ptr<optim::CpuAdam> adam;
  optim::Isa isa = optim::Isa::kScalar;
  std::unique_ptr<optim::LrSchedule> schedule;
  std::unique_ptr<optim::LossScaler> scaler;
  int64_t micro_steps = 0;
  int64_t applied_steps = 0;

  Update update;
  bool update_active = false;  // a worker was started and not yet joined
  Status update_failed;        // sticky until LoadCheckpoint: the state is partly stepped

  EngineCounters counters;
  bool tracing = true;         // Acquires feed the prefetch order (SetTracing)
  bool grads_pending = false;  // ReduceGradients since the last optimizer step

  // Checkpoints: their own I/O engine (options.io_engine when given) and
  // two buffers, made at first use.
  std::unique_ptr<aio::IoEngine> owned_checkpoint_io;
  aio::IoEngine* checkpoint_io = nullptr;
  std::unique_ptr<aio::PinnedPool> checkpoint_pool;

  ~Impl() {
    if (update.worker.joinable()) update.worker.join();
    if (stream) stream->Synchronize().IgnoreError();
    for (BlockState& b : blocks) {
      if (b.full != nullptr) device->Free(b.full);
    }
    if (device != nullptr) {
      device->Free(param_home_device);
      device->Free(grad_flat);
      device->Free(grad_shard);
    }
  }

  const zero3::BlockLayout& layout(BlockId b) const { return partitioner->layout(b); }

  Status Init(const Config& cfg, const std::vector<BlockSpec>& block_specs, const EngineOptions& opts);
  Status Commit();
  Status WriteHome(const char* params);
  Status WriteHomeFromMaster(const float* master);
  Status StartUpdate(const optim::AdamStepArgs& args);
  void RunUpdate(optim::AdamStepArgs args);
  StatusOr<bool> RefreshHome(BlockId b, bool wait);
  void JoinWorker();
  Status FinishUpdate();
  Status Fetch(BlockId b);
  Status Evict(BlockId b);
  bool MakeRoom(int64_t need, bool demand, int64_t candidate_distance);
  void IssuePrefetch();
  void DropAllGathers();
  Status CheckpointPreconditions(const char* what) const;
  Status PrepareCheckpointIo();
  std::map<std::string, std::string> EngineMetadata() const;
  Status CheckBlock(BlockId b) const {
    if (b < 0 || b >= static_cast<BlockId>(blocks.size())) {
      return Status::InvalidArgument("engine: no block " + std::to_string(b));
    }
    return Status::Ok();
  }
};

Status Engine::Impl::Init(const Config& cfg, const std::vector<BlockSpec>& block_specs, const EngineOptions& opts) {
  config = cfg;
  options = opts;
  specs = block_specs;
  const ZeroConfig& zero = config.zero;
  if (zero.stage < 1 || zero.stage > 3) {
    return Status::InvalidArgument("zero_optimization.stage: the engine runs stages 1, 2 and 3, got " +
                                   std::to_string(zero.stage));
  }
  if (config.fp16.enabled && config.bf16.enabled) {
    return Status::InvalidArgument("fp16.enabled and bf16.enabled: at most one may be on");
  }
  if (config.gradient_accumulation_steps < 1) {
    return Status::InvalidArgument("gradient_accumulation_steps: expected >= 1, got " +
                                   std::to_string(config.gradient_accumulation_steps));
  }
  param_type = config.fp16.enabled ? ElementType::kF16 : config.bf16.enabled ? ElementType::kBf16 : ElementType::kF32;
  param_es = ElementSizeBytes(param_type);
  if (opts.grad_type != ElementType::kF32 && opts.grad_type != param_type) {
    return Status::InvalidArgument("engine: gradients must be fp32 or the parameters' type");
  }
  grad_es = ElementSizeBytes(opts.grad_type);

  // Device and communicators.
  device = opts.device;
  if (device == nullptr) {
    ZINF_ASSIGN_OR_RETURN(owned_device, CreateDevice(DeviceOptions{}));
    device = owned_device.get();
  }
  ZINF_ASSIGN_OR_RETURN(stream, device->CreateStream());
  host_comm = opts.host_communicator;
  if (host_comm == nullptr) {
    if (comm::MpiInitialized() && comm::MpiWorldSize() > 1) {
      ZINF_ASSIGN_OR_RETURN(auto mpi, comm::MpiCommunicator::CreateWorld());
      owned_host_comm = std::move(mpi);
    } else {
      owned_host_comm = std::make_unique<comm::LocalCommunicator>();
    }
    host_comm = owned_host_comm.get();
  }
  if (host_comm->buffers_on_device()) {
    return Status::InvalidArgument("engine: the host communicator must work on host buffers");
  }
  device_comm = opts.device_communicator;
  if (device_comm == nullptr) {
    if (device->kind() == DeviceKind::kHost) {
      device_comm = host_comm;
    } else if (host_comm->world_size() == 1) {
      owned_device_comm = std::make_unique<comm::LocalCommunicator>(/*device_buffers=*/true);
      device_comm = owned_device_comm.get();
    } else {
      auto* mpi = dynamic_cast<comm::MpiCommunicator*>(host_comm);
      if (mpi == nullptr) return Status::Unavailable("engine: NCCL needs an MPI host communicator to bootstrap");
      const int ordinal = mpi->rank() % std::max(1, CudaDeviceCount());
      ZINF_ASSIGN_OR_RETURN(auto nccl, comm::NcclCommunicator::Create(*mpi, ordinal));
      owned_device_comm = std::move(nccl);
      device_comm = owned_device_comm.get();
    }
  }
  if (device_comm->world_size() != host_comm->world_size() || device_comm->rank() != host_comm->rank()) {
    return Status::InvalidArgument("engine: the host and device communicators disagree on rank or size");
  }
  if (device->kind() == DeviceKind::kCuda && !device_comm->buffers_on_device()) {
    return Status::InvalidArgument("engine: a CUDA device needs a device-buffer communicator (NCCL)");
  }

  // Partition and prefetch.
  ZINF_ASSIGN_OR_RETURN(zero3::Partitioner p, zero3::Partitioner::Create(specs, host_comm->world_size(), host_comm->rank()));
  partitioner = std::make_unique<zero3::Partitioner>(std::move(p));
  const int nb = partitioner->num_blocks();
  blocks.resize(static_cast<size_t>(nb));
  std::vector<int64_t> elems(static_cast<size_t>(nb));
  for (int b = 0; b < nb; ++b) {
    elems[static_cast<size_t>(b)] = layout(b).padded_numel;
    blocks[static_cast<size_t>(b)].persistent =
        zero.stage < 3 || layout(b).padded_numel < zero.stage3_param_persistence_threshold;
  }
  zero3::PrefetchOptions po;
  po.prefetch_bucket_elems = zero.stage3_prefetch_bucket_size;
  po.max_reuse_distance_elems = zero.stage3_max_reuse_distance;
  coordinator = std::make_unique<zero3::PrefetchCoordinator>(po, elems);
  max_live_elems = zero.stage3_max_live_parameters;

  const int64_t total = partitioner->total_shard_numel();
  const std::string rank_tag = "-r" + std::to_string(host_comm->rank());
  if (opts.io_engine != nullptr) {
    io = opts.io_engine;
  } else if (config.offloads_to_nvme()) {
    aio::IoEngineOptions io_options = aio::FromAioConfig(config.aio);
    io_options.direct_io = aio::DirectIo::kPrefer;
    ZINF_ASSIGN_OR_RETURN(owned_io, aio::CreateIoEngine(io_options));
    io = owned_io.get();
  }

  // Working-parameter home.
  switch (zero.offload_param.device) {
    case OffloadDevice::kNvme: {
      swap::ParamSwapperOptions o = swap::ParamSwapperOptionsFromConfig(zero);
      o.element_size_bytes = static_cast<int32_t>(param_es);
      // A buffer never needs to be larger than the largest shard.
      o.buffer_elems = std::min(o.buffer_elems, partitioner->max_shard_numel());
      o.store.file_prefix += rank_tag;
      o.store.run_id = opts.run_id;
      std::vector<swap::ParamShardSpec> shards;
      for (int b = 0; b < nb; ++b) shards.push_back({specs[static_cast<size_t>(b)].name, layout(b).shard_numel});
      auto swapper = swap::ParamSwapper::Create(o, io, shards);
      if (!swapper.ok()) return swapper.status().WithContext(NvmePathContext("offload_param", o.store.paths));
      param_swapper = std::move(swapper).value();
      for (int b = 0; b < nb; ++b) blocks[static_cast<size_t>(b)].shard_id = b;
      break;
    }
    case OffloadDevice::kCpu: {
      ZINF_ASSIGN_OR_RETURN(param_home_pool,
                            OnePinnedBuffer(total * param_es, zero.offload_param.pin_memory, "param home"));
      param_home = param_home_pool->Acquire();
      break;
    }
    case OffloadDevice::kNone: {
      ZINF_ASSIGN_OR_RETURN(param_home_device, device->Allocate(static_cast<size_t>(total * param_es)));
      break;
    }
  }

  // Optimizer state.
  swap::OptimizerSwapperOptions oo = swap::OptimizerSwapperOptionsFromConfig(zero, total);
  if (oo.device == OffloadDevice::kNone) oo.device = OffloadDevice::kCpu;  // CPU Adam on RAM-resident state
  oo.sub_group_elems = std::min(oo.sub_group_elems, total);
  oo.store.file_prefix += rank_tag;
  oo.store.run_id = opts.run_id;
  oo.prefix = "optim";
  if (oo.device == OffloadDevice::kNvme) {
    ZINF_ASSIGN_OR_RETURN(optim_pool,
                          aio::PinnedPool::Create(aio::PinnedPoolOptions{
                              .buffer_count = swap::OptimizerSwapper::PoolBuffers(oo),
                              .buffer_bytes = swap::OptimizerSwapper::RequiredBufferBytes(oo, 4096),
                              .alignment_bytes = 4096,
                              .pin = zero.offload_optimizer.pin_memory,
                              .require_pinned = false,
                              .huge_pages = false,
                              .numa_node = -1,
                              .name = "optimizer pipeline"}));
  }
  {
    auto swapper = swap::OptimizerSwapper::Create(oo, io, optim_pool.get());
    if (!swapper.ok()) {
      if (oo.device != OffloadDevice::kNvme) return swapper.status();
      return swapper.status().WithContext(NvmePathContext("offload_optimizer", oo.store.paths));
    }
    optimizer = std::move(swapper).value();
  }

  // Host and device gradient buffers.
  ZINF_ASSIGN_OR_RETURN(accum_pool, OnePinnedBuffer(total * 4, true, "grad accumulator"));
  accum = accum_pool->Acquire();
  std::memset(accum.data(), 0, static_cast<size_t>(total * 4));
  ZINF_ASSIGN_OR_RETURN(new_params_pool, OnePinnedBuffer(total * param_es, true, "new params"));
  new_params = new_params_pool->Acquire();
  ZINF_ASSIGN_OR_RETURN(staging_pool, OnePinnedBuffer(partitioner->max_shard_numel() * 8, true, "grad staging"));
  staging = staging_pool->Acquire();
  ZINF_ASSIGN_OR_RETURN(grad_flat, device->Allocate(static_cast<size_t>(partitioner->max_padded_numel() * grad_es)));
  // One rank: the reduce-scatter is the identity, and the shard is the flat buffer.
  if (partitioner->world_size() > 1) {
    ZINF_ASSIGN_OR_RETURN(grad_shard,
                          device->Allocate(static_cast<size_t>(partitioner->max_shard_numel() * grad_es)));
  }
  init_master.assign(static_cast<size_t>(total), 0.0f);

  // Optimizer pieces.
  optim::ThreadPool::Options to;
  to.num_threads = opts.optimizer_threads;
  to.bind_threads = false;
  to.name = "zinf-adam";
  ZINF_ASSIGN_OR_RETURN(threads, optim::ThreadPool::Create(to));
  ZINF_ASSIGN_OR_RETURN(isa, optim::DefaultIsa());
  ZINF_ASSIGN_OR_RETURN(optim::CpuAdam a, optim::CpuAdam::Create(config.optimizer, threads.get(), isa));
  adam = std::make_unique<optim::CpuAdam>(std::move(a));
  ZINF_ASSIGN_OR_RETURN(optim::LrSchedule s, optim::LrSchedule::Create(config.scheduler, config.optimizer.lr));
  schedule = std::make_unique<optim::LrSchedule>(std::move(s));
  ZINF_ASSIGN_OR_RETURN(optim::LossScaler ls, optim::LossScaler::Create(config.fp16));
  scaler = std::make_unique<optim::LossScaler>(std::move(ls));
  return Status::Ok();
}

// Writes the rank shard of working parameters (`params`, total_shard_numel
// elements of param_type) to each block's home tier.
Status Engine::Impl::WriteHome(const char* params) {
  const int64_t total = partitioner->total_shard_numel();
  switch (config.zero.offload_param.device) {
    case OffloadDevice::kNvme:
      for (int b = 0; b < partitioner->num_blocks(); ++b) {
        ZINF_RETURN_IF_ERROR(param_swapper->Store(blocks[static_cast<size_t>(b)].shard_id,
                                                  params + layout(b).rank_offset * param_es));
      }
      return param_swapper->Flush();
    case OffloadDevice::kCpu:
      std::memcpy(param_home.data(), params, static_cast<size_t>(total * param_es));
      return Status::Ok();
    case OffloadDevice::kNone:
      ZINF_RETURN_IF_ERROR(stream->CopyAsync(param_home_device, params, static_cast<size_t>(total * param_es),
                                             CopyDirection::kHostToDevice));
      counters.h2d_bytes += total * param_es;
      return stream->Synchronize();
  }
  return Status::Ok();
}

// The worker thread's body: the sub-group walk, publishing each sub-group's
// end in update.stepped_elems and the result in update.status.
void Engine::Impl::RunUpdate(optim::AdamStepArgs args) {
  float* acc = reinterpret_cast<float*>(accum.data());
  swap::StepIo io;
  io.params = new_params.data();
  io.params_dtype = param_type;
  io.grads = acc;
  io.on_sub_group = [&](int64_t k) {
    const int64_t begin = optimizer->sub_group_begin(k), n = optimizer->sub_group_elems(k);
    std::memset(acc + begin, 0, static_cast<size_t>(n) * sizeof(float));
    std::lock_guard<std::mutex> lock(update.mu);
    update.stepped_elems = begin + n;
    update.cv.notify_all();
    return Status::Ok();
  };
  Status s = optimizer->Step(*adam, args, io);
  std::lock_guard<std::mutex> lock(update.mu);
  update.done = true;
  update.status = std::move(s);
  update.cv.notify_all();
}

// Starts the optimizer's walk over the sub-groups on the worker thread:
// Adam on the accumulated gradient, new parameters into new_params, and
// the consumed gradient zeroed for the next cycle. Every block goes stale.
Status Engine::Impl::StartUpdate(const optim::AdamStepArgs& args) {
  for (BlockState& b : blocks) b.stale = true;
  {
    std::lock_guard<std::mutex> lock(update.mu);
    update.stepped_elems = 0;
    update.done = false;
    update.status = Status::Ok();
  }
  update_active = true;
  try {
    update.worker = std::thread(&Impl::RunUpdate, this, args);
  } catch (const std::system_error& e) {
    // No thread: nothing was stepped, the homes hold the current parameters.
    update_active = false;
    for (BlockState& b : blocks) b.stale = false;
    return Status::ResourceExhausted(std::string("engine: cannot start the optimizer update's thread: ") + e.what());
  }
  return Status::Ok();
}

// Brings block b's home tier up to date with the update in flight: once the
// worker has stepped the block's shard range, its new parameters are
// written home. `wait`: block until then; otherwise returns false when the
// worker is not there yet. A failed update is returned as its error.
StatusOr<bool> Engine::Impl::RefreshHome(BlockId b, bool wait) {
  BlockState& st = blocks[static_cast<size_t>(b)];
  if (!st.stale) return true;
  const zero3::BlockLayout& l = layout(b);
  const int64_t need = l.rank_offset + l.shard_numel;
  {
    const auto t0 = Clock::now();
    std::unique_lock<std::mutex> lock(update.mu);
    auto ready = [&] { return update.done || update.stepped_elems >= need; };
    if (!wait && !ready()) return false;
    update.cv.wait(lock, ready);
    counters.optimizer_ns += NanosSince(t0);
    if (update.stepped_elems < need) {
      return update.status.ok() ? Status::Internal("engine: the optimizer update ended early") : update.status;
    }
  }
  const char* src = new_params.data() + l.rank_offset * param_es;
  const size_t bytes = static_cast<size_t>(l.shard_numel * param_es);
  switch (config.zero.offload_param.device) {
    case OffloadDevice::kNvme:
      ZINF_RETURN_IF_ERROR(param_swapper->Store(st.shard_id, src));
      break;
    case OffloadDevice::kCpu:
      std::memcpy(param_home.data() + l.rank_offset * param_es, src, bytes);
      break;
    case OffloadDevice::kNone:
      // Stream order puts the copy before any fetch from the home; FinishUpdate
      // synchronises before new_params is written again.
      ZINF_RETURN_IF_ERROR(stream->CopyAsync(static_cast<char*>(param_home_device) + l.rank_offset * param_es, src,
                                             bytes, CopyDirection::kHostToDevice));
      counters.h2d_bytes += static_cast<int64_t>(bytes);
      break;
  }
  st.stale = false;
  return true;
}

// Waits for the worker, if one runs, and takes its result into
// update_failed (the worker's error, or OK).
void Engine::Impl::JoinWorker() {
  if (!update.worker.joinable()) return;
  const auto t0 = Clock::now();
  update.worker.join();
  counters.optimizer_ns += NanosSince(t0);
  std::lock_guard<std::mutex> lock(update.mu);
  if (update_failed.ok()) update_failed = update.status;
}

// Waits for the update in flight, writes home the blocks no fetch has
// refreshed, and returns the update's error. A no-op when none runs.
//
// Errors are sticky (update_failed): a failed update left the state partly
// stepped and the blocks it did not reach stale, and a failed write-home
// left some homes old, so every later fetch of such a block, step and save
// fails with the error instead of training on a mixed model, until
// LoadCheckpoint replaces the state.
Status Engine::Impl::FinishUpdate() {
  if (!update_active) return update_failed;
  JoinWorker();
  Status s = update_failed;
  for (BlockId b = 0; s.ok() && b < static_cast<BlockId>(blocks.size()); ++b) {
    s = RefreshHome(b, /*wait=*/true).status();
  }
  if (s.ok() && param_swapper) s = param_swapper->Flush();
  // Copies out of new_params must be done before the next update rewrites it.
  Status sync = stream->Synchronize();
  if (s.ok()) s = sync;
  update_active = false;
  if (update_failed.ok()) update_failed = s;
  return s;
}

// The working parameters of the whole shard from fp32 master weights, in
// new_params and at their home tier.
Status Engine::Impl::WriteHomeFromMaster(const float* master) {
  const int64_t total = partitioner->total_shard_numel();
  if (param_type == ElementType::kF32) {
    std::memcpy(new_params.data(), master, static_cast<size_t>(total * 4));
  } else {
    ZINF_RETURN_IF_ERROR(optim::CastFromF32(*threads, isa, master, param_type, new_params.data(), total));
  }
  return WriteHome(new_params.data());
}

Status Engine::Impl::Commit() {
  if (committed) return Status::Ok();
  std::string missing;
  for (size_t b = 0; b < blocks.size(); ++b) {
    if (!blocks[b].params_set) missing += (missing.empty() ? "" : ", ") + specs[b].name;
  }
  if (!missing.empty()) {
    return Status::FailedPrecondition("engine: SetParameters was not called for block(s) " + missing);
  }
  ZINF_RETURN_IF_ERROR(optimizer->Initialize(init_master.data()));
  ZINF_RETURN_IF_ERROR(WriteHomeFromMaster(init_master.data()));
  std::vector<float>().swap(init_master);
  committed = true;
  return Status::Ok();
}

Status Engine::Impl::Fetch(BlockId b) {
  BlockState& st = blocks[static_cast<size_t>(b)];
  const zero3::BlockLayout& l = layout(b);
  ZINF_ASSIGN_OR_RETURN(bool current, RefreshHome(b, /*wait=*/true));
  (void)current;
  if (st.full == nullptr) {
    ZINF_ASSIGN_OR_RETURN(st.full, device->Allocate(static_cast<size_t>(l.padded_numel * param_es)));
  }
  const int rank = partitioner->rank();
  char* dst = static_cast<char*>(st.full) + rank * l.shard_numel * param_es;
  const size_t shard_bytes = static_cast<size_t>(l.shard_numel * param_es);
  switch (config.zero.offload_param.device) {
    case OffloadDevice::kNvme: {
      const auto t0 = Clock::now();
      ZINF_ASSIGN_OR_RETURN(char* src, param_swapper->Acquire(st.shard_id));
      counters.nvme_wait_ns += NanosSince(t0);
      Status s = stream->CopyAsync(dst, src, shard_bytes, CopyDirection::kHostToDevice);
      if (s.ok()) s = stream->Synchronize();  // the swapper's buffer is reused after Release
      Status r = param_swapper->Release(st.shard_id, /*dirty=*/false);
      ZINF_RETURN_IF_ERROR(s);
      ZINF_RETURN_IF_ERROR(r);
      counters.h2d_bytes += static_cast<int64_t>(shard_bytes);
      break;
    }
    case OffloadDevice::kCpu:
      ZINF_RETURN_IF_ERROR(stream->CopyAsync(dst, param_home.data() + l.rank_offset * param_es, shard_bytes,
                                             CopyDirection::kHostToDevice));
      counters.h2d_bytes += static_cast<int64_t>(shard_bytes);
      break;
    case OffloadDevice::kNone:
      ZINF_RETURN_IF_ERROR(stream->CopyAsync(dst, static_cast<char*>(param_home_device) + l.rank_offset * param_es,
                                             shard_bytes, CopyDirection::kDeviceToDevice));
      break;
  }
  const auto t1 = Clock::now();
  ZINF_RETURN_IF_ERROR(device_comm->AllGather(dst, st.full, l.shard_numel, param_type, stream.get())
                           .WithContext("all-gather of block '" + specs[static_cast<size_t>(b)].name + "'"));
  counters.allgather_ns += NanosSince(t1);
  counters.allgather_bytes += l.padded_numel * param_es;
  ZINF_ASSIGN_OR_RETURN(st.ready, stream->Record());
  ++counters.fetches;
  if (!st.persistent) {
    counters.live_elems += l.padded_numel;
    counters.peak_live_elems = std::max(counters.peak_live_elems, counters.live_elems);
  }
  return Status::Ok();
}

Status Engine::Impl::Evict(BlockId b) {
  BlockState& st = blocks[static_cast<size_t>(b)];
  if (st.full == nullptr) return Status::Ok();
  // Without an event (a fetch that failed after queueing its copies) the
  // whole stream is drained: nothing may still write into st.full.
  Status s = st.ready ? st.ready->Synchronize() : stream->Synchronize();
  st.ready.reset();
  device->Free(st.full);
  st.full = nullptr;
  st.prefetched = false;
  if (!st.persistent) counters.live_elems -= layout(b).padded_numel;
  ++counters.evictions;
  return s;
}

// Frees released, non-persistent gathered blocks, farthest next use first,
// until `need` more elements fit under max_live. A prefetch (demand false)
// only evicts blocks used later than the candidate and gives up (false)
// rather than exceed the limit; a demanded fetch goes ahead past the limit
// when every gathered block is held (counted as an overrun).
bool Engine::Impl::MakeRoom(int64_t need, bool demand, int64_t candidate_distance) {
  while (counters.live_elems + need > max_live_elems) {
    BlockId victim = -1;
    int64_t farthest = -1;
    for (BlockId b = 0; b < static_cast<BlockId>(blocks.size()); ++b) {
      const BlockState& st = blocks[static_cast<size_t>(b)];
      if (st.full == nullptr || st.persistent || st.holds > 0) continue;
      const int64_t d = coordinator->NextUseDistance(b);
      if (!demand && d <= candidate_distance) continue;
      if (d > farthest) {
        farthest = d;
        victim = b;
      }
    }
    if (victim < 0) {
      if (demand) ++counters.live_limit_overruns;
      return demand;
    }
    Evict(victim).IgnoreError();  // a failed gather's error was returned when it was issued
  }
  return true;
}

void Engine::Impl::IssuePrefetch() {
  if (!tracing || !coordinator->replaying()) return;
  const int64_t bucket = coordinator->options().prefetch_bucket_elems;
  if (bucket <= 0) return;  // stage3_prefetch_bucket_size 0: no prefetching, as in DeepSpeed
  auto gathered = [&](int b) { return blocks[static_cast<size_t>(b)].full != nullptr; };
  // NVMe reads run ahead over twice the bucket: they are asynchronous and
  // cheap to hold in the swapper's buffers.
  // A block the optimizer update has not reached yet, and every block after
  // it, waits for a later Acquire: its home still holds the old parameters.
  // Except for the all-gathers with several ranks: each rank must issue the
  // same ones in the same order, and the update's progress differs between
  // ranks, so there the prefetch waits for the update instead. (On error
  // paths, a failed fetch or update on one rank, the ranks can still part.)
  auto current = [&](int b, bool wait) {
    StatusOr<bool> r = RefreshHome(b, wait);
    return r.ok() && *r;  // an error surfaces in the demanded fetch
  };
  const bool gather_waits = partitioner->world_size() > 1;
  if (param_swapper) {
    for (int b : coordinator->Upcoming(2 * bucket, gathered)) {
      if (!current(b, /*wait=*/false)) break;
      Status s = param_swapper->Prefetch(blocks[static_cast<size_t>(b)].shard_id);
      if (!s.ok()) break;  // every buffer busy: the next Acquire reads it
    }
  }
  for (int b : coordinator->Upcoming(bucket, gathered)) {
    if (!current(b, gather_waits)) break;
    BlockState& st = blocks[static_cast<size_t>(b)];
    const int64_t need = st.persistent ? 0 : layout(b).padded_numel;
    if (!MakeRoom(need, /*demand=*/false, coordinator->NextUseDistance(b))) break;
    if (!Fetch(b).ok()) {
      Evict(b).IgnoreError();  // the demanded fetch will retry and report
      break;
    }
    st.prefetched = true;
    ++counters.prefetches;
  }
}

void Engine::Impl::DropAllGathers() {
  for (BlockId b = 0; b < static_cast<BlockId>(blocks.size()); ++b) Evict(b).IgnoreError();
}

// ---------------------------------------------------------------------------

Engine::Engine(std::unique_ptr<Impl> impl) : impl_(std::move(impl)) {}
Engine::~Engine() = default;

StatusOr<std::unique_ptr<Engine>> Engine::Create(const Config& config, const std::vector<BlockSpec>& blocks,
                                                 const EngineOptions& options) {
  auto impl = std::make_unique<Impl>();
  ZINF_RETURN_IF_ERROR(impl->Init(config, blocks, options).WithContext("engine"));
  return std::unique_ptr<Engine>(new Engine(std::move(impl)));
}

Status Engine::SetParameters(BlockId block, const std::vector<const float*>& values) {
  Impl& m = *impl_;
  ZINF_RETURN_IF_ERROR(m.CheckBlock(block));
  if (m.committed) return Status::FailedPrecondition("engine: SetParameters after the first Acquire");
  const zero3::BlockLayout& l = m.layout(block);
  if (values.size() != l.tensors.size()) {
    return Status::InvalidArgument("engine: block '" + m.specs[static_cast<size_t>(block)].name + "' has " +
                                   std::to_string(l.tensors.size()) + " tensors, got " +
                                   std::to_string(values.size()) + " arrays");
  }
  m.partitioner->ExtractShard(block, values, m.init_master.data() + l.rank_offset);
  m.blocks[static_cast<size_t>(block)].params_set = true;
  return Status::Ok();
}

StatusOr<std::vector<void*>> Engine::Acquire(BlockId block) {
  Impl& m = *impl_;
  ZINF_RETURN_IF_ERROR(m.CheckBlock(block));
  ZINF_RETURN_IF_ERROR(m.Commit());
  if (m.tracing) m.coordinator->OnAcquire(block);
  m.counters.order_changes = m.coordinator->order_changes();
  Impl::BlockState& st = m.blocks[static_cast<size_t>(block)];
  if (st.full != nullptr) {
    if (st.prefetched) {
      ++m.counters.prefetch_hits;
    } else {
      ++m.counters.resident_hits;
    }
  } else {
    m.MakeRoom(st.persistent ? 0 : m.layout(block).padded_numel, /*demand=*/true, 0);
    Status s = m.Fetch(block);
    if (!s.ok()) {
      m.Evict(block).IgnoreError();
      return s;
    }
  }
  st.prefetched = false;
  ++st.holds;
  m.IssuePrefetch();
  const auto t0 = Clock::now();
  Status s = st.ready->Synchronize();
  m.counters.fetch_wait_ns += NanosSince(t0);
  if (!s.ok()) {
    --st.holds;
    return s.WithContext("gather of block '" + m.specs[static_cast<size_t>(block)].name + "'");
  }
  std::vector<void*> ptrs;
  for (const zero3::TensorLayout& t : m.layout(block).tensors) {
    ptrs.push_back(static_cast<char*>(st.full) + t.offset * m.param_es);
  }
  return ptrs;
}

Status Engine::Release(BlockId block) {
  Impl& m = *impl_;
  ZINF_RETURN_IF_ERROR(m.CheckBlock(block));
  Impl::BlockState& st = m.blocks[static_cast<size_t>(block)];
  if (st.holds == 0) {
    return Status::FailedPrecondition("engine: Release of block '" + m.specs[static_cast<size_t>(block)].name +
                                      "' that is not acquired");
  }
  if (--st.holds > 0 || st.persistent) return Status::Ok();
  if (m.coordinator->KeepOnRelease(block)) return Status::Ok();
  return m.Evict(block);
}

Status Engine::ReduceGradients(BlockId block, const std::vector<const void*>& grads) {
  Impl& m = *impl_;
  ZINF_RETURN_IF_ERROR(m.CheckBlock(block));
  ZINF_RETURN_IF_ERROR(m.Commit());
  ZINF_RETURN_IF_ERROR(m.FinishUpdate());  // the worker reads and zeroes the accumulator
  m.grads_pending = true;
  const zero3::BlockLayout& l = m.layout(block);
  const std::string& name = m.specs[static_cast<size_t>(block)].name;
  if (grads.size() != l.tensors.size()) {
    return Status::InvalidArgument("engine: block '" + name + "' has " + std::to_string(l.tensors.size()) +
                                   " tensors, got " + std::to_string(grads.size()) + " gradients");
  }
  const int64_t es = m.grad_es;
  auto* flat = static_cast<char*>(m.grad_flat);
  for (size_t t = 0; t < grads.size(); ++t) {
    ZINF_RETURN_IF_ERROR(m.stream->CopyAsync(flat + l.tensors[t].offset * es, grads[t],
                                             static_cast<size_t>(l.tensors[t].numel * es),
                                             CopyDirection::kDeviceToDevice));
  }
  if (l.padded_numel > l.numel) {
    ZINF_RETURN_IF_ERROR(
        m.stream->MemsetAsync(flat + l.numel * es, 0, static_cast<size_t>((l.padded_numel - l.numel) * es)));
  }
  const auto t0 = Clock::now();
  const void* shard = flat;
  if (m.grad_shard != nullptr) {
    ZINF_RETURN_IF_ERROR(m.device_comm
                             ->ReduceScatter(flat, m.grad_shard, l.shard_numel, m.options.grad_type,
                                             comm::ReduceOp::kSum, m.stream.get())
                             .WithContext("reduce-scatter of block '" + name + "'"));
    shard = m.grad_shard;
  }
  char* host = m.staging.data();
  ZINF_RETURN_IF_ERROR(m.stream->CopyAsync(host, shard, static_cast<size_t>(l.shard_numel * es),
                                           CopyDirection::kDeviceToHost));
  ZINF_RETURN_IF_ERROR(m.stream->Synchronize());
  m.counters.reduce_scatter_ns += NanosSince(t0);
  m.counters.reduce_scatter_bytes += l.padded_numel * es;
  m.counters.d2h_bytes += l.shard_numel * es;
  const float* g = reinterpret_cast<const float*>(host);
  if (m.options.grad_type != ElementType::kF32) {
    float* g32 = reinterpret_cast<float*>(host + m.partitioner->max_shard_numel() * 4);
    ZINF_RETURN_IF_ERROR(
        optim::CastToF32(*m.threads, m.isa, host, m.options.grad_type, g32, l.shard_numel));
    g = g32;
  }
  const float scale =
      1.0f / static_cast<float>(m.partitioner->world_size() * m.config.gradient_accumulation_steps);
  float* acc = reinterpret_cast<float*>(m.accum.data()) + l.rank_offset;
  ZINF_RETURN_IF_ERROR(optim::AddScaled(*m.threads, g, scale, acc, l.shard_numel));
  // The last micro-batch before an optimizer step: its first sub-groups'
  // state is read now, under the rest of the backward pass, not after it.
  // Best effort: the gradient is already accumulated, so an error here is
  // left to the step, which reads again and reports it.
  if ((m.micro_steps + 1) % m.config.gradient_accumulation_steps == 0 && !m.optimizer->PrefetchStep().ok()) {
    m.optimizer->DropPrefetch();
  }
  return Status::Ok();
}

StatusOr<StepResult> Engine::Step() {
  Impl& m = *impl_;
  for (size_t b = 0; b < m.blocks.size(); ++b) {
    if (m.blocks[b].holds > 0) {
      return Status::FailedPrecondition("engine: Step while block '" + m.specs[b].name + "' is acquired");
    }
  }
  ZINF_RETURN_IF_ERROR(m.Commit());
  ZINF_RETURN_IF_ERROR(m.FinishUpdate());
  StepResult r;
  ++m.micro_steps;
  r.loss_scale = m.scaler->scale();
  if (m.micro_steps % m.config.gradient_accumulation_steps != 0) return r;
  r.boundary = true;
  const auto t0 = Clock::now();
  const int64_t total = m.partitioner->total_shard_numel();
  float* acc = reinterpret_cast<float*>(m.accum.data());
  ZINF_ASSIGN_OR_RETURN(double sum_squares, optim::SumSquares(*m.threads, m.isa, acc, ElementType::kF32, total));
  ZINF_RETURN_IF_ERROR(
      m.host_comm->AllReduce(&sum_squares, &sum_squares, 1, ElementType::kF64, comm::ReduceOp::kSum, nullptr));
  optim::GradNormAccumulator norm;
  norm.Add(sum_squares);
  r.grad_norm = norm.norm();
  const bool overflow = norm.has_inf_or_nan();
  if (m.config.fp16.enabled) ZINF_RETURN_IF_ERROR(m.scaler->Update(overflow));
  if (!overflow) {
    const double loss_scale = m.config.fp16.enabled ? r.loss_scale : 1.0;
    optim::AdamStepArgs args;
    args.step = m.applied_steps + 1;
    args.lr = m.schedule->lr();
    args.grad_scale = optim::GradScaleFactor(r.grad_norm, loss_scale, m.config.gradient_clipping);
    r.lr = args.lr;
    if (m.optimizer->store() != nullptr) {
      // Master, m and v read and written; the gradient comes from RAM.
      m.counters.optimizer_nvme_bytes += total * 4 * (3 + 3);
    }
    m.DropAllGathers();  // every gathered copy is stale now
    // The update runs under the next forward pass; it zeroes the gradient.
    ZINF_RETURN_IF_ERROR(m.StartUpdate(args));
    ++m.applied_steps;
    m.schedule->Step();
    r.applied = true;
  } else {
    m.DropAllGathers();
    std::memset(acc, 0, static_cast<size_t>(total * 4));
  }
  m.grads_pending = false;
  m.coordinator->OnStepEnd();
  m.counters.order_changes = m.coordinator->order_changes();
  m.counters.optimizer_ns += NanosSince(t0);
  r.loss_scale = m.scaler->scale();
  return r;
}

Status Engine::WaitForUpdate() { return impl_->FinishUpdate(); }

namespace {

// Every EngineCounters field that only grows (the rest are levels).
constexpr int64_t EngineCounters::*kCumulativeCounters[] = {
    &EngineCounters::nvme_read_bytes,   &EngineCounters::nvme_write_bytes,  &EngineCounters::optimizer_nvme_bytes,
    &EngineCounters::h2d_bytes,         &EngineCounters::d2h_bytes,         &EngineCounters::allgather_bytes,
    &EngineCounters::reduce_scatter_bytes, &EngineCounters::nvme_wait_ns,   &EngineCounters::fetch_wait_ns,
    &EngineCounters::allgather_ns,      &EngineCounters::reduce_scatter_ns, &EngineCounters::optimizer_ns,
    &EngineCounters::fetches,           &EngineCounters::prefetches,        &EngineCounters::prefetch_hits,
    &EngineCounters::resident_hits,     &EngineCounters::evictions,         &EngineCounters::live_limit_overruns,
};

}  // namespace

EngineCounters CountersSince(const EngineCounters& before, const EngineCounters& after) {
  EngineCounters d = after;
  for (auto field : kCumulativeCounters) d.*field -= before.*field;
  return d;
}

void AddCounters(EngineCounters& total, const EngineCounters& delta) {
  const int64_t peak = std::max(total.peak_live_elems, delta.peak_live_elems);
  EngineCounters sum = delta;
  for (auto field : kCumulativeCounters) sum.*field += total.*field;
  sum.peak_live_elems = peak;
  total = sum;
}

Status Engine::GetMasterParameters(BlockId block, const std::vector<float*>& out) {
  Impl& m = *impl_;
  ZINF_RETURN_IF_ERROR(m.CheckBlock(block));
  ZINF_RETURN_IF_ERROR(m.Commit());
  ZINF_RETURN_IF_ERROR(m.FinishUpdate());
  const zero3::BlockLayout& l = m.layout(block);
  if (out.size() != l.tensors.size()) return Status::InvalidArgument("engine: one output array per tensor");
  std::vector<float> shard(static_cast<size_t>(l.shard_numel));
  ZINF_RETURN_IF_ERROR(m.optimizer->ReadMaster(l.rank_offset, l.shard_numel, shard.data()));
  std::vector<float> flat(static_cast<size_t>(l.padded_numel));
  ZINF_RETURN_IF_ERROR(
      m.host_comm->AllGather(shard.data(), flat.data(), l.shard_numel, ElementType::kF32, nullptr));
  m.partitioner->Unflatten(block, flat.data(), out);
  return Status::Ok();
}

// ---------------------------------------------------------------------------
// Checkpoints.

namespace {

constexpr char kEngineKeyPrefix[] = "engine.";

// A double as a hexadecimal float: exact through a string and back.
std::string ExactDouble(double v) {
  char buf[64];
  std::snprintf(buf, sizeof(buf), "%a", v);
  return buf;
}

}  // namespace

Status Engine::Impl::CheckpointPreconditions(const char* what) const {
  for (size_t b = 0; b < blocks.size(); ++b) {
    if (blocks[b].holds > 0) {
      return Status::FailedPrecondition(std::string("engine: ") + what + " while block '" + specs[b].name +
                                        "' is acquired");
    }
  }
  if (micro_steps % config.gradient_accumulation_steps != 0 || grads_pending) {
    return Status::FailedPrecondition(std::string("engine: ") + what + " in the middle of a gradient-accumulation cycle (" +
                                      std::to_string(micro_steps % config.gradient_accumulation_steps) + " of " +
                                      std::to_string(config.gradient_accumulation_steps) +
                                      " micro-batches done); checkpoints are taken between optimizer steps");
  }
  return Status::Ok();
}

Status Engine::Impl::PrepareCheckpointIo() {
  if (owned_checkpoint_io && !owned_checkpoint_io->sticky_error().ok()) {
    // A failed save (a full disk, an I/O error) left the previous checkpoint
    // and `latest` as they were, so its sticky error must not refuse every
    // later save of the run: the next one gets a fresh engine.
    owned_checkpoint_io.reset();
    checkpoint_io = nullptr;
  }
  if (checkpoint_io != nullptr) return Status::Ok();
  if (options.io_engine != nullptr) {
    checkpoint_io = options.io_engine;
  } else {
    aio::IoEngineOptions io_options = aio::FromAioConfig(config.aio);
    io_options.direct_io = aio::DirectIo::kPrefer;
    ZINF_ASSIGN_OR_RETURN(owned_checkpoint_io, aio::CreateIoEngine(io_options));
    checkpoint_io = owned_checkpoint_io.get();
  }
  // Pieces of a swap blob are whole stripes: the buffers hold at least one.
  int64_t bytes = 1 << 20, alignment = 4096;
  if (swap::SwapStore* store = optimizer->store()) {
    bytes = std::max(bytes, store->stripe_bytes());
    alignment = std::max(alignment, store->alignment_bytes());
  }
  aio::PinnedPoolOptions po;
  po.buffer_count = 2;
  po.buffer_bytes = bytes;
  po.alignment_bytes = alignment;
  po.pin = false;
  po.huge_pages = false;
  po.name = "checkpoint";
  ZINF_ASSIGN_OR_RETURN(checkpoint_pool, aio::PinnedPool::Create(po));
  return Status::Ok();
}

// What must agree between a checkpoint and the engine loading it, and the
// counters that continue from it.
std::map<std::string, std::string> Engine::Impl::EngineMetadata() const {
  std::string layout;
  for (const BlockSpec& b : specs) {
    layout += b.name + "{";
    for (const TensorSpec& t : b.tensors) {
      layout += t.name + "[";
      for (int64_t d : t.shape) layout += std::to_string(d) + ",";
      layout += "]";
    }
    layout += "}";
  }
  char crc[16];
  std::snprintf(crc, sizeof(crc), "%08x", Crc32c(layout.data(), layout.size()));
  const optim::LossScaler::State& ls = scaler->state();
  return {
      {"engine.format", "1"},
      {"engine.world_size", std::to_string(partitioner->world_size())},
      {"engine.rank", std::to_string(partitioner->rank())},
      {"engine.blocks", std::to_string(specs.size())},
      {"engine.layout_crc32c", crc},
      {"engine.shard_elems", std::to_string(partitioner->total_shard_numel())},
      {"engine.sub_group_elems", std::to_string(optimizer->sub_group_elems(0))},
      {"engine.param_type", std::string(ElementTypeName(param_type))},
      {"engine.applied_steps", std::to_string(applied_steps)},
      {"engine.micro_steps", std::to_string(micro_steps)},
      {"engine.lr_iteration", std::to_string(schedule->last_batch_iteration())},
      {"engine.loss_scale", ExactDouble(ls.scale)},
      {"engine.scaler_iteration", std::to_string(ls.iteration)},
      {"engine.scaler_last_overflow", std::to_string(ls.last_overflow_iteration)},
      {"engine.scaler_hysteresis_left", std::to_string(ls.hysteresis_left)},
  };
}

Status Engine::SaveCheckpoint(const std::string& dir, const std::map<std::string, std::string>& metadata,
                              bool replace_orphan) {
  Impl& m = *impl_;
  ZINF_RETURN_IF_ERROR(m.CheckpointPreconditions("SaveCheckpoint"));
  ZINF_RETURN_IF_ERROR(m.Commit());
  ZINF_RETURN_IF_ERROR(m.FinishUpdate());
  std::map<std::string, std::string> all = m.EngineMetadata();
  for (const auto& [key, value] : metadata) {
    if (key.rfind(kEngineKeyPrefix, 0) == 0) {
      return Status::InvalidArgument("engine: checkpoint metadata key '" + key + "' uses the reserved prefix 'engine.'");
    }
    all[key] = value;
  }
  ZINF_RETURN_IF_ERROR(m.PrepareCheckpointIo());
  // Any prefetched parameter reads finish first: the store is quiet.
  ZINF_RETURN_IF_ERROR(m.stream->Synchronize());
  swap::SaveOptions so;
  so.replace_orphan = replace_orphan;
  return swap::SaveCheckpoint(*m.checkpoint_io, *m.checkpoint_pool, dir, all, m.optimizer->CheckpointBlobs(), so)
      .WithContext("saving checkpoint " + dir);
}

StatusOr<std::map<std::string, std::string>> Engine::LoadCheckpoint(const std::string& dir) {
  Impl& m = *impl_;
  ZINF_RETURN_IF_ERROR(m.CheckpointPreconditions("LoadCheckpoint"));
  ZINF_RETURN_IF_ERROR(m.PrepareCheckpointIo());
  ZINF_ASSIGN_OR_RETURN(swap::CheckpointReader reader,
                        swap::CheckpointReader::Open(*m.checkpoint_io, *m.checkpoint_pool, dir));
  const std::map<std::string, std::string>& md = reader.metadata();
  auto get = [&](const std::string& key) -> StatusOr<std::string> {
    auto it = md.find(key);
    if (it == md.end()) return Status::Corruption("checkpoint " + dir + ": manifest lacks '" + key + "'");
    return it->second;
  };
  auto get_int = [&](const std::string& key) -> StatusOr<int64_t> {
    ZINF_ASSIGN_OR_RETURN(std::string v, get(key));
    char* end = nullptr;
    errno = 0;
    const long long x = std::strtoll(v.c_str(), &end, 10);
    if (v.empty() || *end != '\0' || errno != 0) {
      return Status::Corruption("checkpoint " + dir + ": '" + key + "' is not an integer: '" + v + "'");
    }
    return static_cast<int64_t>(x);
  };
  // Everything that fixes the layout of the saved state must match.
  const std::map<std::string, std::string> mine = m.EngineMetadata();
  for (const char* key : {"engine.format", "engine.world_size", "engine.rank", "engine.blocks", "engine.layout_crc32c",
                          "engine.shard_elems", "engine.sub_group_elems"}) {
    ZINF_ASSIGN_OR_RETURN(std::string theirs, get(key));
    if (theirs != mine.at(key)) {
      return Status::FailedPrecondition("checkpoint " + dir + " does not fit this run: " + key + " is " + theirs +
                                        " there and " + mine.at(key) + " here" +
                                        (std::string(key) == "engine.sub_group_elems"
                                             ? " (zero_optimization.sub_group_size must match the saving run)"
                                             : std::string(key) == "engine.world_size"
                                                   ? " (resume with as many ranks as saved it)"
                                                   : ""));
    }
  }
  ZINF_ASSIGN_OR_RETURN(int64_t applied, get_int("engine.applied_steps"));
  ZINF_ASSIGN_OR_RETURN(int64_t micro, get_int("engine.micro_steps"));
  ZINF_ASSIGN_OR_RETURN(int64_t lr_iteration, get_int("engine.lr_iteration"));
  optim::LossScaler::State ls;
  {
    ZINF_ASSIGN_OR_RETURN(std::string scale, get("engine.loss_scale"));
    char* end = nullptr;
    ls.scale = std::strtod(scale.c_str(), &end);
    if (scale.empty() || *end != '\0' || !(ls.scale > 0)) {
      return Status::Corruption("checkpoint " + dir + ": bad engine.loss_scale '" + scale + "'");
    }
    ZINF_ASSIGN_OR_RETURN(ls.iteration, get_int("engine.scaler_iteration"));
    ZINF_ASSIGN_OR_RETURN(ls.last_overflow_iteration, get_int("engine.scaler_last_overflow"));
    ZINF_ASSIGN_OR_RETURN(int64_t hysteresis, get_int("engine.scaler_hysteresis_left"));
    ls.hysteresis_left = static_cast<int>(hysteresis);
  }

  // The update in flight (or a failed one, whose error was reported by the
  // call that met it) is abandoned: the checkpoint replaces the state and
  // every home is rewritten below, so nothing is refreshed now.
  m.JoinWorker();
  m.update_active = false;

  // Verify every blob, then read them into the optimizer state.
  if (!m.committed) {
    // Nothing to initialise from: the checkpoint is the initial state. The
    // gradient arrays start at zero; master, m and v are overwritten below.
    ZINF_RETURN_IF_ERROR(m.optimizer->Initialize(m.init_master.data()));
  }
  m.DropAllGathers();
  ZINF_RETURN_IF_ERROR(m.stream->Synchronize());
  m.optimizer->DropPrefetch();  // its reads would be of the state replaced here
  // Restore's errors name the checkpoint directory already.
  ZINF_RETURN_IF_ERROR(reader.Restore(m.optimizer->CheckpointBlobs()));

  // The working parameters at their home tier follow from the master weights.
  const int64_t total = m.partitioner->total_shard_numel();
  std::vector<float> master(static_cast<size_t>(total));
  ZINF_RETURN_IF_ERROR(m.optimizer->ReadState(master.data(), nullptr, nullptr, nullptr));
  ZINF_RETURN_IF_ERROR(m.WriteHomeFromMaster(master.data()));
  std::memset(m.accum.data(), 0, static_cast<size_t>(total * 4));
  for (Impl::BlockState& b : m.blocks) {
    b.params_set = true;
    b.stale = false;
  }
  m.update_failed = Status::Ok();
  std::vector<float>().swap(m.init_master);
  m.committed = true;
  m.applied_steps = applied;
  m.micro_steps = micro;
  m.schedule->set_last_batch_iteration(lr_iteration);
  m.scaler->Restore(ls);

  std::map<std::string, std::string> user;
  for (const auto& [key, value] : md) {
    if (key.rfind(kEngineKeyPrefix, 0) != 0) user[key] = value;
  }
  return user;
}

void Engine::SetTracing(bool on) { impl_->tracing = on; }

int Engine::num_blocks() const { return impl_->partitioner->num_blocks(); }
const BlockSpec& Engine::block(BlockId id) const { return impl_->specs[static_cast<size_t>(id)]; }
ElementType Engine::param_type() const { return impl_->param_type; }
ElementType Engine::grad_type() const { return impl_->options.grad_type; }
int Engine::rank() const { return impl_->partitioner->rank(); }
int Engine::world_size() const { return impl_->partitioner->world_size(); }
double Engine::loss_scale() const { return impl_->scaler->scale(); }
int64_t Engine::optimizer_steps() const { return impl_->applied_steps; }
Device& Engine::device() { return *impl_->device; }
EngineCounters Engine::counters() const {
  EngineCounters c = impl_->counters;
  if (impl_->param_swapper) {
    // Prefetched reads included: the swapper counts every byte it moves.
    c.nvme_read_bytes = impl_->param_swapper->stats().read_bytes;
    c.nvme_write_bytes = impl_->param_swapper->stats().write_bytes;
  }
  return c;
}

}  // namespace zinf
