// BufferPlan (zero3/buffer_plan.h): for every offload choice, on three GPT
// shapes (tiny, demo, small) and the dense test model, with the shipped
// configs and their prefetch and keep settings, at world sizes 1 and 2: the
// items add up to the tier totals, each window follows its config keys and
// the units' own formulas, the gathered window is the largest set of blocks
// within the live limit (checked against every subset), the errors name the
// key; and an Engine made from the same config allocates on the device what
// the plan's fixed device buffers say, writes swap files of the planned
// sizes, and never gathers more than the window.
#include "zero3/buffer_plan.h"

#include <gtest/gtest.h>

#include <cstdlib>
#include <filesystem>
#include <string>
#include <vector>

#include "core/units.h"
#include "model/gpt.h"
#include "swap/gradient_window.h"
#include "swap/optimizer_swapper.h"
#include "swap/param_swapper.h"
#include "zero3/engine_test_util.h"
#include "zero3/partitioner.h"
#include "zero3/tiny_model.h"

namespace zinf::zero3 {
namespace {

using swap::testing::TempDir;

constexpr OffloadDevice kParamChoices[] = {OffloadDevice::kNone, OffloadDevice::kCpu, OffloadDevice::kNvme};
constexpr OffloadDevice kOptimizerChoices[] = {OffloadDevice::kCpu, OffloadDevice::kNvme};

std::vector<BlockSpec> Gpt(const std::string& name) {
  auto g = model::LoadGptConfig(name);
  EXPECT_TRUE(g.ok()) << g.status().ToString();
  return model::GptBlockSpecs(*g);
}

// A stage-3 bf16 config with several sub-groups, a live limit of two
// blocks and the given tiers on two NVMe paths.
Config StageThree(OffloadDevice param, OffloadDevice optimizer, const std::vector<BlockSpec>& blocks, int world = 1) {
  auto part = Partitioner::Create(blocks, world, 0);
  EXPECT_TRUE(part.ok());
  Config c;
  c.bf16.enabled = true;
  c.zero.stage = 3;
  c.zero.sub_group_size = std::max<int64_t>(4096, part->total_shard_numel() / 5);
  c.zero.stage3_param_persistence_threshold = 1000;
  c.zero.stage3_max_live_parameters = 2 * part->max_padded_numel();
  c.zero.offload_param.device = param;
  c.zero.offload_param.nvme_paths = {"/nvme0", "/nvme1"};
  c.zero.offload_param.buffer_count = 4;
  c.zero.offload_optimizer.device = optimizer;
  c.zero.offload_optimizer.nvme_paths = {"/nvme0", "/nvme1"};
  c.zero.offload_optimizer.pipeline_read = c.zero.offload_optimizer.pipeline_write = true;
  c.zero.offload_optimizer.buffer_count = 12;
  return c;
}

// The largest sum of non-persistent block elements within `bound`, by
// trying every subset (the models here have at most 14 blocks).
int64_t BestSubset(const BufferPlan& p, int64_t bound) {
  std::vector<int64_t> sizes;
  for (size_t b = 0; b < p.persistent.size(); ++b) {
    if (!p.persistent[b]) sizes.push_back(p.block_padded_elems[b]);
  }
  EXPECT_LE(sizes.size(), 20u);
  int64_t best = 0;
  for (uint32_t mask = 0; mask < (1u << sizes.size()); ++mask) {
    int64_t sum = 0;
    for (size_t i = 0; i < sizes.size(); ++i) sum += (mask >> i) & 1 ? sizes[i] : 0;
    if (sum <= bound) best = std::max(best, sum);
  }
  return best;
}

// What holds for any plan: items and totals agree, and every window is what
// the config, the Partitioner and the swappers' formulas give.
void CheckPlan(const BufferPlan& p, const Config& c, const std::vector<BlockSpec>& blocks, int world) {
  auto part = Partitioner::Create(blocks, world, 0);
  ASSERT_TRUE(part.ok());
  const int64_t total = part->total_shard_numel(), es = p.param_elem_bytes;
  EXPECT_EQ(p.total_shard_elems, total);
  EXPECT_EQ(p.max_shard_elems, part->max_shard_numel());
  EXPECT_EQ(p.max_padded_elems, part->max_padded_numel());

  // Items add up, per tier, to the totals.
  int64_t sums[4] = {0, 0, 0, 0};
  for (const BufferItem& it : p.Items()) {
    EXPECT_GT(it.bytes, 0) << it.what;
    EXPECT_FALSE(it.what.empty());
    sums[static_cast<int>(it.tier)] += it.bytes;
  }
  for (BufferTier t : {BufferTier::kDevice, BufferTier::kPinned, BufferTier::kPageable, BufferTier::kNvme}) {
    EXPECT_EQ(sums[static_cast<int>(t)], p.TierBytes(t)) << BufferTierName(t);
  }
  EXPECT_EQ(p.TierBytes(BufferTier::kDevice), p.device_fixed_bytes() + p.device_gathered_bytes());
  // No start-up copy of the initial weights: they stream into the optimizer state.
  EXPECT_EQ(p.TierBytes(BufferTier::kPageable) - p.TierBytes(BufferTier::kPageable, false), 0);
  EXPECT_EQ(p.TierBytes(BufferTier::kNvme), p.param_swap_file_bytes + p.optimizer_swap_file_bytes);

  // The parameters' home.
  const OffloadDevice home = c.zero.offload_param.device;
  EXPECT_EQ(p.param_home_device_bytes, home == OffloadDevice::kNone ? total * es : 0);
  EXPECT_EQ(p.param_home_host.buffer_count, home == OffloadDevice::kCpu ? 1 : 0);
  EXPECT_EQ(p.param_swap_buffers.buffer_count, home == OffloadDevice::kNvme ? c.zero.offload_param.buffer_count : 0);
  if (home == OffloadDevice::kCpu) {
    EXPECT_EQ(p.param_home_host.buffer_bytes, std::max<int64_t>(total * es, 4096));
  }
  if (home == OffloadDevice::kNvme) {
    const int64_t elems = std::min(c.zero.offload_param.buffer_size, part->max_shard_numel());
    EXPECT_EQ(p.param_swapper.buffer_elems, elems);
    EXPECT_EQ(p.param_swap_buffers.buffer_bytes, AlignUp(elems * es, 4096));
    EXPECT_EQ(p.param_swap_buffers.pin, c.zero.offload_param.pin_memory);
    EXPECT_GE(p.param_swap_file_bytes, total * es);
  } else {
    EXPECT_EQ(p.param_swap_file_bytes, 0);
  }

  // The optimizer state.
  const bool nvme = c.zero.offload_optimizer.device == OffloadDevice::kNvme;
  EXPECT_EQ(p.optimizer.device, nvme ? OffloadDevice::kNvme : OffloadDevice::kCpu);
  // The config's sub-group, cut for pipelining when it leaves the NVMe
  // shard in fewer than kPipelineSubGroups (SplitForPipeline), in whole
  // pieces of the norm's sums.
  int64_t sub_group = std::min(c.zero.sub_group_size, total);
  if (nvme && (total + sub_group - 1) / sub_group < kPipelineSubGroups) {
    sub_group = std::min(
        sub_group, AlignUp(std::max(kMinPipelineSubGroupElems, (total + kPipelineSubGroups - 1) / kPipelineSubGroups),
                           swap::ShardSquares::kAtom));
  }
  EXPECT_EQ(p.optimizer.sub_group_elems, sub_group);
  EXPECT_EQ(p.num_sub_groups, (total + p.optimizer.sub_group_elems - 1) / p.optimizer.sub_group_elems);
  const int64_t sub_bytes = AlignUp(p.optimizer.sub_group_elems * 4, 4096);
  EXPECT_EQ(p.optimizer_resident.buffer_count, nvme ? 0 : 3 * p.num_sub_groups);
  EXPECT_EQ(p.optimizer_pipeline.buffer_count, nvme ? swap::OptimizerSwapper::PoolBuffers(p.optimizer) : 0);
  if (nvme) {
    EXPECT_EQ(p.optimizer_pipeline.buffer_bytes, sub_bytes);
    EXPECT_GE(p.optimizer_pipeline.buffer_count, swap::OptimizerSwapper::RequiredBuffers(p.optimizer));
    EXPECT_GE(p.optimizer_swap_file_bytes, 16 * total);  // master, m, v and the gradient
    EXPECT_TRUE(p.optimizer.gradients_in_store);
  } else {
    EXPECT_EQ(p.optimizer_resident.buffer_bytes, sub_bytes);
    EXPECT_EQ(p.optimizer_swap_file_bytes, 0);
    EXPECT_FALSE(p.optimizer.gradients_in_store);
  }

  // Host and device gradient buffers: with the optimizer on NVMe, a window
  // of a few sub-groups instead of a whole-shard accumulator.
  if (nvme) {
    EXPECT_EQ(p.grad_accumulator.buffer_count, 0);
    EXPECT_EQ(p.grad_window.buffer_count, swap::GradientWindow::BufferCount(p.optimizer, p.max_shard_elems));
    EXPECT_GE(p.grad_window.buffer_count, swap::GradientWindow::kMinBuffers);
    EXPECT_LE(p.grad_window.buffer_count,
              std::max(swap::GradientWindow::kMinBuffers, p.optimizer_pipeline.buffer_count));
    EXPECT_EQ(p.grad_window.buffer_bytes, sub_bytes);
  } else {
    EXPECT_EQ(p.grad_accumulator.buffer_bytes, std::max<int64_t>(total * 4, 4096));
    EXPECT_EQ(p.grad_window.buffer_count, 0);
  }
  // New parameters: into the cpu home itself; the whole shard when nothing
  // is offloaded; otherwise a ring of whole sub-groups, at least two and the
  // largest shard (or the whole shard when that is smaller).
  EXPECT_EQ(p.new_params_in_home, p.param_home == OffloadDevice::kCpu);
  if (p.new_params_in_home) {
    EXPECT_EQ(p.new_params.buffer_count, 0);
    EXPECT_EQ(p.new_params_ring_elems, 0);
  } else if (p.param_home == OffloadDevice::kNone && c.zero.offload_optimizer.device == OffloadDevice::kNone) {
    EXPECT_EQ(p.new_params_ring_elems, 0);
    EXPECT_EQ(p.new_params.buffer_bytes, std::max<int64_t>(total * es, 4096));
  } else if (p.new_params_ring_elems == total) {
    EXPECT_GE(2 * p.optimizer.sub_group_elems + p.max_shard_elems, total);
    EXPECT_EQ(p.new_params.buffer_bytes, std::max<int64_t>(total * es, 4096));
  } else {
    const int64_t g = p.optimizer.sub_group_elems, ring = p.new_params_ring_elems;
    EXPECT_EQ(ring % g, 0);
    EXPECT_GE(ring, 2 * g + p.max_shard_elems);
    EXPECT_LT(ring, 3 * g + p.max_shard_elems);
    EXPECT_LT(ring, total);
    EXPECT_EQ(p.new_params.buffer_bytes, std::max<int64_t>(ring * es, 4096));
  }
  const int64_t staging_es = p.grad_elem_bytes == 4 ? 4 : 8;  // a 16-bit gradient's fp32 cast behind it
  EXPECT_EQ(p.grad_staging.buffer_bytes, std::max<int64_t>(part->max_shard_numel() * staging_es, 4096));
  EXPECT_EQ(p.grad_flat_bytes, world > 1 ? part->max_padded_numel() * p.grad_elem_bytes : 0);
  EXPECT_EQ(p.grad_shard_bytes, world > 1 ? part->max_shard_numel() * p.grad_elem_bytes : 0);
  EXPECT_EQ(p.checkpoint_buffers.buffer_count, 2);

  // Gathered blocks follow stage, persistence threshold and live limit.
  int64_t persistent = 0;
  for (int b = 0; b < part->num_blocks(); ++b) {
    const int64_t n = part->layout(b).padded_numel;
    const bool expect = c.zero.stage < 3 || n < c.zero.stage3_param_persistence_threshold;
    EXPECT_EQ(p.persistent[static_cast<size_t>(b)], expect) << "block " << b;
    if (expect) persistent += n;
  }
  EXPECT_EQ(p.persistent_elems, persistent);
  EXPECT_EQ(p.persistent_bytes, persistent * es);  // gathered blocks are whole 256-byte units
  EXPECT_EQ(p.live_limit_elems, c.zero.stage3_max_live_parameters);
  EXPECT_EQ(p.gathered_window_elems, BestSubset(p, std::max(p.live_limit_elems, p.max_held_elems)));
  EXPECT_EQ(p.gathered_window_bytes, p.gathered_window_elems * es);
}

TEST(BufferPlanTest, EveryOffloadChoiceOnThreeModels) {
  for (const char* name : {"tiny", "demo", "small"}) {
    const std::vector<BlockSpec> blocks = Gpt(name);
    for (int world : {1, 2}) {
      for (OffloadDevice param : kParamChoices) {
        for (OffloadDevice optimizer : kOptimizerChoices) {
          SCOPED_TRACE(std::string(name) + " world " + std::to_string(world) + " param " +
                       std::string(OffloadDeviceName(param)) + " optimizer " +
                       std::string(OffloadDeviceName(optimizer)));
          const Config c = StageThree(param, optimizer, blocks, world);
          auto p = MakeBufferPlan(c, blocks, world, DeviceKind::kHost, ElementType::kF32);
          ASSERT_TRUE(p.ok()) << p.status().ToString();
          CheckPlan(*p, c, blocks, world);
          // Two blocks' worth of live parameters: two layers gathered, no more.
          EXPECT_EQ(p->gathered_window_elems, 2 * p->max_padded_elems);
        }
      }
    }
  }
}

// The shipped configs, with their own prefetch, keep and live settings.
TEST(BufferPlanTest, ShippedConfigs) {
  const char* src = std::getenv("ZINF_SOURCE_DIR");
  ASSERT_NE(src, nullptr) << "ZINF_SOURCE_DIR is set by ctest";
  int checked = 0;
  for (const auto& entry : std::filesystem::directory_iterator(std::string(src) + "/configs")) {
    if (entry.path().extension() != ".json") continue;
    for (int world : {1, 2}) {
      auto c = LoadConfigFile(entry.path().string());
      ASSERT_TRUE(c.ok()) << c.status().ToString();
      AutoContext ctx;
      ctx.world_size = world;
      ASSERT_TRUE(ResolveAuto(*c, ctx).ok()) << entry.path();
      for (const char* name : {"tiny", "demo", "small"}) {
        SCOPED_TRACE(entry.path().filename().string() + " world " + std::to_string(world) + " " + name);
        const std::vector<BlockSpec> blocks = Gpt(name);
        auto p = MakeBufferPlan(*c, blocks, world, DeviceKind::kCuda, ElementType::kF32);
        ASSERT_TRUE(p.ok()) << p.status().ToString();
        CheckPlan(*p, *c, blocks, world);
        // Their live limit (DeepSpeed's 1e9) holds these models whole.
        int64_t all = 0;
        for (size_t b = 0; b < blocks.size(); ++b) all += p->persistent[b] ? 0 : p->block_padded_elems[b];
        EXPECT_EQ(p->gathered_window_elems, all);
        // The prefetch bucket and the reuse distance do not widen the window:
        // MakeRoom bounds prefetched and kept blocks by the live limit.
        Config narrow = *c;
        narrow.zero.stage3_max_live_parameters = p->max_padded_elems;
        narrow.zero.stage3_prefetch_bucket_size = 10 * all;
        narrow.zero.stage3_max_reuse_distance = 10 * all;
        auto q = MakeBufferPlan(narrow, blocks, world, DeviceKind::kCuda, ElementType::kF32);
        ASSERT_TRUE(q.ok());
        CheckPlan(*q, narrow, blocks, world);
        int64_t largest = 0;  // the block in use: the most these configs hold at once
        for (size_t b = 0; b < blocks.size(); ++b)
          largest = std::max(largest, p->persistent[b] ? 0 : p->block_padded_elems[b]);
        EXPECT_EQ(q->gathered_window_elems, largest);
        ++checked;
      }
    }
  }
  EXPECT_GE(checked, 4 * 2 * 3);
}

TEST(BufferPlanTest, WindowIsTheLargestSetWithinTheLimit) {
  // Blocks of 6, 5 and 5 units under a limit of 10: the two fives, which
  // taking the largest first would miss.
  std::vector<BlockSpec> blocks;
  for (int64_t units : {6, 5, 5}) blocks.push_back({"b" + std::to_string(blocks.size()), {{"w", {units, 128}}}});
  Config c;
  c.zero.stage = 3;
  c.zero.stage3_param_persistence_threshold = 0;
  c.zero.stage3_max_live_parameters = 10 * 128;
  auto p = MakeBufferPlan(c, blocks, 1, DeviceKind::kHost, ElementType::kF32);
  ASSERT_TRUE(p.ok()) << p.status().ToString();
  EXPECT_EQ(p->gathered_window_elems, 10 * 128);
  EXPECT_EQ(p->gathered_window_bytes, 10 * 128 * 4);  // fp32 parameters
  // Below the largest block, the block in use still fits: the window is
  // what the model holds at once.
  c.zero.stage3_max_live_parameters = 0;
  p = MakeBufferPlan(c, blocks, 1, DeviceKind::kHost, ElementType::kF32);
  ASSERT_TRUE(p.ok());
  EXPECT_EQ(p->max_held_elems, 6 * 128);
  EXPECT_EQ(p->gathered_window_elems, 6 * 128);
  p = MakeBufferPlan(c, blocks, 1, DeviceKind::kHost, ElementType::kF32, /*max_held_elems=*/11 * 128);
  ASSERT_TRUE(p.ok());
  EXPECT_EQ(p->gathered_window_elems, 11 * 128);  // 6 + 5
  // Stages 1 and 2 keep every block gathered: no window, all persistent.
  for (int stage : {1, 2}) {
    c.zero.stage = stage;
    p = MakeBufferPlan(c, blocks, 1, DeviceKind::kHost, ElementType::kF32);
    ASSERT_TRUE(p.ok());
    EXPECT_EQ(p->gathered_window_elems, 0);
    EXPECT_EQ(p->persistent_blocks, 3);
    EXPECT_EQ(p->persistent_bytes, 16 * 128 * 4);
  }
}

TEST(BufferPlanTest, ErrorsNameTheKey) {
  const std::vector<BlockSpec> blocks = Gpt("tiny");
  auto expect_error = [&](const Config& c, ElementType grad, const std::string& key) {
    auto p = MakeBufferPlan(c, blocks, 1, DeviceKind::kHost, grad);
    ASSERT_FALSE(p.ok()) << key;
    EXPECT_NE(p.status().message().find(key), std::string::npos) << p.status().ToString();
  };
  Config c = StageThree(OffloadDevice::kNvme, OffloadDevice::kNvme, blocks);
  Config bad = c;
  bad.zero.stage = 0;
  expect_error(bad, ElementType::kF32, "zero_optimization.stage");
  bad = c;
  bad.fp16.enabled = true;
  expect_error(bad, ElementType::kF32, "fp16.enabled and bf16.enabled");
  expect_error(c, ElementType::kF16, "gradients must be fp32 or the parameters' type");
  bad = c;
  bad.zero.offload_param.buffer_size = 1000;
  expect_error(bad, ElementType::kF32, "offload_param.buffer_size");
  bad = c;
  bad.zero.offload_param.buffer_count = 0;
  expect_error(bad, ElementType::kF32, "offload_param.buffer_count");
  bad = c;
  bad.zero.sub_group_size = 0;
  expect_error(bad, ElementType::kF32, "zero_optimization.sub_group_size");
  bad = c;
  bad.gradient_accumulation_steps = 0;
  expect_error(bad, ElementType::kF32, "gradient_accumulation_steps");
  EXPECT_FALSE(MakeBufferPlan(c, {}, 1, DeviceKind::kHost, ElementType::kF32).ok());  // the Partitioner's
}

// offload_optimizer.buffer_count below what the pipeline keeps: the
// sub-groups are split so that the pipeline fits the pinned memory the given
// buffers amount to; with enough buffers, or on the cpu tier, nothing changes.
TEST(BufferPlanTest, OptimizerPipelineFitsTheGivenBuffers) {
  const std::vector<BlockSpec> blocks = Gpt("small");
  Config c = StageThree(OffloadDevice::kNvme, OffloadDevice::kNvme, blocks);
  c.zero.sub_group_size = 1'000'000;
  for (int64_t count : {1, 2, 4, 8}) {
    c.zero.offload_optimizer.buffer_count = count;
    auto p = MakeBufferPlan(c, blocks, 1, DeviceKind::kHost, ElementType::kF32);
    ASSERT_TRUE(p.ok()) << p.status().ToString();
    const int64_t given = count * AlignUp(int64_t{4'000'000}, 4096);
    EXPECT_EQ(p->optimizer_pipeline.buffer_count, 12) << count;  // 4 arrays (with the gradient) x 3 sub-groups
    EXPECT_LE(aio::PinnedPool::MappedBytes(p->optimizer_pipeline), AlignUp(given, 2 << 20)) << count;
    EXPECT_GT(12 * (p->optimizer.sub_group_elems * 4 + 4096), given) << count;  // the largest aligned piece
    EXPECT_EQ(p->optimizer.sub_group_elems % 1024, 0);
    ASSERT_EQ(p->fitted.size(), 1u);
    EXPECT_NE(p->fitted[0].find("offload_optimizer.buffer_count " + std::to_string(count)), std::string::npos);
  }
  c.zero.offload_optimizer.buffer_count = 12;
  auto p = MakeBufferPlan(c, blocks, 1, DeviceKind::kHost, ElementType::kF32);
  ASSERT_TRUE(p.ok());
  EXPECT_TRUE(p->fitted.empty());
  EXPECT_EQ(p->optimizer.sub_group_elems, 1'000'000);
  // pipeline_read and pipeline_write off (DeepSpeed's defaults) with 4
  // buffers (one sub-group's arrays): the step pipelines anyway, its
  // sub-groups split to fit the same pinned memory (PipelineAlways).
  c.zero.offload_optimizer.buffer_count = 4;
  c.zero.offload_optimizer.pipeline_read = c.zero.offload_optimizer.pipeline_write = false;
  p = MakeBufferPlan(c, blocks, 1, DeviceKind::kHost, ElementType::kF32);
  ASSERT_TRUE(p.ok());
  ASSERT_EQ(p->fitted.size(), 2u);
  EXPECT_NE(p->fitted[0].find("pipeline_read and pipeline_write are off"), std::string::npos) << p->fitted[0];
  EXPECT_NE(p->fitted[1].find("offload_optimizer.buffer_count 4"), std::string::npos) << p->fitted[1];
  EXPECT_TRUE(p->optimizer.pipeline_read && p->optimizer.pipeline_write);
  EXPECT_EQ(p->optimizer_pipeline.buffer_count, 12);
  EXPECT_LE(aio::PinnedPool::MappedBytes(p->optimizer_pipeline),
            AlignUp(4 * AlignUp(int64_t{4'000'000}, 4096), 2 << 20));
  // The cpu tier keeps its sub-groups whatever buffer_count says.
  c = StageThree(OffloadDevice::kNvme, OffloadDevice::kCpu, blocks);
  c.zero.offload_optimizer.buffer_count = 1;
  p = MakeBufferPlan(c, blocks, 1, DeviceKind::kHost, ElementType::kF32);
  ASSERT_TRUE(p.ok());
  EXPECT_TRUE(p->fitted.empty());
  EXPECT_EQ(p->optimizer.sub_group_elems, std::min(c.zero.sub_group_size, p->total_shard_elems));
}

// offload_param: a shard larger than buffer_size re-cuts the buffers into
// whole shards within buffer_count x buffer_size; only buffers that together
// hold less than one shard are refused, saying what would do.
// A sub_group_size that leaves the NVMe optimizer shard in fewer than
// kPipelineSubGroups sub-groups (the shipped configs' 5e7 on the demo model:
// one) is cut so that the update pipelines; enough sub-groups already, or
// the cpu tier, and nothing changes.
TEST(BufferPlanTest, FewSubGroupsAreSplitForPipelining) {
  const std::vector<BlockSpec> blocks = Gpt("demo");
  Config c = StageThree(OffloadDevice::kNvme, OffloadDevice::kNvme, blocks);
  c.zero.sub_group_size = 50'000'000;
  c.zero.offload_optimizer.buffer_count = 12;
  auto p = MakeBufferPlan(c, blocks, 1, DeviceKind::kHost, ElementType::kF32);
  ASSERT_TRUE(p.ok()) << p.status().ToString();
  const int64_t total = p->total_shard_elems;
  ASSERT_LT(total, 8 * 50'000'000);
  EXPECT_LT(p->optimizer.sub_group_elems, total);
  EXPECT_GE(p->optimizer.sub_group_elems, kMinPipelineSubGroupElems);
  EXPECT_GE(p->num_sub_groups, 2);
  EXPECT_LE(p->num_sub_groups, kPipelineSubGroups);
  ASSERT_EQ(p->fitted.size(), 1u);
  EXPECT_NE(p->fitted[0].find("split into " + std::to_string(p->num_sub_groups)), std::string::npos) << p->fitted[0];
  // The pinned pipeline shrinks with the sub-group, and the new parameters
  // go home through a ring, not a whole-shard buffer.
  EXPECT_EQ(p->optimizer_pipeline.buffer_bytes, AlignUp(p->optimizer.sub_group_elems * 4, 4096));
  EXPECT_GT(p->new_params_ring_elems, 0);
  // The memory 12 whole-shard buffers would have pinned holds every
  // sub-group's four arrays at once: all of them are in flight (read under
  // the backward), still within those bytes.
  EXPECT_EQ(p->optimizer_pipeline.buffer_count, 4 * p->num_sub_groups);
  EXPECT_LE(p->optimizer_pipeline.buffer_count * p->optimizer_pipeline.buffer_bytes, 12 * AlignUp(total * 4, 4096));
  EXPECT_NE(p->fitted[0].find("holds " + std::to_string(p->num_sub_groups) + " of them in flight"), std::string::npos);
  // Two buffers' worth: no more than the pipeline's twelve.
  c.zero.offload_optimizer.buffer_count = 2;
  p = MakeBufferPlan(c, blocks, 1, DeviceKind::kHost, ElementType::kF32);
  ASSERT_TRUE(p.ok()) << p.status().ToString();
  EXPECT_EQ(p->optimizer_pipeline.buffer_count, std::min<int64_t>(12, 4 * p->num_sub_groups));
  c.zero.offload_optimizer.buffer_count = 12;
  // Many sub-groups already: left as configured.
  c.zero.sub_group_size = total / 10;
  p = MakeBufferPlan(c, blocks, 1, DeviceKind::kHost, ElementType::kF32);
  ASSERT_TRUE(p.ok());
  EXPECT_TRUE(p->fitted.empty());
  EXPECT_EQ(p->optimizer.sub_group_elems, total / 10);
  // The cpu tier keeps one sub-group.
  c = StageThree(OffloadDevice::kNvme, OffloadDevice::kCpu, blocks);
  c.zero.sub_group_size = 50'000'000;
  p = MakeBufferPlan(c, blocks, 1, DeviceKind::kHost, ElementType::kF32);
  ASSERT_TRUE(p.ok());
  EXPECT_EQ(p->optimizer.sub_group_elems, total);
}

// A split sub-group is a range of whole pieces of the norm's sums (the
// gradient window takes a sub-group's squares as it writes it): with the
// shipped NVMe config, `small` (whose shard / 8 is not a multiple of
// ShardSquares::kAtom) failed its first step on that before the cut was
// rounded. Every model and rank count here.
TEST(BufferPlanTest, SplitSubGroupsAreWholeNormPieces) {
  for (const std::string name : {"tiny", "demo", "small", "gpt2-124m"}) {
    const std::vector<BlockSpec> blocks = Gpt(name);
    for (int world : {1, 2, 3}) {
      SCOPED_TRACE(name + " x" + std::to_string(world));
      Config c = StageThree(OffloadDevice::kNvme, OffloadDevice::kNvme, blocks);
      c.zero.sub_group_size = 1'000'000'000;
      for (int64_t count : {4, 8}) {
        c.zero.offload_optimizer.buffer_count = count;
        auto p = MakeBufferPlan(c, blocks, world, DeviceKind::kHost, ElementType::kF32);
        ASSERT_TRUE(p.ok()) << p.status().ToString();
        if (p->optimizer.sub_group_elems < p->total_shard_elems) {
          EXPECT_EQ(p->optimizer.sub_group_elems % swap::ShardSquares::kAtom, 0) << p->optimizer.sub_group_elems;
        }
      }
    }
  }
}

TEST(BufferPlanTest, ParamBuffersAreRecutForShardsLargerThanBufferSize) {
  const std::vector<BlockSpec> blocks = Gpt("small");
  Config c = StageThree(OffloadDevice::kNvme, OffloadDevice::kNvme, blocks);
  auto part = Partitioner::Create(blocks, 1, 0);
  ASSERT_TRUE(part.ok());
  const int64_t shard = part->max_shard_numel();
  c.zero.sub_group_size = 1'000'000;  // enough sub-groups: nothing else is fitted
  c.zero.offload_param.buffer_count = 5;
  c.zero.offload_param.buffer_size = shard / 2 + 1;
  auto p = MakeBufferPlan(c, blocks, 1, DeviceKind::kHost, ElementType::kF32);
  ASSERT_TRUE(p.ok()) << p.status().ToString();
  EXPECT_EQ(p->param_swapper.buffer_elems, shard);
  EXPECT_EQ(p->param_swap_buffers.buffer_count, 5 * (shard / 2 + 1) / shard);
  ASSERT_EQ(p->fitted.size(), 1u);
  EXPECT_NE(p->fitted[0].find("offload_param"), std::string::npos);
  c.zero.offload_param.buffer_count = 1;
  p = MakeBufferPlan(c, blocks, 1, DeviceKind::kHost, ElementType::kF32);
  ASSERT_FALSE(p.ok());
  EXPECT_NE(
      p.status().message().find("raise buffer_count to at least 2 or buffer_size to at least " + std::to_string(shard)),
      std::string::npos)
      << p.status().ToString();
}

// An Engine made from the config allocates the plan's fixed device buffers,
// byte for byte, writes swap files of the planned sizes, and keeps its
// gathered blocks within the window, for every offload choice and the
// shipped configs' prefetch and keep settings.
void CheckEngine(Config c, const testing::TinyModel& model, const std::string& what) {
  SCOPED_TRACE(what);
  TempDir dir;
  c.zero.offload_param.nvme_paths = {dir.Sub("param0"), dir.Sub("param1")};
  c.zero.offload_optimizer.nvme_paths = {dir.Sub("optim0")};
  const std::vector<BlockSpec> blocks = model.Blocks();
  auto p = MakeBufferPlan(c, blocks, 1, DeviceKind::kHost, ElementType::kF32);
  ASSERT_TRUE(p.ok()) << p.status().ToString();
  CheckPlan(*p, c, blocks, 1);
  const int64_t host_before = aio::PinnedPool::LiveMappedBytes();
  testing::EngineUnderTest e = testing::MakeEngine(c, blocks);
  ASSERT_NE(e.engine, nullptr);
  EXPECT_EQ(static_cast<int64_t>(e.device->bytes_in_use()), p->device_fixed_bytes());
  EXPECT_EQ(aio::PinnedPool::LiveMappedBytes() - host_before, p->host_fixed_bytes());
  EXPECT_EQ(testing::FileBytesUnder(dir.Sub("param0")) + testing::FileBytesUnder(dir.Sub("param1")),
            p->param_swap_file_bytes);
  EXPECT_EQ(testing::FileBytesUnder(dir.Sub("optim0")), p->optimizer_swap_file_bytes);
  testing::TrainOptions to;
  to.steps = 3;
  testing::Train(*e.engine, model, to, static_cast<int>(c.gradient_accumulation_steps));
  EXPECT_GT(e.engine->counters().peak_live_elems, 0);
  EXPECT_LE(e.engine->counters().peak_live_elems, p->gathered_window_elems);
  EXPECT_EQ(static_cast<int64_t>(e.device->bytes_in_use()), p->device_fixed_bytes());  // after Step: no gathers
  // A checkpoint adds its two buffers, and nothing else stays behind.
  ASSERT_TRUE(e.engine->SaveCheckpoint(dir.Sub("ckpt") + "/step-3", {}).ok());
  EXPECT_EQ(aio::PinnedPool::LiveMappedBytes() - host_before,
            p->host_fixed_bytes() + aio::PinnedPool::MappedBytes(p->checkpoint_buffers));
}

// The new-parameter window is set by the sub-group and the largest shard,
// not by the model: with the optimizer offloaded, a model of 4x the layers
// (same layer shape) plans the same bytes for it on every parameter home,
// the device's included, and the plan lists it as a ring; with nothing
// offloaded it is the whole shard and grows; with the parameters' home in
// pinned RAM there is none (the update writes the home).
TEST(BufferPlanTest, NewParamsRingDoesNotGrowWithTheModel) {
  const auto model = [](int layers) {
    std::vector<int64_t> dims(static_cast<size_t>(layers) + 1, 64);
    return testing::TinyModel{dims}.Blocks();
  };
  const auto plan = [](const std::vector<BlockSpec>& blocks, OffloadDevice param, OffloadDevice optimizer) {
    Config c = testing::BaseConfig();
    c.bf16.enabled = true;
    c.zero.sub_group_size = 1000;  // about a quarter of a block's 4160 elements
    c.zero.offload_param.device = param;
    c.zero.offload_optimizer.device = optimizer;
    c.zero.offload_param.nvme_paths = c.zero.offload_optimizer.nvme_paths = {"/nvme0"};
    auto p = MakeBufferPlan(c, blocks, 1, DeviceKind::kHost, ElementType::kF32);
    EXPECT_TRUE(p.ok()) << p.status().ToString();
    return p.ok() ? *p : BufferPlan{};
  };
  const auto small = model(8), large = model(32);
  for (OffloadDevice param : kParamChoices) {
    for (OffloadDevice optimizer : {OffloadDevice::kNone, OffloadDevice::kCpu, OffloadDevice::kNvme}) {
      SCOPED_TRACE("param " + std::string(OffloadDeviceName(param)) + " optimizer " +
                   std::string(OffloadDeviceName(optimizer)));
      const BufferPlan a = plan(small, param, optimizer), b = plan(large, param, optimizer);
      ASSERT_EQ(b.total_shard_elems, 4 * a.total_shard_elems);
      const auto ring_items = [](const BufferPlan& p) {
        int64_t n = 0;
        for (const BufferItem& it : p.Items()) n += it.what.find("new-parameter ring") != std::string::npos;
        return n;
      };
      if (param == OffloadDevice::kCpu) {
        EXPECT_TRUE(b.new_params_in_home);
        EXPECT_EQ(b.new_params.buffer_count, 0);
        EXPECT_EQ(ring_items(b), 0);
        continue;
      }
      if (param == OffloadDevice::kNone && optimizer == OffloadDevice::kNone) {
        EXPECT_EQ(b.new_params_ring_elems, 0);
        EXPECT_EQ(b.new_params.buffer_bytes, 4 * a.new_params.buffer_bytes);
        EXPECT_EQ(ring_items(b), 0);
        continue;
      }
      EXPECT_EQ(a.new_params_ring_elems, b.new_params_ring_elems);
      EXPECT_EQ(a.new_params.buffer_bytes, b.new_params.buffer_bytes);
      EXPECT_LT(b.new_params_ring_elems, a.total_shard_elems);
      EXPECT_EQ(b.new_params.buffer_bytes, std::max<int64_t>(b.new_params_ring_elems * b.param_elem_bytes, 4096));
      EXPECT_EQ(ring_items(a), 1);
      EXPECT_EQ(ring_items(b), 1);
    }
  }
}

TEST(BufferPlanTest, EngineAllocatesThePlannedBuffers) {
  const testing::TinyModel model{{24, 40, 32, 40, 16}};
  for (OffloadDevice param : kParamChoices) {
    for (OffloadDevice optimizer : kOptimizerChoices) {
      Config c = testing::BaseConfig();
      c.zero.offload_param.device = param;
      c.zero.offload_optimizer.device = optimizer;
      c.zero.stage3_prefetch_bucket_size = 2000;
      c.zero.stage3_max_live_parameters = 2000;  // about two blocks
      c.zero.stage3_max_reuse_distance = 4000;
      CheckEngine(
          c, model,
          "param " + std::string(OffloadDeviceName(param)) + " optimizer " + std::string(OffloadDeviceName(optimizer)));
    }
  }
  // Two blocks above the shipped configs' persistence threshold (1e5
  // elements), two below it.
  const testing::TinyModel wide{{24, 400, 320, 400, 16}};
  const char* src = std::getenv("ZINF_SOURCE_DIR");
  ASSERT_NE(src, nullptr);
  for (const auto& entry : std::filesystem::directory_iterator(std::string(src) + "/configs")) {
    if (entry.path().extension() != ".json") continue;
    auto c = LoadConfigFile(entry.path().string());
    ASSERT_TRUE(c.ok());
    AutoContext ctx;
    ASSERT_TRUE(ResolveAuto(*c, ctx).ok());
    c->gradient_accumulation_steps = 2;  // the test model's batch of 6 in 2 micro-batches
    CheckEngine(*c, wide, entry.path().filename().string());
  }
}

}  // namespace
}  // namespace zinf::zero3
