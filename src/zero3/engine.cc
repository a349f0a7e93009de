// The ZeRO-3 engine (include/zinf/engine.h): the public methods, then the
// steps they are made of. The state and how the jobs are divided between
// units: engine_impl.h; building it: engine_setup.cc; checkpoints:
// engine_checkpoint.cc.
#include "zinf/engine.h"

#include <algorithm>
#include <chrono>
#include <cstring>

#include "core/units.h"
#include "optim/array_ops.h"
#include "optim/grad_clip.h"
#include "zero3/engine_impl.h"

namespace zinf {
namespace {

using Clock = std::chrono::steady_clock;

// Every EngineCounters field that only grows (the rest are levels).
constexpr int64_t EngineCounters::*kCumulativeCounters[] = {
    &EngineCounters::nvme_read_bytes,
    &EngineCounters::nvme_write_bytes,
    &EngineCounters::optimizer_nvme_bytes,
    &EngineCounters::gradient_nvme_bytes,
    &EngineCounters::h2d_bytes,
    &EngineCounters::d2h_bytes,
    &EngineCounters::allgather_bytes,
    &EngineCounters::reduce_scatter_bytes,
    &EngineCounters::nvme_wait_ns,
    &EngineCounters::fetch_wait_ns,
    &EngineCounters::allgather_ns,
    &EngineCounters::reduce_scatter_ns,
    &EngineCounters::optimizer_ns,
    &EngineCounters::fetches,
    &EngineCounters::prefetches,
    &EngineCounters::prefetch_hits,
    &EngineCounters::resident_hits,
    &EngineCounters::evictions,
    &EngineCounters::live_limit_overruns,
    &EngineCounters::evictions_for_memory,
};

}  // namespace

int64_t TensorSpec::numel() const {
  int64_t n = 1;
  for (int64_t d : shape) n *= d;
  return n;
}

int64_t BlockSpec::numel() const {
  int64_t n = 0;
  for (const TensorSpec& t : tensors) n += t.numel();
  return n;
}

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

Device& EngineAccess::device(Engine& engine) { return *engine.impl_->device; }

// ---------------------------------------------------------------------------
// The public methods.

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
  const size_t tensors = m.layout(block).tensors.size();
  if (values.size() != tensors) {
    return Status::InvalidArgument("engine: block '" + m.name(block) + "' has " + std::to_string(tensors) +
                                   " tensors, got " + std::to_string(values.size()) + " arrays");
  }
  return SetParameters(block, [&values](size_t t, int64_t first, int64_t count, float* out) {
    std::memcpy(out, values[t] + first, static_cast<size_t>(count) * sizeof(float));
    return Status::Ok();
  });
}

Status Engine::SetParameters(BlockId block, const TensorFill& fill) {
  Impl& m = *impl_;
  ZINF_RETURN_IF_ERROR(m.CheckBlock(block));
  if (!fill) return Status::InvalidArgument("engine: SetParameters of block '" + m.name(block) + "' without a fill");
  if (m.committed) return Status::FailedPrecondition("engine: SetParameters after the first Acquire");
  const zero3::BlockLayout& l = m.layout(block);
  // Straight into the optimizer's master weights (RAM or NVMe), through
  // the gradient staging window: no whole-shard copy of the initial values.
  // Forward-only: straight home.
  float* shard = reinterpret_cast<float*>(m.staging.data());
  ZINF_RETURN_IF_ERROR(m.partitioner->FillShard(block, fill, shard)
                           .WithContext("engine: initial values of block '" + m.name(block) + "'"));
  Status written = m.options.forward_only ? m.WriteHomeBlock(block, shard)
                                          : m.optimizer->WriteMaster(l.rank_offset, l.shard_numel, shard);
  ZINF_RETURN_IF_ERROR(written.WithContext("engine: initial values of block '" + m.name(block) + "'"));
  m.params_set[static_cast<size_t>(block)] = true;
  return Status::Ok();
}

StatusOr<std::vector<void*>> Engine::Acquire(BlockId block) {
  Impl& m = *impl_;
  ZINF_RETURN_IF_ERROR(m.CheckBlock(block));
  ZINF_RETURN_IF_ERROR(m.Commit());
  if (m.tracing) m.coordinator->OnAcquire(block);
  m.counters.order_changes = m.coordinator->order_changes();
  ZINF_RETURN_IF_ERROR(m.gathered->Hold(block));
  // With several ranks every rank must issue the same gathers in the same
  // order, and the update's progress differs between ranks, so there a
  // prefetch waits for the update instead of stopping where it has not got
  // yet. (On error paths, a failed fetch or update on one rank, the ranks
  // can still part.)
  if (m.tracing) m.gathered->Prefetch(/*wait_for_home=*/m.partitioner->world_size() > 1);
  return m.gathered->WaitReady(block);
}

Status Engine::Release(BlockId block) { return Release(block, nullptr); }

Status Engine::Release(BlockId block, void* stream) {
  Impl& m = *impl_;
  ZINF_RETURN_IF_ERROR(m.CheckBlock(block));
  std::unique_ptr<Event> reading;
  if (stream != nullptr) {
    StatusOr<std::unique_ptr<Event>> recorded = m.device->RecordOn(stream);
    if (!recorded.ok()) {
      return recorded.status().WithContext("engine: Release of block '" + m.name(block) + "' behind a stream");
    }
    reading = std::move(recorded).value();
  }
  return m.gathered->Release(block, stream, std::move(reading));
}

Status Engine::ReduceGradients(BlockId block, const std::vector<const void*>& grads) {
  return ReduceGradients(block, grads, nullptr);
}

Status Engine::ReduceGradients(BlockId block, const std::vector<const void*>& grads, void* stream) {
  if (stream == nullptr) return impl_->ReduceGradients(block, grads, nullptr, nullptr);
  std::shared_ptr<Event> copied;
  ZINF_RETURN_IF_ERROR(impl_->ReduceGradients(block, grads, stream, &copied));
  // The model's later work on its stream (the next block's backward into
  // the same buffers) waits for the copies.
  return impl_->device->WaitOn(stream, *copied).WithContext("engine: gradient of block '" + impl_->name(block) + "'");
}

Status EngineAccess::ReduceGradients(Engine& engine, BlockId block, const std::vector<const void*>& grads, void* stream,
                                     std::shared_ptr<Event>* copied) {
  if (stream == nullptr || copied == nullptr) {
    return Status::InvalidArgument("engine: ReduceGradients handing the copies' event back needs a stream and a place");
  }
  return engine.impl_->ReduceGradients(block, grads, stream, copied);
}

// `model_stream` null: synchronous (the host part now); else `*copied` gets the
// event after the copies out of `grads` (the caller orders its stream).
Status Engine::Impl::ReduceGradients(BlockId block, const std::vector<const void*>& grads, void* model_stream,
                                     std::shared_ptr<Event>* copied) {
  ZINF_RETURN_IF_ERROR(CheckBlock(block));
  ZINF_RETURN_IF_ERROR(Trains("ReduceGradients"));
  ZINF_RETURN_IF_ERROR(Commit());
  ZINF_RETURN_IF_ERROR(FinishGradient());  // the one handed in behind a stream before
  ZINF_RETURN_IF_ERROR(FinishUpdate());    // the worker reads the accumulator
  grads_pending = true;
  const zero3::BlockLayout& l = layout(block);
  if (grads.size() != l.tensors.size()) {
    return Status::InvalidArgument("engine: block '" + name(block) + "' has " + std::to_string(l.tensors.size()) +
                                   " tensors, got " + std::to_string(grads.size()) + " gradients");
  }
  PendingGradient g;
  g.block = block;
  g.grads = grads;
  g.scale = 1.0f / static_cast<float>(partitioner->world_size() * config.gradient_accumulation_steps);
  g.last = (micro_steps + 1) % config.gradient_accumulation_steps == 0;
  const std::string what = "engine: gradient of block '" + name(block) + "'";
  // Behind a stream the gradient goes through staging (or straight into
  // the accumulator: IntoAccum), so that the model's stream can be told
  // when `grads` may be rewritten (an event after the engine's copies); the
  // host part reads staging later.
  g.direct = model_stream == nullptr && GradientsDirect();
  g.into_accum = model_stream != nullptr && IntoAccum(block, g.scale);
  if (!g.direct) {
    if (model_stream != nullptr) {
      // The copies wait on the engine's stream for the model's work.
      StatusOr<std::unique_ptr<Event>> written = device->RecordOn(model_stream);
      if (!written.ok()) return written.status().WithContext(what + " behind a stream");
      ZINF_RETURN_IF_ERROR(stream->Wait(**written).WithContext(what));
    }
    Status queued = g.into_accum ? CopyTensorsToHost(block, grads, accum.data() + l.rank_offset * grad_es,
                                                     /*zero_pad=*/false)
                                 : CopyGradientToHost(block, grads);
    StatusOr<std::unique_ptr<Event>> copied_event =
        queued.ok() ? stream->Record() : StatusOr<std::unique_ptr<Event>>(queued);
    if (!copied_event.ok()) {
      // Copies may be queued that read `grads`: let them run before the
      // caller may rewrite it.
      if (model_stream != nullptr) stream->Synchronize().IgnoreError();
      return copied_event.status().WithContext(what);
    }
    g.ready = std::move(copied_event).value();
    if (copied != nullptr) *copied = g.ready;
  }
  pending_gradient = std::move(g);
  return model_stream != nullptr ? Status::Ok() : FinishGradient();
}

StatusOr<StepResult> Engine::Step() {
  Impl& m = *impl_;
  ZINF_RETURN_IF_ERROR(m.Trains("Step"));
  if (std::optional<BlockId> held = m.gathered->FirstHeld()) {
    return Status::FailedPrecondition("engine: Step while block '" + m.name(*held) + "' is acquired");
  }
  ZINF_RETURN_IF_ERROR(m.Commit());
  ZINF_RETURN_IF_ERROR(m.FinishGradient());
  ZINF_RETURN_IF_ERROR(m.FinishUpdate());
  ZINF_RETURN_IF_ERROR(m.WaitAccumCopies());
  StepResult r;
  ++m.micro_steps;
  r.loss_scale = m.scaler->scale();
  if (m.micro_steps % m.config.gradient_accumulation_steps != 0) return r;
  r.boundary = true;
  const auto t0 = Clock::now();
  ZINF_ASSIGN_OR_RETURN(r, m.ApplyStep(r));
  m.counters.optimizer_ns += NanosSince(t0);
  return r;
}

Status Engine::WaitForUpdate() {
  Impl& m = *impl_;
  if (m.options.forward_only) return Status::Ok();  // there is never one
  ZINF_RETURN_IF_ERROR(m.FinishGradient());
  ZINF_RETURN_IF_ERROR(m.FinishUpdate());
  ZINF_RETURN_IF_ERROR(m.WaitAccumCopies());
  if (!m.grad_window) return Status::Ok();
  const int64_t before = m.grad_window->nvme_bytes();
  Status s = m.grad_window->Flush();
  m.counters.gradient_nvme_bytes += m.grad_window->nvme_bytes() - before;
  return s.WithContext("engine: the accumulated gradient");
}

Status Engine::GetMasterParameters(BlockId block, const std::vector<float*>& out) {
  Impl& m = *impl_;
  ZINF_RETURN_IF_ERROR(m.CheckBlock(block));
  ZINF_RETURN_IF_ERROR(m.Trains("GetMasterParameters"));
  ZINF_RETURN_IF_ERROR(m.Commit());
  ZINF_RETURN_IF_ERROR(m.FinishUpdate());
  const zero3::BlockLayout& l = m.layout(block);
  if (out.size() != l.tensors.size()) return Status::InvalidArgument("engine: one output array per tensor");
  if (m.partitioner->world_size() == 1) {
    // The shard is the flat block: each sub-group's part straight to the
    // tensors it holds, with no block-sized copy between.
    return m.optimizer->ReadMaster(l.rank_offset, l.shard_numel, [&](int64_t at, const float* src, int64_t n) {
      for (size_t t = 0; t < l.tensors.size(); ++t) {
        const int64_t begin = l.tensors[t].offset, end = begin + l.tensors[t].numel;
        const int64_t lo = std::max(at, begin), hi = std::min(at + n, end);
        if (lo < hi) std::memcpy(out[t] + (lo - begin), src + (lo - at), static_cast<size_t>(hi - lo) * sizeof(float));
      }
    });
  }
  std::vector<float> shard(static_cast<size_t>(l.shard_numel));
  ZINF_RETURN_IF_ERROR(m.optimizer->ReadMaster(l.rank_offset, l.shard_numel, shard.data()));
  std::vector<float> flat(static_cast<size_t>(l.padded_numel));
  ZINF_RETURN_IF_ERROR(m.host_comm->AllGather(shard.data(), flat.data(), l.shard_numel, ElementType::kF32, nullptr));
  m.partitioner->Unflatten(block, flat.data(), out);
  return Status::Ok();
}

Status Engine::EndForwardPass() {
  Impl& m = *impl_;
  if (!m.options.forward_only) {
    return Status::FailedPrecondition("engine: EndForwardPass on a training engine (Step ends its passes)");
  }
  if (std::optional<BlockId> held = m.gathered->FirstHeld()) {
    return Status::FailedPrecondition("engine: EndForwardPass while block '" + m.name(*held) + "' is acquired");
  }
  m.coordinator->OnStepEnd();
  m.counters.order_changes = m.coordinator->order_changes();
  return Status::Ok();
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
EngineCounters Engine::counters() const {
  EngineCounters c = impl_->counters;
  // Prefetched reads included: the home counts every byte it moves.
  c.nvme_read_bytes = impl_->home->nvme_read_bytes();
  c.nvme_write_bytes = impl_->home->nvme_write_bytes();
  return c;
}

// ---------------------------------------------------------------------------
// The steps.

Status Engine::Impl::CheckBlock(BlockId b) const {
  if (b < 0 || b >= static_cast<BlockId>(specs.size())) {
    return Status::InvalidArgument("engine: no block " + std::to_string(b));
  }
  return Status::Ok();
}

Status Engine::Impl::Trains(const char* what) const {
  if (!options.forward_only) return Status::Ok();
  return Status::FailedPrecondition(std::string("engine: ") + what +
                                    " on a forward-only engine (EngineOptions::forward_only), which holds no "
                                    "optimizer state or gradient");
}

// The first Acquire (or step) after SetParameters: the optimizer state and
// the working parameters' homes from the initial values.
Status Engine::Impl::Commit() {
  if (committed) return Status::Ok();
  std::string missing;
  for (size_t b = 0; b < params_set.size(); ++b) {
    if (!params_set[b]) missing += (missing.empty() ? "" : ", ") + specs[b].name;
  }
  if (!missing.empty()) {
    return Status::FailedPrecondition("engine: SetParameters was not called for block(s) " + missing);
  }
  if (options.forward_only) {
    ZINF_RETURN_IF_ERROR(home->Flush());  // SetParameters wrote every block home
  } else {
    ZINF_RETURN_IF_ERROR(optimizer->ZeroMoments());  // the master weights came with SetParameters
    ZINF_RETURN_IF_ERROR(WriteHomeFromMaster());
  }
  committed = true;
  return Status::Ok();
}

// Where the update writes the new working parameters: the cpu home itself
// (BufferPlan::new_params_in_home), else the new_params window.
char* Engine::Impl::NewParams() { return plan.new_params_in_home ? home->resident() : new_params.data(); }

// The working parameters of the whole shard from the optimizer's fp32
// master weights, at their home tier: block by block through the staging
// window (no whole-shard fp32 copy). With new_params a ring each block is
// cast to its start and written home (a home that copies on the stream is
// waited for before the next block reuses the space); with the whole shard
// the home takes it at once; the cpu home is written in place.
Status Engine::Impl::WriteHomeFromMaster() {
  auto* master = reinterpret_cast<float*>(staging.data());
  for (BlockId b = 0; b < partitioner->num_blocks(); ++b) {
    const zero3::BlockLayout& l = layout(b);
    ZINF_RETURN_IF_ERROR(optimizer->ReadMaster(l.rank_offset, l.shard_numel, master));
    ZINF_RETURN_IF_ERROR(WriteHomeBlock(b, master));
  }
  if (plan.new_params_ring_elems > 0) return home->Flush();
  return plan.new_params_in_home ? Status::Ok() : home->WriteAll(new_params.data());
}

// Block b's working parameters from its fp32 shard `master`: cast into
// new_params (at the ring's start, then written home; or at the block's
// offset: the cpu home itself, or the whole-shard buffer WriteHomeFromMaster
// then writes home whole); forward-only fp32 ones straight from `master`.
Status Engine::Impl::WriteHomeBlock(BlockId b, const float* master) {
  const zero3::BlockLayout& l = layout(b);
  auto write_home = [&](const char* from) -> Status {
    ZINF_RETURN_IF_ERROR(home->WriteBlock(b, from));
    return home->writes_on_stream() ? stream->Synchronize() : Status::Ok();
  };
  if (plan.forward_only && param_type == ElementType::kF32 && !plan.new_params_in_home) {
    return write_home(reinterpret_cast<const char*>(master));  // nothing to cast (PlanForwardOnly)
  }
  const bool ring = plan.new_params_ring_elems > 0;
  char* dst = NewParams() + (ring ? 0 : l.rank_offset * param_es);
  if (param_type == ElementType::kF32) {
    std::memcpy(dst, master, static_cast<size_t>(l.shard_numel * 4));
  } else {
    ZINF_RETURN_IF_ERROR(optim::CastFromF32(*threads, isa, master, param_type, dst, l.shard_numel));
  }
  return ring ? write_home(dst) : Status::Ok();
}

// The block's gradient, reduce-scattered over the ranks, in `staging`.
Status Engine::Impl::CopyGradientToHost(BlockId b, const std::vector<const void*>& grads) {
  const zero3::BlockLayout& l = layout(b);
  if (grad_flat == nullptr) return CopyTensorsToHost(b, grads, staging.data(), /*zero_pad=*/true);
  auto* flat = static_cast<char*>(grad_flat);
  for (size_t t = 0; t < grads.size(); ++t) {
    ZINF_RETURN_IF_ERROR(stream->CopyAsync(
        flat + l.tensors[t].offset * grad_es, grads[t], static_cast<size_t>(l.tensors[t].numel * grad_es),
        options.host_device ? CopyDirection::kHostToDevice : CopyDirection::kDeviceToDevice));
  }
  if (l.padded_numel > l.numel) {
    ZINF_RETURN_IF_ERROR(
        stream->MemsetAsync(flat + l.numel * grad_es, 0, static_cast<size_t>((l.padded_numel - l.numel) * grad_es)));
  }
  const void* shard = flat;
  if (grad_shard != nullptr) {
    ZINF_RETURN_IF_ERROR(
        device_comm
            ->ReduceScatter(flat, grad_shard, l.shard_numel, options.grad_type, comm::ReduceOp::kSum, stream.get())
            .WithContext("reduce-scatter of block '" + name(b) + "'"));
    shard = grad_shard;
  }
  return stream->CopyAsync(staging.data(), shard, static_cast<size_t>(l.shard_numel * grad_es),
                           CopyDirection::kDeviceToHost);
}

// Behind a stream, a gradient may skip staging and the host's pass over it:
// one rank (the shard is the whole block, nothing to reduce), fp32, the
// accumulator in RAM, and the block's first gradient of the cycle at scale
// 1 (one micro-batch a step), whose set (SetScaled) would give the bits of
// the gradient itself (x * 1 is x) but for the sign of a zero (SetScaled
// adds to +0) and a signalling NaN's quieting: the norm squares the values
// and Adam's moments never take a zero's sign, so the results are the same
// bits. Then the copy to the host is the set, and the driving thread
// neither waits for it nor touches the bytes.
bool Engine::Impl::IntoAccum(BlockId b, float scale) const {
  return grad_flat == nullptr && !grad_window && accum.data() != nullptr && options.grad_type == ElementType::kF32 &&
         scale == 1.0f && !acc_holds[static_cast<size_t>(b)];
}

// Waits for the copies straight into `accum` queued so far.
Status Engine::Impl::WaitAccumCopies() {
  if (!accum_copied) return Status::Ok();
  const auto t0 = Clock::now();
  Status s = accum_copied->Synchronize();
  counters.reduce_scatter_ns += NanosSince(t0);
  ZINF_RETURN_IF_ERROR(s.WithContext("engine: a gradient's copy into the accumulator"));
  accum_copied.reset();  // only once waited for: after an error the next reader waits again
  return Status::Ok();
}

// The gradient traffic of one block: reduced over the ranks, copied to the host.
void Engine::Impl::CountGradient(const zero3::BlockLayout& l) {
  counters.reduce_scatter_bytes += l.padded_numel * grad_es;
  counters.d2h_bytes += l.shard_numel * grad_es;
}

// One rank: the shard is the whole padded block, each tensor copied to its
// place at `host` (`staging`, one copy instead of device flat buffer, then
// host; or the block's range of `accum`, IntoAccum). `zero_pad`: the
// padding up to the shard zeroed too (staging is reused; the accumulator's
// padding stays zero, as nothing else writes it).
Status Engine::Impl::CopyTensorsToHost(BlockId b, const std::vector<const void*>& grads, char* host, bool zero_pad) {
  const zero3::BlockLayout& l = layout(b);
  for (size_t t = 0; t < grads.size(); ++t) {
    ZINF_RETURN_IF_ERROR(stream->CopyAsync(host + l.tensors[t].offset * grad_es, grads[t],
                                           static_cast<size_t>(l.tensors[t].numel * grad_es),
                                           CopyDirection::kDeviceToHost));
  }
  if (zero_pad) std::memset(host + l.numel * grad_es, 0, static_cast<size_t>((l.shard_numel - l.numel) * grad_es));
  return Status::Ok();
}

// One rank on the host device with fp32 gradients, handed in synchronously:
// each tensor goes straight from the model's arrays into the accumulator
// (no copy into staging; the block's padding stays zero). The device's kind
// decides, not EngineOptions::host_device: the trainer hands its host device
// in through the hooks. Otherwise (and behind a stream) the gradient comes
// through `staging`.
bool Engine::Impl::GradientsDirect() const {
  return grad_flat == nullptr && device->kind() == DeviceKind::kHost && options.grad_type == ElementType::kF32;
}

// The host part of the gradient handed in last (ReduceGradients), when one
// is pending: once its copies into staging have run (the engine's stream
// may hold later work, prefetches, that this does not wait for; direct:
// at once), added into the accumulator; then, at the last micro-batch, the
// optimizer state's read-ahead.
Status Engine::Impl::FinishGradient() {
  if (!pending_gradient) return Status::Ok();
  const PendingGradient g = std::move(*pending_gradient);
  pending_gradient.reset();
  const int64_t before = grad_window ? grad_window->nvme_bytes() : 0;
  Status s = AccumulateGradient(g);
  if (grad_window) counters.gradient_nvme_bytes += grad_window->nvme_bytes() - before;
  ZINF_RETURN_IF_ERROR(s.WithContext("engine: gradient of block '" + name(g.block) + "'"));
  // The last micro-batch before an optimizer step: its first sub-groups'
  // state is read now, under the rest of the backward pass, not after it.
  // Best effort: the gradient is already accumulated, so an error here is
  // left to the step, which reads again and reports it.
  if (g.last && !optimizer->PrefetchStep().ok()) optimizer->DropPrefetch();
  return Status::Ok();
}

// Adds the gradient x scale into the accumulator (the gradient window on
// NVMe, or the RAM one): direct, each tensor highest first as the window
// expects; otherwise from `staging`, cast to fp32. Elementwise either way:
// bit-identical.
Status Engine::Impl::AccumulateGradient(const PendingGradient& pg) {
  const BlockId b = pg.block;
  const zero3::BlockLayout& l = layout(b);
  if (pg.into_accum) {  // its copies are the set: waited for by whatever reads `accum` next
    accum_copied = pg.ready;
    CountGradient(l);
    acc_holds[static_cast<size_t>(b)] = true;
    return Status::Ok();
  }
  ZINF_RETURN_IF_ERROR(WaitAccumCopies());  // an add below may read what they write
  const auto t0 = Clock::now();
  if (pg.ready) ZINF_RETURN_IF_ERROR(pg.ready->Synchronize());
  counters.reduce_scatter_ns += NanosSince(t0);
  CountGradient(l);  // on the host device, what a GPU would reduce and copy
  // The block's first gradient of the cycle is set in the accumulator, not
  // added to it (SetScaled: the bits AddScaled gives on zeros).
  const bool first = !acc_holds[static_cast<size_t>(b)];
  auto add = [&](int64_t begin, int64_t n, const float* g) {
    if (grad_window) return grad_window->Add(begin, n, g, pg.scale, pg.last);
    float* dst = reinterpret_cast<float*>(accum.data()) + begin;
    return first ? optim::SetScaled(*threads, g, pg.scale, dst, n) : optim::AddScaled(*threads, g, pg.scale, dst, n);
  };
  if (pg.direct) {
    for (size_t t = pg.grads.size(); t-- > 0;) {
      ZINF_RETURN_IF_ERROR(
          add(l.rank_offset + l.tensors[t].offset, l.tensors[t].numel, static_cast<const float*>(pg.grads[t])));
    }
  } else {
    const float* g = reinterpret_cast<const float*>(staging.data());
    if (options.grad_type != ElementType::kF32) {
      float* g32 = reinterpret_cast<float*>(staging.data() + partitioner->max_shard_numel() * 4);
      ZINF_RETURN_IF_ERROR(optim::CastToF32(*threads, isa, staging.data(), options.grad_type, g32, l.shard_numel));
      g = g32;
    }
    ZINF_RETURN_IF_ERROR(add(l.rank_offset, l.shard_numel, g));
  }
  acc_holds[static_cast<size_t>(b)] = true;
  return Status::Ok();
}

// At a gradient-accumulation boundary: the global norm, the loss scale, and
// the update started (or skipped on an fp16 overflow).
//
// The sum of squares is taken in pieces cut at the config's sub-groups and
// 4 KiB units, added in piece order, on every tier (swap::ShardSquares;
// the gradient window takes the same sums as it writes the last
// micro-batch's values, whatever sub-groups the pipeline was fitted to), so
// the norm, the overflow check and the clip factor agree bit for bit.
StatusOr<StepResult> Engine::Impl::ApplyStep(StepResult r) {
  const int64_t total = partitioner->total_shard_numel();
  float* acc = reinterpret_cast<float*>(accum.data());
  double sum_squares = 0.0;
  if (grad_window) {
    const int64_t before = grad_window->nvme_bytes();
    auto sq = grad_window->Finish();  // every gradient write is on NVMe after this
    counters.gradient_nvme_bytes += grad_window->nvme_bytes() - before;
    ZINF_RETURN_IF_ERROR(sq.status().WithContext("engine: the accumulated gradient"));
    sum_squares = *sq;
  } else {
    ZeroUnreducedGradients();
    ZINF_RETURN_IF_ERROR(norm_squares->Add(*threads, isa, 0, acc, total));  // every piece: none left from before
    sum_squares = norm_squares->Total();
  }
  ZINF_RETURN_IF_ERROR(
      host_comm->AllReduce(&sum_squares, &sum_squares, 1, ElementType::kF64, comm::ReduceOp::kSum, nullptr));
  optim::GradNormAccumulator norm;
  norm.Add(sum_squares);
  r.grad_norm = norm.norm();
  const bool overflow = norm.has_inf_or_nan();
  if (config.fp16.enabled) ZINF_RETURN_IF_ERROR(scaler->Update(overflow));
  gathered->DropAll();  // every gathered copy is stale now (or, on overflow, its gradient is dropped)
  if (!overflow) {
    optim::AdamStepArgs args;
    args.step = applied_steps + 1;
    args.lr = schedule->lr();
    args.grad_scale =
        optim::GradScaleFactor(r.grad_norm, config.fp16.enabled ? r.loss_scale : 1.0, config.gradient_clipping);
    r.lr = args.lr;
    if (optimizer->store() != nullptr) {
      // Master, m and v read (not m and v the first step, still zero) and
      // written; the gradient read, but for the sub-groups the window still
      // holds (its writes during the backward are in gradient_nvme_bytes).
      counters.optimizer_nvme_bytes += optimizer->StepStateBytes();
      const int64_t held = grad_window ? grad_window->FinalGradientElems() : 0;
      counters.gradient_nvme_bytes += (total - held) * 4;
    }
    // The update runs under the next forward pass.
    ZINF_RETURN_IF_ERROR(StartUpdate(args));
    ++applied_steps;
    schedule->Step();
    r.applied = true;
  }
  // The next cycle sets each block's gradient afresh (the window starts
  // from zero of its own).
  std::fill(acc_holds.begin(), acc_holds.end(), false);
  grads_pending = false;
  coordinator->OnStepEnd();
  counters.order_changes = coordinator->order_changes();
  r.loss_scale = scaler->scale();
  return r;
}

// The accumulator's ranges of the blocks no micro-batch of this cycle
// reduced hold an older cycle's gradient (or a skipped step's): zeroed, as
// they contribute none. Between blocks' ranges, and in their padding,
// nothing but zeros is ever written.
void Engine::Impl::ZeroUnreducedGradients() {
  auto* acc = reinterpret_cast<float*>(accum.data());
  for (BlockId b = 0; b < partitioner->num_blocks(); ++b) {
    if (acc_holds[static_cast<size_t>(b)]) continue;
    const zero3::BlockLayout& l = layout(b);
    std::memset(acc + l.rank_offset, 0, static_cast<size_t>(l.shard_numel) * sizeof(float));
  }
}

// Starts the optimizer's walk over the sub-groups on the worker: Adam on
// the accumulated gradient, new parameters into new_params (its ring
// drained by RefreshHome, or its whole shard) or straight into a cpu home.
// Every block goes stale.
Status Engine::Impl::StartUpdate(const optim::AdamStepArgs& args) {
  // Copies out of a home the worker rewrites in place finish first.
  if (plan.new_params_in_home) ZINF_RETURN_IF_ERROR(stream->Synchronize().WithContext("engine"));
  Status s = update.Start([this, args](zero3::UpdateWorker::Progress& progress) { return RunUpdate(args, progress); });
  if (!s.ok()) return s.WithContext("engine");  // nothing was stepped: the homes hold the current parameters
  std::fill(stale.begin(), stale.end(), true);
  refresh_next = 0;
  update_pending = true;
  return Status::Ok();
}

// The worker's body: the sub-group walk, publishing each stepped slice's end.
Status Engine::Impl::RunUpdate(const optim::AdamStepArgs& args, zero3::UpdateWorker::Progress& progress) {
  float* acc = reinterpret_cast<float*>(accum.data());  // null: the gradient is in the optimizer's store
  swap::StepIo sio;
  const int64_t ring = plan.new_params_ring_elems;
  sio.params = NewParams();
  sio.params_dtype = param_type;
  sio.params_ring_elems = ring;
  sio.grads = acc;
  if (!no_decay.empty()) sio.no_decay = &no_decay;
  // The last sub-groups the backward wrote are still in the window's
  // buffers (unchanged until the next ReduceGradients, which finishes this
  // update first): the first sub-groups stepped start without a read.
  if (grad_window) sio.held_grads = [this](int64_t k) { return grad_window->FinalGradient(k); };
  sio.on_stepped = [&](int64_t end) {
    progress.Publish(end);
    return Status::Ok();
  };
  sio.on_sub_group = [&](int64_t k) {
    // Sub-group k+1 overwrites the ring's elements `ring` before it: they
    // must be home first.
    if (ring > 0 && k + 1 < optimizer->num_sub_groups()) {
      progress.WaitConsumed(optimizer->sub_group_begin(k + 1) + optimizer->sub_group_elems(k + 1) - ring);
    }
    return Status::Ok();
  };
  return optimizer->Step(*adam, args, sio);
}

// Brings block b's home tier up to date with the update in flight: once the
// worker has stepped the block's shard range, its new parameters are
// written home (a cpu home has them already: the worker wrote it). `wait`:
// block until then; otherwise returns false when the
// worker is not there yet. A failed update is returned as its error.
//
// With new_params a ring, the blocks before b go home first, in block
// (= shard) order, and each one's ring space is handed back to the worker
// (UpdateWorker::Consume): the worker waits only for blocks ending in
// sub-groups it has already published, so neither side waits forever. A
// home that copies on the stream (the device's H2D from the pinned ring)
// hands the space back from the stream once its copy is done
// (LaunchHostFunc), so the driving thread never waits for the copy and the
// worker never for a driver busy elsewhere.
StatusOr<bool> Engine::Impl::RefreshHome(BlockId b, bool wait) {
  if (!stale[static_cast<size_t>(b)]) return true;
  if (plan.new_params_ring_elems == 0) return RefreshOne(b, wait);
  for (BlockId c = refresh_next; c <= b; ++c) {
    ZINF_ASSIGN_OR_RETURN(bool there, RefreshOne(c, wait));
    if (!there) return false;
    refresh_next = c + 1;
    const int64_t end = layout(c).rank_offset + layout(c).shard_numel;
    if (home->writes_on_stream()) {
      ZINF_RETURN_IF_ERROR(stream->LaunchHostFunc([this, end] { update.Consume(end); }));
    } else {
      update.Consume(end);
    }
  }
  return true;
}

// RefreshHome for block b alone.
StatusOr<bool> Engine::Impl::RefreshOne(BlockId b, bool wait) {
  if (!stale[static_cast<size_t>(b)]) return true;
  const zero3::BlockLayout& l = layout(b);
  const int64_t ring = plan.new_params_ring_elems;
  const bool on_stream = ring > 0 && home->writes_on_stream();
  ZINF_ASSIGN_OR_RETURN(bool there, update.WaitFor(l.rank_offset + l.shard_numel, /*wait=*/false));
  if (!there && wait) {
    // The worker may be waiting for ring space that the stream hands back:
    // everything enqueued runs first (and a failed copy is an error here,
    // not a wait for a hand-back that never comes).
    if (on_stream) ZINF_RETURN_IF_ERROR(stream->Synchronize());
    ZINF_ASSIGN_OR_RETURN(there, update.WaitFor(l.rank_offset + l.shard_numel, wait, &counters.optimizer_ns));
  }
  if (!there) return false;
  if (plan.new_params_in_home) {  // the worker wrote the home itself
    stale[static_cast<size_t>(b)] = false;
    return true;
  }
  const char* src = new_params.data() + (ring > 0 ? l.rank_offset % ring : l.rank_offset) * param_es;
  if (ring > 0 && l.rank_offset % ring + l.shard_numel > ring) {
    // The shard wraps around the ring's end: joined in the gradient
    // staging window, idle while an update is pending (ReduceGradients
    // finishes the update first); the home copies it at once.
    char* joined = staging.data();
    const int64_t head = ring - l.rank_offset % ring;
    std::memcpy(joined, src, static_cast<size_t>(head * param_es));
    std::memcpy(joined + head * param_es, new_params.data(), static_cast<size_t>((l.shard_numel - head) * param_es));
    src = joined;
  }
  ZINF_RETURN_IF_ERROR(home->WriteBlock(b, src));
  // The next wrapped block is joined in the same window.
  if (on_stream && src == staging.data()) ZINF_RETURN_IF_ERROR(stream->Synchronize());
  stale[static_cast<size_t>(b)] = false;
  return true;
}

// Waits for the worker, if one runs, and takes its result into
// update_failed (the worker's error, or OK).
void Engine::Impl::JoinWorker() {
  Status s = update.Join(&counters.optimizer_ns);
  if (update_failed.ok()) update_failed = s;
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
  if (!update_pending) return update_failed;
  // The blocks home as the worker steps them (a ring must be drained for
  // the worker to finish), then the worker joined: an error of its own
  // after its last sub-group surfaces there.
  Status s = update_failed;
  for (BlockId b = 0; s.ok() && b < static_cast<BlockId>(stale.size()); ++b) s = RefreshHome(b, /*wait=*/true).status();
  JoinWorker();
  if (s.ok()) s = update_failed;
  if (s.ok()) s = home->Flush();
  // Copies out of new_params must be done before the next update rewrites it.
  Status sync = stream->Synchronize();
  if (s.ok()) s = sync;
  update_pending = false;
  if (update_failed.ok()) update_failed = s;
  return s;
}

}  // namespace zinf
