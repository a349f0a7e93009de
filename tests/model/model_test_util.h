// Helpers shared by the model tests: a temporary directory, the HF fixture
// folders, whole-file reads and writes, the small ZeRO-3 config the tiny GPT
// trains with, a trainer on a device, and a trainer's losses over some
// steps.
#pragma once

#include <cmath>
#include <cstdint>
#include <cstdlib>
#include <fstream>
#include <functional>
#include <iterator>
#include <memory>
#include <string>
#include <vector>

#include <gtest/gtest.h>

#include "device/device.h"
#include "model/trainer.h"
#include "swap/swap_test_util.h"
#include "zinf/config.h"

namespace zinf::model::testing {

using swap::testing::TempDir;

// The Hugging Face fixture folder tests/model/hf/`name` (from the source
// tree ZINF_SOURCE_DIR names, else relative to the working directory).
inline std::string FixtureDir(const std::string& name) {
  const char* root = std::getenv("ZINF_SOURCE_DIR");
  return std::string(root != nullptr ? root : ".") + "/tests/model/hf/" + name;
}

inline std::string ReadBytes(const std::string& path) {
  std::ifstream in(path, std::ios::binary);
  return std::string(std::istreambuf_iterator<char>(in), std::istreambuf_iterator<char>());
}

inline void WriteBytes(const std::string& path, const std::string& bytes) {
  std::ofstream out(path, std::ios::binary | std::ios::trunc);
  out.write(bytes.data(), static_cast<std::streamsize>(bytes.size()));
  ASSERT_TRUE(out.good()) << path;
}

// ZeRO-3, bf16, AdamW, small sub-groups and prefetch window, both optimizer
// pipelines on; swap files under `root`/param and `root`/optim.
inline Config TinyTrainingConfig(const std::string& root, OffloadDevice param, OffloadDevice optimizer,
                                 int64_t micro_batch) {
  Config c;
  c.train_micro_batch_size_per_gpu = micro_batch;
  c.gradient_accumulation_steps = 1;
  c.gradient_clipping = 1.0;
  c.bf16.enabled = true;
  c.optimizer.lr = 3e-3;
  c.optimizer.weight_decay = 0.0;
  c.zero.stage = 3;
  c.zero.sub_group_size = 20000;
  c.zero.stage3_param_persistence_threshold = 0;
  c.zero.stage3_prefetch_bucket_size = 20000;
  c.zero.stage3_max_live_parameters = 100000;
  c.zero.offload_param.device = param;
  c.zero.offload_param.nvme_paths = {root + "/param"};
  c.zero.offload_param.buffer_count = 4;
  c.zero.offload_param.buffer_size = 20000;
  c.zero.offload_param.max_in_cpu = 0;
  c.zero.offload_optimizer.device = optimizer;
  c.zero.offload_optimizer.nvme_paths = {root + "/optim"};
  c.zero.offload_optimizer.pipeline_read = true;
  c.zero.offload_optimizer.pipeline_write = true;
  c.zero.offload_optimizer.buffer_count = 12;
  return c;
}

// A trainer and the device it computes on (declared first: it outlives
// the trainer).
struct TrainerRun {
  std::unique_ptr<Device> device;
  std::unique_ptr<Trainer> trainer;  // null when Create failed (a test failure)
};

// The built-in `model`'s trainer of `config` on `device`: a 256 KiB
// built-in corpus, one optimizer thread, run id `run_id`; `edit` changes
// the options last.
inline TrainerRun MakeTrainerOn(std::unique_ptr<Device> device, const Config& config, const std::string& model,
                                const std::string& run_id, const std::function<void(TrainerOptions&)>& edit = {}) {
  TrainerRun r;
  r.device = std::move(device);
  TrainerOptions o;
  auto m = LoadGptConfig(model);
  EXPECT_TRUE(m.ok()) << m.status().ToString();
  if (!m.ok()) return r;
  o.model = *m;
  o.corpus_bytes = 256 << 10;
  o.hooks.device = r.device.get();
  o.engine.optimizer_threads = 1;
  o.engine.run_id = run_id;
  if (edit) edit(o);
  auto t = Trainer::Create(config, o);
  EXPECT_TRUE(t.ok()) << t.status().ToString();
  if (t.ok()) r.trainer = std::move(t).value();
  return r;
}

// The losses of `steps` optimizer steps, each finite; stops (with a failure)
// at the first error.
inline std::vector<double> StepLosses(Trainer& t, int steps) {
  std::vector<double> out;
  for (int i = 0; i < steps; ++i) {
    auto r = t.Step();
    EXPECT_TRUE(r.ok()) << r.status().ToString();
    if (!r.ok()) break;
    EXPECT_TRUE(std::isfinite(r->loss));
    out.push_back(r->loss);
  }
  return out;
}

}  // namespace zinf::model::testing
