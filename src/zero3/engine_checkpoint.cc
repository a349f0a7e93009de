// Engine::SaveCheckpoint and LoadCheckpoint (include/zinf/engine.h): the
// optimizer state's blobs through swap/checkpoint.h, with the engine's
// manifest keys (engine_manifest.h) beside the caller's.

#include <algorithm>
#include <cstring>
#include <functional>

#include "swap/checkpoint.h"
#include "zero3/engine_impl.h"
#include "zero3/engine_manifest.h"

namespace zinf {

Status Engine::SaveCheckpoint(const std::string& dir, const std::map<std::string, std::string>& metadata,
                              bool replace_orphan) {
  Impl& m = *impl_;
  ZINF_RETURN_IF_ERROR(m.Trains("SaveCheckpoint"));
  ZINF_RETURN_IF_ERROR(m.CheckpointPreconditions("SaveCheckpoint"));
  ZINF_RETURN_IF_ERROR(m.Commit());
  ZINF_RETURN_IF_ERROR(m.FinishUpdate());
  ZINF_RETURN_IF_ERROR(zero3::CheckUserKeys(metadata));
  std::map<std::string, std::string> all = m.Manifest();
  all.insert(metadata.begin(), metadata.end());
  ZINF_RETURN_IF_ERROR(m.PrepareCheckpointIo());
  // Any prefetched parameter reads finish first: the store is quiet.
  ZINF_RETURN_IF_ERROR(m.stream->Synchronize());
  swap::SaveOptions so;
  so.replace_orphan = replace_orphan;
  if (m.options.progress) so.progress = m.options.progress("saving checkpoint " + dir);
  StatusOr<std::vector<swap::BlobRef>> blobs = m.optimizer->CheckpointBlobs(swap::OptimizerSwapper::BlobUse::kSave);
  if (!blobs.ok()) return blobs.status().WithContext("saving checkpoint " + dir);
  return swap::SaveCheckpoint(*m.checkpoint_io, *m.checkpoint_pool, dir, all, *blobs, so)
      .WithContext("saving checkpoint " + dir);
}

StatusOr<std::map<std::string, std::string>> Engine::LoadCheckpoint(const std::string& dir) {
  Impl& m = *impl_;
  ZINF_RETURN_IF_ERROR(m.CheckpointPreconditions("LoadCheckpoint"));
  ZINF_RETURN_IF_ERROR(m.PrepareCheckpointIo());
  ZINF_ASSIGN_OR_RETURN(swap::CheckpointReader reader,
                        swap::CheckpointReader::Open(*m.checkpoint_io, *m.checkpoint_pool, dir));
  const std::map<std::string, std::string>& md = reader.metadata();
  if (m.options.forward_only) {
    ZINF_RETURN_IF_ERROR(zero3::CheckLayoutFits(md, m.Manifest(), dir, /*weights_only=*/true));
    ZINF_RETURN_IF_ERROR(m.LoadMasterHome(reader));
    return zero3::UserMetadata(md);
  }
  // Everything that fixes the layout of the saved state must match.
  ZINF_RETURN_IF_ERROR(zero3::CheckLayoutFits(md, m.Manifest(), dir));
  ZINF_ASSIGN_OR_RETURN(zero3::EngineProgress progress, zero3::ReadProgress(md, dir));

  // The update in flight (or a failed one, whose error was reported by the
  // call that met it) is abandoned: the checkpoint replaces the state and
  // every home is rewritten below, so nothing is refreshed now.
  m.JoinWorker();
  m.update_pending = false;

  // Verify every blob, then read them into the optimizer state.
  if (!m.committed) {
    // Nothing to initialise from: the checkpoint is the initial state. The
    // gradient arrays start at zero; master, m and v are overwritten below.
    ZINF_RETURN_IF_ERROR(m.optimizer->ZeroMoments());
  }
  m.gathered->DropAll();
  ZINF_RETURN_IF_ERROR(m.stream->Synchronize());
  m.optimizer->DropPrefetch();  // its reads would be of the state replaced here
  // Restore's errors name the checkpoint directory already.
  ProgressFn progress_fn;
  if (m.options.progress) progress_fn = m.options.progress("loading checkpoint " + dir);
  ZINF_ASSIGN_OR_RETURN(std::vector<swap::BlobRef> blobs,
                        m.optimizer->CheckpointBlobs(swap::OptimizerSwapper::BlobUse::kRestore));
  ZINF_RETURN_IF_ERROR(reader.Restore(blobs, progress_fn));
  m.optimizer->Restored();

  // The working parameters at their home tier follow from the master weights.
  ZINF_RETURN_IF_ERROR(m.WriteHomeFromMaster());
  // The accumulator is not zeroed: with no block holding a gradient of
  // the cycle, the first reduce of each sets its range and the step zeroes
  // the ranges of the others (ZeroUnreducedGradients).
  std::fill(m.acc_holds.begin(), m.acc_holds.end(), false);
  if (m.grad_window) m.grad_window->Reset();
  std::fill(m.params_set.begin(), m.params_set.end(), true);
  std::fill(m.stale.begin(), m.stale.end(), false);
  m.update_failed = Status::Ok();
  m.committed = true;
  m.applied_steps = progress.applied_steps;
  m.micro_steps = progress.micro_steps;
  m.schedule->set_last_batch_iteration(progress.lr_iteration);
  m.scaler->Restore(progress.loss_scaler);
  return zero3::UserMetadata(md);
}

// Forward-only: the checkpoint's master weights (master.0, master.1, ...:
// the rank shard in sub-groups, end to end, whatever size the saving run
// cut them) streamed into staging, each block written home once its shard
// is whole. The parameters are replaced once the blobs are found to fit;
// they count as set only once every block is, and none does after an error.
Status Engine::Impl::LoadMasterHome(const swap::CheckpointReader& reader) {
  const std::string& dir = reader.dir();
  const int64_t total = partitioner->total_shard_numel();
  std::vector<std::string> masters;
  int64_t elems = 0;
  while (elems < total) {
    std::string blob = "master." + std::to_string(masters.size());
    ZINF_ASSIGN_OR_RETURN(const swap::BlobInfo* info, reader.Find(blob));
    if (info->size_bytes <= 0 || info->size_bytes % 4 != 0) {
      return Status::Corruption("checkpoint " + dir + ": blob '" + blob + "' holds " +
                                std::to_string(info->size_bytes) + " bytes, not whole fp32 master weights");
    }
    elems += info->size_bytes / 4;
    masters.push_back(std::move(blob));
  }
  if (elems != total) {
    return Status::Corruption("checkpoint " + dir + ": its master weights (" + std::to_string(masters.size()) +
                              " sub-groups) hold " + std::to_string(elems) + " elements, the rank shard " +
                              std::to_string(total));
  }
  // The blobs fit: the parameters are replaced from here on.
  gathered->DropAll();
  ZINF_RETURN_IF_ERROR(stream->Synchronize());
  std::fill(params_set.begin(), params_set.end(), false);
  committed = false;
  std::function<void(int64_t, int64_t)> progress;
  if (options.progress) progress = options.progress("loading checkpoint " + dir + " (master weights)");
  if (progress) progress(0, total * 4);
  auto* shard = reinterpret_cast<float*>(staging.data());
  BlockId b = 0;
  int64_t filled = 0, done = 0;  // elements of block b in staging; of the rank shard read
  auto place = [&](int64_t, const char* data, int64_t n) -> Status {
    for (int64_t left = n / 4; left > 0;) {
      const int64_t numel = layout(b).shard_numel;
      const int64_t take = std::min(left, numel - filled);
      std::memcpy(shard + filled, data, static_cast<size_t>(take * 4));
      data += take * 4;
      left -= take;
      filled += take;
      if (filled < numel) continue;
      ZINF_RETURN_IF_ERROR(WriteHomeBlock(b, shard).WithContext("checkpoint " + dir + ": block '" + name(b) + "'"));
      params_set[static_cast<size_t>(b)] = true;
      ++b;
      filled = 0;
    }
    if (progress) progress(done += n / 4 * 4, total * 4);
    return Status::Ok();
  };
  Status s;
  for (size_t k = 0; k < masters.size() && s.ok(); ++k) s = reader.ReadBlobPieces(masters[k], place);
  if (s.ok()) s = Commit();
  // A chunk's crc is checked once it is whole, and the last writes home
  // are waited for in Commit: after an error what went home may be damaged.
  if (!s.ok()) std::fill(params_set.begin(), params_set.end(), false);
  return s;
}

Status Engine::Impl::CheckpointPreconditions(const char* what) const {
  if (std::optional<BlockId> held = gathered->FirstHeld()) {
    return Status::FailedPrecondition(std::string("engine: ") + what + " while block '" + name(*held) +
                                      "' is acquired");
  }
  const int64_t gas = config.gradient_accumulation_steps;
  if (micro_steps % gas != 0 || grads_pending) {
    return Status::FailedPrecondition(std::string("engine: ") + what +
                                      " in the middle of a gradient-accumulation cycle (" +
                                      std::to_string(micro_steps % gas) + " of " + std::to_string(gas) +
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
  if (hooks.io_engine != nullptr) {
    checkpoint_io = hooks.io_engine;
  } else {
    aio::IoEngineOptions io_options = aio::FromAioConfig(config.aio);
    io_options.direct_io = aio::DirectIo::kPrefer;
    ZINF_ASSIGN_OR_RETURN(owned_checkpoint_io, aio::CreateIoEngine(io_options));
    checkpoint_io = owned_checkpoint_io.get();
  }
  // Pieces of a swap blob are whole stripes: the buffers hold at least one.
  ZINF_ASSIGN_OR_RETURN(checkpoint_pool, aio::PinnedPool::Create(plan.checkpoint_buffers));
  return Status::Ok();
}

// What must agree between a checkpoint and the engine loading it, and the
// counters that continue from it.
std::map<std::string, std::string> Engine::Impl::Manifest() const {
  zero3::EngineLayoutKeys layout;
  layout.world_size = partitioner->world_size();
  layout.rank = partitioner->rank();
  layout.specs = &specs;
  layout.shard_elems = partitioner->total_shard_numel();
  layout.sub_group_elems = optimizer ? optimizer->sub_group_elems(0) : plan.optimizer.sub_group_elems;
  layout.config_sub_group_size = config.zero.sub_group_size;
  layout.optimizer_device = config.zero.offload_optimizer.device;
  layout.optimizer_buffer_count = config.zero.offload_optimizer.buffer_count;
  layout.param_type = param_type;
  zero3::EngineProgress progress;
  progress.applied_steps = applied_steps;
  progress.micro_steps = micro_steps;
  progress.lr_iteration = schedule->last_batch_iteration();
  progress.loss_scaler = scaler->state();
  return zero3::EngineMetadata(layout, progress);
}

}  // namespace zinf
