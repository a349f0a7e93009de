// ParamHome: each tier (device, pinned RAM, NVMe) keeps every block's shard
// where it says and copies it to the device byte for byte.
#include "zero3/param_home.h"

#include <gtest/gtest.h>

#include <cstring>
#include <vector>

#include "device/device.h"
#include "stream_gate.h"
#include "swap/swap_test_util.h"
#include "zero3/buffer_plan.h"
#include "zero3/partitioner.h"

namespace zinf::zero3 {
namespace {

using swap::testing::TempDir;

const std::vector<BlockSpec> kSpecs = {
    {"embed", {{"wte", {37, 8}}}}, {"h.0", {{"w", {16, 16}}, {"b", {16}}}}, {"head", {{"g", {8}}}}};

class ParamHomeTest : public ::testing::TestWithParam<OffloadDevice> {
 protected:
  void SetUp() override {
    auto p = Partitioner::Create(kSpecs, /*world_size=*/2, /*rank=*/1);
    ASSERT_TRUE(p.ok()) << p.status().ToString();
    part_ = std::make_unique<Partitioner>(std::move(p).value());
    device_ = CreateHostDevice(0);
    auto s = device_->CreateStream();
    ASSERT_TRUE(s.ok());
    stream_ = std::move(s).value();
    io_ = swap::testing::MakeEngine();
    config_.zero.offload_param.device = GetParam();
    config_.bf16.enabled = true;  // 16-bit working parameters
    config_.zero.stage = 3;
    config_.zero.offload_param.nvme_paths = {dir_.Sub("p0"), dir_.Sub("p1")};
    config_.zero.offload_param.buffer_count = 2;
    config_.zero.offload_param.max_in_cpu = 0;
    auto plan = MakeBufferPlan(config_, kSpecs, 2, DeviceKind::kHost, ElementType::kF32);
    ASSERT_TRUE(plan.ok()) << plan.status().ToString();
    plan_ = std::move(plan).value();
    ParamHomeOptions o;
    o.plan = &plan_;
    o.specs = &kSpecs;
    o.partitioner = part_.get();
    o.device = device_.get();
    o.stream = stream_.get();
    o.io = io_.get();
    o.run_id = "param-home-test";
    o.counters = &counters_;
    auto home = CreateParamHome(o);
    ASSERT_TRUE(home.ok()) << home.status().ToString();
    home_ = std::move(home).value();
  }

  // Block b's shard as the device sees it after CopyToDevice.
  std::vector<char> Fetch(BlockId b) {
    const size_t bytes = static_cast<size_t>(part_->layout(b).shard_numel * 2);
    auto dst = device_->Allocate(bytes);
    EXPECT_TRUE(dst.ok());
    EXPECT_TRUE(home_->CopyToDevice(b, static_cast<char*>(*dst)).ok());
    EXPECT_TRUE(stream_->Synchronize().ok());
    std::vector<char> out(bytes);
    std::memcpy(out.data(), *dst, bytes);
    device_->Free(*dst);
    return out;
  }

  // dst[b] holds block b's shard of the rank shard `all`; frees dst.
  void ExpectCopiedAndFree(const std::vector<void*>& dst, const std::vector<char>& all) {
    for (size_t b = 0; b < dst.size(); ++b) {
      const BlockLayout& l = part_->layout(static_cast<BlockId>(b));
      EXPECT_EQ(0, std::memcmp(dst[b], all.data() + l.rank_offset * 2, static_cast<size_t>(l.shard_numel * 2)))
          << "block " << b;
      device_->Free(dst[b]);
    }
  }

  std::vector<char> Pattern(int64_t bytes, int seed) const {
    std::vector<char> v(static_cast<size_t>(bytes));
    for (size_t i = 0; i < v.size(); ++i) v[i] = static_cast<char>((i * 31 + static_cast<size_t>(seed) * 7) & 0xff);
    return v;
  }

  TempDir dir_;
  Config config_;
  BufferPlan plan_;
  std::unique_ptr<Partitioner> part_;
  std::unique_ptr<Device> device_;
  std::unique_ptr<Stream> stream_;
  std::unique_ptr<aio::IoEngine> io_;
  EngineCounters counters_;
  std::unique_ptr<ParamHome> home_;
};

TEST_P(ParamHomeTest, EveryBlockComesBackAsWrittenAndOneBlockCanBeRewritten) {
  const std::vector<char> all = Pattern(part_->total_shard_numel() * 2, 1);
  ASSERT_TRUE(home_->WriteAll(all.data()).ok());
  for (BlockId b = 0; b < part_->num_blocks(); ++b) {
    const BlockLayout& l = part_->layout(b);
    const std::vector<char> got = Fetch(b);
    ASSERT_EQ(0, std::memcmp(got.data(), all.data() + l.rank_offset * 2, got.size())) << "block " << b;
  }
  const BlockLayout& l1 = part_->layout(1);
  const std::vector<char> fresh = Pattern(l1.shard_numel * 2, 2);
  ASSERT_TRUE(home_->WriteBlock(1, fresh.data()).ok());
  ASSERT_TRUE(home_->Flush().ok());
  ASSERT_TRUE(stream_->Synchronize().ok());
  EXPECT_EQ(Fetch(1), fresh);
  const std::vector<char> block0 = Fetch(0);
  EXPECT_EQ(0, std::memcmp(block0.data(), all.data(), block0.size())) << "a neighbour was overwritten";
}

TEST_P(ParamHomeTest, CountsWhatItMoves) {
  const std::vector<char> all = Pattern(part_->total_shard_numel() * 2, 3);
  ASSERT_TRUE(home_->WriteAll(all.data()).ok());
  const EngineCounters before = counters_;
  const int64_t read_before = home_->nvme_read_bytes();
  Fetch(1);
  const int64_t shard_bytes = part_->layout(1).shard_numel * 2;
  switch (GetParam()) {
    case OffloadDevice::kNone:
      EXPECT_EQ(counters_.h2d_bytes, before.h2d_bytes);  // device to device
      EXPECT_FALSE(home_->reads_ahead());
      break;
    case OffloadDevice::kCpu:
      EXPECT_EQ(counters_.h2d_bytes - before.h2d_bytes, shard_bytes);
      EXPECT_EQ(home_->nvme_read_bytes(), 0);
      break;
    case OffloadDevice::kNvme:
      EXPECT_EQ(counters_.h2d_bytes - before.h2d_bytes, shard_bytes);
      EXPECT_EQ(home_->nvme_read_bytes() - read_before, shard_bytes);  // max_in_cpu 0: read again
      EXPECT_GE(home_->nvme_write_bytes(), part_->total_shard_numel() * 2);
      EXPECT_TRUE(home_->reads_ahead());
      break;
  }
}

TEST_P(ParamHomeTest, APrefetchedShardIsTheOneCopied) {
  const std::vector<char> all = Pattern(part_->total_shard_numel() * 2, 4);
  ASSERT_TRUE(home_->WriteAll(all.data()).ok());
  ASSERT_TRUE(home_->Prefetch(2).ok());
  const std::vector<char> got = Fetch(2);
  EXPECT_EQ(0, std::memcmp(got.data(), all.data() + part_->layout(2).rank_offset * 2, got.size()));
}

// A copy is queued, not waited for: with the stream held at a gate,
// CopyToDevice returns at once, and the NVMe home keeps the buffer it
// copies from until the copy has run (two buffers here, so the third
// block's read waits for the first copy instead of overwriting its source).
TEST_P(ParamHomeTest, CopiesAreQueuedAndTheirSourcesOutliveThem) {
  const std::vector<char> all = Pattern(part_->total_shard_numel() * 2, 5);
  ASSERT_TRUE(home_->WriteAll(all.data()).ok());
  std::vector<void*> dst;
  for (BlockId b = 0; b < 3; ++b) {
    auto p = device_->Allocate(static_cast<size_t>(part_->layout(b).shard_numel * 2));
    ASSERT_TRUE(p.ok());
    dst.push_back(*p);
  }
  {
    test_support::StreamGate gate;
    ASSERT_TRUE(gate.HoldOn(*stream_).ok());
    gate.OpenAfter(std::chrono::milliseconds(500));
    for (BlockId b = 0; b < 2; ++b) {
      ASSERT_TRUE(home_->CopyToDevice(b, static_cast<char*>(dst[static_cast<size_t>(b)])).ok());
      EXPECT_FALSE(gate.opened()) << "CopyToDevice of block " << b << " waited for the stream";
    }
    ASSERT_TRUE(home_->CopyToDevice(2, static_cast<char*>(dst[2])).ok());
    ASSERT_TRUE(stream_->Synchronize().ok());
  }
  ExpectCopiedAndFree(dst, all);
}

// Writing a block home while every buffer is held by a queued copy: the
// write waits for the oldest copy instead of failing for want of a buffer.
TEST_P(ParamHomeTest, AWriteWaitsForAQueuedCopyWhenEveryBufferIsHeld) {
  const std::vector<char> all = Pattern(part_->total_shard_numel() * 2, 7);
  ASSERT_TRUE(home_->WriteAll(all.data()).ok());
  const std::vector<char> fresh = Pattern(part_->layout(2).shard_numel * 2, 8);
  std::vector<void*> dst;
  {
    test_support::StreamGate gate;
    ASSERT_TRUE(gate.HoldOn(*stream_).ok());
    gate.OpenAfter(std::chrono::milliseconds(100));
    for (BlockId b = 0; b < 2; ++b) {
      auto p = device_->Allocate(static_cast<size_t>(part_->layout(b).shard_numel * 2));
      ASSERT_TRUE(p.ok());
      dst.push_back(*p);
      ASSERT_TRUE(home_->CopyToDevice(b, static_cast<char*>(*p)).ok());
    }
    const Status s = home_->WriteBlock(2, fresh.data());
    EXPECT_TRUE(s.ok()) << s.ToString();
    ASSERT_TRUE(home_->Flush().ok());
    ASSERT_TRUE(stream_->Synchronize().ok());
  }
  ExpectCopiedAndFree(dst, all);
  EXPECT_EQ(Fetch(2), fresh);
}

// Writing a block home while its copy to the device is still queued: the
// copy gets the bytes it was queued for, later fetches the new ones. (The
// pinned home is written in place at once: the engine drains the stream
// before the update writes it.)
TEST_P(ParamHomeTest, ABlockWrittenBehindItsQueuedCopy) {
  if (GetParam() == OffloadDevice::kCpu) GTEST_SKIP() << "the pinned home is written in place, not behind copies";
  const std::vector<char> all = Pattern(part_->total_shard_numel() * 2, 6);
  ASSERT_TRUE(home_->WriteAll(all.data()).ok());
  const BlockLayout& l = part_->layout(1);
  const std::vector<char> fresh = Pattern(l.shard_numel * 2, 9);
  auto dst = device_->Allocate(static_cast<size_t>(l.shard_numel * 2));
  ASSERT_TRUE(dst.ok());
  {
    test_support::StreamGate gate;
    ASSERT_TRUE(gate.HoldOn(*stream_).ok());
    gate.OpenAfter(std::chrono::milliseconds(100));
    ASSERT_TRUE(home_->CopyToDevice(1, static_cast<char*>(*dst)).ok());
    ASSERT_TRUE(home_->WriteBlock(1, fresh.data()).ok());
    ASSERT_TRUE(home_->Flush().ok());
    ASSERT_TRUE(stream_->Synchronize().ok());
  }
  EXPECT_EQ(0, std::memcmp(*dst, all.data() + l.rank_offset * 2, fresh.size()));
  device_->Free(*dst);
  EXPECT_EQ(Fetch(1), fresh);
}

INSTANTIATE_TEST_SUITE_P(Tiers, ParamHomeTest,
                         ::testing::Values(OffloadDevice::kNone, OffloadDevice::kCpu, OffloadDevice::kNvme));

// CreateParamHome's result for `config` on one rank, on a host device of
// `budget_bytes` (0: none).
StatusOr<std::unique_ptr<ParamHome>> CreateAlone(const Config& config, size_t budget_bytes) {
  auto part = Partitioner::Create(kSpecs, 1, 0);
  auto plan = MakeBufferPlan(config, kSpecs, 1, DeviceKind::kHost, ElementType::kF32);
  if (!part.ok() || !plan.ok()) return part.ok() ? plan.status() : part.status();
  auto device = CreateHostDevice(budget_bytes);
  auto stream = device->CreateStream();
  if (!stream.ok()) return stream.status();
  auto io = swap::testing::MakeEngine();
  EngineCounters counters;
  ParamHomeOptions o;
  o.plan = &*plan;
  o.specs = &kSpecs;
  o.partitioner = &*part;
  o.device = device.get();
  o.stream = stream->get();
  o.io = io.get();
  o.counters = &counters;
  auto home = CreateParamHome(o);
  EXPECT_FALSE(home.ok()) << "the callers expect an error: the home would outlive its device";
  return home;
}

TEST(ParamHomeErrorsTest, AnUnusableNvmePathNamesTheConfigKey) {
  Config config;
  config.zero.offload_param.device = OffloadDevice::kNvme;
  config.bf16.enabled = true;
  config.zero.stage = 3;
  config.zero.offload_param.nvme_paths = {"/proc/zinf-no-such-dir"};
  auto home = CreateAlone(config, 0);
  ASSERT_FALSE(home.ok());
  EXPECT_NE(home.status().message().find("zero_optimization.offload_param.nvme_path [/proc/zinf-no-such-dir]"),
            std::string::npos)
      << home.status().ToString();
}

TEST(ParamHomeErrorsTest, ADeviceHomeBeyondTheBudgetIsOutOfMemory) {
  Config config;
  config.zero.offload_param.device = OffloadDevice::kNone;
  config.zero.stage = 3;
  auto home = CreateAlone(config, 1024);  // smaller than the shard
  ASSERT_FALSE(home.ok());
  EXPECT_EQ(home.status().code(), StatusCode::kOutOfMemory);
}

}  // namespace
}  // namespace zinf::zero3
