// StripedSpace over several directories: unaligned round trips against an
// in-memory model, stripe placement, bounds, faults, persistence.
#include "aio/striped_space.h"

#include <cstring>
#include <fstream>
#include <random>
#include <string>
#include <vector>

#include <gtest/gtest.h>

#include "aio/aio_test_util.h"
#include "aio/fault_engine.h"
#include "core/units.h"

namespace zinf::aio {
namespace {

using testing::FillRandom;
using testing::TempDir;

constexpr int64_t kStripe = 64 * kKiB;
constexpr int64_t kCapacity = 3 * kMiB + 5 * kStripe;  // not a whole number of stripe rows

struct Dirs {
  TempDir a, b, c;
  std::vector<std::string> list() const { return {a.path(), b.path(), c.path()}; }
};

StripedSpaceOptions Options(const Dirs& d, EngineKind kind) {
  StripedSpaceOptions o;
  o.dirs = d.list();
  o.capacity_bytes = kCapacity;
  o.stripe_bytes = kStripe;
  o.engine.kind = kind;
  o.engine.block_size_bytes = 32 * kKiB;
  o.engine.queue_depth = 8;
  o.engine.thread_count = 2;
  o.bounce_bytes = 256 * kKiB;  // small, so long transfers take several windows
  return o;
}

// Random unaligned writes mirrored in a model, then random unaligned reads.
void RandomRoundTrips(StripedSpace& s, uint64_t seed, int rounds) {
  std::vector<char> model(static_cast<size_t>(s.capacity_bytes()), 0);
  std::mt19937_64 rng(seed);
  for (int i = 0; i < rounds; ++i) {
    const int64_t len = 1 + static_cast<int64_t>(rng() % (700 * kKiB));
    const int64_t off = static_cast<int64_t>(rng() % static_cast<uint64_t>(s.capacity_bytes() - len));
    std::vector<char> data(static_cast<size_t>(len));
    FillRandom(data.data(), data.size(), rng());
    Status st = s.Write(off, data.data(), len);
    ASSERT_TRUE(st.ok()) << st.ToString();
    std::memcpy(model.data() + off, data.data(), data.size());
  }
  for (int i = 0; i < rounds; ++i) {
    const int64_t len = 1 + static_cast<int64_t>(rng() % (900 * kKiB));
    const int64_t off = static_cast<int64_t>(rng() % static_cast<uint64_t>(s.capacity_bytes() - len));
    std::vector<char> got(static_cast<size_t>(len));
    Status st = s.Read(off, got.data(), len);
    ASSERT_TRUE(st.ok()) << st.ToString();
    ASSERT_EQ(std::memcmp(got.data(), model.data() + off, got.size()), 0) << "read at " << off << " len " << len;
  }
  std::vector<char> all(model.size());
  ASSERT_TRUE(s.Read(0, all.data(), static_cast<int64_t>(all.size())).ok());
  EXPECT_TRUE(all == model);
}

class StripedSpaceTest : public ::testing::TestWithParam<EngineKind> {};

TEST_P(StripedSpaceTest, UnalignedRoundTripsAcrossThreePaths) {
  Dirs d;
  auto s = StripedSpace::Open(Options(d, GetParam()));
  ASSERT_TRUE(s.ok()) << s.status().ToString();
  EXPECT_EQ((*s)->path_count(), 3);
  EXPECT_GE((*s)->capacity_bytes(), kCapacity);
  RandomRoundTrips(**s, 1234, 25);
  // Tiny edge cases: one byte, one byte across a stripe boundary, zero bytes.
  char x = 'x', y = 0;
  ASSERT_TRUE((*s)->Write(kStripe - 1, &x, 1).ok());
  ASSERT_TRUE((*s)->Read(kStripe - 1, &y, 1).ok());
  EXPECT_EQ(y, 'x');
  char two[2] = {'a', 'b'}, back[2] = {};
  ASSERT_TRUE((*s)->Write(2 * kStripe - 1, two, 2).ok());
  ASSERT_TRUE((*s)->Read(2 * kStripe - 1, back, 2).ok());
  EXPECT_EQ(std::memcmp(two, back, 2), 0);
  EXPECT_TRUE((*s)->Write(0, &x, 0).ok());
}

TEST_P(StripedSpaceTest, AlignedRequestsLandOnTheirStripes) {
  Dirs d;
  auto s = StripedSpace::Open(Options(d, GetParam()));
  ASSERT_TRUE(s.ok());
  PinnedPoolOptions po;
  po.buffer_count = 1;
  po.buffer_bytes = 12 * kStripe;
  auto pool = PinnedPool::Create(po);
  ASSERT_TRUE(pool.ok());
  auto region = (*pool)->region();
  ASSERT_TRUE((*s)->RegisterMemory(region.data(), region.size()).ok());
  PinnedBuffer b = (*pool)->Acquire();
  FillRandom(b.data(), b.size(), 9);
  // Starts mid-stripe (stripe 1, offset 4 KiB), 11 stripes long.
  const int64_t off = kStripe + 4096;
  const int64_t len = 11 * kStripe;
  auto t = (*s)->Submit(IoOp::kWrite, off, b.data(), len);
  ASSERT_TRUE(t.ok()) << t.status().ToString();
  ASSERT_TRUE((*s)->Wait(*t).ok());
  ASSERT_TRUE((*s)->Sync().ok());
  // Check placement straight from the files: logical byte L is on path
  // (L / stripe) % 3 at ((L / stripe) / 3) * stripe + L % stripe.
  std::vector<std::string> files;
  for (int p = 0; p < 3; ++p) {
    std::ifstream in((*s)->file_path(p), std::ios::binary);
    files.emplace_back((std::istreambuf_iterator<char>(in)), std::istreambuf_iterator<char>());
  }
  for (int64_t l = off; l < off + len; l += 4096) {
    const int64_t stripe = l / kStripe;
    const auto& f = files[static_cast<size_t>(stripe % 3)];
    const int64_t at = (stripe / 3) * kStripe + l % kStripe;
    ASSERT_EQ(std::memcmp(f.data() + at, b.data() + (l - off), 4096), 0) << "logical " << l;
  }
}

TEST_P(StripedSpaceTest, BadRangesAreRejectedWithOffsetAndLength) {
  Dirs d;
  auto s = StripedSpace::Open(Options(d, GetParam()));
  ASSERT_TRUE(s.ok());
  char c = 0;
  Status st = (*s)->Read((*s)->capacity_bytes() - 1, &c, 2);
  EXPECT_EQ(st.code(), StatusCode::kInvalidArgument);
  EXPECT_NE(st.message().find("length 2"), std::string::npos) << st.ToString();
  st = (*s)->Write(-1, &c, 1);
  EXPECT_EQ(st.code(), StatusCode::kInvalidArgument);
  alignas(4096) static char buf[8192];
  auto t = (*s)->Submit(IoOp::kRead, 512 + 4096, buf, 4096);
  if ((*s)->alignment_bytes() > 512) {
    ASSERT_FALSE(t.ok());
    EXPECT_NE(t.status().message().find("offset 4608"), std::string::npos) << t.status().ToString();
  }
  t = (*s)->Submit(IoOp::kRead, 0, buf + 1, 4096);
  EXPECT_EQ(t.status().code(), StatusCode::kInvalidArgument);
}

TEST_P(StripedSpaceTest, RecoverableFaultsOnEveryPathStillRoundTrip) {
  Dirs d;
  std::vector<FaultyEngine*> faulty;
  EngineFactory factory = [&](int index, const IoEngineOptions& o) -> StatusOr<std::unique_ptr<IoEngine>> {
    FaultOptions f;
    f.seed = 100 + static_cast<uint64_t>(index);
    f.eagain_rate = 0.1;
    f.eintr_rate = 0.05;
    f.short_rate = 0.2;
    f.delay_rate = 0.2;
    ZINF_ASSIGN_OR_RETURN(auto e, FaultyEngine::Create(o, f));
    faulty.push_back(e.get());
    return std::unique_ptr<IoEngine>(std::move(e));
  };
  auto s = StripedSpace::Open(Options(d, GetParam()), factory);
  ASSERT_TRUE(s.ok()) << s.status().ToString();
  RandomRoundTrips(**s, 77, 12);
  for (FaultyEngine* e : faulty) EXPECT_GT(e->injector().counts().total(), 0);
}

TEST_P(StripedSpaceTest, AnEioOnOnePathSurfacesAsAnError) {
  Dirs d;
  EngineFactory factory = [&](int index, const IoEngineOptions& o) -> StatusOr<std::unique_ptr<IoEngine>> {
    FaultOptions f;
    f.eio_rate = index == 1 ? 1.0 : 0.0;
    ZINF_ASSIGN_OR_RETURN(auto e, FaultyEngine::Create(o, f));
    return std::unique_ptr<IoEngine>(std::move(e));
  };
  auto s = StripedSpace::Open(Options(d, GetParam()), factory);
  ASSERT_TRUE(s.ok());
  std::vector<char> data(static_cast<size_t>(4 * kStripe), 'z');
  Status st = (*s)->Write(100, data.data(), static_cast<int64_t>(data.size()));
  ASSERT_FALSE(st.ok());
  EXPECT_NE(st.message().find((*s)->file_path(1)), std::string::npos) << st.ToString();
}

TEST_P(StripedSpaceTest, SyncedDataSurvivesReopen) {
  Dirs d;
  std::vector<char> data(300 * 1000);
  FillRandom(data.data(), data.size(), 3);
  {
    auto s = StripedSpace::Open(Options(d, GetParam()));
    ASSERT_TRUE(s.ok());
    ASSERT_TRUE((*s)->Write(12345, data.data(), static_cast<int64_t>(data.size())).ok());
    ASSERT_TRUE((*s)->Sync().ok());
  }
  auto s = StripedSpace::Open(Options(d, GetParam()));
  ASSERT_TRUE(s.ok());
  std::vector<char> got(data.size());
  ASSERT_TRUE((*s)->Read(12345, got.data(), static_cast<int64_t>(got.size())).ok());
  EXPECT_TRUE(got == data);
}

INSTANTIATE_TEST_SUITE_P(Engines, StripedSpaceTest, ::testing::Values(EngineKind::kUring, EngineKind::kPosix),
                         [](const ::testing::TestParamInfo<EngineKind>& p) {
                           return std::string(p.param == EngineKind::kUring ? "uring" : "posix");
                         });

TEST(StripedSpaceOpen, RejectsMissingDirsAndBadOptions) {
  StripedSpaceOptions o;
  o.dirs = {"/nonexistent/zinf"};
  o.capacity_bytes = kMiB;
  EXPECT_EQ(StripedSpace::Open(o).status().code(), StatusCode::kNotFound);
  o.dirs = {};
  EXPECT_EQ(StripedSpace::Open(o).status().code(), StatusCode::kInvalidArgument);
  TempDir t;
  o.dirs = {t.path()};
  o.stripe_bytes = 1000;
  EXPECT_EQ(StripedSpace::Open(o).status().code(), StatusCode::kInvalidArgument);
}

}  // namespace
}  // namespace zinf::aio
