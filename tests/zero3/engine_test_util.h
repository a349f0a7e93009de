// Configs and engine construction shared by the zero3 engine tests.
#pragma once

#include <cstdint>
#include <filesystem>
#include <memory>
#include <string>
#include <system_error>

#include "device/device.h"
#include "swap/swap_test_util.h"
#include "zero3/engine_hooks.h"
#include "zinf/config.h"
#include "zinf/engine.h"

namespace zinf::zero3::testing {

// Stage 3, small sub-groups (several per rank shard), both pipelines on,
// gradient accumulation, AdamW with weight decay.
inline Config BaseConfig() {
  Config c;
  c.zero.stage = 3;
  c.gradient_accumulation_steps = 2;
  c.optimizer.lr = 1e-2;
  c.optimizer.weight_decay = 0.01;
  c.zero.sub_group_size = 300;
  c.zero.stage3_param_persistence_threshold = 0;
  c.zero.stage3_prefetch_bucket_size = 0;
  c.zero.offload_param.buffer_count = 3;
  c.zero.offload_param.max_in_cpu = 0;  // every reuse goes back to NVMe
  c.zero.offload_optimizer.pipeline_read = true;
  c.zero.offload_optimizer.pipeline_write = true;
  c.zero.offload_optimizer.pin_memory = true;
  return c;
}

inline void SetTiers(Config& c, OffloadDevice param, OffloadDevice optimizer, const swap::testing::TempDir& dir) {
  c.zero.offload_param.device = param;
  c.zero.offload_optimizer.device = optimizer;
  c.zero.offload_param.nvme_paths = {dir.Sub("param0"), dir.Sub("param1")};
  c.zero.offload_optimizer.nvme_paths = {dir.Sub("optim0")};
}

// Bytes of the regular files under `dir` (0 when it does not exist).
inline int64_t FileBytesUnder(const std::string& dir) {
  int64_t sum = 0;
  std::error_code ec;
  for (const auto& e : std::filesystem::recursive_directory_iterator(dir, ec)) {
    if (e.is_regular_file()) sum += static_cast<int64_t>(e.file_size());
  }
  return sum;
}

struct EngineUnderTest {
  std::unique_ptr<Device> device;
  std::unique_ptr<Engine> engine;
};

inline EngineUnderTest MakeEngine(const Config& config, const std::vector<BlockSpec>& blocks,
                                  comm::Communicator* host_comm = nullptr, size_t device_budget_bytes = 0,
                                  ElementType grad_type = ElementType::kF32, bool forward_only = false) {
  EngineUnderTest e;
  e.device = CreateHostDevice(device_budget_bytes);
  EngineHooks hooks;
  hooks.device = e.device.get();
  hooks.host_communicator = host_comm;
  EngineOptions o;
  o.hooks = &hooks;
  o.optimizer_threads = 1;
  o.grad_type = grad_type;
  o.forward_only = forward_only;
  o.run_id = "zero3-test";
  auto engine = Engine::Create(config, blocks, o);
  EXPECT_TRUE(engine.ok()) << engine.status().ToString();
  if (engine.ok()) e.engine = std::move(engine).value();
  return e;
}

}  // namespace zinf::zero3::testing
