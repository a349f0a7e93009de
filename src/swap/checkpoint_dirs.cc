// Checkpoint folders (checkpoint_dirs.h).
#include "swap/checkpoint_dirs.h"

#include <algorithm>
#include <cstdio>
#include <memory>
#include <utility>
#include <vector>

#include "aio/io_engine.h"
#include "aio/pinned_pool.h"
#include "core/fs.h"
#include "core/log.h"
#include "swap/checkpoint.h"

namespace zinf::swap {
namespace {

constexpr char kRankPrefix[] = "rank-";
constexpr char kStepPrefix[] = "step-";

// A buffered I/O engine and one unpinned buffer, for reading pointers and
// manifests outside any engine.
struct MetadataIo {
  std::unique_ptr<aio::IoEngine> engine;
  std::unique_ptr<aio::PinnedPool> pool;

  static StatusOr<MetadataIo> Create() {
    MetadataIo m;
    aio::IoEngineOptions io;
    io.direct_io = aio::DirectIo::kOff;
    ZINF_ASSIGN_OR_RETURN(m.engine, aio::CreateIoEngine(io));
    aio::PinnedPoolOptions po;
    po.buffer_count = 1;
    po.buffer_bytes = 64 << 10;
    po.pin = false;
    po.huge_pages = false;
    po.name = "checkpoint metadata";
    ZINF_ASSIGN_OR_RETURN(m.pool, aio::PinnedPool::Create(po));
    return m;
  }
};

bool IsRankDirectory(const std::string& path) { return BaseName(path).rfind(kRankPrefix, 0) == 0; }

}  // namespace

std::string RankDirectory(const std::string& save_dir, int rank) {
  return JoinPath(save_dir, kRankPrefix + std::to_string(rank));
}

std::string StepDirectory(const std::string& rank_dir, int64_t step) {
  char name[32];
  std::snprintf(name, sizeof(name), "%s%08lld", kStepPrefix, static_cast<long long>(step));
  return JoinPath(rank_dir, name);
}

int64_t StepOfDirectory(const std::string& path) {
  const std::string base = BaseName(path);
  const size_t prefix = sizeof(kStepPrefix) - 1;
  if (base.rfind(kStepPrefix, 0) != 0 || base.size() == prefix) return -1;
  int64_t step = 0;
  for (size_t i = prefix; i < base.size(); ++i) {
    if (base[i] < '0' || base[i] > '9' || step > (int64_t{1} << 50)) return -1;
    step = step * 10 + (base[i] - '0');
  }
  return step;
}

StatusOr<FileLock> LockRankDirectory(const std::string& save_dir, int rank) {
  const std::string rank_dir = RankDirectory(save_dir, rank);
  ZINF_RETURN_IF_ERROR(MakeDirectories(rank_dir));
  StatusOr<FileLock> lock = FileLock::Acquire(JoinPath(rank_dir, ".lock"));
  if (!lock.ok()) {
    return lock.status().WithContext("checkpoint directory " + rank_dir + " is in use; give each run its own save dir");
  }
  return lock;
}

Status CheckKeepCheckpoints(int keep, int world_size) {
  if (keep >= 0 && (keep != 1 || world_size == 1)) return Status::Ok();
  return Status::InvalidArgument("keep " + std::to_string(keep) + " checkpoints: expected 0 (all)" +
                                 (world_size > 1 ? " or at least 2 with several ranks" : " or more"));
}

Status PruneCheckpoints(const std::string& rank_dir, int64_t saved_step, int keep) {
  if (keep <= 0) return Status::Ok();
  ZINF_ASSIGN_OR_RETURN(std::vector<std::string> entries, ListDirectory(rank_dir));
  std::vector<std::pair<int64_t, std::string>> steps;
  for (const std::string& e : entries) {
    const int64_t step = StepOfDirectory(e);
    if (step >= 0 && step <= saved_step) steps.emplace_back(step, JoinPath(rank_dir, e));
  }
  std::sort(steps.begin(), steps.end());
  for (size_t i = 0; i + static_cast<size_t>(keep) < steps.size(); ++i) {
    ZINF_RETURN_IF_ERROR(RemoveTree(steps[i].second));
    Log("swap").info("removed checkpoint {} (keeping the newest {})", steps[i].second, keep);
  }
  return Status::Ok();
}

StatusOr<int64_t> LatestStep(const std::string& rank_dir) {
  ZINF_ASSIGN_OR_RETURN(MetadataIo io, MetadataIo::Create());
  ZINF_ASSIGN_OR_RETURN(std::string latest, ResolveLatest(*io.engine, *io.pool, rank_dir));
  const int64_t step = StepOfDirectory(latest);
  if (step < 0) {
    return Status::Corruption(JoinPath(rank_dir, kLatestFileName) + " names " + latest + ", not a step directory");
  }
  return step;
}

StatusOr<ResumePoint> FindResumePoint(const std::string& path, int rank, int world_size) {
  ResumePoint point;
  point.path = path;
  if (PathExists(JoinPath(path, "manifest"))) {
    // One step directory: `.../rank-<k>/step-<n>`; each rank takes its own.
    const std::string rank_dir = ParentPath(path);
    const int64_t step = StepOfDirectory(path);
    if (step < 0 || !IsRankDirectory(rank_dir)) {
      if (world_size > 1) {
        return Status::InvalidArgument(path + " is not <save-dir>/" + kRankPrefix + "<r>/" + kStepPrefix + "<n>");
      }
      return point;  // a lone checkpoint: one rank resumes it as it is
    }
    point.rank_dir = RankDirectory(ParentPath(rank_dir), rank);
    point.step = step;
    point.path = StepDirectory(point.rank_dir, step);
    return point;
  }
  point.rank_dir = RankDirectory(path, rank);
  if (!PathExists(point.rank_dir)) {
    return Status::NotFound(path + " is neither a checkpoint (no manifest) nor a save directory (no " + point.rank_dir +
                            ")");
  }
  ZINF_ASSIGN_OR_RETURN(point.step, LatestStep(point.rank_dir));
  point.path = StepDirectory(point.rank_dir, point.step);
  return point;
}

StatusOr<std::map<std::string, std::string>> ReadCheckpointMetadata(const std::string& dir) {
  ZINF_ASSIGN_OR_RETURN(MetadataIo io, MetadataIo::Create());
  ZINF_ASSIGN_OR_RETURN(CheckpointReader reader, CheckpointReader::Open(*io.engine, *io.pool, dir));
  return reader.metadata();
}

}  // namespace zinf::swap
