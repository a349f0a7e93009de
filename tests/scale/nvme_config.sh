# Sourced by the scale tests (scale_test.sh, hf_load_test.sh).
# scale_nvme_config NVME_DIR: prints their DeepSpeed config: micro-batch 1,
# bf16, AdamW, clipping, stage 3 with sub-groups of 1e6, parameters and
# optimizer state on NVMe under NVME_DIR with DeepSpeed's buffer counts.
scale_nvme_config() {
  cat <<JSON
{
  "train_micro_batch_size_per_gpu": 1,
  "gradient_accumulation_steps": 1,
  "gradient_clipping": 1.0,
  "steps_per_print": 1,
  "bf16": {"enabled": true},
  "optimizer": {"type": "AdamW", "params": {"lr": 1e-3, "betas": [0.9, 0.95], "eps": 1e-8, "weight_decay": 0.1}},
  "zero_optimization": {
    "stage": 3,
    "sub_group_size": 1e6,
    "stage3_prefetch_bucket_size": 4e6,
    "offload_param": {"device": "nvme", "nvme_path": "$1", "buffer_count": 4, "buffer_size": 4e6, "max_in_cpu": 0},
    "offload_optimizer": {"device": "nvme", "nvme_path": "$1", "buffer_count": 4,
                          "pipeline_read": true, "pipeline_write": true}
  }
}
JSON
}
