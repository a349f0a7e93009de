// Engine on one rank with the host device: tiers give bit-identical
// training, prefetching stays under max_live and changes nothing, a changed
// acquire order is re-recorded.
#include <gtest/gtest.h>

#include <algorithm>
#include <bit>
#include <chrono>
#include <cmath>
#include <cstring>
#include <filesystem>
#include <functional>
#include <map>
#include <memory>
#include <string>
#include <utility>

#include "aio/fault_engine.h"
#include "comm/communicator.h"
#include "core/fs.h"
#include "stream_gate.h"
#include "zero3/buffer_plan.h"
#include "zero3/engine_test_util.h"
#include "zero3/partitioner.h"
#include "zero3/tiny_model.h"

namespace zinf::zero3::testing {
namespace {

using swap::testing::TempDir;

const TinyModel kModel{{13, 37, 29, 41, 11}};  // block sizes 518, 1102, 1230, 462

struct Outcome {
  std::vector<float> master;
  float loss = 0.0f;
  EngineCounters counters;
};

Outcome TrainModel(const Config& config, const TrainOptions& train = {}, const TinyModel& model = kModel) {
  comm::LocalCommunicator local;
  EngineUnderTest e = MakeEngine(config, model.Blocks(), &local);
  Outcome o;
  if (!e.engine) return o;
  o.loss = Train(*e.engine, model, train, static_cast<int>(config.gradient_accumulation_steps));
  o.master = MasterWeights(*e.engine, model);
  o.counters = e.engine->counters();
  return o;
}

// `steps` more steps from step `first_step` on an engine whose state came
// from a checkpoint: what to compare with an uninterrupted run.
Outcome ContinueTraining(Engine& engine, int first_step, int steps, const Config& config) {
  TrainOptions rest;
  rest.steps = steps;
  rest.first_step = first_step;
  rest.set_parameters = false;
  Outcome o;
  o.loss = Train(engine, kModel, rest, static_cast<int>(config.gradient_accumulation_steps));
  o.master = MasterWeights(engine, kModel);
  return o;
}

void ExpectBitIdentical(const Outcome& a, const Outcome& b) {
  ASSERT_EQ(a.master.size(), b.master.size());
  ASSERT_FALSE(a.master.empty());
  EXPECT_EQ(std::memcmp(a.master.data(), b.master.data(), a.master.size() * 4), 0);
  EXPECT_EQ(a.loss, b.loss);
}

// Trains `steps` steps of kModel with `config` on an engine of its own and
// saves them as checkpoint `ckpt` (its parent folder made) with `metadata`.
void TrainAndSave(const Config& config, int steps, const std::string& ckpt,
                  const std::map<std::string, std::string>& metadata = {}) {
  comm::LocalCommunicator local;
  EngineUnderTest e = MakeEngine(config, kModel.Blocks(), &local);
  ASSERT_NE(e.engine, nullptr);
  TrainOptions first;
  first.steps = steps;
  Train(*e.engine, kModel, first, static_cast<int>(config.gradient_accumulation_steps));
  ASSERT_TRUE(MakeDirectories(std::filesystem::path(ckpt).parent_path().string()).ok());
  const Status s = e.engine->SaveCheckpoint(ckpt, metadata);
  ASSERT_TRUE(s.ok()) << s.ToString();
}

class EngineTierTest : public ::testing::TestWithParam<std::tuple<OffloadDevice, OffloadDevice>> {};

TEST_P(EngineTierTest, OffloadedTrainingIsBitIdenticalToResident) {
  const auto [param, optimizer] = GetParam();
  TempDir dir;
  Config config = BaseConfig();
  config.bf16.enabled = true;
  config.gradient_clipping = 0.5;  // exercises the norm pass and the clip factor
  Config resident = config;
  SetTiers(resident, OffloadDevice::kNone, OffloadDevice::kNone, dir);
  SetTiers(config, param, optimizer, dir);
  // The new parameters go straight into a cpu home; on the other tiers
  // they pass through a ring smaller than the shard, and a block wraps
  // around its end.
  auto plan = MakeBufferPlan(config, kModel.Blocks(), 1, DeviceKind::kHost, ElementType::kF32);
  ASSERT_TRUE(plan.ok()) << plan.status().ToString();
  EXPECT_EQ(plan->new_params_in_home, param == OffloadDevice::kCpu);
  if (!plan->new_params_in_home) {
    const int64_t ring = plan->new_params_ring_elems;
    EXPECT_GT(ring, 0);
    EXPECT_LT(ring, plan->total_shard_elems);
    auto part = Partitioner::Create(kModel.Blocks(), 1, 0);
    ASSERT_TRUE(part.ok());
    bool wraps = false;
    for (BlockId b = 0; b < part->num_blocks(); ++b) {
      const BlockLayout& l = part->layout(b);
      wraps = wraps || (ring > 0 && l.rank_offset % ring + l.shard_numel > ring);
    }
    EXPECT_TRUE(wraps);
  }

  const Outcome want = TrainModel(resident);
  const Outcome got = TrainModel(config);
  ExpectBitIdentical(got, want);
  if (param == OffloadDevice::kNvme) {
    EXPECT_GT(got.counters.nvme_read_bytes, 0);
    EXPECT_GT(got.counters.nvme_write_bytes, 0);
  }
  if (optimizer == OffloadDevice::kNvme) {
    EXPECT_GT(got.counters.optimizer_nvme_bytes, 0);
  }
}

INSTANTIATE_TEST_SUITE_P(Tiers, EngineTierTest,
                         ::testing::Values(std::make_tuple(OffloadDevice::kNvme, OffloadDevice::kNvme),
                                           std::make_tuple(OffloadDevice::kCpu, OffloadDevice::kNvme),
                                           std::make_tuple(OffloadDevice::kNvme, OffloadDevice::kCpu),
                                           std::make_tuple(OffloadDevice::kCpu, OffloadDevice::kCpu),
                                           std::make_tuple(OffloadDevice::kNone, OffloadDevice::kNvme),
                                           std::make_tuple(OffloadDevice::kNone, OffloadDevice::kCpu)),
                         [](const auto& p) {
                           return "param_" + std::string(OffloadDeviceName(std::get<0>(p.param))) + "_optim_" +
                                  std::string(OffloadDeviceName(std::get<1>(p.param)));
                         });

// offload_param none with the optimizer offloaded: the new parameters pass
// through the ring into the device home (H2D from the pinned ring, whose
// space the stream hands back), on a model whose blocks span several
// sub-groups or share one, with 3 micro-batches per step, with and without
// prefetching (fetches that refresh ahead without waiting): bit for bit the
// all-in-RAM run, which writes the whole shard at once.
TEST(EngineTest, DeviceHomeThroughTheRingIsBitIdentical) {
  const TinyModel model{{13, 37, 29, 41, 11, 5, 7, 3, 9, 6, 4}};  // 518, 1102, 1230, 462, 60, 40, 24, 30, 60, 28
  for (int64_t sub_group : {300, 700}) {
    for (int64_t prefetch : {0, 3000}) {
      TempDir dir;
      Config config = BaseConfig();
      config.bf16.enabled = true;
      config.gradient_accumulation_steps = 3;
      config.gradient_clipping = 0.5;
      config.zero.sub_group_size = sub_group;
      config.zero.stage3_prefetch_bucket_size = prefetch;
      Config resident = config;
      SetTiers(resident, OffloadDevice::kNone, OffloadDevice::kNone, dir);
      auto whole = MakeBufferPlan(resident, model.Blocks(), 1, DeviceKind::kHost, ElementType::kF32);
      ASSERT_TRUE(whole.ok()) << whole.status().ToString();
      EXPECT_EQ(whole->new_params_ring_elems, 0);
      TrainOptions t;
      t.steps = 4;
      const Outcome want = TrainModel(resident, t, model);
      for (OffloadDevice optimizer : {OffloadDevice::kCpu, OffloadDevice::kNvme}) {
        SCOPED_TRACE("sub-group " + std::to_string(sub_group) + " prefetch " + std::to_string(prefetch) +
                     " optimizer " + std::string(OffloadDeviceName(optimizer)));
        Config c = config;
        TempDir d;
        SetTiers(c, OffloadDevice::kNone, optimizer, d);
        auto plan = MakeBufferPlan(c, model.Blocks(), 1, DeviceKind::kHost, ElementType::kF32);
        ASSERT_TRUE(plan.ok()) << plan.status().ToString();
        const int64_t ring = plan->new_params_ring_elems;
        ASSERT_GT(ring, 0);
        EXPECT_LT(ring, plan->total_shard_elems);
        auto part = Partitioner::Create(model.Blocks(), 1, 0);
        ASSERT_TRUE(part.ok());
        bool wraps = false, spans = false, shares = false;
        for (BlockId b = 0; b < part->num_blocks(); ++b) {
          const BlockLayout& l = part->layout(b);
          wraps = wraps || l.rank_offset % ring + l.shard_numel > ring;
          spans = spans || l.shard_numel > sub_group;
          shares = shares || l.shard_numel < sub_group;
        }
        EXPECT_TRUE(wraps);
        EXPECT_TRUE(spans);
        EXPECT_TRUE(shares);
        ExpectBitIdentical(TrainModel(c, t, model), want);
      }
    }
  }
}

// offload_param cpu: the update writes the new parameters into the pinned
// home itself while fetches (and, with a prefetch window, prefetches) copy
// the blocks it has published out of it: bit for bit the all-in-RAM run.
TEST(EngineTest, CpuHomeWrittenInPlaceIsBitIdentical) {
  const TinyModel model{{13, 37, 29, 41, 11, 5, 7, 3, 9, 6, 4}};
  for (int64_t prefetch : {0, 3000}) {
    TempDir dir;
    Config config = BaseConfig();
    config.bf16.enabled = true;
    config.gradient_clipping = 0.5;
    config.zero.sub_group_size = 700;
    config.zero.stage3_prefetch_bucket_size = prefetch;
    Config resident = config;
    SetTiers(resident, OffloadDevice::kNone, OffloadDevice::kNone, dir);
    TrainOptions t;
    t.steps = 4;
    const Outcome want = TrainModel(resident, t, model);
    for (OffloadDevice optimizer : {OffloadDevice::kCpu, OffloadDevice::kNvme}) {
      SCOPED_TRACE("prefetch " + std::to_string(prefetch) + " optimizer " + std::string(OffloadDeviceName(optimizer)));
      Config c = config;
      TempDir d;
      SetTiers(c, OffloadDevice::kCpu, optimizer, d);
      auto plan = MakeBufferPlan(c, model.Blocks(), 1, DeviceKind::kHost, ElementType::kF32);
      ASSERT_TRUE(plan.ok()) << plan.status().ToString();
      EXPECT_TRUE(plan->new_params_in_home);
      const Outcome got = TrainModel(c, t, model);
      ExpectBitIdentical(got, want);
      if (prefetch > 0) {
        EXPECT_GT(got.counters.prefetches, 0);
      }
    }
  }
}

// DeepSpeed's buffer semantics: offload_optimizer.buffer_count 4 with both
// pipelines (12 buffers needed: master, m, v, gradient) splits the sub-groups to fit the given pinned
// memory, and offload_param buffers smaller than a shard are re-cut; the
// training is bit-identical to the same config with buffers that need no
// fitting, and to the all-resident run.
TEST(EngineTest, BuffersFittedToTheConfigTrainBitIdentically) {
  TempDir dir;
  Config config = BaseConfig();
  config.bf16.enabled = true;
  config.gradient_clipping = 0.5;
  config.zero.sub_group_size = 4000;  // one sub-group of the whole 3312-element shard
  Config resident = config;
  SetTiers(resident, OffloadDevice::kNone, OffloadDevice::kNone, dir);
  SetTiers(config, OffloadDevice::kNvme, OffloadDevice::kNvme, dir);
  Config unfitted = config;
  unfitted.zero.offload_optimizer.buffer_count = 12;  // 4 arrays (the gradient too) x 3 sub-groups in flight
  unfitted.zero.offload_param.buffer_size = 2000;
  config.zero.offload_optimizer.buffer_count = 4;
  config.zero.offload_param.buffer_count = 4;
  config.zero.offload_param.buffer_size = 700;  // the largest shard has 1230 elements

  auto fitted_plan = MakeBufferPlan(config, kModel.Blocks(), 1, DeviceKind::kHost, ElementType::kF32);
  auto unfitted_plan = MakeBufferPlan(unfitted, kModel.Blocks(), 1, DeviceKind::kHost, ElementType::kF32);
  ASSERT_TRUE(fitted_plan.ok()) << fitted_plan.status().ToString();
  ASSERT_TRUE(unfitted_plan.ok()) << unfitted_plan.status().ToString();
  EXPECT_EQ(fitted_plan->fitted.size(), 2u);
  EXPECT_TRUE(unfitted_plan->fitted.empty());
  EXPECT_EQ(unfitted_plan->num_sub_groups, 1);
  EXPECT_EQ(fitted_plan->optimizer.sub_group_elems, 1024);  // 12 x 4 KiB within 4 x 16 KiB
  EXPECT_EQ(fitted_plan->num_sub_groups, 4);
  EXPECT_EQ(fitted_plan->param_swap_buffers.buffer_count, 2);  // 4 x 700 elements re-cut into shards of 1230

  const Outcome want = TrainModel(resident);
  const Outcome plain = TrainModel(unfitted);
  const Outcome got = TrainModel(config);
  ExpectBitIdentical(plain, want);
  ExpectBitIdentical(got, want);
  EXPECT_GT(got.counters.optimizer_nvme_bytes, 0);
}

// A checkpoint holds the optimizer state per sub-group, so a resume whose
// buffer_count fits the sub-groups differently is refused, naming
// buffer_count and both values (not sub_group_size, which did not change).
TEST(EngineTest, AResumeWithOtherFittedSubGroupsNamesBufferCount) {
  TempDir dir;
  Config config = BaseConfig();
  config.zero.sub_group_size = 4000;
  SetTiers(config, OffloadDevice::kNvme, OffloadDevice::kNvme, dir);
  config.zero.offload_optimizer.buffer_count = 4;  // fewer than the pipeline keeps: sub-groups split
  Config unfitted = config;
  unfitted.zero.offload_optimizer.buffer_count = 12;
  const std::string ckpt = dir.Sub("ckpt") + "/step-1";
  ASSERT_NO_FATAL_FAILURE(TrainAndSave(config, 1, ckpt));
  TempDir dir2;
  SetTiers(unfitted, OffloadDevice::kNvme, OffloadDevice::kNvme, dir2);
  comm::LocalCommunicator local;
  EngineUnderTest e = MakeEngine(unfitted, kModel.Blocks(), &local);
  ASSERT_NE(e.engine, nullptr);
  auto md = e.engine->LoadCheckpoint(ckpt);
  ASSERT_FALSE(md.ok());
  EXPECT_EQ(md.status().code(), StatusCode::kFailedPrecondition);
  auto fitted = MakeBufferPlan(config, kModel.Blocks(), 1, DeviceKind::kHost, ElementType::kF32);
  auto plain = MakeBufferPlan(unfitted, kModel.Blocks(), 1, DeviceKind::kHost, ElementType::kF32);
  ASSERT_TRUE(fitted.ok() && plain.ok());
  ASSERT_LT(fitted->optimizer.sub_group_elems, plain->optimizer.sub_group_elems);
  EXPECT_NE(
      md.status().message().find("engine.sub_group_elems is " + std::to_string(fitted->optimizer.sub_group_elems) +
                                 " there and " + std::to_string(plain->optimizer.sub_group_elems) +
                                 " here (offload_optimizer.buffer_count 4 there and 12 here"),
      std::string::npos)
      << md.status().ToString();
  EXPECT_EQ(md.status().message().find("zero_optimization.sub_group_size 4000"), std::string::npos);
}

// One step from the same weights (so the same gradient): the decayed
// tensors move exactly as with decay everywhere, the undecayed biases
// exactly as with weight_decay 0, on NVMe tiers with sub-groups.
TEST(EngineTest, UndecayedTensorsStepWithoutWeightDecay) {
  TempDir dir;
  Config config = BaseConfig();
  config.optimizer.weight_decay = 0.5;
  config.zero.sub_group_size = 1000;
  SetTiers(config, OffloadDevice::kNvme, OffloadDevice::kNvme, dir);
  Config no_decay = config;
  no_decay.optimizer.weight_decay = 0.0;
  TinyModel all_decay = kModel;
  all_decay.decay_biases = true;
  auto run = [&](const Config& c, const TinyModel& model) {
    comm::LocalCommunicator local;
    EngineUnderTest e = MakeEngine(c, model.Blocks(), &local);
    if (!e.engine) return std::vector<float>{};
    TrainOptions one_step;
    one_step.steps = 1;
    Train(*e.engine, model, one_step, static_cast<int>(c.gradient_accumulation_steps));
    return MasterWeights(*e.engine, model);
  };
  const std::vector<float> masked = run(config, kModel), all = run(config, all_decay), none = run(no_decay, kModel);
  ASSERT_FALSE(masked.empty());
  ASSERT_EQ(masked.size(), all.size());
  ASSERT_EQ(masked.size(), none.size());
  size_t at = 0, biases_moved_apart = 0;
  for (const BlockSpec& b : kModel.Blocks()) {
    for (const TensorSpec& t : b.tensors) {
      const std::vector<float>& want = t.decay ? all : none;
      for (int64_t i = 0; i < t.numel(); ++i, ++at) {
        ASSERT_EQ(std::bit_cast<uint32_t>(masked[at]), std::bit_cast<uint32_t>(want[at])) << b.name << "." << t.name;
        biases_moved_apart += !t.decay && masked[at] != all[at];
      }
    }
  }
  EXPECT_GT(biases_moved_apart, 0u);
}

TEST(EngineTest, Fp16OnNvmeIsBitIdenticalToResidentAndSkipsOverflows) {
  TempDir dir;
  Config config = BaseConfig();
  config.fp16.enabled = true;
  config.fp16.initial_scale_power = 12;
  config.fp16.hysteresis = 1;  // the first overflow halves the scale
  config.gradient_clipping = 1.0;
  Config resident = config;
  SetTiers(resident, OffloadDevice::kNone, OffloadDevice::kNone, dir);
  SetTiers(config, OffloadDevice::kNvme, OffloadDevice::kNvme, dir);
  TrainOptions t;
  t.steps = 4;
  t.inf_step = 1;
  std::vector<StepResult> results;
  t.results = &results;
  const Outcome got = TrainModel(config, t);
  t.results = nullptr;
  ExpectBitIdentical(got, TrainModel(resident, t));
  ASSERT_EQ(results.size(), 4u);
  EXPECT_TRUE(results[0].applied);
  EXPECT_FALSE(results[1].applied);  // overflow: skipped
  EXPECT_TRUE(std::isinf(results[1].grad_norm));
  EXPECT_EQ(results[0].loss_scale, 4096.0);
  EXPECT_EQ(results[1].loss_scale, 2048.0);
  EXPECT_TRUE(results[3].applied);
  EXPECT_GT(results[3].grad_norm, 0.0);
}

// Three micro-batches per step, an fp16 overflow skip and clipping that
// takes effect: with the optimizer on NVMe the gradient accumulates in its
// store (no RAM accumulator), and norms, skips, losses and weights equal
// the all-resident run's bit for bit on every tier.
TEST(EngineTest, AccumulationOverflowAndClippingAreBitIdenticalOnEveryTier) {
  TempDir dir;
  Config config = BaseConfig();
  config.gradient_accumulation_steps = 3;
  config.fp16.enabled = true;
  config.fp16.initial_scale_power = 12;
  config.fp16.hysteresis = 1;
  config.gradient_clipping = 0.05;  // below the norms seen: every applied step is clipped
  TrainOptions t;
  t.steps = 4;
  t.inf_step = 2;
  std::vector<StepResult> want_results;
  t.results = &want_results;
  Config resident = config;
  SetTiers(resident, OffloadDevice::kNone, OffloadDevice::kNone, dir);
  const Outcome want = TrainModel(resident, t);
  ASSERT_EQ(want_results.size(), 4u);
  EXPECT_FALSE(want_results[2].applied);
  for (int i : {0, 1, 3}) EXPECT_GT(want_results[static_cast<size_t>(i)].grad_norm, 0.05);
  for (auto [param, optimizer] : {std::make_tuple(OffloadDevice::kNvme, OffloadDevice::kNvme),
                                  std::make_tuple(OffloadDevice::kCpu, OffloadDevice::kNvme),
                                  std::make_tuple(OffloadDevice::kNvme, OffloadDevice::kCpu),
                                  std::make_tuple(OffloadDevice::kNone, OffloadDevice::kNvme),
                                  std::make_tuple(OffloadDevice::kNone, OffloadDevice::kCpu)}) {
    SCOPED_TRACE(std::string(OffloadDeviceName(param)) + "/" + std::string(OffloadDeviceName(optimizer)));
    Config c = config;
    TempDir d;
    SetTiers(c, param, optimizer, d);
    std::vector<StepResult> got_results;
    t.results = &got_results;
    const Outcome got = TrainModel(c, t);
    ExpectBitIdentical(got, want);
    ASSERT_EQ(got_results.size(), want_results.size());
    for (size_t i = 0; i < got_results.size(); ++i) {
      EXPECT_EQ(got_results[i].applied, want_results[i].applied) << "step " << i;
      EXPECT_EQ(std::memcmp(&got_results[i].grad_norm, &want_results[i].grad_norm, sizeof(double)), 0)
          << "step " << i << ": " << got_results[i].grad_norm << " vs " << want_results[i].grad_norm;
      EXPECT_EQ(got_results[i].loss_scale, want_results[i].loss_scale);
    }
    if (optimizer == OffloadDevice::kNvme) {
      // Written at least once in each of the 4 steps (in each micro-batch
      // when the window's buffers cannot hold the sub-groups between them),
      // 4 bytes per element each time; the 3 applied updates read it back
      // too, but for the sub-groups the window still holds.
      const int64_t elems = got.counters.gradient_nvme_bytes / 4;
      EXPECT_GE(elems, 4 * static_cast<int64_t>(got.master.size()));
    } else {
      EXPECT_EQ(got.counters.gradient_nvme_bytes, 0);
    }
  }
}

// A block that no micro-batch of a cycle reduced steps on a zero gradient
// (its moments still move it), not on what an earlier cycle left: the
// accumulator sets each block's first gradient of a cycle instead of being
// zeroed behind the update. The same with the optimizer on NVMe.
class EngineUnreducedTest : public ::testing::TestWithParam<OffloadDevice> {};

TEST_P(EngineUnreducedTest, ABlockWithoutGradientsStepsOnZeros) {
  TempDir dir;
  Config config = BaseConfig();
  config.gradient_accumulation_steps = 1;
  config.gradient_clipping = 0.5;
  SetTiers(config, OffloadDevice::kNone, GetParam(), dir);
  // Step 0 reduces every block; step 1 block 0 and, as `rest` says, the
  // others: none, zeros, or step 0's gradients again.
  enum class Rest { kNone, kZeros, kAgain };
  const std::vector<BlockSpec> blocks = kModel.Blocks();
  auto run = [&](Rest rest) {
    comm::LocalCommunicator local;
    EngineUnderTest e = MakeEngine(config, blocks, &local);
    if (!e.engine) return std::vector<float>{};
    SetInitialParameters(*e.engine, kModel);
    for (int step = 0; step < 2; ++step) {
      for (int b = kModel.num_blocks() - 1; b >= 0; --b) {
        if (step == 1 && b > 0 && rest == Rest::kNone) continue;
        std::vector<std::vector<float>> g;
        for (const TensorSpec& t : blocks[static_cast<size_t>(b)].tensors) {
          std::vector<float> v(static_cast<size_t>(t.numel()));
          const bool zeros = step == 1 && b > 0 && rest == Rest::kZeros;
          const int seed = step == 1 && b > 0 ? 0 : step;  // kAgain: step 0's values
          for (size_t i = 0; i < v.size(); ++i) {
            v[i] = zeros ? 0.0f : 0.01f * std::sin(0.3f * static_cast<float>(i) + static_cast<float>(b + 7 * seed));
          }
          g.push_back(std::move(v));
        }
        const Status s = e.engine->ReduceGradients(b, {g[0].data(), g[1].data()});
        EXPECT_TRUE(s.ok()) << s.ToString();
      }
      auto r = e.engine->Step();
      EXPECT_TRUE(r.ok()) << r.status().ToString();
    }
    return MasterWeights(*e.engine, kModel);
  };
  const std::vector<float> none = run(Rest::kNone), zeros = run(Rest::kZeros), again = run(Rest::kAgain);
  ASSERT_FALSE(none.empty());
  ASSERT_EQ(none.size(), zeros.size());
  EXPECT_EQ(std::memcmp(none.data(), zeros.data(), none.size() * 4), 0);
  EXPECT_NE(std::memcmp(none.data(), again.data(), none.size() * 4), 0);
}

INSTANTIATE_TEST_SUITE_P(Optimizer, EngineUnreducedTest,
                         ::testing::Values(OffloadDevice::kNone, OffloadDevice::kCpu, OffloadDevice::kNvme),
                         [](const auto& p) { return std::string(OffloadDeviceName(p.param)); });

TEST(EngineTest, TrainingLowersTheLoss) {
  TempDir dir;
  Config config = BaseConfig();
  SetTiers(config, OffloadDevice::kNvme, OffloadDevice::kNvme, dir);
  TrainOptions t;
  t.steps = 1;
  const float first = TrainModel(config, t).loss;
  t.steps = 12;
  const float last = TrainModel(config, t).loss;
  EXPECT_LT(last, 0.7f * first) << "first " << first << " last " << last;
}

TEST(EngineTest, AccumulatedMicroBatchesMatchOneLargeBatch) {
  // gradient_accumulation_steps 3 of 2 samples against 1 of 6: the same mean
  // gradient summed in another order, so within a tolerance (fp32 params,
  // Adam eps 1e-3 as in engine_mpi_test.cc, which explains it).
  TempDir dir;
  Config config = BaseConfig();
  config.optimizer.eps = 1e-3;
  SetTiers(config, OffloadDevice::kNvme, OffloadDevice::kNvme, dir);
  config.gradient_accumulation_steps = 3;
  const Outcome accumulated = TrainModel(config);
  config.gradient_accumulation_steps = 1;
  const Outcome one = TrainModel(config);
  ASSERT_EQ(accumulated.master.size(), one.master.size());
  ASSERT_FALSE(one.master.empty());
  for (size_t i = 0; i < one.master.size(); ++i) {
    ASSERT_NEAR(accumulated.master[i], one.master[i], 1e-5 * std::max(1.0f, std::fabs(one.master[i]))) << i;
  }
  EXPECT_NEAR(accumulated.loss, one.loss, 1e-5);
}

TEST(EngineTest, StagesOneAndTwoMatchStageThreeOnOneRank) {
  TempDir dir;
  Config config = BaseConfig();
  config.bf16.enabled = true;
  SetTiers(config, OffloadDevice::kNone, OffloadDevice::kCpu, dir);
  const Outcome three = TrainModel(config);
  config.zero.stage = 2;
  const Outcome two = TrainModel(config);
  ExpectBitIdentical(two, three);
  // Every block stays gathered between steps: one gather per block per step.
  EXPECT_EQ(two.counters.fetches, 3 * kModel.num_blocks());
}

TEST(EnginePrefetchTest, PrefetchStaysUnderMaxLiveAndChangesNothing) {
  TempDir dir;
  Config config = BaseConfig();
  config.bf16.enabled = true;
  SetTiers(config, OffloadDevice::kNvme, OffloadDevice::kNvme, dir);
  config.zero.offload_param.max_in_cpu = 1 << 20;
  const Outcome plain = TrainModel(config);
  // Padded blocks: 640, 1152, 1280, 512 elements; at most two live at once.
  config.zero.stage3_prefetch_bucket_size = 2500;
  config.zero.stage3_max_live_parameters = 2600;
  config.zero.stage3_max_reuse_distance = 0;  // keep only a block used again at once
  const Outcome fetched = TrainModel(config);
  ExpectBitIdentical(fetched, plain);
  const EngineCounters& c = fetched.counters;
  EXPECT_LE(c.peak_live_elems, 2600);
  EXPECT_EQ(c.live_limit_overruns, 0);
  EXPECT_GT(c.prefetches, 0);
  EXPECT_GT(c.prefetch_hits, 0);
  EXPECT_GT(c.resident_hits, 0);  // the last block: forward then at once backward
  EXPECT_EQ(c.order_changes, 0);
  EXPECT_EQ(plain.counters.prefetches, 0);
  EXPECT_GT(c.allgather_bytes, 0);
  EXPECT_GT(c.h2d_bytes, 0);
}

TEST(EnginePrefetchTest, MaxLiveBelowTwoBlocksStillRuns) {
  TempDir dir;
  Config config = BaseConfig();
  SetTiers(config, OffloadDevice::kCpu, OffloadDevice::kCpu, dir);
  const Outcome plain = TrainModel(config);
  config.zero.stage3_prefetch_bucket_size = 1 << 20;
  config.zero.stage3_max_live_parameters = 1300;  // the largest block alone
  const Outcome fetched = TrainModel(config);
  ExpectBitIdentical(fetched, plain);
  EXPECT_LE(fetched.counters.peak_live_elems, 1300);
  EXPECT_EQ(fetched.counters.live_limit_overruns, 0);
}

// DeepSpeed's defaults keep every block gathered (max_live and the reuse
// distance 1e9): under a device budget far below that window, kept and
// prefetched blocks give way to what the model needs (its gradient arrays
// too), and training is bit for bit the same.
TEST(EngineMemoryTest, KeptAndPrefetchedBlocksYieldToTheDeviceBudget) {
  for (OffloadDevice tier : {OffloadDevice::kCpu, OffloadDevice::kNvme}) {
    SCOPED_TRACE(std::string(OffloadDeviceName(tier)));
    TempDir dir;
    Config config = BaseConfig();
    config.bf16.enabled = true;
    SetTiers(config, tier, tier, dir);
    config.zero.stage3_prefetch_bucket_size = 50'000'000;
    config.zero.stage3_max_live_parameters = 1'000'000'000;
    config.zero.stage3_max_reuse_distance = 1'000'000'000;
    // Seven blocks (padded 896, 5 x 1152, 640 elements: 14.5 KiB in bf16
    // all gathered); the budget holds the fixed buffers, the largest block
    // and the model's fp32 gradient of it, and 1 KiB more.
    const TinyModel deep{{24, 32, 32, 32, 32, 32, 32, 16}};
    comm::LocalCommunicator local;
    EngineUnderTest free = MakeEngine(config, deep.Blocks(), &local);
    ASSERT_NE(free.engine, nullptr);
    Outcome plain;
    plain.loss = Train(*free.engine, deep, {}, static_cast<int>(config.gradient_accumulation_steps));
    plain.master = MasterWeights(*free.engine, deep);
    plain.counters = free.engine->counters();
    auto plan = MakeBufferPlan(config, deep.Blocks(), 1, DeviceKind::kHost, ElementType::kF32);
    ASSERT_TRUE(plan.ok()) << plan.status().ToString();
    const size_t budget =
        static_cast<size_t>(plan->device_fixed_bytes() + (1152 * 2 + 256) + (1024 * 4 + 256) + (32 * 4 + 256) + 1024);
    ASSERT_LT(budget, static_cast<size_t>(plan->device_fixed_bytes() + plan->device_gathered_bytes()));
    EngineUnderTest e = MakeEngine(config, deep.Blocks(), &local, budget);
    ASSERT_NE(e.engine, nullptr);
    Outcome capped;
    capped.loss = Train(*e.engine, deep, {}, static_cast<int>(config.gradient_accumulation_steps));
    capped.master = MasterWeights(*e.engine, deep);
    ExpectBitIdentical(capped, plain);
    const EngineCounters c = e.engine->counters();
    EXPECT_LT(c.peak_live_elems, plain.counters.peak_live_elems);  // the cache gave way
    EXPECT_GT(c.evictions, plain.counters.evictions);
    EXPECT_LE(e.device->bytes_in_use(), budget);
  }
}

// The engine of the Release-behind-a-stream tests: blocks 1 and 2 of the
// same size and other values, nothing prefetched or kept on release, the
// parameters set.
EngineUnderTest StreamReleaseEngine(const TempDir& dir, const TinyModel& model, comm::Communicator* local,
                                    int64_t max_live = 1'000'000'000) {
  Config config = BaseConfig();
  config.bf16.enabled = true;
  SetTiers(config, OffloadDevice::kCpu, OffloadDevice::kCpu, dir);
  config.zero.stage3_prefetch_bucket_size = 0;
  config.zero.stage3_max_reuse_distance = 0;
  config.zero.stage3_max_live_parameters = max_live;
  EngineUnderTest e = MakeEngine(config, model.Blocks(), local);
  if (e.engine) SetInitialParameters(*e.engine, model);
  return e;
}

const TinyModel kTwinBlocks{{24, 32, 32, 32}};  // blocks 1 and 2: 1152 elements padded

// Release behind a stream: the model's reads queued there still see the
// block after the engine has gathered another of the same size, which does
// not take its memory until they have run.
TEST(EngineMemoryTest, ReleaseBehindAStreamKeepsTheMemoryUntilItsReadsRan) {
  TempDir dir;
  comm::LocalCommunicator local;
  EngineUnderTest e = StreamReleaseEngine(dir, kTwinBlocks, &local);
  ASSERT_NE(e.engine, nullptr);
  if (!e.device->keeps_freed()) GTEST_SKIP() << "this device returns freed memory at once (an ASan build)";
  auto stream = e.device->CreateStream();
  ASSERT_TRUE(stream.ok()) << stream.status().ToString();
  test_support::StreamGate gate;
  auto first = e.engine->Acquire(1);
  ASSERT_TRUE(first.ok()) << first.status().ToString();
  const size_t bytes = static_cast<size_t>(kTwinBlocks.Blocks()[1].tensors[0].numel()) * 2;  // the bf16 weight
  const auto* weight = static_cast<const char*>((*first)[0]);
  const std::vector<char> seen(weight, weight + bytes);
  // The model's read of block 1, held at the gate until block 2 is gathered.
  bool intact = false;
  ASSERT_TRUE(gate.HoldOn(**stream).ok());
  ASSERT_TRUE((*stream)->LaunchHostFunc([&] { intact = std::memcmp(weight, seen.data(), bytes) == 0; }).ok());
  ASSERT_TRUE(e.engine->Release(1, stream->get()).ok());
  auto second = e.engine->Acquire(2);
  ASSERT_TRUE(second.ok()) << second.status().ToString();
  EXPECT_NE((*second)[0], (*first)[0]) << "block 2 was gathered into memory block 1's reads still use";
  ASSERT_TRUE(e.engine->Release(2).ok());
  gate.Open();
  ASSERT_TRUE((*stream)->Synchronize().ok());
  EXPECT_TRUE(intact);
}

// ReduceGradients behind a stream: the gradient is read only once the work
// queued there before it has run (here the copy that writes it, held at a
// gate that opens later), the call does not wait for that work, the work
// queued there after it (the next block's copy into the same buffers)
// runs only once the engine has copied the gradient out, and the training
// is bit for bit that of gradients handed in synchronously. fp32 and bf16
// gradients, through the staging window and the engine's stream, into the
// RAM accumulator and into the gradient window on NVMe. (Without that last
// wait the next copy races the engine's: it wins in some of the four cases
// in every run tried, and TSan sees the race whichever wins.) The same with
// the copies' event handed back (EngineAccess::ReduceGradients): the stream
// is made to wait for it by the caller, before the next block's copy. With
// one micro-batch a step, fp32 and the accumulator in RAM the copies go
// straight into it (no staging, no host pass): the step waits for them.
class EngineGradientStreamTest
    : public ::testing::TestWithParam<std::tuple<ElementType, OffloadDevice, int /*micro-batches a step*/>> {};

TEST_P(EngineGradientStreamTest, AGradientBehindAStreamIsReadOnceItsWorkRan) {
  const auto [grad_type, optimizer, gas] = GetParam();
  const int es = ElementSizeBytes(grad_type);
  TempDir dir;
  Config config = BaseConfig();
  config.gradient_accumulation_steps = gas;
  config.bf16.enabled = true;
  config.gradient_clipping = 0.5;
  SetTiers(config, OffloadDevice::kCpu, optimizer, dir);
  const std::vector<BlockSpec> blocks = kModel.Blocks();
  enum Mode { kSynchronous, kBehindStream, kEventHandedBack };
  auto run = [&](Mode mode) {
    const bool behind_stream = mode != kSynchronous;
    std::shared_ptr<Event> copied;
    comm::LocalCommunicator local;
    EngineUnderTest e = MakeEngine(config, blocks, &local, 0, grad_type);
    if (!e.engine) return std::vector<float>{};
    SetInitialParameters(*e.engine, kModel);
    auto stream = e.device->CreateStream();
    EXPECT_TRUE(stream.ok());
    if (!stream.ok()) return std::vector<float>{};
    // One device buffer per tensor (weight, bias) for every block, as
    // large as the largest block's.
    std::vector<void*> set;
    for (size_t t = 0; t < 2; ++t) {
      int64_t n = 0;
      for (const BlockSpec& b : blocks) n = std::max(n, b.tensors[t].numel());
      auto p = e.device->Allocate(static_cast<size_t>(n * es));
      EXPECT_TRUE(p.ok());
      set.push_back(p.ok() ? *p : nullptr);
    }
    std::vector<std::vector<char>> host;  // the values, kept until their copies ran
    // Each block's copies wait at a gate that opens 20 ms later, when the
    // next call (which reads the gradient) has started; the first one's
    // opens later still, and that first call must return before it does.
    std::vector<std::unique_ptr<test_support::StreamGate>> gates;
    int turn = 0;
    for (int micro = 0; micro < 4; ++micro) {
      for (int b = kModel.num_blocks() - 1; b >= 0; --b, ++turn) {
        std::vector<const void*> grads;
        test_support::StreamGate& gate = *gates.emplace_back(std::make_unique<test_support::StreamGate>());
        if (behind_stream) {
          EXPECT_TRUE(gate.HoldOn(**stream).ok());
          gate.OpenAfter(std::chrono::milliseconds(turn == 0 ? 200 : 20));
        }
        if (copied) {
          EXPECT_TRUE(e.device->WaitOn(stream->get(), *std::exchange(copied, nullptr)).ok());
        }
        for (size_t t = 0; t < blocks[static_cast<size_t>(b)].tensors.size(); ++t) {
          const int64_t n = blocks[static_cast<size_t>(b)].tensors[t].numel();
          std::vector<char>& v = host.emplace_back(static_cast<size_t>(n * es));
          for (int64_t i = 0; i < n; ++i) {
            const float x = 0.02f * std::sin(0.37f * static_cast<float>(i) + static_cast<float>(b + 5 * micro + t));
            if (grad_type == ElementType::kF32) {
              std::memcpy(v.data() + i * 4, &x, 4);
            } else {
              const uint16_t h = FloatToBf16(x);
              std::memcpy(v.data() + i * 2, &h, 2);
            }
          }
          if (behind_stream) {
            EXPECT_TRUE((*stream)->CopyAsync(set[t], v.data(), v.size(), CopyDirection::kHostToDevice).ok());
          } else {
            std::memcpy(set[t], v.data(), v.size());
          }
          grads.push_back(set[t]);
        }
        const Status s = mode == kEventHandedBack
                             ? EngineAccess::ReduceGradients(*e.engine, b, grads, stream->get(), &copied)
                             : e.engine->ReduceGradients(b, grads, behind_stream ? stream->get() : nullptr);
        EXPECT_TRUE(s.ok()) << s.ToString();
        EXPECT_EQ(copied != nullptr, mode == kEventHandedBack);
        if (behind_stream && turn == 0) {
          EXPECT_FALSE(gate.opened()) << "ReduceGradients waited for the stream";
        }
      }
      auto r = e.engine->Step();
      EXPECT_TRUE(r.ok()) << r.status().ToString();
    }
    EXPECT_TRUE((*stream)->Synchronize().ok());
    for (void* p : set) e.device->Free(p);
    return MasterWeights(*e.engine, kModel);
  };
  const std::vector<float> sync = run(kSynchronous);
  ASSERT_FALSE(sync.empty());
  for (Mode mode : {kBehindStream, kEventHandedBack}) {
    SCOPED_TRACE(mode == kBehindStream ? "behind a stream" : "the copies' event handed back");
    const std::vector<float> behind = run(mode);
    ASSERT_EQ(sync.size(), behind.size());
    EXPECT_EQ(std::memcmp(sync.data(), behind.data(), sync.size() * 4), 0);
  }
}

INSTANTIATE_TEST_SUITE_P(GradTypes, EngineGradientStreamTest,
                         ::testing::Combine(::testing::Values(ElementType::kF32, ElementType::kBf16),
                                            ::testing::Values(OffloadDevice::kCpu, OffloadDevice::kNvme),
                                            ::testing::Values(2)),
                         [](const auto& p) {
                           return std::string(ElementTypeName(std::get<0>(p.param))) + "_optim_" +
                                  std::string(OffloadDeviceName(std::get<1>(p.param)));
                         });
INSTANTIATE_TEST_SUITE_P(OneMicroBatch, EngineGradientStreamTest,
                         ::testing::Values(std::tuple{ElementType::kF32, OffloadDevice::kCpu, 1},
                                           std::tuple{ElementType::kF32, OffloadDevice::kNvme, 1}),
                         [](const auto& p) {
                           return "f32_optim_" + std::string(OffloadDeviceName(std::get<1>(p.param)));
                         });

TEST(EngineMemoryTest, ReleaseBehindSomethingNotAStreamIsRefusedNamingTheBlock) {
  TempDir dir;
  comm::LocalCommunicator local;
  EngineUnderTest e = StreamReleaseEngine(dir, kTwinBlocks, &local);
  ASSERT_NE(e.engine, nullptr);
  ASSERT_TRUE(e.engine->Acquire(1).ok());
  int not_a_stream = 0;
  Status bad = e.engine->Release(1, &not_a_stream);
  EXPECT_EQ(bad.code(), StatusCode::kInvalidArgument);
  EXPECT_NE(bad.message().find(kTwinBlocks.Blocks()[1].name), std::string::npos) << bad.ToString();
  EXPECT_TRUE(e.engine->Release(1).ok()) << "the refused Release left the block acquired";
  // The same for a gradient handed in behind it.
  std::vector<float> w(static_cast<size_t>(kTwinBlocks.Blocks()[1].tensors[0].numel())), b(32);
  bad = e.engine->ReduceGradients(1, {w.data(), b.data()}, &not_a_stream);
  EXPECT_EQ(bad.code(), StatusCode::kInvalidArgument);
  EXPECT_NE(bad.message().find(kTwinBlocks.Blocks()[1].name), std::string::npos) << bad.ToString();
  // And with its copies' event handed back: a stream and a place for it are needed.
  std::shared_ptr<Event> copied;
  EXPECT_EQ(EngineAccess::ReduceGradients(*e.engine, 1, {w.data(), b.data()}, nullptr, &copied).code(),
            StatusCode::kInvalidArgument);
  auto stream = e.device->CreateStream();
  ASSERT_TRUE(stream.ok());
  EXPECT_EQ(EngineAccess::ReduceGradients(*e.engine, 1, {w.data(), b.data()}, stream->get(), nullptr).code(),
            StatusCode::kInvalidArgument);
}

// An evicted block whose reads are still queued counts against
// stage3_max_live_parameters: a demanded gather beyond it waits for them.
TEST(EngineMemoryTest, AnEvictedBlockStillBeingReadCountsAgainstMaxLive) {
  TempDir dir;
  comm::LocalCommunicator local;
  EngineUnderTest e = StreamReleaseEngine(dir, kTwinBlocks, &local, /*max_live=*/1152);
  ASSERT_NE(e.engine, nullptr);
  auto stream = e.device->CreateStream();
  ASSERT_TRUE(stream.ok()) << stream.status().ToString();
  test_support::StreamGate gate;
  ASSERT_TRUE(e.engine->Acquire(1).ok());
  ASSERT_TRUE(gate.HoldOn(**stream).ok());
  // Set first: a device that frees at once (ASan) waits in Release.
  gate.OpenAfter(std::chrono::milliseconds(50));
  ASSERT_TRUE(e.engine->Release(1, stream->get()).ok());
  auto second = e.engine->Acquire(2);
  ASSERT_TRUE(second.ok()) << second.status().ToString();
  EXPECT_TRUE(gate.opened()) << "block 2 was gathered while block 1's reads still held the live elements";
  EXPECT_EQ(e.engine->counters().live_limit_overruns, 0);
  EXPECT_TRUE(e.engine->Release(2).ok());
}

TEST(EngineMemoryTest, ABlockThatCannotFitNamesWhatItNeeds) {
  TempDir dir;
  Config config = BaseConfig();
  config.bf16.enabled = true;
  SetTiers(config, OffloadDevice::kCpu, OffloadDevice::kCpu, dir);
  auto plan = MakeBufferPlan(config, kModel.Blocks(), 1, DeviceKind::kHost, ElementType::kF32);
  ASSERT_TRUE(plan.ok());
  // Room for any one block (the largest: 1280 elements), not for blocks 0
  // and 1 (640 and 1152) at once.
  const size_t budget = static_cast<size_t>(plan->device_fixed_bytes() + 1280 * 2 + 256 + 256);
  comm::LocalCommunicator local;
  EngineUnderTest e = MakeEngine(config, kModel.Blocks(), &local, budget);
  ASSERT_NE(e.engine, nullptr);
  for (int b = 0; b < kModel.num_blocks(); ++b) {
    auto v = kModel.InitialValues(b);
    ASSERT_TRUE(e.engine->SetParameters(b, {v[0].data(), v[1].data()}).ok());
  }
  ASSERT_TRUE(e.engine->Acquire(0).ok());
  auto second = e.engine->Acquire(1);  // block 0 is held: nothing can give way
  ASSERT_FALSE(second.ok());
  EXPECT_EQ(second.status().code(), StatusCode::kOutOfMemory);
  EXPECT_NE(second.status().message().find("gathering block '" + kModel.Blocks()[1].name + "': it needs 2.25 KiB"),
            std::string::npos)
      << second.status().ToString();
  EXPECT_NE(second.status().message().find("--device-budget"), std::string::npos);
  ASSERT_TRUE(e.engine->Release(0).ok());
  auto again = e.engine->Acquire(1);  // released, block 0 gives way
  ASSERT_TRUE(again.ok()) << again.status().ToString();
  EXPECT_TRUE(e.engine->Release(1).ok());
}

// SetParameters from ranges: a fill's error comes back naming the block,
// which stays unset; a fill that succeeds sets what the arrays would.
TEST(EngineTest, SetParametersFromRangesPassesAFillsErrorOn) {
  TempDir dir;
  Config config = BaseConfig();
  SetTiers(config, OffloadDevice::kCpu, OffloadDevice::kCpu, dir);
  comm::LocalCommunicator local;
  EngineUnderTest e = MakeEngine(config, kModel.Blocks(), &local);
  ASSERT_NE(e.engine, nullptr);
  const Status failed = e.engine->SetParameters(
      0, [](size_t, int64_t, int64_t, float*) { return Status::Corruption("tensor 0: a bad checkpoint byte"); });
  EXPECT_EQ(failed.code(), StatusCode::kCorruption);
  EXPECT_NE(failed.message().find("initial values of block '" + kModel.Blocks()[0].name + "'"), std::string::npos)
      << failed.ToString();
  EXPECT_NE(failed.message().find("a bad checkpoint byte"), std::string::npos) << failed.ToString();
  for (int b = 1; b < kModel.num_blocks(); ++b) {
    auto v = kModel.InitialValues(b);
    ASSERT_TRUE(e.engine->SetParameters(b, {v[0].data(), v[1].data()}).ok());
  }
  auto unset = e.engine->Acquire(1);
  ASSERT_FALSE(unset.ok());
  EXPECT_NE(unset.status().message().find("SetParameters was not called"), std::string::npos)
      << unset.status().ToString();
  const std::vector<std::vector<float>> v = kModel.InitialValues(0);
  int64_t asked = 0;
  ASSERT_TRUE(e.engine
                  ->SetParameters(0,
                                  [&](size_t t, int64_t first, int64_t count, float* out) {
                                    asked += count;
                                    std::copy(v[t].begin() + first, v[t].begin() + first + count, out);
                                    return Status::Ok();
                                  })
                  .ok());
  EXPECT_EQ(asked, static_cast<int64_t>(v[0].size() + v[1].size()));  // one rank: every element, once
  auto got = e.engine->Acquire(0);
  ASSERT_TRUE(got.ok()) << got.status().ToString();
  for (size_t t = 0; t < v.size(); ++t) {
    EXPECT_EQ(std::memcmp((*got)[t], v[t].data(), v[t].size() * sizeof(float)), 0) << "tensor " << t;
  }
  EXPECT_TRUE(e.engine->Release(0).ok());
}

TEST(EnginePrefetchTest, ChangedAcquireOrderIsRecordedAgain) {
  TempDir dir;
  Config config = BaseConfig();
  config.bf16.enabled = true;
  SetTiers(config, OffloadDevice::kNvme, OffloadDevice::kCpu, dir);
  TrainOptions t;
  t.steps = 4;
  t.peek_step = 2;  // step 2 starts with an acquire of the last block
  const Outcome plain = TrainModel(config, t);
  config.zero.stage3_prefetch_bucket_size = 2500;
  config.zero.stage3_max_live_parameters = 2600;
  const Outcome fetched = TrainModel(config, t);
  ExpectBitIdentical(fetched, plain);
  // Step 2 diverges from the record; step 3 diverges from step 2's record
  // (no peek) and is recorded again.
  EXPECT_GE(fetched.counters.order_changes, 2);
  EXPECT_LE(fetched.counters.peak_live_elems, 2600);
  EXPECT_GT(fetched.counters.prefetch_hits, 0);
}

TEST(EngineTest, MisuseIsAnError) {
  TempDir dir;
  Config config = BaseConfig();
  SetTiers(config, OffloadDevice::kCpu, OffloadDevice::kCpu, dir);
  comm::LocalCommunicator local;
  EngineUnderTest e = MakeEngine(config, kModel.Blocks(), &local);
  ASSERT_NE(e.engine, nullptr);
  auto p = e.engine->Acquire(0);
  ASSERT_FALSE(p.ok());
  EXPECT_EQ(p.status().code(), StatusCode::kFailedPrecondition);
  EXPECT_NE(p.status().message().find("layer0"), std::string::npos) << p.status().message();
  for (int b = 0; b < kModel.num_blocks(); ++b) {
    auto v = kModel.InitialValues(b);
    ASSERT_TRUE(e.engine->SetParameters(b, {v[0].data(), v[1].data()}).ok());
  }
  EXPECT_EQ(e.engine->Release(0).code(), StatusCode::kFailedPrecondition);
  ASSERT_TRUE(e.engine->Acquire(1).ok());
  EXPECT_EQ(e.engine->Step().status().code(), StatusCode::kFailedPrecondition);
  EXPECT_TRUE(e.engine->Release(1).ok());
  EXPECT_EQ(e.engine->Acquire(99).status().code(), StatusCode::kInvalidArgument);
  EXPECT_TRUE(e.engine->Step().ok());

  config.zero.stage = 0;
  EXPECT_EQ(Engine::Create(config, kModel.Blocks(), {}).status().code(), StatusCode::kInvalidArgument);
  config.zero.stage = 3;
  EXPECT_EQ(Engine::Create(config, {}, {}).status().code(), StatusCode::kInvalidArgument);
}

// Train 2 steps and checkpoint; a new engine (other swap files, other tiers
// for the optimizer state) loads it and trains 2 more: bit for bit what 4
// uninterrupted steps give, fp16 loss-scaler and LR schedule included. The
// parameters' home (the first tier) is rewritten from the loaded master
// weights, through the new-parameter ring.
class EngineCheckpointTest : public ::testing::TestWithParam<std::tuple<OffloadDevice, OffloadDevice, OffloadDevice>> {
};

TEST_P(EngineCheckpointTest, ResumeEqualsUninterruptedTraining) {
  const auto [param_tier, save_tier, load_tier] = GetParam();
  TempDir dir;
  Config config = BaseConfig();
  config.fp16.enabled = true;
  config.fp16.initial_scale_power = 12;
  config.scheduler.type = SchedulerType::kWarmupLR;
  config.scheduler.warmup_num_steps = 3;
  config.scheduler.warmup_max_lr = 1e-2;
  SetTiers(config, param_tier, save_tier, dir);
  TrainOptions all;
  all.steps = 4;
  const Outcome want = TrainModel(config, all);

  const std::string ckpt = dir.Sub("ckpt") + "/step-2";
  ASSERT_NO_FATAL_FAILURE(TrainAndSave(config, 2, ckpt, {{"trainer.step", "2"}}));
  comm::LocalCommunicator local;
  Config other = config;
  TempDir dir2;
  SetTiers(other, param_tier, load_tier, dir2);
  EngineUnderTest e = MakeEngine(other, kModel.Blocks(), &local);
  ASSERT_NE(e.engine, nullptr);
  auto md = e.engine->LoadCheckpoint(ckpt);
  ASSERT_TRUE(md.ok()) << md.status().ToString();
  EXPECT_EQ(md->at("trainer.step"), "2");
  EXPECT_EQ(md->count("engine.applied_steps"), 0u);  // the engine's own keys stay inside
  EXPECT_EQ(e.engine->optimizer_steps(), 2);
  ExpectBitIdentical(ContinueTraining(*e.engine, 2, 2, config), want);
}

INSTANTIATE_TEST_SUITE_P(
    Tiers, EngineCheckpointTest,
    ::testing::Values(std::make_tuple(OffloadDevice::kNvme, OffloadDevice::kNvme, OffloadDevice::kNvme),
                      std::make_tuple(OffloadDevice::kNvme, OffloadDevice::kNvme, OffloadDevice::kCpu),
                      std::make_tuple(OffloadDevice::kNvme, OffloadDevice::kCpu, OffloadDevice::kNvme),
                      std::make_tuple(OffloadDevice::kNone, OffloadDevice::kNvme, OffloadDevice::kCpu),
                      std::make_tuple(OffloadDevice::kNone, OffloadDevice::kCpu, OffloadDevice::kNvme)),
    [](const auto& p) {
      return "param_" + std::string(OffloadDeviceName(std::get<0>(p.param))) + "_saved_" +
             std::string(OffloadDeviceName(std::get<1>(p.param))) + "_loaded_" +
             std::string(OffloadDeviceName(std::get<2>(p.param)));
    });

// The optimizer update runs after Step returned. When it fails part-way,
// the blocks whose sub-groups it stepped can still be fetched, the others
// cannot, and the error reaches WaitForUpdate and stays: ReduceGradients
// (through Step), Step and SaveCheckpoint refuse, so no step trains on a mix
// of old and new parameters. The saved state, loaded into a new engine,
// goes on as if nothing had happened.
TEST(EngineTest, FailedUpdateIsStickyAndOnlySteppedBlocksCanBeFetched) {
  TempDir dir;
  Config config = BaseConfig();
  SetTiers(config, OffloadDevice::kCpu, OffloadDevice::kNvme, dir);
  // Shards of 640, 1152, 1280 and 512 elements; sub-groups of 700. With
  // torn writes, sub-group 0's write-back fails and is noticed when its
  // buffers are reused for sub-group 3's read: after sub-groups 0 and 1
  // (1400 elements: block 0, not block 1) are stepped.
  config.zero.sub_group_size = 700;
  TrainOptions all;
  all.steps = 3;
  const Outcome want = TrainModel(config, all);

  aio::IoEngineOptions inner;
  inner.direct_io = aio::DirectIo::kPrefer;
  aio::FaultOptions f;
  f.seed = 5;
  f.torn_write_rate = 1.0;
  f.path_filter = dir.Sub("optim0") + "/";
  auto faulty = aio::FaultyEngine::Create(inner, f);
  ASSERT_TRUE(faulty.ok()) << faulty.status().ToString();
  (*faulty)->injector().set_enabled(false);

  comm::LocalCommunicator local;
  auto device = CreateHostDevice(0);
  EngineHooks hooks;
  hooks.device = device.get();
  hooks.host_communicator = &local;
  hooks.io_engine = faulty->get();
  EngineOptions o;
  o.hooks = &hooks;
  o.optimizer_threads = 1;
  o.run_id = "zero3-sticky";
  auto engine = Engine::Create(config, kModel.Blocks(), o);
  ASSERT_TRUE(engine.ok()) << engine.status().ToString();
  Engine& e = **engine;
  TrainOptions first;
  first.steps = 1;
  Train(e, kModel, first, static_cast<int>(config.gradient_accumulation_steps));
  const std::string ckpt = dir.Sub("ckpt") + "/step-1";
  ASSERT_TRUE(MakeDirectories(dir.Sub("ckpt")).ok());
  ASSERT_TRUE(e.SaveCheckpoint(ckpt, {}).ok());

  // Step 2's update writes the optimizer state to the failing file (its
  // gradient, in the same file, is written before the faults begin).
  TrainOptions second = first;
  second.first_step = 1;
  second.set_parameters = false;
  second.before_boundary_step = [&] {
    EXPECT_TRUE(e.WaitForUpdate().ok());
    (*faulty)->injector().set_enabled(true);
  };
  Train(e, kModel, second, static_cast<int>(config.gradient_accumulation_steps));
  auto stepped = e.Acquire(0);
  ASSERT_TRUE(stepped.ok()) << stepped.status().ToString();
  ASSERT_TRUE(e.Release(0).ok());
  auto not_stepped = e.Acquire(1);
  ASSERT_FALSE(not_stepped.ok()) << "a block the failed update did not reach was fetched";
  EXPECT_NE(not_stepped.status().message().find("optim0/"), std::string::npos) << not_stepped.status().ToString();
  (*faulty)->injector().set_enabled(false);
  Status failed = e.WaitForUpdate();
  ASSERT_FALSE(failed.ok());
  EXPECT_EQ(failed.code(), not_stepped.status().code()) << failed.ToString();
  EXPECT_EQ(e.WaitForUpdate().code(), failed.code());
  EXPECT_FALSE(e.Acquire(1).ok());
  EXPECT_FALSE(e.Step().ok());
  EXPECT_FALSE(e.SaveCheckpoint(dir.Sub("ckpt") + "/step-2", {}).ok());

  // The failed update's I/O error leaves the optimizer's swap store failed
  // too, so the checkpoint goes into a new engine.
  TempDir dir2;
  Config other = config;
  SetTiers(other, OffloadDevice::kCpu, OffloadDevice::kNvme, dir2);
  EngineUnderTest resumed = MakeEngine(other, kModel.Blocks(), &local);
  ASSERT_NE(resumed.engine, nullptr);
  ASSERT_TRUE(resumed.engine->LoadCheckpoint(ckpt).ok());
  ExpectBitIdentical(ContinueTraining(*resumed.engine, 1, 2, config), want);
}

// Trains one step and saves it, runs `then` on the engine (more training),
// loads the checkpoint, and expects two more steps from it to equal an
// uninterrupted three-step run, bit for bit.
void ExpectResumeFromStep1After(const Config& config, const TempDir& dir, const std::function<void(Engine&)>& then) {
  TrainOptions all;
  all.steps = 3;
  const Outcome want = TrainModel(config, all);

  comm::LocalCommunicator local;
  EngineUnderTest e = MakeEngine(config, kModel.Blocks(), &local);
  ASSERT_NE(e.engine, nullptr);
  TrainOptions first;
  first.steps = 1;
  Train(*e.engine, kModel, first, static_cast<int>(config.gradient_accumulation_steps));
  const std::string ckpt = dir.Sub("ckpt") + "/step-1";
  ASSERT_TRUE(MakeDirectories(dir.Sub("ckpt")).ok());
  ASSERT_TRUE(e.engine->SaveCheckpoint(ckpt, {}).ok());
  then(*e.engine);
  auto md = e.engine->LoadCheckpoint(ckpt);
  ASSERT_TRUE(md.ok()) << md.status().ToString();
  EXPECT_EQ(e.engine->optimizer_steps(), 1);
  ExpectBitIdentical(ContinueTraining(*e.engine, 1, 2, config), want);
}

// LoadCheckpoint while the last step's update is still running abandons the
// update: the checkpoint's state is what trains on, bit for bit.
TEST(EngineTest, LoadCheckpointDuringAnUpdateAbandonsIt) {
  TempDir dir;
  Config config = BaseConfig();
  SetTiers(config, OffloadDevice::kNvme, OffloadDevice::kNvme, dir);
  ExpectResumeFromStep1After(config, dir, [&](Engine& engine) {
    TrainOptions second;
    second.first_step = 1;
    second.steps = 1;
    second.set_parameters = false;
    Train(engine, kModel, second, static_cast<int>(config.gradient_accumulation_steps));
    // Step 2's update may still run here.
  });
}

// In the last micro-batch before a step the engine reads the first
// sub-groups' optimizer state ahead (PrefetchStep). A step skipped for an
// overflow leaves those reads in flight; a checkpoint loaded then replaces
// the state they read, so they are dropped, not used by the next step.
TEST(EngineTest, LoadCheckpointDropsTheOptimizerStateReadAhead) {
  TempDir dir;
  Config config = BaseConfig();
  config.fp16.enabled = true;
  config.fp16.initial_scale_power = 12;
  SetTiers(config, OffloadDevice::kNvme, OffloadDevice::kNvme, dir);
  ExpectResumeFromStep1After(config, dir, [&](Engine& engine) {
    // Step 1 changes the state; step 2 overflows and is skipped with step
    // 3's read-ahead (of step 1's result) in flight.
    TrainOptions more;
    more.first_step = 1;
    more.steps = 2;
    more.inf_step = 2;
    more.set_parameters = false;
    std::vector<StepResult> results;
    more.results = &results;
    Train(engine, kModel, more, static_cast<int>(config.gradient_accumulation_steps));
    ASSERT_EQ(results.size(), 2u);
    EXPECT_TRUE(results[0].applied);
    EXPECT_FALSE(results[1].applied);
  });
}

TEST(EngineTest, CheckpointRefusesAnotherLayoutAndMidAccumulation) {
  TempDir dir;
  Config config = BaseConfig();
  SetTiers(config, OffloadDevice::kCpu, OffloadDevice::kCpu, dir);
  comm::LocalCommunicator local;
  EngineUnderTest e = MakeEngine(config, kModel.Blocks(), &local);
  ASSERT_NE(e.engine, nullptr);
  TrainOptions one;
  one.steps = 1;
  Train(*e.engine, kModel, one, static_cast<int>(config.gradient_accumulation_steps));
  ASSERT_TRUE(MakeDirectories(dir.Sub("ckpt")).ok());
  const std::string ckpt = dir.Sub("ckpt") + "/a";
  ASSERT_TRUE(e.engine->SaveCheckpoint(ckpt, {}).ok());
  EXPECT_EQ(e.engine->SaveCheckpoint(dir.Sub("ckpt") + "/b", {{"engine.x", "1"}}).code(), StatusCode::kInvalidArgument);

  // One micro-batch of two: gradients pending.
  auto p = e.engine->Acquire(0);
  ASSERT_TRUE(p.ok());
  ASSERT_TRUE(e.engine->Release(0).ok());
  ASSERT_TRUE(e.engine->Step().ok());
  Status mid = e.engine->SaveCheckpoint(dir.Sub("ckpt") + "/c", {});
  EXPECT_EQ(mid.code(), StatusCode::kFailedPrecondition);
  EXPECT_NE(mid.message().find("accumulation"), std::string::npos) << mid.message();

  // Gradients handed in but not yet stepped: not in a checkpoint, so refused.
  ASSERT_TRUE(e.engine->Step().ok());  // completes the accumulation cycle
  {
    const std::vector<BlockSpec> blocks = kModel.Blocks();
    const BlockSpec& spec = blocks[0];
    const int64_t n = spec.numel();
    auto g = e.device->Allocate(static_cast<size_t>(n) * 4);  // gradients are device memory
    ASSERT_TRUE(g.ok());
    std::memset(*g, 0, static_cast<size_t>(n) * 4);  // the host device's memory is host memory
    std::vector<const void*> grads;
    int64_t off = 0;
    for (const auto& t : spec.tensors) {
      grads.push_back(static_cast<const float*>(*g) + off);
      off += t.numel();
    }
    Status rg = e.engine->ReduceGradients(0, grads);
    ASSERT_TRUE(rg.ok()) << rg.ToString();
    EXPECT_EQ(e.engine->SaveCheckpoint(dir.Sub("ckpt") + "/d", {}).code(), StatusCode::kFailedPrecondition);
    e.device->Free(*g);
  }

  // Another model: refused, naming what differs; nothing loaded.
  const TinyModel other{{13, 37, 29, 41, 12}};
  EngineUnderTest f = MakeEngine(config, other.Blocks(), &local);
  ASSERT_NE(f.engine, nullptr);
  auto md = f.engine->LoadCheckpoint(ckpt);
  ASSERT_FALSE(md.ok());
  EXPECT_EQ(md.status().code(), StatusCode::kFailedPrecondition);
  EXPECT_NE(md.status().message().find("engine.layout_crc32c"), std::string::npos) << md.status().message();

  // Another sub-group size: refused with the config key to fix.
  Config sub = config;
  sub.zero.sub_group_size = 200;
  EngineUnderTest g = MakeEngine(sub, kModel.Blocks(), &local);
  ASSERT_NE(g.engine, nullptr);
  md = g.engine->LoadCheckpoint(ckpt);
  ASSERT_FALSE(md.ok());
  EXPECT_NE(md.status().message().find("sub_group_size"), std::string::npos) << md.status().message();
}

}  // namespace
}  // namespace zinf::zero3::testing
