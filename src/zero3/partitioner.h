// Partitioner: where every element of every block lives.
//
// A block's tensors are laid end to end (registration order, no gaps) into
// one flat buffer of numel elements. The flat buffer is padded to
// padded_numel = world_size * shard_numel, shard_numel being ceil(numel /
// world_size) rounded up to kShardAlignElems so every shard starts 512-byte
// aligned on the device at any element size (NCCL and the copy engines like
// it). Rank r owns flat elements [r * shard_numel, (r + 1) * shard_numel);
// the part past numel is padding (zeros, zero gradient).
//
// A rank's shards of all blocks are laid end to end (block order) into one
// "rank shard" of total_shard_numel elements: the array the optimizer walks
// in sub-groups and the working-parameter home tiers hold.
//
// Thread-safety: immutable after Create.
#pragma once

#include <cstdint>
#include <string>
#include <vector>

#include "optim/cpu_adam.h"
#include "zinf/engine.h"
#include "zinf/status.h"

namespace zinf::zero3 {

inline constexpr int64_t kShardAlignElems = 128;

struct TensorLayout {
  int64_t offset = 0;  // in the block's flat buffer, elements
  int64_t numel = 0;
  bool decay = true;  // TensorSpec::decay
};

struct BlockLayout {
  std::vector<TensorLayout> tensors;
  int64_t numel = 0;
  int64_t shard_numel = 0;
  int64_t padded_numel = 0;
  int64_t rank_offset = 0;  // this block's shard in the rank shard, elements
};

class Partitioner {
 public:
  // Errors: no blocks, an empty block or tensor, a negative dimension,
  // duplicate block names, world_size < 1 or rank outside it.
  static StatusOr<Partitioner> Create(const std::vector<BlockSpec>& blocks, int world_size, int rank);

  int world_size() const { return world_size_; }
  int rank() const { return rank_; }
  int num_blocks() const { return static_cast<int>(layouts_.size()); }
  const BlockLayout& layout(BlockId b) const { return layouts_[static_cast<size_t>(b)]; }
  int64_t total_shard_numel() const { return total_shard_numel_; }
  int64_t max_padded_numel() const { return max_padded_numel_; }
  int64_t max_shard_numel() const { return max_shard_numel_; }
  // The parts of this rank's shard that hold tensors with decay off: sorted,
  // disjoint, adjacent ones merged (padding is left out: it stays zero
  // either way). Empty when every tensor decays.
  std::vector<optim::ElemRange> NoDecayRanges() const;

  // This rank's shard of a block into `shard` (shard_numel fp32; padding
  // zeroed): `fill` writes each tensor range the shard holds (Engine::
  // TensorFill), in order.
  Status FillShard(BlockId b, const Engine::TensorFill& fill, float* shard) const;
  // Writes a gathered flat block (padded_numel fp32) into per-tensor arrays.
  void Unflatten(BlockId b, const float* flat, const std::vector<float*>& out) const;

 private:
  std::vector<BlockLayout> layouts_;
  int world_size_ = 1;
  int rank_ = 0;
  int64_t total_shard_numel_ = 0;
  int64_t max_padded_numel_ = 0;
  int64_t max_shard_numel_ = 0;
};

}  // namespace zinf::zero3
