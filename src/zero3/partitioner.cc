#include "zero3/partitioner.h"

#include <algorithm>
#include <cstring>
#include <set>

#include "core/units.h"

namespace zinf::zero3 {

StatusOr<Partitioner> Partitioner::Create(const std::vector<BlockSpec>& blocks, int world_size, int rank) {
  if (world_size < 1 || rank < 0 || rank >= world_size) {
    return Status::InvalidArgument("partitioner: rank " + std::to_string(rank) + " of world size " +
                                   std::to_string(world_size));
  }
  if (blocks.empty()) return Status::InvalidArgument("engine: no blocks registered");
  Partitioner p;
  p.world_size_ = world_size;
  p.rank_ = rank;
  std::set<std::string> names;
  for (const BlockSpec& b : blocks) {
    if (b.name.empty() || !names.insert(b.name).second) {
      return Status::InvalidArgument("engine: block name '" + b.name + "' is empty or used twice");
    }
    if (b.tensors.empty()) return Status::InvalidArgument("engine: block '" + b.name + "' has no tensors");
    BlockLayout l;
    std::set<std::string> tensor_names;
    for (const TensorSpec& t : b.tensors) {
      if (!tensor_names.insert(t.name).second) {
        return Status::InvalidArgument("engine: tensor '" + b.name + "." + t.name + "' is defined twice");
      }
      for (int64_t d : t.shape) {
        if (d <= 0) {
          return Status::InvalidArgument("engine: tensor '" + b.name + "." + t.name + "' has dimension " +
                                         std::to_string(d));
        }
      }
      l.tensors.push_back({l.numel, t.numel(), t.decay});
      l.numel += t.numel();
    }
    l.shard_numel = AlignUp((l.numel + world_size - 1) / world_size, kShardAlignElems);
    l.padded_numel = l.shard_numel * world_size;
    l.rank_offset = p.total_shard_numel_;
    p.total_shard_numel_ += l.shard_numel;
    p.max_padded_numel_ = std::max(p.max_padded_numel_, l.padded_numel);
    p.max_shard_numel_ = std::max(p.max_shard_numel_, l.shard_numel);
    p.layouts_.push_back(std::move(l));
  }
  return p;
}

std::vector<optim::ElemRange> Partitioner::NoDecayRanges() const {
  std::vector<optim::ElemRange> ranges;
  for (const BlockLayout& l : layouts_) {
    const int64_t begin = rank_ * l.shard_numel;
    const int64_t end = begin + l.shard_numel;
    for (const TensorLayout& t : l.tensors) {
      const int64_t lo = std::max(begin, t.offset);
      const int64_t hi = std::min(end, t.offset + t.numel);
      if (t.decay || lo >= hi) continue;
      const optim::ElemRange r{l.rank_offset + lo - begin, l.rank_offset + hi - begin};
      if (!ranges.empty() && ranges.back().end == r.begin) {
        ranges.back().end = r.end;
      } else {
        ranges.push_back(r);
      }
    }
  }
  return ranges;
}

Status Partitioner::FillShard(BlockId b, const Engine::TensorFill& fill, float* shard) const {
  const BlockLayout& l = layout(b);
  const int64_t begin = rank_ * l.shard_numel;
  const int64_t end = begin + l.shard_numel;
  std::fill(shard, shard + l.shard_numel, 0.0f);
  for (size_t t = 0; t < l.tensors.size(); ++t) {
    const int64_t lo = std::max(begin, l.tensors[t].offset);
    const int64_t hi = std::min(end, l.tensors[t].offset + l.tensors[t].numel);
    if (lo >= hi) continue;
    ZINF_RETURN_IF_ERROR(fill(t, lo - l.tensors[t].offset, hi - lo, shard + (lo - begin)));
  }
  return Status::Ok();
}

void Partitioner::Unflatten(BlockId b, const float* flat, const std::vector<float*>& out) const {
  const BlockLayout& l = layout(b);
  for (size_t t = 0; t < l.tensors.size(); ++t) {
    std::memcpy(out[t], flat + l.tensors[t].offset, static_cast<size_t>(l.tensors[t].numel) * sizeof(float));
  }
}

}  // namespace zinf::zero3
