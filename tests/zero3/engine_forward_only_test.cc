// A forward-only Engine (EngineOptions::forward_only): on every parameter
// tier and type it gathers the bits a training engine gathers, from initial
// values and from any training checkpoint (other sub-groups, another
// optimizer tier); it allocates what its plan says and no optimizer state;
// it refuses the calls that need the optimizer; passes after the first
// prefetch; a damaged checkpoint leaves it holding no parameters.
#include <gtest/gtest.h>

#include <cstdint>
#include <cstdio>
#include <filesystem>
#include <fstream>
#include <string>
#include <tuple>
#include <vector>

#include "aio/pinned_pool.h"
#include "comm/communicator.h"
#include "core/fs.h"
#include "zero3/buffer_plan.h"
#include "zero3/engine_test_util.h"
#include "zero3/tiny_model.h"

namespace zinf::zero3::testing {
namespace {

using swap::testing::TempDir;

const TinyModel kModel{{13, 37, 29, 41, 11}};

using Gathered = std::vector<std::vector<std::vector<float>>>;  // block, tensor, element

// Every block as Acquire hands it out, read back to the host.
Gathered GatherAll(EngineUnderTest& e) {
  Gathered all;
  auto stream = e.device->CreateStream();
  EXPECT_TRUE(stream.ok());
  if (!stream.ok()) return all;
  for (BlockId b = 0; b < e.engine->num_blocks(); ++b) {
    auto ptrs = e.engine->Acquire(b);
    EXPECT_TRUE(ptrs.ok()) << ptrs.status().ToString();
    if (!ptrs.ok()) return {};
    all.push_back(ReadBlock(*e.engine, **stream, b, *ptrs));
    EXPECT_TRUE(e.engine->Release(b).ok());
  }
  return all;
}

Config TierConfig(OffloadDevice param, bool bf16, const TempDir& dir) {
  Config c = BaseConfig();
  c.bf16.enabled = bf16;
  SetTiers(c, param, OffloadDevice::kNvme, dir);
  return c;
}

// Blocks evicted after use and fetched ahead along the recorded order.
Config PrefetchingConfig(OffloadDevice param, bool bf16, const TempDir& dir) {
  Config c = TierConfig(param, bf16, dir);
  c.zero.stage3_prefetch_bucket_size = 2500;
  c.zero.stage3_max_live_parameters = 2500;
  c.zero.stage3_max_reuse_distance = 0;
  return c;
}

EngineUnderTest ForwardOnly(const Config& c) {
  return MakeEngine(c, kModel.Blocks(), nullptr, 0, ElementType::kF32, /*forward_only=*/true);
}

class ForwardOnlyTierTest : public ::testing::TestWithParam<std::tuple<OffloadDevice, bool>> {};

// Initial values: the same gathers as a training engine's, and the plan's
// buffers, byte for byte: the home, one or two one-shard windows, and no
// optimizer state in RAM or on NVMe. Passes after the first (each ended by
// EndForwardPass) fetch ahead along it, and gather the same.
TEST_P(ForwardOnlyTierTest, GathersWhatATrainingEngineGathers) {
  const auto [param, bf16] = GetParam();
  TempDir dir, dir2;
  EngineUnderTest training = MakeEngine(PrefetchingConfig(param, bf16, dir), kModel.Blocks());
  ASSERT_NE(training.engine, nullptr);
  SetInitialParameters(*training.engine, kModel);
  const Gathered want = GatherAll(training);
  ASSERT_EQ(want.size(), 4u);

  const Config c = PrefetchingConfig(param, bf16, dir2);
  auto plan = MakeBufferPlan(c, kModel.Blocks(), 1, DeviceKind::kHost, ElementType::kF32, 0, /*forward_only=*/true);
  ASSERT_TRUE(plan.ok()) << plan.status().ToString();
  EXPECT_EQ(plan->optimizer_resident.buffer_count + plan->optimizer_pipeline.buffer_count, 0);
  EXPECT_EQ(plan->grad_accumulator.buffer_count + plan->grad_window.buffer_count, 0);
  EXPECT_EQ(plan->optimizer_swap_file_bytes + plan->norm_squares_bytes + plan->device_fixed_bytes() -
                DeviceFootprint(plan->param_home_device_bytes),
            0);
  for (const BufferItem& it : plan->Items()) {
    EXPECT_EQ(it.what.find("optimizer"), std::string::npos) << it.what;
    EXPECT_EQ(it.what.find("gradient"), std::string::npos) << it.what;
  }
  const int64_t host_before = aio::PinnedPool::LiveMappedBytes();
  EngineUnderTest e = ForwardOnly(c);
  ASSERT_NE(e.engine, nullptr);
  EXPECT_EQ(aio::PinnedPool::LiveMappedBytes() - host_before, plan->host_fixed_bytes());
  EXPECT_EQ(static_cast<int64_t>(e.device->bytes_in_use()), plan->device_fixed_bytes());
  SetInitialParameters(*e.engine, kModel);
  EXPECT_EQ(GatherAll(e), want);
  ASSERT_TRUE(e.engine->EndForwardPass().ok());
  EXPECT_EQ(e.engine->counters().prefetches, 0);
  for (int pass = 0; pass < 2; ++pass) {
    EXPECT_EQ(GatherAll(e), want);
    ASSERT_TRUE(e.engine->EndForwardPass().ok());
  }
  EXPECT_GT(e.engine->counters().prefetches, 0);
  EXPECT_LE(e.engine->counters().peak_live_elems, plan->gathered_window_elems);
  EXPECT_EQ(FileBytesUnder(dir2.Sub("optim0")), 0);
  EXPECT_EQ(FileBytesUnder(dir2.Sub("param0")) + FileBytesUnder(dir2.Sub("param1")), plan->param_swap_file_bytes);
}

INSTANTIATE_TEST_SUITE_P(Tiers, ForwardOnlyTierTest,
                         ::testing::Combine(::testing::Values(OffloadDevice::kNone, OffloadDevice::kCpu,
                                                              OffloadDevice::kNvme),
                                            ::testing::Bool()),
                         [](const auto& p) {
                           return std::string(OffloadDeviceName(std::get<0>(p.param))) +
                                  (std::get<1>(p.param) ? "_bf16" : "_fp32");
                         });

// Trains 2 steps on its own engine and saves checkpoint `ckpt`; returns
// what a training engine of `load` gathers after loading it.
Gathered TrainSaveAndGather(const Config& save, const Config& load, const std::string& ckpt) {
  {
    comm::LocalCommunicator local;
    EngineUnderTest e = MakeEngine(save, kModel.Blocks(), &local);
    EXPECT_NE(e.engine, nullptr);
    if (!e.engine) return {};
    TrainOptions to;
    to.steps = 2;
    Train(*e.engine, kModel, to, static_cast<int>(save.gradient_accumulation_steps));
    EXPECT_TRUE(e.engine->SaveCheckpoint(ckpt, {{"caller.key", "kept"}}).ok());
  }
  EngineUnderTest e = MakeEngine(load, kModel.Blocks());
  EXPECT_NE(e.engine, nullptr);
  if (!e.engine) return {};
  auto md = e.engine->LoadCheckpoint(ckpt);
  EXPECT_TRUE(md.ok()) << md.status().ToString();
  return GatherAll(e);
}

// A training checkpoint (optimizer on NVMe in sub-groups of 300 elements)
// loads into forward-only engines whose sub-groups and optimizer tier
// differ, on every parameter tier: the master weights alone, cut into
// blocks across the sub-groups' boundaries, give the training engine's
// gathers bit for bit. The caller's metadata comes back.
TEST(ForwardOnlyTest, LoadsTheMasterWeightsOfACheckpointWithOtherSubGroups) {
  TempDir dir;
  for (bool bf16 : {false, true}) {
    SCOPED_TRACE(bf16 ? "bf16" : "fp32");
    Config save = TierConfig(OffloadDevice::kNvme, bf16, dir);
    const std::string ckpt = dir.Sub(bf16 ? "ckpt16" : "ckpt32") + "/step-2";
    ASSERT_TRUE(MakeDirectories(std::filesystem::path(ckpt).parent_path().string()).ok());
    const Gathered want = TrainSaveAndGather(save, save, ckpt);
    ASSERT_EQ(want.size(), 4u);
    for (OffloadDevice param : {OffloadDevice::kNone, OffloadDevice::kCpu, OffloadDevice::kNvme}) {
      SCOPED_TRACE(OffloadDeviceName(param));
      TempDir tiers;
      Config c = TierConfig(param, bf16, tiers);
      c.zero.sub_group_size = 1'000'000'000;
      c.zero.offload_optimizer.device = OffloadDevice::kCpu;
      EngineUnderTest e = ForwardOnly(c);
      ASSERT_NE(e.engine, nullptr);
      auto md = e.engine->LoadCheckpoint(ckpt);
      ASSERT_TRUE(md.ok()) << md.status().ToString();
      EXPECT_EQ(md->at("caller.key"), "kept");
      EXPECT_EQ(md->count("engine.sub_group_elems"), 0u);
      EXPECT_EQ(GatherAll(e), want);
    }
  }
}

// ReduceGradients, Step, GetMasterParameters and SaveCheckpoint need the
// optimizer's state: refused, naming the call; WaitForUpdate has nothing
// to wait for.
TEST(ForwardOnlyTest, RefusesWhatNeedsTheOptimizer) {
  TempDir dir;
  EngineUnderTest e = ForwardOnly(TierConfig(OffloadDevice::kCpu, true, dir));
  ASSERT_NE(e.engine, nullptr);
  SetInitialParameters(*e.engine, kModel);
  std::vector<float> w(37 * 13), b(37), out_w(37 * 13), out_b(37);
  const auto refused = [](const Status& s, const std::string& call) {
    EXPECT_EQ(s.code(), StatusCode::kFailedPrecondition) << s.ToString();
    EXPECT_NE(s.message().find(call + " on a forward-only engine"), std::string::npos) << s.ToString();
  };
  refused(e.engine->ReduceGradients(0, {w.data(), b.data()}), "ReduceGradients");
  refused(e.engine->Step().status(), "Step");
  refused(e.engine->GetMasterParameters(0, {out_w.data(), out_b.data()}), "GetMasterParameters");
  refused(e.engine->SaveCheckpoint(dir.Sub("ckpt") + "/step-0", {}), "SaveCheckpoint");
  EXPECT_FALSE(std::filesystem::exists(dir.Sub("ckpt") + "/step-0"));
  EXPECT_TRUE(e.engine->WaitForUpdate().ok());
  EXPECT_EQ(GatherAll(e).size(), 4u);  // still serves its parameters
  auto held = e.engine->Acquire(0);
  ASSERT_TRUE(held.ok());
  const Status mid = e.engine->EndForwardPass();
  EXPECT_NE(mid.message().find("while block 'layer0' is acquired"), std::string::npos) << mid.ToString();
  ASSERT_TRUE(e.engine->Release(0).ok());
  EngineUnderTest training = MakeEngine(TierConfig(OffloadDevice::kCpu, true, dir), kModel.Blocks());
  ASSERT_NE(training.engine, nullptr);
  EXPECT_EQ(training.engine->EndForwardPass().code(), StatusCode::kFailedPrecondition);
}

// A flipped byte in a master blob is kCorruption naming the file and
// offset; the engine then holds no parameters (Acquire names the blocks
// not set) until a good load. A checkpoint refused before its weights are
// read leaves them as they were; another model's is refused by layout.
TEST(ForwardOnlyTest, ADamagedCheckpointLeavesNoParameters) {
  TempDir dir;
  Config save = TierConfig(OffloadDevice::kCpu, false, dir);
  save.zero.offload_optimizer.device = OffloadDevice::kCpu;
  const std::string ckpt = dir.Sub("ckpt") + "/step-2";
  ASSERT_TRUE(MakeDirectories(dir.Sub("ckpt")).ok());
  const Gathered want = TrainSaveAndGather(save, save, ckpt);
  ASSERT_EQ(want.size(), 4u);

  TempDir tiers;
  EngineUnderTest e = ForwardOnly(TierConfig(OffloadDevice::kNvme, false, tiers));
  ASSERT_NE(e.engine, nullptr);
  ASSERT_TRUE(e.engine->LoadCheckpoint(ckpt).ok());
  ASSERT_EQ(GatherAll(e), want);

  // The last master blob: master.<k> is blob 3k (master, m, v per sub-group).
  const std::string damaged = dir.Sub("damaged");
  std::filesystem::copy(ckpt, damaged, std::filesystem::copy_options::recursive);
  std::string last_master;
  for (int k = 0;; ++k) {
    char name[32];
    std::snprintf(name, sizeof(name), "/blob-%05d.bin", 3 * k);
    if (!std::filesystem::exists(damaged + name)) break;
    last_master = damaged + name;
  }
  ASSERT_FALSE(last_master.empty());
  {
    std::fstream f(last_master, std::ios::in | std::ios::out | std::ios::binary);
    f.seekp(8);
    const char x = 0x5a;
    f.write(&x, 1);
  }
  auto md = e.engine->LoadCheckpoint(damaged);
  ASSERT_FALSE(md.ok());
  EXPECT_EQ(md.status().code(), StatusCode::kCorruption) << md.status().ToString();
  EXPECT_NE(md.status().message().find(last_master), std::string::npos) << md.status().ToString();
  auto held = e.engine->Acquire(0);
  ASSERT_FALSE(held.ok());
  EXPECT_NE(held.status().message().find("SetParameters was not called for block(s) layer0"), std::string::npos)
      << held.status().ToString();
  ASSERT_TRUE(e.engine->LoadCheckpoint(ckpt).ok());
  EXPECT_EQ(GatherAll(e), want);
  // Refused before a weight is read (a blob file gone): the parameters stay.
  std::filesystem::remove(last_master);
  md = e.engine->LoadCheckpoint(damaged);
  ASSERT_FALSE(md.ok());
  EXPECT_EQ(GatherAll(e), want);

  const TinyModel other{{13, 37, 29, 41, 12}};
  TempDir tiers2;
  auto o = MakeEngine(TierConfig(OffloadDevice::kCpu, false, tiers2), other.Blocks(), nullptr, 0, ElementType::kF32,
                      /*forward_only=*/true);
  ASSERT_NE(o.engine, nullptr);
  md = o.engine->LoadCheckpoint(ckpt);
  ASSERT_FALSE(md.ok());
  EXPECT_EQ(md.status().code(), StatusCode::kFailedPrecondition) << md.status().ToString();
  EXPECT_NE(md.status().message().find("does not fit this run"), std::string::npos) << md.status().ToString();
}

}  // namespace
}  // namespace zinf::zero3::testing
