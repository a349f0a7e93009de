// Building an Engine (engine_impl.h): the device and communicators, the
// BufferPlan (which also checks the config), the partition, the parameters'
// home tier, the optimizer state, the host and device buffers, and the
// optimizer pieces. Every window is allocated as the plan says, so `zinf
// plan` and `config-check` print what is allocated here: the device holds a
// gathered block per live block (allocated at fetch, freed at eviction:
// their number is bounded by max_live, not by the model) plus one gradient
// flat buffer and one gradient shard buffer of the largest block; pinned RAM
// holds the fp32 gradient accumulator (or, with the optimizer on NVMe, the
// gradient window into its store), the new-parameter buffer the optimizer
// writes into (none beside a cpu home, which it writes in place), and a
// staging buffer for gradient shards. A forward-only engine has only the
// home, the gathered blocks and two one-shard windows (PlanForwardOnly).
#include <algorithm>
#include <cstring>

#include "comm/bootstrap.h"
#include "core/log.h"
#include "optim/isa.h"
#include "zero3/engine_impl.h"

namespace zinf {

Engine::Impl::~Impl() {
  update.Join().IgnoreError();  // the worker reads the optimizer state and the windows below
  // Copies into the device home and the gathered buffers, and the ring's
  // hand-backs (RefreshHome), finish before those buffers go.
  if (stream) stream->Synchronize().IgnoreError();
  gathered.reset();
  home.reset();
  if (device != nullptr) {
    device->Free(grad_flat);
    device->Free(grad_shard);
  }
}

Status Engine::Impl::Init(const Config& cfg, const std::vector<BlockSpec>& block_specs, const EngineOptions& opts) {
  config = cfg;
  options = opts;
  options.hooks = nullptr;  // read here only: the pointee need not outlive Create
  if (opts.hooks != nullptr) hooks = *opts.hooks;
  if (hooks.device != nullptr) options.host_device = false;  // the hooks' device decides
  specs = block_specs;
  // A bad config is reported before a device, MPI or NCCL is brought up.
  ZINF_RETURN_IF_ERROR(zero3::CheckEngineConfig(config, opts.grad_type));
  ZINF_RETURN_IF_ERROR(InitDeviceAndComms());
  ZINF_ASSIGN_OR_RETURN(plan, zero3::MakeBufferPlan(config, specs, host_comm->world_size(), device->kind(),
                                                    opts.grad_type, /*max_held_elems=*/0, opts.forward_only));
  if (host_comm->rank() == 0) {
    for (const std::string& f : plan.fitted) Log("zero3").info("fitted: {}", f);
  }
  param_type = plan.param_type;
  param_es = plan.param_elem_bytes;
  grad_es = plan.grad_elem_bytes;
  ZINF_RETURN_IF_ERROR(InitPartition());
  if (hooks.io_engine != nullptr) {
    io = hooks.io_engine;
  } else if (config.offloads_to_nvme()) {
    aio::IoEngineOptions io_options = aio::FromAioConfig(config.aio);
    io_options.direct_io = aio::DirectIo::kPrefer;
    ZINF_ASSIGN_OR_RETURN(owned_io, aio::CreateIoEngine(io_options));
    io = owned_io.get();
  }
  ZINF_RETURN_IF_ERROR(InitParamHome());
  if (!opts.forward_only) ZINF_RETURN_IF_ERROR(InitOptimizerState());
  ZINF_RETURN_IF_ERROR(InitBuffers());
  return InitOptimizer();
}

Status Engine::Impl::InitDeviceAndComms() {
  const EngineHooks& h = hooks;
  device = h.device;
  if (device == nullptr) {
    DeviceOptions device_options;
    if (options.host_device) device_options.choice = DeviceOptions::Choice::kHost;
    ZINF_ASSIGN_OR_RETURN(owned_device, CreateDevice(device_options));
    device = owned_device.get();
  }
  ZINF_ASSIGN_OR_RETURN(stream, device->CreateStream());
  ZINF_ASSIGN_OR_RETURN(host_comm, comm::HostCommunicator(h.host_communicator, owned_host_comm));
  ZINF_ASSIGN_OR_RETURN(device_comm,
                        comm::DeviceCommunicator(h.device_communicator, *host_comm, device->kind(), owned_device_comm));
  return Status::Ok();
}

Status Engine::Impl::InitPartition() {
  ZINF_ASSIGN_OR_RETURN(zero3::Partitioner p,
                        zero3::Partitioner::Create(specs, host_comm->world_size(), host_comm->rank()));
  partitioner = std::make_unique<zero3::Partitioner>(std::move(p));
  no_decay = partitioner->NoDecayRanges();
  const int nb = partitioner->num_blocks();
  std::vector<int64_t> elems(static_cast<size_t>(nb));
  for (int b = 0; b < nb; ++b) elems[static_cast<size_t>(b)] = layout(b).padded_numel;
  const ZeroConfig& zero = config.zero;
  zero3::PrefetchOptions po;
  po.prefetch_bucket_elems = zero.stage3_prefetch_bucket_size;
  po.max_reuse_distance_elems = zero.stage3_max_reuse_distance;
  coordinator = std::make_unique<zero3::PrefetchCoordinator>(po, elems);
  params_set.assign(static_cast<size_t>(nb), false);
  stale.assign(static_cast<size_t>(nb), false);
  return Status::Ok();
}

Status Engine::Impl::InitParamHome() {
  zero3::ParamHomeOptions ho;
  ho.plan = &plan;
  ho.specs = &specs;
  ho.partitioner = partitioner.get();
  ho.device = device;
  ho.stream = stream.get();
  ho.io = io;
  ho.run_id = options.run_id;
  ho.counters = &counters;
  ZINF_ASSIGN_OR_RETURN(home, zero3::CreateParamHome(ho));

  zero3::GatherCache::Options go;
  go.device = device;
  go.stream = stream.get();
  go.device_comm = device_comm;
  go.partitioner = partitioner.get();
  go.specs = &specs;
  go.home = home.get();
  go.coordinator = coordinator.get();
  go.counters = &counters;
  go.param_type = param_type;
  go.persistent = plan.persistent;
  go.max_live_elems = plan.live_limit_elems;
  go.refresh = [this](BlockId b, bool wait) { return RefreshHome(b, wait); };
  gathered = std::make_unique<zero3::GatherCache>(std::move(go));
  return Status::Ok();
}

Status Engine::Impl::InitOptimizerState() {
  swap::OptimizerSwapperOptions oo = plan.optimizer;
  oo.store.file_prefix += "-r" + std::to_string(host_comm->rank());
  oo.store.run_id = options.run_id;
  if (plan.optimizer_pipeline.buffer_count > 0) {
    ZINF_ASSIGN_OR_RETURN(optim_pool, aio::PinnedPool::Create(plan.optimizer_pipeline));
  }
  auto swapper = swap::OptimizerSwapper::Create(oo, io, optim_pool.get());
  if (!swapper.ok()) {
    if (oo.device != OffloadDevice::kNvme) return swapper.status();
    return swapper.status().WithContext(swap::NvmePathContext("offload_optimizer", oo.store.paths));
  }
  optimizer = std::move(swapper).value();
  return Status::Ok();
}

Status Engine::Impl::InitBuffers() {
  if (plan.grad_accumulator.buffer_count > 0) {
    ZINF_ASSIGN_OR_RETURN(accum, zero3::HostWindow::Create(plan.grad_accumulator));
    std::memset(accum.data(), 0, static_cast<size_t>(plan.total_shard_elems * 4));
  }
  acc_holds.assign(static_cast<size_t>(partitioner->num_blocks()), false);
  if (plan.new_params.buffer_count > 0) {
    ZINF_ASSIGN_OR_RETURN(new_params, zero3::HostWindow::Create(plan.new_params));
  } else if (!plan.new_params_in_home && !(plan.forward_only && param_type == ElementType::kF32)) {
    return Status::Internal("engine: the plan has no new-parameter window and no cpu home to write");
  } else if (plan.new_params_in_home && home->resident() == nullptr) {
    return Status::Internal("engine: the plan writes new parameters into a home that is not in host memory");
  }
  ZINF_ASSIGN_OR_RETURN(staging, zero3::HostWindow::Create(plan.grad_staging));
  // One rank: none (the gradient goes straight to staging).
  if (plan.grad_flat_bytes > 0) {
    ZINF_ASSIGN_OR_RETURN(grad_flat, device->Allocate(static_cast<size_t>(plan.grad_flat_bytes)));
    ZINF_ASSIGN_OR_RETURN(grad_shard, device->Allocate(static_cast<size_t>(plan.grad_shard_bytes)));
  }
  return Status::Ok();
}

Status Engine::Impl::InitOptimizer() {
  optim::ThreadPool::Options to;
  to.num_threads = options.optimizer_threads;
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
  if (options.forward_only) return Status::Ok();  // no gradient: the pool and the lr serve the manifest
  if (plan.grad_window.buffer_count > 0) {
    ZINF_ASSIGN_OR_RETURN(grad_window_pool, aio::PinnedPool::Create(plan.grad_window));
    ZINF_ASSIGN_OR_RETURN(grad_window, swap::GradientWindow::Create(optimizer.get(), grad_window_pool.get(),
                                                                    threads.get(), isa, NormCut()));
  } else {
    norm_squares = std::make_unique<swap::ShardSquares>(partitioner->total_shard_numel(), NormCut());
  }
  return Status::Ok();
}

}  // namespace zinf
