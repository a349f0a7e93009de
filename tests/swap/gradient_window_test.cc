// GradientWindow against a RAM accumulator: the same ranges added in any
// order over several micro-batches leave the same gradient in the store,
// bit for bit, and Finish's sum of squares is ShardSumSquares'; ShardSquares
// gives the same bits whatever sub-groups cut the shard.
#include "swap/gradient_window.h"

#include <gtest/gtest.h>

#include <algorithm>
#include <cstring>
#include <random>
#include <thread>

#include "aio/fault_engine.h"
#include "optim/array_ops.h"
#include "swap/swap_test_util.h"

namespace zinf::swap {
namespace {

using testing::MakeEngine;
using testing::MakeFaultyEngine;
using testing::MakePool;
using testing::MakeThreads;
using testing::RandomFloats;
using testing::TempDir;

constexpr int64_t kTotal = 10'007;    // not a multiple of the sub-group
constexpr int64_t kSubGroup = 1'500;  // 7 sub-groups, the last one 1'007

struct Range {
  int64_t begin, count;
  enum When { kEvery, kNotLast, kLastOnly } when = kEvery;  // in which micro-batches
};

// How the shard is cut: into sub-groups, store extents (stripe units) and
// the norm's pieces (multiples of ShardSquares::kAtom and of `cut`).
struct Geometry {
  int64_t total, sub_group, cut, stripe_bytes;
  int64_t scale;  // the ranges below are for 10'007 elements: times this
};

// Sub-groups that are not multiples of the atom: only the first one's
// extents are whole pieces, the rest are squared and summed whole.
constexpr Geometry kUnaligned = {kTotal, kSubGroup, kSubGroup, 8 << 10, 1};
// A fitted pipeline's: sub-groups of whole atoms, 3 extents each (the last
// one's 2, one of them padded), the config's cut (10'000) inside extents:
// every extent is sealed as the last micro-batch sets it.
constexpr Geometry kAtomAligned = {2 * kTotal, 3 * ShardSquares::kAtom, 10'000, 4 << 10, 2};

class GradientWindowTest : public ::testing::Test {
 protected:
  void SetUp() override {
    threads_ = MakeThreads();
    ASSERT_NE(threads_, nullptr);
  }

  OptimizerSwapperOptions Options() {
    OptimizerSwapperOptions o;
    o.store.checksums = checksums_;
    o.total_elems = g_.total;
    o.sub_group_elems = g_.sub_group;
    o.device = OffloadDevice::kNvme;
    o.pipeline_read = o.pipeline_write = true;
    o.gradients_in_store = true;
    o.store.paths = {dir_.Sub("nvme0"), dir_.Sub("nvme1")};
    o.store.stripe_bytes = g_.stripe_bytes;
    return o;
  }

  std::vector<Range> Scaled(std::vector<Range> ranges) const {
    for (Range& r : ranges) {
      r.begin *= g_.scale;
      r.count = r.begin + r.count * g_.scale > g_.total ? g_.total - r.begin : r.count * g_.scale;
    }
    return ranges;
  }

  // Adds `micro` micro-batches of gradients over `ranges` (in that order,
  // each micro-batch; `skip_last` ranges are left out of the last one)
  // through a window and into a RAM array; expects the same gradient and
  // the same sum of squares. `flush_after`: the window is flushed after
  // that range of each micro-batch (buffers still being filled).
  // `largest_add`: what the window's buffers are sized for (0: the fewest).
  void Check(aio::IoEngine* io, const std::vector<Range>& ranges, int micro, size_t skip_last = 0,
             size_t flush_after = SIZE_MAX, int64_t largest_add = 0) {
    const OptimizerSwapperOptions o = Options();
    auto pool = MakePool(OptimizerSwapper::RequiredBuffers(o), OptimizerSwapper::RequiredBufferBytes(o, 4096));
    auto swapper = OptimizerSwapper::Create(o, io, pool.get());
    ASSERT_TRUE(swapper.ok()) << swapper.status().ToString();
    const std::vector<float> master = RandomFloats(g_.total, 1);
    ASSERT_TRUE((*swapper)->Initialize(master.data()).ok());
    aio::PinnedPoolOptions wo = GradientWindow::PoolOptions(o, false, largest_add);
    ASSERT_EQ(wo.buffer_count, GradientWindow::BufferCount(o, largest_add));
    auto wpool = aio::PinnedPool::Create(wo);
    ASSERT_TRUE(wpool.ok()) << wpool.status().ToString();
    auto window = GradientWindow::Create(swapper->get(), wpool->get(), threads_.get(), optim::Isa::kScalar, g_.cut);
    ASSERT_TRUE(window.ok()) << window.status().ToString();

    const float scale = 1.0f / static_cast<float>(micro);
    for (int cycle = 0; cycle < 2; ++cycle) {  // the second starts from zero again
      std::vector<float> want(static_cast<size_t>(g_.total), 0.0f);
      for (int m = 0; m < micro; ++m) {
        const bool last = m + 1 == micro;
        for (size_t i = 0; i < ranges.size() - (last ? skip_last : 0); ++i) {
          const Range& r = ranges[i];
          if ((r.when == Range::kNotLast && last) || (r.when == Range::kLastOnly && !last)) continue;
          const std::vector<float> g = RandomFloats(r.count, 100 * cycle + 10 * m + i);
          ASSERT_TRUE(optim::AddScaled(*threads_, g.data(), scale, want.data() + r.begin, r.count).ok());
          Status s = (*window)->Add(r.begin, r.count, g.data(), scale, last);
          ASSERT_TRUE(s.ok()) << s.ToString();
          for (int64_t k = 0; k < (*swapper)->num_sub_groups(); ++k) {
            EXPECT_EQ((*window)->FinalGradient(k), nullptr) << "lent while the cycle goes on: " << k;
          }
          if (i == flush_after) {
            ASSERT_TRUE((*window)->Flush().ok());
          }
        }
      }
      auto got_sum = (*window)->Finish();
      ASSERT_TRUE(got_sum.ok()) << got_sum.status().ToString();
      // The buffers lent to the step hold the final values.
      int held = 0;
      int64_t held_elems = 0;
      for (int64_t k = 0; k < (*swapper)->num_sub_groups(); ++k) {
        const float* f = (*window)->FinalGradient(k);
        if (f == nullptr) continue;
        ++held;
        held_elems += (*swapper)->sub_group_elems(k);
        EXPECT_EQ(std::memcmp(f, want.data() + (*swapper)->sub_group_begin(k), (*swapper)->sub_group_elems(k) * 4), 0)
            << "sub-group " << k;
      }
      EXPECT_GT(held, 0);
      EXPECT_EQ((*window)->FinalGradientElems(), held_elems);
      EXPECT_LE(held, GradientWindow::BufferCount(o, largest_add));
      const bool every =
          std::all_of(ranges.begin(), ranges.end(), [](const Range& r) { return r.when == Range::kEvery; });
      if (ranges.back().begin == 0 && skip_last == 0 && every) {  // the backward's order: the step's first is held
        EXPECT_NE((*window)->FinalGradient(0), nullptr);
      }
      auto want_sum = ShardSumSquares(*threads_, optim::Isa::kScalar, want.data(), g_.total, g_.cut);
      ASSERT_TRUE(want_sum.ok());
      EXPECT_EQ(std::memcmp(&*got_sum, &*want_sum, sizeof(double)), 0) << *got_sum << " vs " << *want_sum;
      std::vector<float> got(static_cast<size_t>(g_.total));
      ASSERT_TRUE((*swapper)->ReadState(nullptr, nullptr, nullptr, got.data()).ok());
      EXPECT_EQ(std::memcmp(got.data(), want.data(), got.size() * 4), 0) << "cycle " << cycle;
      EXPECT_GT((*window)->nvme_bytes(), 0);
    }
  }

  Geometry g_ = kUnaligned;
  bool checksums_ = true;
  TempDir dir_;
  std::unique_ptr<optim::ThreadPool> threads_;
};

// The same checks where every extent is sealed in the pass that sets it.
class SealedGradientWindowTest : public GradientWindowTest {
 protected:
  void SetUp() override {
    GradientWindowTest::SetUp();
    g_ = kAtomAligned;
  }
};

// Block shards as a backward pass hands them: descending, not aligned to
// the sub-groups.
std::vector<Range> Descending() { return {{8'000, 2'007}, {5'100, 2'900}, {3'000, 2'100}, {700, 2'300}, {0, 700}}; }

TEST_F(GradientWindowTest, DescendingRangesOneMicroBatch) {
  auto io = MakeEngine();
  Check(io.get(), Descending(), 1);
}

TEST_F(GradientWindowTest, DescendingRangesThreeMicroBatches) {
  auto io = MakeEngine();
  Check(io.get(), Descending(), 3);
}

// Any order is right: ascending, jumping back, a range added twice (a tied
// block), one reaching across the part of a fresh sub-group set so far,
// and ranges that leave sub-groups untouched.
std::vector<Range> AnyOrder() {
  return {{0, 700}, {9'000, 1'007}, {700, 2'300}, {0, 700}, {5'100, 100}, {5'000, 150}, {4'000, 10}};
}

TEST_F(GradientWindowTest, AnyOrderAndGapsOneMicroBatch) {
  auto io = MakeEngine();
  Check(io.get(), AnyOrder(), 1);
}

TEST_F(GradientWindowTest, AnyOrderAndGapsThreeMicroBatches) {
  auto io = MakeEngine();
  Check(io.get(), AnyOrder(), 3);
}

// A window sized for the largest range (3'001 elements touch up to 3
// sub-groups of 1'500, 3'002 up to 4): a range is taken in with no write
// waited for; capped by the optimizer pipeline's buffers.
TEST_F(GradientWindowTest, DescendingRangesInAWindowSizedForThem) {
  const OptimizerSwapperOptions o = Options();
  const int64_t pipeline = OptimizerSwapper::PoolBuffers(o);
  ASSERT_GE(pipeline, 4);
  EXPECT_EQ(GradientWindow::BufferCount(o, 0), GradientWindow::kMinBuffers);
  EXPECT_EQ(GradientWindow::BufferCount(o, 1), GradientWindow::kMinBuffers);
  EXPECT_EQ(GradientWindow::BufferCount(o, 3'001), 3);
  EXPECT_EQ(GradientWindow::BufferCount(o, 3'002), 4);
  EXPECT_EQ(GradientWindow::BufferCount(o, int64_t{1} << 40), pipeline);
  auto io = MakeEngine();
  Check(io.get(), Descending(), 1, 0, SIZE_MAX, /*largest_add=*/3'002);
  Check(io.get(), Descending(), 3, 0, SIZE_MAX, /*largest_add=*/3'002);
  Check(io.get(), AnyOrder(), 2, 0, /*flush_after=*/3, /*largest_add=*/3'002);
}

// A flush while sub-groups are half filled (WaitForUpdate's) writes them
// whole: what no range set yet is zero, and the next ranges still add.
TEST_F(GradientWindowTest, FlushWhileFilling) {
  auto io = MakeEngine();
  Check(io.get(), Descending(), 1, 0, /*flush_after=*/1);
  Check(io.get(), Descending(), 2, 0, /*flush_after=*/2);
}

// Ranges added in earlier micro-batches but not in the last: their squares
// are taken from the store at Finish.
TEST_F(GradientWindowTest, RangesMissingFromTheLastMicroBatch) {
  auto io = MakeEngine();
  Check(io.get(), Descending(), 2, /*skip_last=*/2);
}

// A failed write is an error naming the sub-group and the swap file, from
// Add or at the latest from Finish.
TEST_F(GradientWindowTest, WriteErrorsReachTheCaller) {
  aio::FaultOptions f;
  f.torn_write_rate = 1.0;
  auto io = MakeFaultyEngine(f);
  io->injector().set_enabled(false);
  const OptimizerSwapperOptions o = Options();
  auto pool = MakePool(OptimizerSwapper::RequiredBuffers(o), OptimizerSwapper::RequiredBufferBytes(o, 4096));
  auto swapper = OptimizerSwapper::Create(o, io.get(), pool.get());
  ASSERT_TRUE(swapper.ok()) << swapper.status().ToString();
  auto wpool = aio::PinnedPool::Create(GradientWindow::PoolOptions(o, false, 0));
  ASSERT_TRUE(wpool.ok());
  auto window = GradientWindow::Create(swapper->get(), wpool->get(), threads_.get(), optim::Isa::kScalar, kSubGroup);
  ASSERT_TRUE(window.ok()) << window.status().ToString();
  io->injector().set_enabled(true);
  const std::vector<float> g = RandomFloats(kTotal, 3);
  Status s;
  for (const Range& r : Descending()) {
    s = (*window)->Add(r.begin, r.count, g.data() + r.begin, 1.0f, true);
    if (!s.ok()) break;
  }
  if (s.ok()) s = (*window)->Finish().status();
  ASSERT_FALSE(s.ok());
  EXPECT_NE(s.message().find("nvme"), std::string::npos) << s.ToString();
  for (int64_t k = 0; k < (*swapper)->num_sub_groups(); ++k) {
    EXPECT_EQ((*window)->FinalGradient(k), nullptr) << "a failed cycle lends nothing: " << k;
  }
  EXPECT_FALSE((*window)->Add(-1, 5, g.data(), 1.0f, true).ok());
}

TEST_F(GradientWindowTest, NeedsAStoredGradient) {
  OptimizerSwapperOptions o = Options();
  o.gradients_in_store = false;
  EXPECT_EQ(GradientWindow::PoolOptions(o, false, kTotal).buffer_count, 0);
  auto io = MakeEngine();
  auto pool = MakePool(OptimizerSwapper::RequiredBuffers(o), OptimizerSwapper::RequiredBufferBytes(o, 4096));
  auto swapper = OptimizerSwapper::Create(o, io.get(), pool.get());
  ASSERT_TRUE(swapper.ok());
  auto wpool = MakePool(GradientWindow::kMinBuffers, OptimizerSwapper::RequiredBufferBytes(o, 4096));
  EXPECT_EQ(GradientWindow::Create(swapper->get(), wpool.get(), threads_.get(), optim::Isa::kScalar, kSubGroup)
                .status()
                .code(),
            StatusCode::kInvalidArgument);
}

// Sealed as set: the squares and crcs taken extent by extent while the
// last micro-batch sets them give the RAM accumulator's sum and a gradient
// that reads back clean (ReadState verifies every crc), in the backward's
// order and in any other: a range added again over sealed extents (a tied
// block), one straddling a sub-group's unset part, gaps, earlier
// micro-batches only (squares taken at the write), a flush mid-fill.
TEST_F(SealedGradientWindowTest, DescendingRanges) {
  auto io = MakeEngine();
  Check(io.get(), Scaled(Descending()), 1);
  Check(io.get(), Scaled(Descending()), 3);
  Check(io.get(), Scaled(Descending()), 1, 0, SIZE_MAX, /*largest_add=*/2 * 3'002);
}

TEST_F(SealedGradientWindowTest, AnyOrderAndGaps) {
  auto io = MakeEngine();
  Check(io.get(), Scaled(AnyOrder()), 1);
  Check(io.get(), Scaled(AnyOrder()), 3);
}

TEST_F(SealedGradientWindowTest, FlushesAndRangesMissingFromTheLastMicroBatch) {
  auto io = MakeEngine();
  Check(io.get(), Scaled(Descending()), 1, 0, /*flush_after=*/1);
  Check(io.get(), Scaled(Descending()), 2, /*skip_last=*/2);
}

// A buffer held from an earlier micro-batch, part of its sub-group set
// then: the last one sets the rest below it, and the extent that holds both
// is sealed with the earlier values in it (they are final). Without
// checksums the store takes no crcs and the squares are still sealed.
TEST_F(SealedGradientWindowTest, SealedOverValuesOfEarlierMicroBatches) {
  auto io = MakeEngine();
  // Sub-group 3 is [9'216, 12'288): 784 elements of its first extent set
  // before the last micro-batch, the rest of that extent and the one below
  // in it.
  const std::vector<Range> ranges = {
      {10'000, 200, Range::kNotLast}, {9'216, 784, Range::kLastOnly}, {5'000, 4'216, Range::kLastOnly}, {0, 5'000}};
  Check(io.get(), ranges, 2);
  Check(io.get(), ranges, 3);
  checksums_ = false;
  Check(io.get(), ranges, 2);
  Check(io.get(), Scaled(AnyOrder()), 1);
}

// The norm's order does not follow the sub-groups: pieces added through any
// split whose boundaries are multiples of the atom or of the config's cut
// (a fitted pipeline's sub-groups, the config's own), in any order, give the
// bits of the whole array in RAM; a range that cuts a piece is refused.
TEST_F(GradientWindowTest, ShardSquaresDoNotDependOnTheSubGroups) {
  constexpr int64_t kN = 70'001, kCut = 10'000;  // the config's sub_group_size, not a multiple of 1024
  std::vector<float> x = RandomFloats(kN, 7);
  for (float& v : x) v *= 1e3f;  // magnitudes where the order of a double sum shows
  auto want = ShardSumSquares(*threads_, optim::Isa::kScalar, x.data(), kN, kCut);
  ASSERT_TRUE(want.ok()) << want.status().ToString();
  double plain = 0.0;  // the squares added in one pass: not the same bits in general
  for (float v : x) plain += double(v) * double(v);
  EXPECT_NEAR(*want, plain, 1e-9 * plain);
  for (int64_t piece : {kCut, int64_t{3 * 1024}, int64_t{1024}, int64_t{40 * 1024}}) {
    ShardSquares squares(kN, kCut);
    std::vector<int64_t> starts;
    for (int64_t b = 0; b < kN; b += piece) starts.push_back(b);
    std::shuffle(starts.begin(), starts.end(), std::mt19937_64(static_cast<uint64_t>(piece)));
    for (int64_t b : starts) {
      const int64_t n = std::min(piece, kN - b);
      ASSERT_TRUE(squares.Add(*threads_, optim::Isa::kScalar, b, x.data() + b, n).ok()) << piece;
    }
    EXPECT_EQ(squares.Total(), *want) << "sub-groups of " << piece;
  }
  ShardSquares squares(kN, kCut);
  EXPECT_EQ(squares.Add(*threads_, optim::Isa::kScalar, 100, x.data() + 100, 1000).code(),
            StatusCode::kInvalidArgument);
}

// AddSerial (one thread, extent by extent, in batches of pieces) gives
// Add's piece sums: ranges of 1 MiB of fp32 (256 atoms, over the batch)
// with the cut inside some, the last one ending at the shard's end, taken
// by two threads at once; and the serial helpers give the pooled ones' bits.
TEST_F(GradientWindowTest, AddSerialGivesAddsBits) {
  constexpr int64_t kN = 1'000'003, kCut = 300'000, kExtent = 256 * ShardSquares::kAtom;
  std::vector<float> x = RandomFloats(kN, 9);
  for (float& v : x) v *= 1e3f;
  ShardSquares pooled(kN, kCut), serial(kN, kCut);
  ASSERT_TRUE(pooled.Add(*threads_, optim::Isa::kScalar, 0, x.data(), kN).ok());
  std::vector<Status> got(2);
  std::thread other([&] {
    for (int64_t b = kExtent; b < kN && got[1].ok(); b += 2 * kExtent) {
      got[1] = serial.AddSerial(optim::Isa::kScalar, b, x.data() + b, std::min(kExtent, kN - b));
    }
  });
  for (int64_t b = 0; b < kN && got[0].ok(); b += 2 * kExtent) {
    got[0] = serial.AddSerial(optim::Isa::kScalar, b, x.data() + b, std::min(kExtent, kN - b));
  }
  other.join();
  ASSERT_TRUE(got[0].ok() && got[1].ok()) << got[0].ToString() << got[1].ToString();
  const double want = pooled.Total(), have = serial.Total();
  EXPECT_EQ(std::memcmp(&want, &have, sizeof(double)), 0) << have << " vs " << want;
  EXPECT_EQ(serial.AddSerial(optim::Isa::kScalar, 100, x.data() + 100, 1000).code(), StatusCode::kInvalidArgument);

  std::vector<float> a(static_cast<size_t>(kN)), b(static_cast<size_t>(kN));
  ASSERT_TRUE(optim::SetScaled(*threads_, x.data(), 0.37f, a.data(), kN).ok());
  optim::SetScaledSerial(x.data(), 0.37f, b.data(), kN);
  EXPECT_EQ(std::memcmp(a.data(), b.data(), a.size() * 4), 0);
  const int64_t bounds[] = {0, 1, 1024, 5000, kN};
  double p[4], q[4];
  ASSERT_TRUE(optim::SumSquaresPieces(*threads_, optim::Isa::kScalar, x.data(), bounds, 4, p).ok());
  ASSERT_TRUE(optim::SumSquaresPiecesSerial(optim::Isa::kScalar, x.data(), bounds, 4, q).ok());
  EXPECT_EQ(std::memcmp(p, q, sizeof(p)), 0);
}

// The engine keeps one ShardSquares for every step: Add over the whole shard
// replaces every piece, so a reused object gives a fresh one's bits; its
// footprint counts a double per piece and Add's scratch (a boundary per
// piece and the end).
TEST_F(GradientWindowTest, AReusedShardSquaresGivesAFreshOnesBits) {
  constexpr int64_t kN = 70'001, kCut = 10'000;
  ShardSquares kept(kN, kCut);
  for (uint64_t seed : {11u, 12u, 13u}) {
    std::vector<float> x = RandomFloats(kN, seed);
    for (float& v : x) v *= 1e3f;
    auto want = ShardSumSquares(*threads_, optim::Isa::kScalar, x.data(), kN, kCut);
    ASSERT_TRUE(want.ok());
    ASSERT_TRUE(kept.Add(*threads_, optim::Isa::kScalar, 0, x.data(), kN).ok());
    const double got = kept.Total();
    EXPECT_EQ(std::memcmp(&*want, &got, sizeof(double)), 0) << got << " vs " << *want;
  }
  int64_t pieces = 0;
  for (int64_t p = 0; p < kN; ++p) pieces += p % ShardSquares::kAtom == 0 || p % kCut == 0;
  EXPECT_EQ(ShardSquares::FootprintBytes(kN, kCut), pieces * 8 + (pieces + 1) * 8);
  EXPECT_EQ(ShardSquares::FootprintBytes(kN, 4 * kN), ShardSquares::FootprintBytes(kN, kN));  // cut at most the shard
}

}  // namespace
}  // namespace zinf::swap
