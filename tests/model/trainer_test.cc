// The Trainer end to end: the tiny GPT through the ZeRO-3 engine on the host
// device and real files. Training lowers the loss, offloaded tiers give the
// resident run's loss curve exactly, a resumed run continues the same curve,
// exported weights are the master weights, and a device budget below the
// training state is enough.
#include "model/trainer.h"

#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <cstring>
#include <functional>
#include <span>

#include "core/fs.h"
#include "core/half.h"
#include "device/device.h"
#include "model/data.h"
#include "model/hf_checkpoint.h"
#include "model/model_test_util.h"
#include "model/safetensors.h"

namespace zinf::model {
namespace {

using swap::testing::TempDir;
using testing::StepLosses;

Config TinyConfig(const TempDir& dir, OffloadDevice param, OffloadDevice optimizer) {
  return testing::TinyTrainingConfig(dir.path(), param, optimizer, /*micro_batch=*/8);
}

using testing::TrainerRun;

TrainerRun MakeTrainer(const Config& config, size_t budget_bytes = 0, const std::string& model = "tiny",
                       LayerActivations activations = LayerActivations::kRecompute, int64_t fetch_unit = 0) {
  return testing::MakeTrainerOn(CreateHostDevice(budget_bytes), config, model, "trainer-test", [&](TrainerOptions& o) {
    o.activations = activations;
    o.fetch_unit = fetch_unit;
  });
}

// 50 steps of the tiny model on the built-in corpus: the held-out loss falls
// from about ln(257) = 5.55 (uniform) by at least 40%.
TEST(TrainerTest, FiftyStepsLowerTheLoss) {
  TempDir dir;
  TrainerRun r = MakeTrainer(TinyConfig(dir, OffloadDevice::kNvme, OffloadDevice::kNvme));
  ASSERT_NE(r.trainer, nullptr);
  auto before = r.trainer->Evaluate(4);
  ASSERT_TRUE(before.ok()) << before.status().ToString();
  EXPECT_NEAR(*before, std::log(257.0), 0.3);
  const std::vector<double> losses = StepLosses(*r.trainer, 50);
  ASSERT_EQ(losses.size(), 50u);
  auto after = r.trainer->Evaluate(4);
  ASSERT_TRUE(after.ok()) << after.status().ToString();
  EXPECT_LT(*after, 0.6 * *before) << "eval loss " << *before << " -> " << *after;
  EXPECT_LT(losses.back(), 0.6 * losses.front());
}

// The engine's tiers are bit-identical, so the whole loss curve is too.
TEST(TrainerTest, OffloadedAndResidentGiveTheSameLossCurve) {
  TempDir dir;
  TrainerRun resident = MakeTrainer(TinyConfig(dir, OffloadDevice::kNone, OffloadDevice::kNone));
  TrainerRun nvme = MakeTrainer(TinyConfig(dir, OffloadDevice::kNvme, OffloadDevice::kNvme));
  TrainerRun cpu = MakeTrainer(TinyConfig(dir, OffloadDevice::kCpu, OffloadDevice::kCpu));
  ASSERT_NE(resident.trainer, nullptr);
  ASSERT_NE(nvme.trainer, nullptr);
  ASSERT_NE(cpu.trainer, nullptr);
  const std::vector<double> want = StepLosses(*resident.trainer, 8);
  EXPECT_EQ(StepLosses(*nvme.trainer, 8), want);
  EXPECT_EQ(StepLosses(*cpu.trainer, 8), want);
  EXPECT_GT(nvme.trainer->engine().counters().nvme_read_bytes, 0);
  EXPECT_GT(nvme.trainer->engine().counters().optimizer_nvme_bytes, 0);
}

// Activations kept from the forward are the ones the recompute makes, so
// the loss curve and the weights do not move: NVMe tiers, layers whole and
// in pieces, gradient accumulation over two micro-batches.
TEST(TrainerTest, KeptActivationsGiveTheRecomputedLossCurve) {
  TempDir dir;
  Config resident = TinyConfig(dir, OffloadDevice::kNone, OffloadDevice::kNone);
  Config nvme = TinyConfig(dir, OffloadDevice::kNvme, OffloadDevice::kNvme);
  for (Config* c : {&resident, &nvme}) c->gradient_accumulation_steps = 2;
  TrainerRun want = MakeTrainer(resident);
  ASSERT_NE(want.trainer, nullptr);
  EXPECT_EQ(want.trainer->activations(), LayerActivations::kRecompute);
  const std::vector<double> losses = StepLosses(*want.trainer, 5);
  for (int64_t fetch_unit : {int64_t{0}, int64_t{6000}}) {
    SCOPED_TRACE("fetch unit " + std::to_string(fetch_unit));
    TrainerRun kept = MakeTrainer(nvme, 0, "tiny", LayerActivations::kKeep, fetch_unit);
    ASSERT_NE(kept.trainer, nullptr);
    EXPECT_EQ(kept.trainer->activations(), LayerActivations::kKeep);
    EXPECT_EQ(kept.trainer->layout().split(), fetch_unit > 0);
    EXPECT_EQ(StepLosses(*kept.trainer, 5), losses);
    const std::string a = dir.Sub("want.safetensors"), b = dir.Sub("kept.safetensors");
    ASSERT_TRUE(want.trainer->ExportSafetensors(a, "F32").ok());
    ASSERT_TRUE(kept.trainer->ExportSafetensors(b, "F32").ok());
    const std::string wa = testing::ReadBytes(a), wb = testing::ReadBytes(b);
    EXPECT_GT(wa.size(), 0u);
    EXPECT_TRUE(wa == wb) << "the exported fp32 weights differ";
  }
}

// Layer inputs in pinned host memory (--activations offload, the config's
// cpu_checkpointing): the recompute's losses and weights bit for bit with
// L + 1 - 3 layer inputs fewer on the device; under a budget one byte below
// what the recompute holds once created, the recompute is refused with an
// error that points at the offload, and the offload trains.
TEST(TrainerTest, OffloadedLayerInputsTrainWhereTheRecomputeDoesNotFit) {
  TempDir dir;
  Config config = TinyConfig(dir, OffloadDevice::kNvme, OffloadDevice::kNvme);
  config.gradient_accumulation_steps = 2;
  int trainers = 0;  // each its own swap folders: they live side by side
  auto make = [&](LayerActivations a, size_t budget) {
    Config c = config;
    const std::string root = dir.Sub("run-" + std::to_string(trainers++));
    c.zero.offload_param.nvme_paths = {root + "/param"};
    c.zero.offload_optimizer.nvme_paths = {root + "/optim"};
    return testing::MakeTrainerOn(CreateHostDevice(budget), c, "tiny", "trainer-test", [&](TrainerOptions& o) {
      o.model.n_layer = 8;
      o.model.seq_len = 64;
      o.activations = a;
    });
  };
  TrainerRun want = make(LayerActivations::kRecompute, 0);
  ASSERT_NE(want.trainer, nullptr);
  const size_t recompute_bytes = want.device->bytes_in_use();
  const std::vector<double> losses = StepLosses(*want.trainer, 2);
  TrainerRun offload = make(LayerActivations::kOffload, 0);
  ASSERT_NE(offload.trainer, nullptr);
  EXPECT_EQ(offload.trainer->activations(), LayerActivations::kOffload);
  const int64_t x_bytes = int64_t{8} * 64 * 32 * 4;  // micro-batch x seq_len x n_embd, fp32
  EXPECT_EQ(static_cast<int64_t>(recompute_bytes - offload.device->bytes_in_use()), (9 - 3) * x_bytes);
  EXPECT_EQ(want.trainer->activation_bytes() - offload.trainer->activation_bytes(), (9 - 3) * x_bytes);
  EXPECT_EQ(want.trainer->host_activation_bytes(), 0);
  EXPECT_GE(offload.trainer->host_activation_bytes(), 9 * x_bytes);
  EXPECT_EQ(StepLosses(*offload.trainer, 2), losses);
  const std::string a = dir.Sub("want.safetensors"), b = dir.Sub("offload.safetensors");
  ASSERT_TRUE(want.trainer->ExportSafetensors(a, "F32").ok());
  const Status exported = offload.trainer->ExportSafetensors(b, "F32");
  ASSERT_TRUE(exported.ok()) << exported.ToString();
  EXPECT_TRUE(testing::ReadBytes(a) == testing::ReadBytes(b)) << "the exported fp32 weights differ";

  TrainerOptions o;
  o.model = *LoadGptConfig("tiny");
  o.model.n_layer = 8;
  o.model.seq_len = 64;
  o.corpus_bytes = 256 << 10;
  o.engine.optimizer_threads = 1;
  o.engine.run_id = "trainer-test";
  auto small = CreateHostDevice(recompute_bytes - 1);
  o.hooks.device = small.get();
  auto refused = Trainer::Create(config, o);
  ASSERT_FALSE(refused.ok());
  EXPECT_EQ(refused.status().code(), StatusCode::kOutOfMemory);
  EXPECT_NE(refused.status().message().find("--activations offload"), std::string::npos) << refused.status().ToString();
  TrainerRun fits = make(LayerActivations::kOffload, recompute_bytes - 1);
  ASSERT_NE(fits.trainer, nullptr);
  EXPECT_EQ(StepLosses(*fits.trainer, 2), losses);
  EXPECT_LT(fits.device->bytes_in_use(), recompute_bytes);
}

// Train 6 steps with a checkpoint after 3; a new trainer resumed from the
// save dir runs steps 4..6 with exactly the same losses.
TEST(TrainerTest, ResumeContinuesTheIdenticalLossCurve) {
  TempDir dir;
  const Config config = TinyConfig(dir, OffloadDevice::kNvme, OffloadDevice::kNvme);
  std::vector<double> want;
  {
    TrainerRun r = MakeTrainer(config);
    ASSERT_NE(r.trainer, nullptr);
    want = StepLosses(*r.trainer, 3);
    auto saved = r.trainer->Save(dir.Sub("ckpt"));
    ASSERT_TRUE(saved.ok()) << saved.status().ToString();
    EXPECT_EQ(*saved, dir.Sub("ckpt") + "/rank-0/step-00000003");
    for (double l : StepLosses(*r.trainer, 3)) want.push_back(l);
  }
  TrainerRun r = MakeTrainer(config);
  ASSERT_NE(r.trainer, nullptr);
  Status s = r.trainer->Resume(dir.Sub("ckpt"));
  ASSERT_TRUE(s.ok()) << s.ToString();
  EXPECT_EQ(r.trainer->step(), 3);
  const std::vector<double> got = StepLosses(*r.trainer, 3);
  EXPECT_EQ(got, std::vector<double>(want.begin() + 3, want.end()));
}

// Saving after every step with keep 2 leaves the two newest step
// directories; the latest resumes; a bad keep is refused before saving.
TEST(TrainerTest, SaveKeepsTheNewestCheckpoints) {
  TempDir dir;
  const Config config = TinyConfig(dir, OffloadDevice::kCpu, OffloadDevice::kCpu);
  const std::string save_dir = dir.Sub("ckpt");
  std::vector<double> want;
  {
    TrainerRun r = MakeTrainer(config);
    ASSERT_NE(r.trainer, nullptr);
    EXPECT_EQ(r.trainer->Save(save_dir, -1).status().code(), StatusCode::kInvalidArgument);
    for (int step = 1; step <= 4; ++step) {
      StepLosses(*r.trainer, 1);
      auto saved = r.trainer->Save(save_dir, 2);
      ASSERT_TRUE(saved.ok()) << saved.status().ToString();
    }
    want = StepLosses(*r.trainer, 2);
  }
  auto entries = ListDirectory(save_dir + "/rank-0");
  ASSERT_TRUE(entries.ok()) << entries.status().ToString();
  std::sort(entries->begin(), entries->end());
  EXPECT_EQ(*entries, (std::vector<std::string>{"latest", "step-00000003", "step-00000004"}));
  {
    TrainerRun r = MakeTrainer(config);
    ASSERT_NE(r.trainer, nullptr);
    ASSERT_TRUE(r.trainer->Resume(save_dir).ok());
    EXPECT_EQ(r.trainer->step(), 4);
    EXPECT_EQ(StepLosses(*r.trainer, 2), want);
  }
  // Four checkpoints kept, then a run resumed from the older step 2 saves
  // there again (replacing it: latest named step 4) with keep 2: steps 1
  // and 2 are the newest two up to the save; the abandoned run's steps 3
  // and 4 are later, neither counted nor removed.
  const std::string all_dir = dir.Sub("all");
  {
    TrainerRun r = MakeTrainer(config);
    ASSERT_NE(r.trainer, nullptr);
    for (int step = 1; step <= 4; ++step) {
      StepLosses(*r.trainer, 1);
      ASSERT_TRUE(r.trainer->Save(all_dir).ok());
    }
  }
  TrainerRun r = MakeTrainer(config);
  ASSERT_NE(r.trainer, nullptr);
  ASSERT_TRUE(r.trainer->Resume(all_dir + "/rank-0/step-00000002").ok());
  ASSERT_EQ(r.trainer->step(), 2);
  auto again = r.trainer->Save(all_dir, 2);
  ASSERT_TRUE(again.ok()) << again.status().ToString();
  entries = ListDirectory(all_dir + "/rank-0");
  ASSERT_TRUE(entries.ok());
  std::sort(entries->begin(), entries->end());
  EXPECT_EQ(*entries,
            (std::vector<std::string>{"latest", "step-00000001", "step-00000002", "step-00000003", "step-00000004"}));
}

TEST(TrainerTest, ResumeRefusesAnotherModelOrData) {
  TempDir dir;
  const Config config = TinyConfig(dir, OffloadDevice::kCpu, OffloadDevice::kCpu);
  {
    TrainerRun r = MakeTrainer(config);
    ASSERT_NE(r.trainer, nullptr);
    StepLosses(*r.trainer, 1);
    ASSERT_TRUE(r.trainer->Save(dir.Sub("ckpt")).ok());
  }
  // Same shapes, other data.
  auto device = CreateHostDevice(0);
  TrainerOptions o;
  o.model = *LoadGptConfig("tiny");
  o.corpus_bytes = 128 << 10;
  o.hooks.device = device.get();
  o.engine.optimizer_threads = 1;
  auto t = Trainer::Create(config, o);
  ASSERT_TRUE(t.ok()) << t.status().ToString();
  Status s = (*t)->Resume(dir.Sub("ckpt"));
  EXPECT_EQ(s.code(), StatusCode::kFailedPrecondition) << s.ToString();
  EXPECT_NE(s.message().find("trainer.data"), std::string::npos) << s.message();
  // Refused before anything was loaded: the engine is untouched.
  EXPECT_EQ((*t)->engine().optimizer_steps(), 0);
  EXPECT_EQ((*t)->step(), 0);

  // Nothing there.
  TrainerRun fresh = MakeTrainer(config);
  ASSERT_NE(fresh.trainer, nullptr);
  s = fresh.trainer->Resume(dir.Sub("nothing"));
  EXPECT_EQ(s.code(), StatusCode::kNotFound) << s.ToString();
}

// The export holds the master weights (rounded to bf16), GPT-2 names, no
// vocabulary padding rows, and the model config.
TEST(TrainerTest, ExportWritesTheMasterWeightsAsSafetensors) {
  TempDir dir;
  TrainerRun r = MakeTrainer(TinyConfig(dir, OffloadDevice::kCpu, OffloadDevice::kCpu));
  ASSERT_NE(r.trainer, nullptr);
  StepLosses(*r.trainer, 2);
  const std::string path = dir.Sub("model.safetensors");
  Status s = r.trainer->ExportSafetensors(path, "BF16");
  ASSERT_TRUE(s.ok()) << s.ToString();
  auto file = ReadSafetensors(path);
  ASSERT_TRUE(file.ok()) << file.status().ToString();
  const GptConfig& m = r.trainer->model();
  EXPECT_EQ(file->tensors.size(), 2u + 12u * static_cast<size_t>(m.n_layer) + 2u);  // tied: no lm_head
  const auto* wte = file->Find("wte");
  ASSERT_NE(wte, nullptr);
  EXPECT_EQ(wte->shape, (std::vector<int64_t>{m.vocab_size, m.n_embd}));
  EXPECT_EQ(wte->dtype, "BF16");
  ASSERT_NE(file->Find("h.1.mlp.c_proj.weight"), nullptr);
  EXPECT_EQ(file->Find("h.1.mlp.c_proj.weight")->shape, (std::vector<int64_t>{m.n_embd, 4 * m.n_embd}));
  EXPECT_EQ(file->metadata.at("zinf.model"), GptConfigToJson(m));

  const BlockSpec& layer0 = r.trainer->engine().block(LayerBlock(0));
  std::vector<std::vector<float>> master(layer0.tensors.size());
  std::vector<float*> out;
  for (size_t t = 0; t < master.size(); ++t) {
    master[t].resize(static_cast<size_t>(layer0.tensors[t].numel()));
    out.push_back(master[t].data());
  }
  ASSERT_TRUE(r.trainer->engine().GetMasterParameters(LayerBlock(0), out).ok());
  const auto* qkv = file->Find("h.0.attn.c_attn.weight");
  ASSERT_NE(qkv, nullptr);
  ASSERT_EQ(qkv->data.size(), master[kQkvW].size() * 2);
  for (size_t i = 0; i < master[kQkvW].size(); ++i) {
    uint16_t h;
    std::memcpy(&h, qkv->data.data() + 2 * i, 2);
    ASSERT_EQ(h, FloatToBf16(master[kQkvW][i])) << i;
  }
}

// The "demo" model's training state (16-bit params + fp32 master, m, v,
// grad: 18 bytes per parameter) is more than 3x a host-device budget that
// still trains it with parameters and optimizer state on NVMe.
TEST(TrainerTest, TrainsUnderADeviceBudgetBelowATHirdOfTheState) {
  TempDir dir;
  auto model = LoadGptConfig("demo");
  ASSERT_TRUE(model.ok());
  const int64_t state = model->NumParameters() * 18;
  Config config = TinyConfig(dir, OffloadDevice::kNvme, OffloadDevice::kNvme);
  config.train_micro_batch_size_per_gpu = 4;
  config.zero.sub_group_size = 1 << 20;
  config.zero.stage3_prefetch_bucket_size = 1 << 20;
  config.zero.stage3_max_live_parameters = 2 << 20;
  config.zero.offload_param.buffer_size = 1 << 20;
  const size_t budget = static_cast<size_t>(state / 3);
  TrainerRun r = MakeTrainer(config, budget, "demo");
  ASSERT_NE(r.trainer, nullptr);
  const std::vector<double> losses = StepLosses(*r.trainer, 3);
  ASSERT_EQ(losses.size(), 3u);
  EXPECT_LE(r.device->bytes_in_use(), budget);
  EXPECT_GT(r.trainer->engine().counters().nvme_read_bytes, 0);
}

// A budget below the model's own working set (activations and the fp32
// scratch of its largest block) is an out-of-memory error that itemizes it
// and names a budget that holds it; that budget trains.
TEST(TrainerTest, ABudgetBelowTheWorkingSetSaysWhatWouldFit) {
  TempDir dir;
  Config config = TinyConfig(dir, OffloadDevice::kNvme, OffloadDevice::kNvme);
  config.zero.offload_param.buffer_size = 1 << 20;
  TrainerOptions o;
  auto model = LoadGptConfig("demo");
  ASSERT_TRUE(model.ok());
  o.model = *model;
  o.corpus_bytes = 256 << 10;
  o.engine.optimizer_threads = 1;
  o.engine.run_id = "trainer-test";
  auto small = CreateHostDevice(2 << 20);
  o.hooks.device = small.get();
  auto t = Trainer::Create(config, o);
  ASSERT_FALSE(t.ok());
  EXPECT_EQ(t.status().code(), StatusCode::kOutOfMemory);
  const std::string msg(t.status().message());
  EXPECT_NE(msg.find("model's working set"), std::string::npos) << msg;
  EXPECT_NE(msg.find("micro-batch " + std::to_string(config.train_micro_batch_size_per_gpu)), std::string::npos) << msg;
  const std::string key = "raise --device-budget to more than ";
  const size_t at = msg.find(key);
  ASSERT_NE(at, std::string::npos) << msg;
  // "286.10 MiB": FormatBytes' form.
  std::istringstream in(msg.substr(at + key.size()));
  double number = 0;
  std::string unit;
  in >> number >> unit;
  ASSERT_EQ(unit.substr(0, 3), "MiB") << msg;
  auto enough = CreateHostDevice(static_cast<size_t>(number * (1 << 20)) + (4 << 20));
  o.hooks.device = enough.get();
  auto u = Trainer::Create(config, o);
  ASSERT_TRUE(u.ok()) << u.status().ToString();
  EXPECT_EQ(StepLosses(**u, 1).size(), 1u);
}

TEST(TrainerTest, Fp16WithTheLossScalerTrains) {
  TempDir dir;
  Config config = TinyConfig(dir, OffloadDevice::kCpu, OffloadDevice::kCpu);
  config.bf16.enabled = false;
  config.fp16.enabled = true;
  config.fp16.initial_scale_power = 16;
  TrainerRun r = MakeTrainer(config);
  ASSERT_NE(r.trainer, nullptr);
  const std::vector<double> losses = StepLosses(*r.trainer, 30);
  ASSERT_EQ(losses.size(), 30u);
  EXPECT_LT(losses.back(), 0.8 * losses.front());
}

// The reported gradient norm is of the true gradient whatever the loss
// scale: fp16 and bf16 runs agree on step 1 up to their rounding.
TEST(TrainerTest, GradNormIsUnscaled) {
  TempDir dir;
  Config bf16 = TinyConfig(dir, OffloadDevice::kCpu, OffloadDevice::kCpu);
  Config fp16 = bf16;
  fp16.bf16.enabled = false;
  fp16.fp16.enabled = true;
  fp16.fp16.initial_scale_power = 16;
  TrainerRun a = MakeTrainer(bf16);
  TrainerRun b = MakeTrainer(fp16);
  ASSERT_NE(a.trainer, nullptr);
  ASSERT_NE(b.trainer, nullptr);
  auto ra = a.trainer->Step();
  auto rb = b.trainer->Step();
  ASSERT_TRUE(ra.ok() && rb.ok());
  EXPECT_NEAR(rb->grad_norm, ra->grad_norm, 0.05 * ra->grad_norm);
}

// An evaluation between steps neither records its walk as the training
// order nor costs the next step its prefetching.
TEST(TrainerTest, EvaluationLeavesThePrefetchOrderAlone) {
  TempDir dir;
  TrainerRun r = MakeTrainer(TinyConfig(dir, OffloadDevice::kNvme, OffloadDevice::kNvme));
  ASSERT_NE(r.trainer, nullptr);
  StepLosses(*r.trainer, 3);
  auto plain = r.trainer->Step();
  ASSERT_TRUE(plain.ok());
  const EngineCounters before = r.trainer->engine().counters();
  ASSERT_TRUE(r.trainer->Evaluate(2).ok());
  auto step = r.trainer->Step();
  ASSERT_TRUE(step.ok()) << step.status().ToString();
  EXPECT_EQ(r.trainer->engine().counters().order_changes, before.order_changes);
  // Blocks fetched on demand (not prefetched, not still gathered): no more
  // than in a step without the evaluation.
  EXPECT_LE(step->engine.fetches - step->engine.prefetches, plain->engine.fetches - plain->engine.prefetches);
}

TEST(TrainerTest, BadTokenFileIsRefusedNamingTheFile) {
  TempDir dir;
  const std::string path = dir.Sub("tokens.bin");
  std::vector<uint32_t> tokens(5000, 7);
  tokens[1234] = 300;  // beyond the byte vocabulary
  ASSERT_TRUE(WriteTokenFile(path, tokens).ok());
  auto device = CreateHostDevice(0);
  TrainerOptions o;
  o.model = *LoadGptConfig("tiny");
  o.data_path = path;
  o.hooks.device = device.get();
  auto t = Trainer::Create(TinyConfig(dir, OffloadDevice::kCpu, OffloadDevice::kCpu), o);
  ASSERT_FALSE(t.ok());
  EXPECT_NE(t.status().message().find("tokens.bin"), std::string::npos) << t.status().message();
  EXPECT_NE(t.status().message().find("1234"), std::string::npos) << t.status().message();
}

// ---------------------------------------------------------------------------
// Data order, held-out tokens and in-order evaluation

// A trainer whose options `tweak` adjusts (the tiny model, host device).
TrainerRun MakeTrainerWith(const Config& config, const std::function<void(TrainerOptions&)>& tweak) {
  TrainerRun r;
  r.device = CreateHostDevice(0);
  TrainerOptions o;
  o.model = *LoadGptConfig("tiny");
  o.corpus_bytes = 256 << 10;
  o.hooks.device = r.device.get();
  o.engine.optimizer_threads = 1;
  o.engine.run_id = "trainer-test";
  tweak(o);
  auto t = Trainer::Create(config, o);
  EXPECT_TRUE(t.ok()) << t.status().ToString();
  if (t.ok()) r.trainer = std::move(t).value();
  return r;
}

// Sequential order over a corpus of four micro-batches (no held-out
// tokens): six steps wrap into the second epoch; a run resumed after step 3
// gives the uninterrupted run's losses bit for bit.
TEST(TrainerTest, SequentialOrderResumesBitIdenticallyAcrossTheWrap) {
  TempDir dir;
  const Config config = TinyConfig(dir, OffloadDevice::kNvme, OffloadDevice::kNvme);  // micro-batch 8 x T 32
  auto tweak = [](TrainerOptions& o) {
    o.data_order = DataOrder::kSequential;
    o.eval_fraction = 0.0;
    o.corpus_bytes = 4 * 8 * 32 + 40;  // 4 batches and a little (the "\n\n" pairs shorten it)
  };
  std::vector<double> want;
  {
    TrainerRun r = MakeTrainerWith(config, tweak);
    ASSERT_NE(r.trainer, nullptr);
    want = StepLosses(*r.trainer, 3);
    ASSERT_TRUE(r.trainer->Save(dir.Sub("ckpt")).ok());
    for (double l : StepLosses(*r.trainer, 3)) want.push_back(l);
  }
  // The epoch is four batches: step 5 sees step 1's batch again (with
  // trained weights, so a lower loss, not the same one).
  EXPECT_LT(want[4], want[0]);
  TrainerRun r = MakeTrainerWith(config, tweak);
  ASSERT_NE(r.trainer, nullptr);
  Status s = r.trainer->Resume(dir.Sub("ckpt"));
  ASSERT_TRUE(s.ok()) << s.ToString();
  EXPECT_EQ(StepLosses(*r.trainer, 3), std::vector<double>(want.begin() + 3, want.end()));

  // The checkpoint records the order: a shuffled run may not resume it.
  TrainerRun other = MakeTrainerWith(config, [&](TrainerOptions& o) {
    tweak(o);
    o.data_order = DataOrder::kShuffled;
  });
  ASSERT_NE(other.trainer, nullptr);
  s = other.trainer->Resume(dir.Sub("ckpt"));
  EXPECT_EQ(s.code(), StatusCode::kFailedPrecondition) << s.ToString();
  EXPECT_NE(s.message().find("trainer.data_order was sequential"), std::string::npos) << s.message();
  // Nor one holding other tokens out.
  TrainerRun held = MakeTrainerWith(config, [&](TrainerOptions& o) {
    tweak(o);
    o.eval_fraction = 0.01;
  });
  ASSERT_NE(held.trainer, nullptr);
  s = held.trainer->Resume(dir.Sub("ckpt"));
  EXPECT_NE(s.message().find("trainer.train_tokens"), std::string::npos) << s.ToString();
}

// A token file's identity in a checkpoint is its tokens', not its width:
// the same tokens as a uint16 file and as a uint32 one resume each other
// (the uint32 file read in place, its CRC over the tokens as uint16).
TEST(TrainerTest, TheSameTokensInEitherWidthResume) {
  TempDir dir;
  const Config config = TinyConfig(dir, OffloadDevice::kCpu, OffloadDevice::kCpu);
  const std::vector<uint32_t> corpus = BuiltinCorpusTokens(32 << 10, 5);
  ASSERT_TRUE(WriteTokenFile(dir.Sub("t16.bin"), corpus, TokenFileFormat::kUint16).ok());
  ASSERT_TRUE(WriteTokenFile(dir.Sub("t32.bin"), corpus, TokenFileFormat::kUint32).ok());
  auto with = [&](const std::string& file) { return [&, file](TrainerOptions& o) { o.data_path = dir.Sub(file); }; };
  {
    TrainerRun r = MakeTrainerWith(config, with("t16.bin"));
    ASSERT_NE(r.trainer, nullptr);
    StepLosses(*r.trainer, 2);
    ASSERT_TRUE(r.trainer->Save(dir.Sub("ckpt")).ok());
  }
  TrainerRun r = MakeTrainerWith(config, with("t32.bin"));
  ASSERT_NE(r.trainer, nullptr);
  const Status s = r.trainer->Resume(dir.Sub("ckpt"));
  EXPECT_TRUE(s.ok()) << s.ToString();
  EXPECT_EQ(r.trainer->step(), 2);
}

TEST(TrainerTest, HoldoutZeroTrainsOnEveryTokenAndDoesNotEvaluate) {
  TempDir dir;
  const Config config = TinyConfig(dir, OffloadDevice::kCpu, OffloadDevice::kCpu);
  TrainerRun none = MakeTrainerWith(config, [](TrainerOptions& o) { o.eval_fraction = 0.0; });
  ASSERT_NE(none.trainer, nullptr);
  EXPECT_EQ(none.trainer->num_train_tokens(), static_cast<int64_t>(BuiltinCorpusTokens(256 << 10, 1234).size()));
  EXPECT_FALSE(none.trainer->can_evaluate());
  EXPECT_EQ(none.trainer->Evaluate(1).status().code(), StatusCode::kFailedPrecondition);
  TrainerRun tenth = MakeTrainerWith(config, [](TrainerOptions& o) { o.eval_fraction = 0.1; });
  ASSERT_NE(tenth.trainer, nullptr);
  EXPECT_TRUE(tenth.trainer->can_evaluate());
  EXPECT_NEAR(static_cast<double>(tenth.trainer->num_train_tokens()),
              0.9 * static_cast<double>(none.trainer->num_train_tokens()), 1.0);
}

// llm.c's windows: batch k is tokens [k*B*T, (k+1)*B*T + 1), so two windows
// share one token, and a tail shorter than a window is not scored. The
// mean over a file of two windows is the mean of each window's file alone.
TEST(TrainerTest, EvaluateInOrderScoresOverlappingWindowsInFileOrder) {
  TempDir dir;
  const Config config = TinyConfig(dir, OffloadDevice::kCpu, OffloadDevice::kCpu);
  const size_t bt = 8 * 32;
  const std::vector<uint32_t> corpus = BuiltinCorpusTokens(8 << 10, 3);
  auto eval = [&](size_t begin, size_t count) -> Trainer::InOrderEval {
    const std::string path = dir.Sub("t" + std::to_string(begin) + "_" + std::to_string(count) + ".bin");
    EXPECT_TRUE(WriteTokenFile(path, std::span<const uint32_t>(corpus.data() + begin, count)).ok());
    TrainerRun r = MakeTrainerWith(config, [&](TrainerOptions& o) {
      o.data_path = path;
      o.eval_fraction = 0.0;
    });
    EXPECT_NE(r.trainer, nullptr);
    if (r.trainer == nullptr) return {};
    auto e = r.trainer->EvaluateInOrder();
    EXPECT_TRUE(e.ok()) << e.status().ToString();
    return e.ok() ? *e : Trainer::InOrderEval{};
  };
  const Trainer::InOrderEval first = eval(0, bt + 1), second = eval(bt, bt + 1), both = eval(0, 2 * bt + 1 + 5);
  EXPECT_EQ(both.windows, 2);
  EXPECT_EQ(both.tokens, static_cast<int64_t>(2 * bt));
  EXPECT_EQ(first.windows, 1);
  EXPECT_GT(first.loss, 0.0);
  EXPECT_NE(first.loss, second.loss);
  EXPECT_EQ(both.loss, (first.loss + second.loss) / 2);
}

// A checkpoint's weights load into a trainer on other data (LoadWeights),
// and an F32 export of the same weights gives the identical evaluation;
// Resume would refuse the other data.
TEST(TrainerTest, LoadWeightsAndInitFromSafetensorsGiveTheSameWeights) {
  TempDir dir;
  const Config config = TinyConfig(dir, OffloadDevice::kCpu, OffloadDevice::kCpu);
  {
    TrainerRun r = MakeTrainer(config);
    ASSERT_NE(r.trainer, nullptr);
    StepLosses(*r.trainer, 3);
    ASSERT_TRUE(r.trainer->Save(dir.Sub("ckpt")).ok());
    ASSERT_TRUE(r.trainer->ExportSafetensors(dir.Sub("w.safetensors"), "F32").ok());
  }
  const std::string data = dir.Sub("other.bin");
  ASSERT_TRUE(WriteTokenFile(data, BuiltinCorpusTokens(16 << 10, 77)).ok());
  auto other_data = [&](TrainerOptions& o) {
    o.data_path = data;
    o.eval_fraction = 0.0;
    o.seed = 5;
  };
  TrainerRun a = MakeTrainerWith(config, other_data);
  ASSERT_NE(a.trainer, nullptr);
  Status s = a.trainer->LoadWeights(dir.Sub("ckpt"));
  ASSERT_TRUE(s.ok()) << s.ToString();
  EXPECT_EQ(a.trainer->step(), 0);
  TrainerRun b = MakeTrainerWith(config, other_data);
  ASSERT_NE(b.trainer, nullptr);
  s = b.trainer->InitFromSafetensors(dir.Sub("w.safetensors"));
  ASSERT_TRUE(s.ok()) << s.ToString();
  TrainerRun fresh = MakeTrainerWith(config, other_data);
  ASSERT_NE(fresh.trainer, nullptr);
  auto ea = a.trainer->EvaluateInOrder(), eb = b.trainer->EvaluateInOrder(), ef = fresh.trainer->EvaluateInOrder();
  ASSERT_TRUE(ea.ok() && eb.ok() && ef.ok());
  EXPECT_EQ(ea->loss, eb->loss);
  EXPECT_NE(ea->loss, ef->loss);  // the seeded initial weights are others

  TrainerRun c = MakeTrainerWith(config, other_data);
  ASSERT_NE(c.trainer, nullptr);
  EXPECT_EQ(c.trainer->Resume(dir.Sub("ckpt")).code(), StatusCode::kFailedPrecondition);
}

// `zinf eval`'s trainer (engine.forward_only) loads a training run's
// checkpoint whatever its sub-groups, optimizer tier and weight decay, and
// evaluates bit for bit as a training trainer does on the same weights; it
// keeps no gradient scratch, and refuses Step, Resume, Save and the exports
// (which read master weights it does not hold) before touching a file.
TEST(TrainerTest, AForwardOnlyTrainerEvaluatesAsATrainingOne) {
  TempDir dir;
  Config saving = TinyConfig(dir, OffloadDevice::kCpu, OffloadDevice::kNvme);
  saving.zero.sub_group_size = 7000;
  {
    TrainerRun r = MakeTrainerWith(saving, [](TrainerOptions& o) { o.weight_decay_on = WeightDecayOn::kAll; });
    ASSERT_NE(r.trainer, nullptr);
    StepLosses(*r.trainer, 2);
    ASSERT_TRUE(r.trainer->Save(dir.Sub("ckpt")).ok());
  }
  const std::string data = dir.Sub("other.bin");
  ASSERT_TRUE(WriteTokenFile(data, BuiltinCorpusTokens(8 << 10, 77)).ok());
  struct Evaluated {
    double loss = 0.0;
    int64_t device_bytes = 0;  // after Create: the engine's home and the trainer's scratch
  };
  auto evaluate = [&](const Config& config, bool forward_only) -> Evaluated {
    TrainerRun r = MakeTrainerWith(config, [&](TrainerOptions& o) {
      o.data_path = data;
      o.eval_fraction = 0.0;
      o.weight_decay_on = forward_only ? WeightDecayOn::kMatrices : WeightDecayOn::kAll;
      o.engine.forward_only = forward_only;
    });
    EXPECT_NE(r.trainer, nullptr);
    if (r.trainer == nullptr) return {};
    Evaluated out;
    out.device_bytes = static_cast<int64_t>(r.device->bytes_in_use());
    Status s = r.trainer->LoadWeights(dir.Sub("ckpt"));
    EXPECT_TRUE(s.ok()) << s.ToString();
    auto e = r.trainer->EvaluateInOrder();
    EXPECT_TRUE(e.ok()) << e.status().ToString();
    if (e.ok()) out.loss = e->loss;
    if (forward_only) {
      EXPECT_EQ(r.trainer->Step().status().code(), StatusCode::kFailedPrecondition);
      EXPECT_EQ(r.trainer->Resume(dir.Sub("ckpt")).code(), StatusCode::kFailedPrecondition);
      s = r.trainer->ExportSafetensors(dir.Sub("w.safetensors"), "F32");
      EXPECT_NE(s.message().find("ExportSafetensors on a forward-only trainer"), std::string::npos) << s.ToString();
      EXPECT_EQ(r.trainer->Save(dir.Sub("saved")).status().code(), StatusCode::kFailedPrecondition);
      EXPECT_EQ(r.trainer->ExportHfFolder(dir.Sub("hf"), "F32", nullptr).code(), StatusCode::kFailedPrecondition);
      EXPECT_FALSE(PathExists(dir.Sub("saved")) || PathExists(dir.Sub("hf")) || PathExists(dir.Sub("w.safetensors")));
    }
    return out;
  };
  const Evaluated want = evaluate(saving, false);
  EXPECT_GT(want.loss, 0.0);
  for (OffloadDevice param : {OffloadDevice::kNone, OffloadDevice::kCpu, OffloadDevice::kNvme}) {
    SCOPED_TRACE(OffloadDeviceName(param));
    TempDir tiers;
    Config c = TinyConfig(tiers, param, OffloadDevice::kCpu);
    c.zero.sub_group_size = 1'000'000'000;
    const Evaluated got = evaluate(c, true);
    EXPECT_EQ(got.loss, want.loss);
    // The same home (cpu) without the gradient scratch: less device memory.
    if (param == OffloadDevice::kCpu) {
      EXPECT_LT(got.device_bytes, want.device_bytes);
    }
  }
}

// An untied Llama-family head whose vocabulary is not a multiple of 64
// (the llama fixture: 200 rows, padded to 256) round-trips through the
// one-file export: its lm_head is written and read without the padding rows.
// So do the experts, and dense layers among them under their own names
// (qwen3_moe-dense: 100 rows).
void UntiedHeadRoundTrips(const char* fixture);
TEST(TrainerTest, UntiedLlamaHeadRoundTripsThroughTheOneFileExport) {
  for (const char* fixture : {"llama", "qwen3_moe-dense", "glm4_moe"}) {
    SCOPED_TRACE(fixture);
    UntiedHeadRoundTrips(fixture);
  }
}

void UntiedHeadRoundTrips(const char* fixture) {
  TempDir dir;
  const Config config = TinyConfig(dir, OffloadDevice::kCpu, OffloadDevice::kCpu);
  auto source = ResolveModel(testing::FixtureDir(fixture), 0);
  ASSERT_TRUE(source.ok()) << source.status().ToString();
  ASSERT_FALSE(source->model.tied_embeddings);
  ASSERT_NE(source->model.vocab_size % 64, 0);
  std::vector<uint32_t> tokens(4096);
  for (size_t i = 0; i < tokens.size(); ++i) {
    tokens[i] = static_cast<uint32_t>((i * 37) % static_cast<size_t>(source->model.vocab_size));
  }
  ASSERT_TRUE(WriteTokenFile(dir.Sub("t.bin"), tokens).ok());
  auto with = [&](TrainerOptions& o) {
    o.model = source->model;
    o.data_path = dir.Sub("t.bin");
    o.eval_fraction = 0.0;
  };
  TrainerRun a = MakeTrainerWith(config, [&](TrainerOptions& o) {
    with(o);
    o.initial_weights = source->InitialWeights();
  });
  ASSERT_NE(a.trainer, nullptr);
  ASSERT_TRUE(a.trainer->ExportSafetensors(dir.Sub("w.safetensors"), "F32").ok());
  TrainerRun b = MakeTrainerWith(config, with);
  ASSERT_NE(b.trainer, nullptr);
  const Status s = b.trainer->InitFromSafetensors(dir.Sub("w.safetensors"));
  ASSERT_TRUE(s.ok()) << s.ToString();
  auto ea = a.trainer->EvaluateInOrder(), eb = b.trainer->EvaluateInOrder();
  ASSERT_TRUE(ea.ok() && eb.ok());
  EXPECT_EQ(ea->loss, eb->loss);
}

// A router's selection bias (GLM-4.5's e_score_correction_bias, a buffer
// in transformers; ERNIE 4.5's, an untrained parameter there, stored as a
// row [1, E]) is frozen: after AdamW steps that decay every tensor, with
// the optimizer on NVMe, it keeps its bits while the router's weight moves.
void FrozenSelectionBiasKeepsItsBits(const char* fixture, const std::string& stored_bias);
TEST(TrainerTest, FrozenSelectionBiasKeepsItsBits) {
  FrozenSelectionBiasKeepsItsBits("glm4_moe", "model.layers.1.mlp.gate.e_score_correction_bias");
  FrozenSelectionBiasKeepsItsBits("ernie4_5_moe", "model.layers.1.mlp.moe_statics.e_score_correction_bias");
}

void FrozenSelectionBiasKeepsItsBits(const char* fixture, const std::string& stored_bias) {
  SCOPED_TRACE(fixture);
  TempDir dir;
  Config config = TinyConfig(dir, OffloadDevice::kNvme, OffloadDevice::kNvme);
  config.optimizer.weight_decay = 0.1;
  auto source = ResolveModel(testing::FixtureDir(fixture), 0);
  ASSERT_TRUE(source.ok()) << source.status().ToString();
  std::vector<uint32_t> tokens(4096);
  for (size_t i = 0; i < tokens.size(); ++i) tokens[i] = static_cast<uint32_t>((i * 37 + i / 7) % 100);
  ASSERT_TRUE(WriteTokenFile(dir.Sub("t.bin"), tokens).ok());
  TrainerRun r = MakeTrainerWith(config, [&](TrainerOptions& o) {
    o.model = source->model;
    o.data_path = dir.Sub("t.bin");
    o.eval_fraction = 0.0;
    o.weight_decay_on = WeightDecayOn::kAll;
    o.initial_weights = source->InitialWeights();
  });
  ASSERT_NE(r.trainer, nullptr);
  StepLosses(*r.trainer, 3);
  ASSERT_TRUE(r.trainer->ExportSafetensors(dir.Sub("w.safetensors"), "F32").ok());
  auto trained = ReadSafetensors(dir.Sub("w.safetensors"));
  auto stored = ReadSafetensors(testing::FixtureDir(fixture) + "/model.safetensors");
  ASSERT_TRUE(trained.ok() && stored.ok());
  // zinf's one-file export names the bias as GLM-4.5's checkpoints do.
  for (const auto& [name, stored_name] :
       {std::pair<std::string, std::string>{"model.layers.1.mlp.gate.e_score_correction_bias", stored_bias},
        {"model.layers.2.mlp.gate.weight", "model.layers.2.mlp.gate.weight"}}) {
    const auto* a = trained->Find(name);
    const auto* b = stored->Find(stored_name);
    ASSERT_TRUE(a != nullptr && b != nullptr) << name;
    const bool bias = name.ends_with("bias");
    EXPECT_EQ(a->data == b->data, bias) << name << (bias ? " changed" : " did not train");
  }
}

TEST(TrainerTest, InitFromSafetensorsNamesAMismatchedTensor) {
  TempDir dir;
  const Config config = TinyConfig(dir, OffloadDevice::kCpu, OffloadDevice::kCpu);
  {
    TrainerRun r = MakeTrainer(config);
    ASSERT_NE(r.trainer, nullptr);
    ASSERT_TRUE(r.trainer->ExportSafetensors(dir.Sub("w.safetensors"), "BF16").ok());
  }
  TrainerRun r = MakeTrainerWith(config, [](TrainerOptions& o) { o.model.n_embd = 64; });
  ASSERT_NE(r.trainer, nullptr);
  Status s = r.trainer->InitFromSafetensors(dir.Sub("w.safetensors"));
  EXPECT_EQ(s.code(), StatusCode::kInvalidArgument) << s.ToString();
  EXPECT_NE(s.message().find("tensor wte has shape [257, 32], this model expects [257, 64]"), std::string::npos)
      << s.ToString();
  EXPECT_EQ(r.trainer->InitFromSafetensors(dir.Sub("none.safetensors")).code(), StatusCode::kNotFound);
}

}  // namespace
}  // namespace zinf::model
