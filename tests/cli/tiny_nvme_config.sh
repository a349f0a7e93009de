# Sourced by the CLI tests that train `tiny` with every block fetched
# (persistence threshold 0) and parameters and optimizer on NVMe:
# write_tiny_nvme_config DIR writes DIR/config.json, swap files under
# DIR/nvme (made here). Two micro-batches a step, clipping on, bf16.
write_tiny_nvme_config() {
  mkdir -p "$1/nvme"
  cat > "$1/config.json" <<JSON
{
  "train_micro_batch_size_per_gpu": 4,
  "gradient_accumulation_steps": 2,
  "gradient_clipping": 1.0,
  "bf16": {"enabled": true},
  "optimizer": {"type": "AdamW", "params": {"lr": 3e-3, "weight_decay": 0.1}},
  "zero_optimization": {
    "stage": 3,
    "sub_group_size": 20000,
    "stage3_param_persistence_threshold": 0,
    "stage3_prefetch_bucket_size": 20000,
    "stage3_max_live_parameters": 100000,
    "offload_param": {"device": "nvme", "nvme_path": "$1/nvme", "buffer_count": 4, "buffer_size": 20000},
    "offload_optimizer": {"device": "nvme", "nvme_path": "$1/nvme", "pipeline_read": true,
                          "pipeline_write": true, "buffer_count": 12}
  }
}
JSON
}
