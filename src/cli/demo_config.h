// The built-in default job's config (`zinf demo`), shared with
// `zinf bench step`, whose default is to time the demo's steps.
#pragma once

#include <string>

namespace zinf::cli {

// The built-in default config; "@NVME@" becomes the demo's nvme directory.
// max_in_cpu 0: released parameter shards are not cached in RAM, so every
// fetch that prefetching does not hide really reads NVMe.
inline constexpr char kDemoConfig[] = R"({
  "train_micro_batch_size_per_gpu": 4,
  "gradient_accumulation_steps": 2,
  "gradient_clipping": 1.0,
  "steps_per_print": 20,
  "bf16": {"enabled": true},
  "optimizer": {"type": "AdamW", "params": {"lr": 2e-3, "betas": [0.9, 0.95], "weight_decay": 0.0}},
  "scheduler": {"type": "WarmupDecayLR", "params": {"warmup_min_lr": 0, "warmup_max_lr": 2e-3,
                                                    "warmup_num_steps": 20, "warmup_type": "linear",
                                                    "total_num_steps": "auto"}},
  "zero_optimization": {
    "stage": 3,
    "sub_group_size": 1048576,
    "stage3_prefetch_bucket_size": 1048576,
    "stage3_max_live_parameters": 1572864,
    "stage3_param_persistence_threshold": 0,
    "offload_param": {"device": "nvme", "nvme_path": "@NVME@", "pin_memory": true,
                      "buffer_count": 6, "buffer_size": 1048576, "max_in_cpu": 0},
    "offload_optimizer": {"device": "nvme", "nvme_path": "@NVME@", "pin_memory": true,
                          "buffer_count": 12, "pipeline_read": true, "pipeline_write": true}
  },
  "aio": {"block_size": 1048576, "queue_depth": 32, "thread_count": 1, "overlap_events": true}
})";

// kDemoConfig with its NVMe paths set to `nvme_dir`.
inline std::string DemoConfigJson(const std::string& nvme_dir) {
  std::string text = kDemoConfig;
  for (size_t at; (at = text.find("@NVME@")) != std::string::npos;) text.replace(at, 6, nvme_dir);
  return text;
}

}  // namespace zinf::cli
