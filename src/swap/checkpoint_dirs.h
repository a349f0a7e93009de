// Checkpoint folders: where a training run's checkpoints live, how `latest`,
// pruning and orphans work, and where a resume starts.
//
// A run saves one checkpoint (checkpoint.h) per rank and step:
//   <save_dir>/rank-<r>/step-<n>/   rank r's state after n optimizer steps
//                                   (n written with at least 8 digits)
//   <save_dir>/rank-<r>/latest      names rank r's newest complete step
// Every rank writes only its own rank directory, and all ranks save the same
// steps. The rules:
// * Resume: a crash between the ranks' saves can leave their `latest` one
//   checkpoint apart, so a run resumes from the oldest of the ranks' latest
//   steps, which every rank has. This layer has no communicator: the caller
//   agrees on that step across ranks (FindResumePoint gives each rank's own).
// * Orphans: a step directory that `latest` does not name was left by a run
//   killed after renaming it into place but before updating `latest`, or by
//   a run since resumed from an older step. Saving the same step again
//   replaces it (save with SaveOptions::replace_orphan, which never replaces
//   the directory `latest` names).
// * Pruning (keep the newest k): only step directories up to the one just
//   saved count; later ones belong to a run this one resumed from an older
//   step of, and are left alone. With several ranks k must be 0 (all) or at
//   least 2: with 1, a rank one save ahead of the others would already have
//   removed the step they all resume from.
// * One run per rank directory: a run holds `<rank_dir>/.lock`
//   (LockRankDirectory) while it saves there. Without it, a second run on the
//   same save_dir would take the first's step directory that `latest` does
//   not name yet (a save in progress) for an orphan and delete it.
//
// Reading `latest` and manifests here goes through a small buffered IoEngine
// and a one-buffer unpinned pool of its own (made per call): these are a few
// hundred bytes read outside any engine, before one exists.
//
// Thread-safety: free functions without shared state; concurrent calls on
// the same rank directory must not prune and save at once.
#pragma once

#include <cstdint>
#include <map>
#include <string>

#include "core/file_lock.h"
#include "zinf/status.h"

namespace zinf::swap {

// <save_dir>/rank-<rank>.
std::string RankDirectory(const std::string& save_dir, int rank);
// <rank_dir>/step-<step> (at least 8 digits). `step` >= 0.
std::string StepDirectory(const std::string& rank_dir, int64_t step);
// The step of a step directory, from the last component of `path`
// ("a/rank-0/step-00000042" -> 42); -1 when it is no step directory name.
int64_t StepOfDirectory(const std::string& path);

// Creates <save_dir>/rank-<rank> if missing and locks it for this run
// (core/file_lock.h); hold the lock while saving checkpoints there.
// kFailedPrecondition naming the directory and the holder's pid when another
// run holds it; mkdir's and open's errors.
StatusOr<FileLock> LockRankDirectory(const std::string& save_dir, int rank);

// kInvalidArgument unless `keep` (checkpoints kept per rank; 0: all) suits
// a run of `world_size` ranks (see the file comment).
Status CheckKeepCheckpoints(int keep, int world_size);

// Removes the step directories of `rank_dir` older than the newest `keep`
// among those up to `saved_step` (the one just saved, which `latest` names);
// logs each removal. keep <= 0 keeps all. Errors: the directory listing's or removal's,
// naming the path.
Status PruneCheckpoints(const std::string& rank_dir, int64_t saved_step, int keep);

// The step `<rank_dir>/latest` names. kNotFound without a `latest`;
// kCorruption when it is damaged or names no step directory.
StatusOr<int64_t> LatestStep(const std::string& rank_dir);

// Where rank `rank` of `world_size` resumes, given `path`: a save_dir (this
// rank's `latest`), or a step directory `<save_dir>/rank-<k>/step-<n>` (each
// rank takes step n of its own rank directory). With one rank, `path` may be
// any checkpoint directory (one with a manifest). Errors: kNotFound when
// `path` is neither a checkpoint nor holds this rank's directory;
// kInvalidArgument for a checkpoint outside the layout with several ranks;
// LatestStep's.
struct ResumePoint {
  std::string rank_dir;  // empty: `path` itself is the checkpoint (one rank, outside the layout)
  int64_t step = -1;     // the step found for this rank; -1 with an empty rank_dir
  std::string path;      // the checkpoint this rank found
  // The checkpoint of step `agreed` (the ranks' agreed step; see the file comment).
  std::string Checkpoint(int64_t agreed) const { return rank_dir.empty() ? path : StepDirectory(rank_dir, agreed); }
};
StatusOr<ResumePoint> FindResumePoint(const std::string& path, int rank, int world_size);

// The metadata of checkpoint `dir`'s manifest, read and checked (checkpoint
// crc, blob files present) without loading any blob. CheckpointReader::Open's
// errors.
StatusOr<std::map<std::string, std::string>> ReadCheckpointMetadata(const std::string& dir);

}  // namespace zinf::swap
