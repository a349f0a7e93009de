#include "zero3/partitioner.h"

#include <gtest/gtest.h>

#include <numeric>

namespace zinf::zero3 {
namespace {

std::vector<BlockSpec> Blocks() {
  return {{"a", {{"w", {7, 5}}, {"b", {7}}}}, {"b", {{"w", {300}}}}, {"c", {{"s", {}}}}};
}

// The no-decay ranges of every rank's shard, mapped back to flat block
// offsets, are exactly the undecayed tensors' elements.
TEST(PartitionerTest, NoDecayRangesCoverTheUndecayedTensorsOfEachShard) {
  std::vector<BlockSpec> blocks = {
      {"a", {{"w", {7, 5}}, {"b", {7}}, {"n", {130}}}}, {"b", {{"w", {300}}}}, {"c", {{"s", {}}, {"b", {3}}}}};
  blocks[0].tensors[1].decay = false;
  blocks[0].tensors[2].decay = false;
  blocks[2].tensors[1].decay = false;
  for (int world : {1, 2, 3}) {
    std::vector<std::vector<bool>> undecayed(blocks.size());
    for (int r = 0; r < world; ++r) {
      auto p = Partitioner::Create(blocks, world, r);
      ASSERT_TRUE(p.ok());
      const std::vector<optim::ElemRange> ranges = p->NoDecayRanges();
      for (size_t k = 0; k < ranges.size(); ++k) {
        ASSERT_LT(ranges[k].begin, ranges[k].end);
        if (k > 0) {
          ASSERT_LT(ranges[k - 1].end, ranges[k].begin);  // sorted, merged
        }
      }
      for (size_t b = 0; b < blocks.size(); ++b) {
        const BlockLayout& l = p->layout(static_cast<BlockId>(b));
        undecayed[b].resize(static_cast<size_t>(l.padded_numel));
        for (const optim::ElemRange& range : ranges) {
          for (int64_t i = range.begin; i < range.end; ++i) {
            if (i < l.rank_offset || i >= l.rank_offset + l.shard_numel) continue;
            undecayed[b][static_cast<size_t>(r * l.shard_numel + i - l.rank_offset)] = true;
          }
        }
      }
    }
    for (size_t b = 0; b < blocks.size(); ++b) {
      std::vector<bool> want;
      for (const TensorSpec& t : blocks[b].tensors) want.insert(want.end(), static_cast<size_t>(t.numel()), !t.decay);
      want.resize(undecayed[b].size(), false);
      EXPECT_EQ(undecayed[b], want) << "block " << b << ", world " << world;
    }
  }
  auto all = Partitioner::Create(Blocks(), 2, 1);
  ASSERT_TRUE(all.ok());
  EXPECT_TRUE(all->NoDecayRanges().empty());
}

TEST(PartitionerTest, ShardsAreEqualAlignedAndPadded) {
  for (int world : {1, 2, 3}) {
    auto p = Partitioner::Create(Blocks(), world, world - 1);
    ASSERT_TRUE(p.ok()) << p.status().ToString();
    EXPECT_EQ(p->layout(0).numel, 42);
    EXPECT_EQ(p->layout(0).tensors[1].offset, 35);
    EXPECT_EQ(p->layout(2).numel, 1);  // a scalar
    int64_t offset = 0;
    for (int b = 0; b < p->num_blocks(); ++b) {
      const BlockLayout& l = p->layout(b);
      EXPECT_EQ(l.shard_numel % kShardAlignElems, 0);
      EXPECT_EQ(l.padded_numel, l.shard_numel * world);
      EXPECT_GE(l.padded_numel, l.numel);
      EXPECT_LT(l.padded_numel - l.numel, world * kShardAlignElems + l.shard_numel);
      EXPECT_EQ(l.rank_offset, offset);
      offset += l.shard_numel;
    }
    EXPECT_EQ(p->total_shard_numel(), offset);
  }
}

TEST(PartitionerTest, ShardsOfAllRanksRebuildTheBlock) {
  const int world = 3;
  std::vector<float> w(300);
  std::iota(w.begin(), w.end(), 1.0f);
  std::vector<float> flat;
  int64_t asked = 0;  // each rank is asked for its own ranges only: 300 elements in all
  for (int r = 0; r < world; ++r) {
    auto p = Partitioner::Create(Blocks(), world, r);
    ASSERT_TRUE(p.ok());
    std::vector<float> shard(static_cast<size_t>(p->layout(1).shard_numel), -1.0f);
    ASSERT_TRUE(p->FillShard(
                     1,
                     [&](size_t t, int64_t first, int64_t count, float* out) {
                       EXPECT_EQ(t, 0u);
                       EXPECT_GE(first, 0);
                       EXPECT_LE(first + count, 300);
                       asked += count;
                       std::copy(w.begin() + first, w.begin() + first + count, out);
                       return Status::Ok();
                     },
                     shard.data())
                    .ok());
    flat.insert(flat.end(), shard.begin(), shard.end());
  }
  EXPECT_EQ(asked, 300);
  auto p = Partitioner::Create(Blocks(), world, 0);
  std::vector<float> back(300);
  p->Unflatten(1, flat.data(), {back.data()});
  EXPECT_EQ(back, w);
  for (size_t i = 300; i < flat.size(); ++i) EXPECT_EQ(flat[i], 0.0f);  // padding
}

TEST(PartitionerTest, BadLayoutsAreErrors) {
  EXPECT_FALSE(Partitioner::Create({}, 1, 0).ok());
  EXPECT_FALSE(Partitioner::Create(Blocks(), 2, 2).ok());
  EXPECT_FALSE(Partitioner::Create({{"a", {}}}, 1, 0).ok());
  EXPECT_FALSE(Partitioner::Create({{"a", {{"w", {3, 0}}}}}, 1, 0).ok());
  EXPECT_FALSE(Partitioner::Create({{"a", {{"w", {3}}}}, {"a", {{"w", {3}}}}}, 1, 0).ok());
  EXPECT_FALSE(Partitioner::Create({{"a", {{"w", {3}}, {"w", {3}}}}}, 1, 0).ok());
}

}  // namespace
}  // namespace zinf::zero3
