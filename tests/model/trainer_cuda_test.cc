// The Trainer on a GPU (label gpu): with bf16 parameters it computes the
// linear layers in bf16 on tensor cores by default (CudaOps' 16-bit mode),
// and --gpu-compute fp32 keeps the fp32 path. The 16-bit run follows the
// fp32 run's loss curve; layer inputs offloaded to the host give the
// recompute's losses bit for bit.
//
// Tolerance: 40 steps of the tiny model; every 16-bit loss within 0.05 of
// the fp32 one (the losses fall from about 5.5; rounding the matmuls'
// operands to bf16, 8 bits of mantissa, moves each GEMM's result by about
// 2^-9 relative), and the mean difference within 0.02.
//
// Skips (with the reason) without a GPU.
#include <gtest/gtest.h>

#include <cmath>
#include <memory>
#include <string>
#include <vector>

#include "device/cuda_device.h"
#include "device/device.h"
#include "model/model_test_util.h"
#include "model/trainer.h"

namespace zinf::model {
namespace {

using swap::testing::TempDir;
using testing::StepLosses;

using testing::TrainerRun;

TrainerRun MakeGpuTrainer(const Config& config, bool compute16) {
  auto device = CreateCudaDevice(0, 0);
  EXPECT_TRUE(device.ok()) << device.status().ToString();
  if (!device.ok()) return {};
  return testing::MakeTrainerOn(std::move(device).value(), config, "tiny",
                                compute16 ? "trainer-cuda-16" : "trainer-cuda-f32",
                                [&](TrainerOptions& o) { o.gpu_compute16 = compute16; });
}

TEST(TrainerCudaTest, Bf16ComputeFollowsTheFp32Curve) {
  if (CudaDeviceCount() == 0) GTEST_SKIP() << "no CUDA GPU: " << CudaUnavailableReason();
  TempDir dir;
  const Config config = testing::TinyTrainingConfig(dir.path(), OffloadDevice::kCpu, OffloadDevice::kCpu, 8);
  ASSERT_TRUE(config.bf16.enabled);
  std::vector<double> losses[2];
  for (int k = 0; k < 2; ++k) {
    const bool compute16 = k == 0;
    TrainerRun r = MakeGpuTrainer(config, compute16);
    ASSERT_NE(r.trainer, nullptr);
    EXPECT_EQ(r.trainer->compute_name(), compute16 ? "cuda-16" : "cuda-f32");
    losses[k] = StepLosses(*r.trainer, 40);
    ASSERT_EQ(losses[k].size(), 40u);
    r.trainer.reset();  // before its device
  }
  double sum = 0.0;
  for (size_t i = 0; i < losses[0].size(); ++i) {
    const double d = std::fabs(losses[0][i] - losses[1][i]);
    EXPECT_LE(d, 0.05) << "step " << i + 1 << ": bf16 " << losses[0][i] << ", fp32 " << losses[1][i];
    sum += d;
  }
  EXPECT_LE(sum / static_cast<double>(losses[0].size()), 0.02);
  EXPECT_LT(losses[0].back(), 0.8 * losses[0].front()) << "the 16-bit run learns";
}

// fp32 parameters (bf16 and fp16 off): the fp32 path whatever gpu_compute16 says.
TEST(TrainerCudaTest, Fp32ParametersComputeInFp32) {
  if (CudaDeviceCount() == 0) GTEST_SKIP() << "no CUDA GPU: " << CudaUnavailableReason();
  TempDir dir;
  Config config = testing::TinyTrainingConfig(dir.path(), OffloadDevice::kCpu, OffloadDevice::kCpu, 8);
  config.bf16.enabled = false;
  TrainerRun r = MakeGpuTrainer(config, /*compute16=*/true);
  ASSERT_NE(r.trainer, nullptr);
  EXPECT_EQ(r.trainer->compute_name(), "cuda-f32");
  EXPECT_EQ(StepLosses(*r.trainer, 2).size(), 2u);
  r.trainer.reset();
}

// Layer inputs offloaded to pinned host memory (kOffload) on the GPU: each
// copied out and back on a stream of its own, ordered with the model's
// stream by events, never by a host wait. The losses are the recompute's
// on the same GPU bit for bit (the same deterministic kernels on the same
// values), 16-bit compute, five layers so that the three device slots turn
// over.
TEST(TrainerCudaTest, OffloadedLayerInputsGiveTheRecomputesLosses) {
  if (CudaDeviceCount() == 0) GTEST_SKIP() << "no CUDA GPU: " << CudaUnavailableReason();
  TempDir dir;
  const Config config = testing::TinyTrainingConfig(dir.path(), OffloadDevice::kCpu, OffloadDevice::kCpu, 8);
  std::vector<double> losses[2];
  for (int k = 0; k < 2; ++k) {
    const LayerActivations a = k == 0 ? LayerActivations::kRecompute : LayerActivations::kOffload;
    auto device = CreateCudaDevice(0, 0);
    ASSERT_TRUE(device.ok()) << device.status().ToString();
    TrainerRun r = testing::MakeTrainerOn(std::move(device).value(), config, "tiny", "trainer-cuda-offload",
                                          [&](TrainerOptions& o) {
                                            o.model.n_layer = 5;
                                            o.activations = a;
                                          });
    ASSERT_NE(r.trainer, nullptr);
    EXPECT_EQ(r.trainer->activations(), a);
    EXPECT_EQ(r.trainer->compute_name(), "cuda-16");
    EXPECT_EQ(r.trainer->host_activation_bytes() > 0, k == 1);
    losses[k] = StepLosses(*r.trainer, 10);
    ASSERT_EQ(losses[k].size(), 10u);
    r.trainer.reset();  // before its device
  }
  EXPECT_EQ(losses[1], losses[0]);
}

// wall_clock_breakdown on the GPU: CUDA timing events around every kernel
// call give the untimed run's losses bit for bit, and each step's kernel
// time (the 16-bit matmuls among it) within the step's wall time.
TEST(TrainerCudaTest, TimedKernelsGiveTheSameLossesAndTheirGpuTime) {
  if (CudaDeviceCount() == 0) GTEST_SKIP() << "no CUDA GPU: " << CudaUnavailableReason();
  TempDir dir;
  Config config = testing::TinyTrainingConfig(dir.path(), OffloadDevice::kCpu, OffloadDevice::kCpu, 8);
  std::vector<double> losses[2];
  for (int timed = 0; timed < 2; ++timed) {
    config.wall_clock_breakdown = timed == 1;
    TrainerRun r = MakeGpuTrainer(config, /*compute16=*/true);
    ASSERT_NE(r.trainer, nullptr);
    for (int step = 0; step < 4; ++step) {
      auto report = r.trainer->Step();
      ASSERT_TRUE(report.ok()) << report.status().ToString();
      losses[timed].push_back(report->loss);
      const KernelTimes& k = report->kernels;
      EXPECT_EQ(k.by_op.empty(), timed == 0);
      if (timed == 0) continue;
      EXPECT_GT(k.busy_seconds, 0.0);
      EXPECT_LE(k.busy_seconds, report->seconds);
      ASSERT_EQ(k.by_op.count("MatmulBackward16"), 1u);
      EXPECT_GT(k.by_op.at("MatmulBackward16").seconds, 0.0);
    }
    r.trainer.reset();  // before its device
  }
  EXPECT_EQ(losses[1], losses[0]);
}

}  // namespace
}  // namespace zinf::model
