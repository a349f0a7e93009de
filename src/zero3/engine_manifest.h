// The engine's part of a checkpoint manifest: the "engine." keys that
// SaveCheckpoint writes beside the caller's metadata and LoadCheckpoint
// checks and reads back.
//
// Three kinds of key: the layout (format, world size, rank, blocks, a CRC of
// the block and tensor names and shapes, shard and sub-group sizes), which
// must equal the loading engine's own, compared as text; the settings the
// sub-group size came from (sub_group_size, the optimizer's tier and
// buffer_count), which are not compared but say in a refusal which one
// changed; and the progress
// (optimizer and micro steps, LR-schedule position, loss-scaler state),
// which continues from the checkpoint. Doubles are written as hexadecimal
// floats, so they come back exactly.
//
// Thread-safety: plain functions and values.
#pragma once

#include <cstdint>
#include <map>
#include <string>
#include <vector>

#include "optim/loss_scaler.h"
#include "zinf/config.h"
#include "zinf/engine.h"
#include "zinf/status.h"

namespace zinf::zero3 {

using Metadata = std::map<std::string, std::string>;

// The reserved prefix of the engine's keys; a caller's key may not use it.
inline constexpr char kEngineKeyPrefix[] = "engine.";

struct EngineLayoutKeys {
  int world_size = 1;
  int rank = 0;
  const std::vector<BlockSpec>* specs = nullptr;
  int64_t shard_elems = 0;  // this rank's shard, elements
  // The optimizer's sub-group size as the engine runs it: the config's
  // sub_group_size, split by FitOptimizerPipeline when the state is on NVMe
  // and buffer_count holds fewer buffers than the pipeline keeps. The
  // checkpoint stores the state per sub-group (master.<k>, ...), so this is
  // what a checkpoint's layout depends on.
  int64_t sub_group_elems = 0;
  // Where sub_group_elems came from (recorded, not compared).
  int64_t config_sub_group_size = 0;
  OffloadDevice optimizer_device = OffloadDevice::kNone;
  int64_t optimizer_buffer_count = 0;
  ElementType param_type = ElementType::kBf16;
};

struct EngineProgress {
  int64_t applied_steps = 0;
  int64_t micro_steps = 0;
  int64_t lr_iteration = 0;  // LrSchedule::last_batch_iteration
  optim::LossScaler::State loss_scaler;
};

// Every engine key of a checkpoint for this layout and progress.
Metadata EngineMetadata(const EngineLayoutKeys& layout, const EngineProgress& progress);

// OK when the layout keys of checkpoint `dir`'s manifest `theirs` equal
// `mine` (an EngineMetadata of the loading engine); else
// kFailedPrecondition naming the key, both values and what to change (for
// the sub-group size: which of the settings it came from differs, when the
// checkpoint recorded them), or kCorruption when a layout key is missing.
// `weights_only` (a forward-only engine, which reads the master weights
// alone): the sub-group size is not compared.
Status CheckLayoutFits(const Metadata& theirs, const Metadata& mine, const std::string& dir, bool weights_only = false);

// The progress saved in checkpoint `dir`'s manifest; kCorruption naming
// the key when one is missing or not a number.
StatusOr<EngineProgress> ReadProgress(const Metadata& md, const std::string& dir);

// The caller's keys of `md` (those without the engine prefix).
Metadata UserMetadata(const Metadata& md);

// kInvalidArgument when a caller's key uses the reserved prefix.
Status CheckUserKeys(const Metadata& md);

}  // namespace zinf::zero3
