// The Trainer with the host device's kernels queued on one of its streams
// (TrainerOptions::host_stream): the path a GPU takes, where each block is
// released and its gradients reduced behind the model's stream and the host
// does not wait for the kernels, gives the synchronous run's losses, held-out
// loss and weights bit for bit: every tier, layers whole and in pieces,
// activations recomputed, kept and recomputed from layer inputs offloaded
// to the host (copied on a stream of their own), gradient accumulation, the
// layers' gradients in two buffers by turns (the default with no budget) or
// one, one micro-batch a step (the gradients copied straight into the
// accumulator). Under ThreadSanitizer (make test-tsan runs this test) a wait missing
// between the stream's kernels and the engine's copies is a reported race;
// here it changes bits (mutations tried: a Release or a ReduceGradients not
// behind the stream, one gradient buffer rewritten without waiting for its
// copy). A second test: wall_clock_breakdown's timed kernels.
#include <gtest/gtest.h>

#include <string>
#include <vector>

#include "device/device.h"
#include "model/model_test_util.h"
#include "model/trainer.h"

namespace zinf::model {
namespace {

using swap::testing::TempDir;
using testing::StepLosses;
using testing::TrainerRun;

// The demo model: its kernels take long enough for a missing wait to change
// bits. Under a sanitizer, the tiny one: ThreadSanitizer reports the race
// itself, AddressSanitizer is there for memory freed under queued work
// (the plain build checks the bits), and both run the kernels far slower
// (the demo model's eight runs took over 900 s under ASan on a 2-core Zen 4
// VM, CI's per-test limit).
#if defined(__has_feature)
#if __has_feature(thread_sanitizer) || __has_feature(address_sanitizer)
#define ZINF_TEST_UNDER_SANITIZER 1
#endif
#endif
#if defined(__SANITIZE_THREAD__) || defined(__SANITIZE_ADDRESS__) || defined(ZINF_TEST_UNDER_SANITIZER)
constexpr char kModel[] = "tiny";
#else
constexpr char kModel[] = "demo";
#endif

constexpr int kMicroBatch = 4;

struct Variant {
  std::string name;
  OffloadDevice param, optimizer;
  LayerActivations activations = LayerActivations::kRecompute;
  bool pieces = false;   // layers fetched in pieces of a third
  int n_layer = 0;       // 0: the model's
  int grad_buffers = 0;  // TrainerOptions::grad_buffers (0: two, queued on a host stream with no budget)
  int grad_accum = 2;    // micro-batches a step (1: each gradient copied straight into the accumulator)
};

// A third of a layer.
int64_t PieceUnit() {
  auto model = LoadGptConfig(kModel);
  EXPECT_TRUE(model.ok()) << model.status().ToString();
  return model.ok() ? GptBlockSpecs(*model)[1].numel() / 3 : 0;
}

TrainerRun MakeTrainer(const Config& config, const Variant& v, bool host_stream) {
  return testing::MakeTrainerOn(CreateHostDevice(0), config, kModel, "trainer-stream-test", [&](TrainerOptions& o) {
    o.activations = v.activations;
    o.fetch_unit = v.pieces ? PieceUnit() : 0;
    o.host_stream = host_stream;
    o.grad_buffers = v.grad_buffers;
    if (v.n_layer > 0) o.model.n_layer = v.n_layer;
  });
}

TEST(TrainerStreamTest, QueuedKernelsGiveTheSynchronousRun) {
  const Variant variants[] = {
      {"resident", OffloadDevice::kNone, OffloadDevice::kNone},
      // One gradient buffer: each layer's backward waits for the last one's copy.
      {"cpu/cpu, one gradient buffer", OffloadDevice::kCpu, OffloadDevice::kCpu, LayerActivations::kRecompute, false, 0,
       1},
      {"cpu/cpu, one micro-batch a step", OffloadDevice::kCpu, OffloadDevice::kCpu, LayerActivations::kRecompute, false,
       0, 0, 1},
      {"cpu/cpu in pieces", OffloadDevice::kCpu, OffloadDevice::kCpu, LayerActivations::kRecompute, true},
      {"nvme/nvme", OffloadDevice::kNvme, OffloadDevice::kNvme},
      {"nvme/nvme kept, in pieces", OffloadDevice::kNvme, OffloadDevice::kNvme, LayerActivations::kKeep, true},
      // Five layers: six inputs turn the three device slots over twice.
      {"cpu/cpu offloaded layer inputs, in pieces", OffloadDevice::kCpu, OffloadDevice::kCpu,
       LayerActivations::kOffload, true, 5},
  };
  for (const Variant& v : variants) {
    SCOPED_TRACE(v.name);
    TempDir dir;
    Config config = testing::TinyTrainingConfig(dir.path(), v.param, v.optimizer, kMicroBatch);
    config.gradient_accumulation_steps = v.grad_accum;
    config.zero.sub_group_size = 1 << 20;
    config.zero.stage3_prefetch_bucket_size = 1 << 20;
    config.zero.stage3_max_live_parameters = 2 << 20;
    config.zero.offload_param.buffer_size = 1 << 20;
    std::vector<double> losses[2], held_out(2);
    std::string weights[2];
    for (int queued = 0; queued < 2; ++queued) {
      TrainerRun r = MakeTrainer(config, v, queued == 1);
      ASSERT_NE(r.trainer, nullptr);
      EXPECT_EQ(r.trainer->compute_name(), queued == 1 ? "cpu-f32-stream" : "cpu-f32");
      losses[queued] = StepLosses(*r.trainer, 3);
      ASSERT_EQ(losses[queued].size(), 3u);
      auto eval = r.trainer->Evaluate(2);
      ASSERT_TRUE(eval.ok()) << eval.status().ToString();
      held_out[queued] = *eval;
      const std::string file = dir.Sub("weights-" + std::to_string(queued) + ".safetensors");
      ASSERT_TRUE(r.trainer->ExportSafetensors(file, "F32").ok());
      weights[queued] = testing::ReadBytes(file);
      EXPECT_EQ(r.trainer->layout().split(), v.pieces);
    }
    EXPECT_EQ(losses[1], losses[0]);
    EXPECT_EQ(held_out[1], held_out[0]);
    EXPECT_GT(weights[0].size(), 0u);
    EXPECT_TRUE(weights[1] == weights[0]) << "the exported fp32 weights differ";
  }
}

// wall_clock_breakdown wraps the kernels in TimedOps: the same bits, in
// place and queued, GPT-2 and Llama blocks; every call is timed once (the
// layers' attention: L backwards and 2L forwards with the recompute), an
// evaluation's calls are left out of the next step, and the device time is
// within the step's wall time.
TEST(TrainerStreamTest, TimedKernelsGiveTheSameBitsAndEachCallsDeviceTime) {
  for (bool llama : {false, true}) {
    for (bool queued : {false, true}) {
      SCOPED_TRACE(std::string(llama ? "llama" : "gpt-2") + (queued ? ", queued" : ", in place"));
      TempDir dir;
      Config config = testing::TinyTrainingConfig(dir.path(), OffloadDevice::kCpu, OffloadDevice::kCpu, kMicroBatch);
      std::vector<double> losses[2];
      for (int timed = 0; timed < 2; ++timed) {
        config.wall_clock_breakdown = timed == 1;
        TrainerRun r =
            testing::MakeTrainerOn(CreateHostDevice(0), config, "tiny", "trainer-stream-test", [&](TrainerOptions& o) {
              o.host_stream = queued;
              if (!llama) return;
              o.model.family = ModelFamily::kLlama;
              o.model.n_kv_head = 1;
              o.model.intermediate_size = 48;
            });
        ASSERT_NE(r.trainer, nullptr);
        const int64_t n_layer = r.trainer->model().n_layer;
        for (int step = 0; step < 3; ++step) {
          if (step == 2) {
            ASSERT_TRUE(r.trainer->Evaluate(1).ok());
          }
          auto report = r.trainer->Step();
          ASSERT_TRUE(report.ok()) << report.status().ToString();
          losses[timed].push_back(report->loss);
          const KernelTimes& k = report->kernels;
          if (timed == 0) {
            EXPECT_TRUE(k.by_op.empty());
            continue;
          }
          EXPECT_GT(k.busy_seconds, 0.0);
          EXPECT_LE(k.busy_seconds, report->seconds);
          double sum = 0.0;
          for (const auto& [name, t] : k.by_op) {
            EXPECT_GT(t.calls, 0) << name;
            EXPECT_GE(t.seconds, 0.0) << name;
            sum += t.seconds;
          }
          EXPECT_NEAR(sum, k.busy_seconds, 1e-9);
          ASSERT_TRUE(k.by_op.count("AttentionBackward") && k.by_op.count("AttentionForward"));
          EXPECT_EQ(k.by_op.at("AttentionBackward").calls, n_layer);
          EXPECT_EQ(k.by_op.at("AttentionForward").calls, 2 * n_layer);
          const char* family_ops[] = {llama ? "RmsNormBackward" : "LayerNormBackward",
                                      llama ? "GluBackward" : "GeluBackward",
                                      llama ? "RopeBackward" : "EncoderBackward", "CrossEntropyForwardBackward"};
          for (const char* op : family_ops) EXPECT_EQ(k.by_op.count(op), 1u) << op;
          if (llama) {
            EXPECT_EQ(k.by_op.count("GqaExpandBackward"), 1u);
          }
        }
      }
      EXPECT_EQ(losses[1], losses[0]);
    }
  }
}

}  // namespace
}  // namespace zinf::model
