// The CUDA path (label gpu): the same training on a CudaDevice (device
// memory, cudaMemcpyAsync, a device-buffer communicator) gives the same
// parameters, bit for bit, as on the host stand-in: the optimizer, the
// casts and the model's math all run on the host, and the device only
// stores and moves bytes. Skips without a GPU.
#include <gtest/gtest.h>

#include <cstring>

#include "comm/communicator.h"
#include "zero3/engine_test_util.h"
#include "zero3/tiny_model.h"

namespace zinf::zero3::testing {
namespace {

using swap::testing::TempDir;

const TinyModel kModel{{13, 37, 29, 41, 11}};

TEST(EngineCudaTest, CudaDeviceTrainsBitIdenticallyToTheHostDevice) {
  if (CudaDeviceCount() == 0) GTEST_SKIP() << "no CUDA device visible";
  TempDir dir;
  Config config = BaseConfig();
  config.bf16.enabled = true;
  config.zero.stage3_prefetch_bucket_size = 2500;
  config.zero.stage3_max_live_parameters = 2600;
  SetTiers(config, OffloadDevice::kNvme, OffloadDevice::kNvme, dir);
  comm::LocalCommunicator local;

  EngineUnderTest host = MakeEngine(config, kModel.Blocks(), &local);
  ASSERT_NE(host.engine, nullptr);
  const float host_loss = Train(*host.engine, kModel, {}, 2);
  const std::vector<float> want = MasterWeights(*host.engine, kModel);

  DeviceOptions o;
  o.choice = DeviceOptions::Choice::kCuda;
  auto device = CreateDevice(o);
  ASSERT_TRUE(device.ok()) << device.status().ToString();
  EngineHooks hooks;
  hooks.device = device->get();
  hooks.host_communicator = &local;
  EngineOptions eo;
  eo.hooks = &hooks;
  eo.optimizer_threads = 1;
  eo.run_id = "zero3-cuda-test";
  Config cuda_config = config;
  cuda_config.zero.offload_param.nvme_paths = {dir.Sub("cuda-param")};
  cuda_config.zero.offload_optimizer.nvme_paths = {dir.Sub("cuda-optim")};
  auto engine = Engine::Create(cuda_config, kModel.Blocks(), eo);
  ASSERT_TRUE(engine.ok()) << engine.status().ToString();
  const float cuda_loss = Train(**engine, kModel, {}, 2);
  const std::vector<float> got = MasterWeights(**engine, kModel);
  ASSERT_EQ(got.size(), want.size());
  EXPECT_EQ(std::memcmp(got.data(), want.data(), got.size() * 4), 0);
  EXPECT_EQ(cuda_loss, host_loss);
  EXPECT_LE((*engine)->counters().peak_live_elems, 2600);
}

// EngineOptions::host_device keeps the engine off a GPU that is there: its
// Acquire pointers are host memory a CPU model can read (examples/).
TEST(EngineCudaTest, HostDeviceOptionKeepsTheEngineOnTheHost) {
  if (CudaDeviceCount() == 0) GTEST_SKIP() << "no CUDA device visible";
  comm::LocalCommunicator local;
  EngineHooks hooks;
  hooks.host_communicator = &local;
  for (bool host_device : {false, true}) {
    EngineOptions eo;
    eo.hooks = &hooks;
    eo.optimizer_threads = 1;
    eo.host_device = host_device;
    auto engine = Engine::Create(BaseConfig(), kModel.Blocks(), eo);
    ASSERT_TRUE(engine.ok()) << engine.status().ToString();
    EXPECT_EQ(EngineAccess::device(**engine).kind(), host_device ? DeviceKind::kHost : DeviceKind::kCuda);
  }
}

}  // namespace
}  // namespace zinf::zero3::testing
