// Engine::Impl: the state of one Engine and the steps its public methods
// (engine.cc, engine_checkpoint.cc) are made of; engine_setup.cc builds it.
// Each job lives in a unit of its own: the parameters' home tier
// (ParamHome), the gathered blocks (GatherCache), the optimizer update on
// its thread (UpdateWorker), the checkpoint manifest (engine_manifest.h).
//
// The update overlaps the next forward pass. Step() computes the global
// gradient norm, then hands the sub-group walk (Adam, the optimizer state's
// NVMe reads and writes) to the UpdateWorker and returns. The shard is laid
// out in block order, which is the forward's order, so the first blocks'
// new parameters are ready first: a block is "stale" until the worker has
// stepped its shard range (it publishes every slice it steps), and the driving thread
// writes its new parameters home (RefreshHome; a cpu home the worker has
// written itself) when a fetch needs it,
// waiting only if the worker has not got that far. The new parameters pass
// through a bounded ring (BufferPlan::new_params), drained in block order,
// that the worker waits on (a whole-shard buffer only when neither the
// parameters nor the optimizer are offloaded; none with the parameters'
// home in pinned RAM, which the worker writes in place); the device home's
// H2D copies out of it hand their space back from the stream. Everything that
// reads or writes the optimizer state or the gradient accumulator (ReduceGradients,
// Step, checkpoints, GetMasterParameters) first waits for the whole update
// (FinishUpdate), which is also where an error from the worker surfaces.
//
// With the optimizer state on NVMe there is no accumulator: ReduceGradients
// adds each block's gradient shard into the optimizer's store through the
// GradientWindow (writes overlapping the next block's backward), and Step
// ends the cycle there (GradientWindow::Finish) before the update reads it.
// A gradient handed in behind the model's stream is pending
// (PendingGradient) until the next call that touches the gradient adds it.
//
// Thread-safety: the driving thread only, except what the worker's body
// touches between UpdateWorker::Start and Join: optimizer, adam and its
// threads, new_params or a cpu home's memory (written; a block's part is
// read, by its fetch's copy, only once the worker has published it), accum
// (read), and param_type, no_decay and plan (read; set in Init and left
// alone after). All are declared before `update`, so ~Impl joins the worker
// before any of them goes.
#pragma once

#include <algorithm>
#include <cstdint>
#include <memory>
#include <optional>
#include <string>
#include <vector>

#include "aio/io_engine.h"
#include "aio/pinned_pool.h"
#include "comm/communicator.h"
#include "device/device.h"
#include "optim/cpu_adam.h"
#include "optim/isa.h"
#include "optim/loss_scaler.h"
#include "optim/lr_schedule.h"
#include "optim/thread_pool.h"
#include "swap/checkpoint.h"
#include "swap/gradient_window.h"
#include "swap/optimizer_swapper.h"
#include "zero3/buffer_plan.h"
#include "zero3/engine_hooks.h"
#include "zero3/gather_cache.h"
#include "zero3/host_window.h"
#include "zero3/param_home.h"
#include "zero3/partitioner.h"
#include "zero3/prefetch_coordinator.h"
#include "zero3/update_worker.h"
#include "zinf/engine.h"

namespace zinf {

struct Engine::Impl {
  ~Impl();

  // Setup (engine_setup.cc).
  Status Init(const Config& cfg, const std::vector<BlockSpec>& block_specs, const EngineOptions& opts);
  Status InitDeviceAndComms();
  Status InitPartition();
  Status InitParamHome();
  Status InitOptimizerState();
  Status InitBuffers();
  Status InitOptimizer();

  // Steps of the public methods (engine.cc).
  Status CheckBlock(BlockId b) const;
  // kFailedPrecondition naming `what` on a forward-only engine.
  Status Trains(const char* what) const;
  Status Commit();
  char* NewParams();
  Status WriteHomeFromMaster();
  Status WriteHomeBlock(BlockId b, const float* master);
  Status StartUpdate(const optim::AdamStepArgs& args);
  Status RunUpdate(const optim::AdamStepArgs& args, zero3::UpdateWorker::Progress& progress);
  StatusOr<bool> RefreshHome(BlockId b, bool wait);
  StatusOr<bool> RefreshOne(BlockId b, bool wait);
  void JoinWorker();
  Status FinishUpdate();
  Status CopyGradientToHost(BlockId b, const std::vector<const void*>& grads);
  Status CopyTensorsToHost(BlockId b, const std::vector<const void*>& grads, char* host, bool zero_pad);
  void CountGradient(const zero3::BlockLayout& l);
  // A block's gradient handed to ReduceGradients: its copies queued on the
  // engine's stream, its host part (FinishGradient) left to the next call
  // that touches the gradient when it came behind a stream.
  struct PendingGradient {
    BlockId block = -1;
    std::vector<const void*> grads;
    // What the host part waits for: through staging (or straight into
    // `accum`), an event after the copies; else (direct, handed in
    // synchronously) none.
    std::shared_ptr<Event> ready;  // shared with a caller that waits for it itself (ReduceGradients' `copied`)
    float scale = 1.0f;            // 1 / (world_size * gradient_accumulation_steps)
    bool last = false;             // the last micro-batch before an optimizer step
    bool direct = false;           // read from `grads` itself (GradientsDirect, no stream)
    bool into_accum = false;       // copied straight into `accum` behind a stream (IntoAccum)
  };
  bool GradientsDirect() const;
  bool IntoAccum(BlockId block, float scale) const;
  Status WaitAccumCopies();
  Status ReduceGradients(BlockId block, const std::vector<const void*>& grads, void* model_stream,
                         std::shared_ptr<Event>* copied);
  Status FinishGradient();
  Status AccumulateGradient(const PendingGradient& pg);
  void ZeroUnreducedGradients();
  StatusOr<StepResult> ApplyStep(StepResult r);

  // Checkpoints (engine_checkpoint.cc).
  Status CheckpointPreconditions(const char* what) const;
  Status PrepareCheckpointIo();
  Status LoadMasterHome(const swap::CheckpointReader& reader);
  std::map<std::string, std::string> Manifest() const;

  // Where the gradient's sum of squares is cut besides 4 KiB units: the
  // config's sub_group_size, not the pipeline's fitted one (ShardSquares).
  int64_t NormCut() const { return std::min<int64_t>(config.zero.sub_group_size, partitioner->total_shard_numel()); }
  const zero3::BlockLayout& layout(BlockId b) const { return partitioner->layout(b); }
  const std::string& name(BlockId b) const { return specs[static_cast<size_t>(b)].name; }

  Config config;
  EngineOptions options;
  EngineHooks hooks;  // options.hooks' values, or none
  std::vector<BlockSpec> specs;
  std::vector<optim::ElemRange> no_decay;  // the shard's tensors with decay off (Partitioner::NoDecayRanges)
  zero3::BufferPlan plan;                  // every window allocated below, sized once
  ElementType param_type = ElementType::kBf16;
  int64_t param_es = 2;  // bytes per working parameter
  int64_t grad_es = 4;   // bytes per gradient element

  // Device and communicators (owned ones when the hooks name none).
  std::unique_ptr<Device> owned_device;
  Device* device = nullptr;
  std::unique_ptr<comm::Communicator> owned_host_comm, owned_device_comm;
  comm::Communicator* host_comm = nullptr;
  comm::Communicator* device_comm = nullptr;
  std::unique_ptr<Stream> stream;

  std::unique_ptr<zero3::Partitioner> partitioner;
  std::unique_ptr<zero3::PrefetchCoordinator> coordinator;

  // Tiers. `io` is the hooks' I/O engine when given, else owned_io.
  std::unique_ptr<aio::IoEngine> owned_io;
  aio::IoEngine* io = nullptr;
  std::unique_ptr<zero3::ParamHome> home;
  std::unique_ptr<zero3::GatherCache> gathered;
  std::unique_ptr<aio::PinnedPool> optim_pool;  // optimizer pipeline (nvme)
  std::unique_ptr<swap::OptimizerSwapper> optimizer;
  // Optimizer on NVMe: the gradient accumulates in its store through this
  // window (gradient_window.h) and `accum` is not allocated.
  std::unique_ptr<aio::PinnedPool> grad_window_pool;
  std::unique_ptr<swap::GradientWindow> grad_window;
  // Otherwise the gradient norm's per-piece sums over `accum`, made once
  // (plan.norm_squares_bytes), so a step allocates nothing for its norm.
  std::unique_ptr<swap::ShardSquares> norm_squares;

  // Host windows: the fp32 gradient accumulator (optimizer in RAM), the new
  // working parameters the update writes, the gradient shard staging.
  zero3::HostWindow accum, new_params, staging;
  // Per block: `accum` holds its gradient of this accumulation cycle. A
  // block's first ReduceGradients of a cycle sets its range instead of
  // adding, so nothing zeroes the accumulator behind the update.
  std::vector<bool> acc_holds;
  // The event after the last copy straight into `accum` (IntoAccum) that
  // nothing has waited for yet: whatever reads `accum` next waits first
  // (the engine's stream is in order, so the last covers the others).
  std::shared_ptr<Event> accum_copied;
  bool committed = false;
  std::vector<bool> params_set;

  // Device gradient buffers: the largest block's flat gradient, and its
  // reduce-scattered shard (several ranks only).
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

  // The update in flight (see the file comment).
  zero3::UpdateWorker update;
  bool update_pending = false;  // started, and FinishUpdate has not run since
  std::vector<bool> stale;      // home holds the parameters from before the update
  BlockId refresh_next = 0;     // new_params a ring: the first block not yet home
  Status update_failed;         // sticky until LoadCheckpoint: the state is partly stepped

  EngineCounters counters;
  bool tracing = true;                              // Acquires feed the prefetch order (SetTracing)
  bool grads_pending = false;                       // ReduceGradients since the last optimizer step
  std::optional<PendingGradient> pending_gradient;  // see PendingGradient

  // Checkpoints: their own I/O engine (the hooks' when given) and two
  // buffers, made at first use.
  std::unique_ptr<aio::IoEngine> owned_checkpoint_io;
  aio::IoEngine* checkpoint_io = nullptr;
  std::unique_ptr<aio::PinnedPool> checkpoint_pool;
};

}  // namespace zinf
