// zinf's configuration: DeepSpeed's JSON, parsed once into plain structs.
//
// ParseConfig() reads the JSON text, fills every default DeepSpeed documents,
// and reports every problem at once, each naming the JSON path of the key
// (`zero_optimization.offload_param.buffer_count: expected a positive
// integer, got "five"`). Nothing below core/ ever sees JSON: layers take the
// structs below.
//
// Numbers may be written as JSON numbers (1e9) or strings ("5e8"). "auto" is
// accepted where zinf can work the value out (see ResolveAuto) and rejected
// elsewhere. Keys DeepSpeed has that zinf does not act on are listed in
// Config::ignored_keys (the caller reports them once); unknown keys are errors.
//
// Thread-safety: plain values.
#pragma once

#include <cstdint>
#include <optional>
#include <string>
#include <vector>

#include "zinf/status.h"

namespace zinf {

enum class OffloadDevice { kNone, kCpu, kNvme };
enum class OptimizerType { kAdam, kAdamW };
enum class SchedulerType { kNone, kWarmupLR, kWarmupDecayLR, kWarmupCosineLR };
enum class WarmupType { kLog, kLinear };

std::string_view OffloadDeviceName(OffloadDevice d);
std::string_view OptimizerTypeName(OptimizerType t);
std::string_view SchedulerTypeName(SchedulerType t);
std::string_view WarmupTypeName(WarmupType t);

struct Fp16Config {
  bool enabled = false;
  double loss_scale = 0.0;              // 0: dynamic loss scaling
  int initial_scale_power = 16;         // dynamic scale starts at 2^power
  int loss_scale_window = 1000;         // overflow-free steps before the scale doubles
  int hysteresis = 2;                   // overflows tolerated before the scale halves
  bool consecutive_hysteresis = false;  // refill hysteresis after a good step
  double min_loss_scale = 1.0;
};

struct Bf16Config {
  bool enabled = false;
};

struct OptimizerConfig {
  OptimizerType type = OptimizerType::kAdamW;
  double lr = 1e-3;
  double beta1 = 0.9;
  double beta2 = 0.999;
  double eps = 1e-8;
  double weight_decay = 0.0;
  bool adam_w_mode = true;  // decoupled weight decay (AdamW)
  bool bias_correction = true;
};

struct SchedulerConfig {
  SchedulerType type = SchedulerType::kNone;
  double warmup_min_lr = 0.0;   // WarmupLR, WarmupDecayLR
  double warmup_max_lr = 1e-3;  // WarmupLR, WarmupDecayLR
  int64_t warmup_num_steps = 1000;
  WarmupType warmup_type = WarmupType::kLog;
  int64_t total_num_steps = 0;    // WarmupDecayLR, WarmupCosineLR (required there)
  double warmup_min_ratio = 0.0;  // WarmupCosineLR
  double cos_min_ratio = 0.0001;  // WarmupCosineLR
};

struct OffloadParamConfig {
  OffloadDevice device = OffloadDevice::kNone;
  std::vector<std::string> nvme_paths;  // one or several drives (striped)
  bool pin_memory = false;
  int64_t buffer_count = 5;
  int64_t buffer_size = 100'000'000;   // elements
  int64_t max_in_cpu = 1'000'000'000;  // elements
};

struct OffloadOptimizerConfig {
  OffloadDevice device = OffloadDevice::kNone;
  std::vector<std::string> nvme_paths;
  bool pin_memory = false;
  int64_t buffer_count = 4;
  bool fast_init = false;
  bool pipeline_read = false;
  bool pipeline_write = false;
  double ratio = 1.0;  // fraction of optimizer state updated on the CPU
};

struct ZeroConfig {
  int stage = 0;
  bool overlap_comm = false;  // DeepSpeed turns it on for stage 3 unless set
  bool contiguous_gradients = true;
  int64_t reduce_bucket_size = 500'000'000;              // elements
  int64_t allgather_bucket_size = 500'000'000;           // elements
  int64_t sub_group_size = 1'000'000'000;                // elements
  int64_t stage3_prefetch_bucket_size = 50'000'000;      // elements
  int64_t stage3_param_persistence_threshold = 100'000;  // elements
  int64_t stage3_max_live_parameters = 1'000'000'000;    // elements
  int64_t stage3_max_reuse_distance = 1'000'000'000;     // elements
  bool stage3_gather_16bit_weights_on_model_save = false;
  OffloadParamConfig offload_param;
  OffloadOptimizerConfig offload_optimizer;
};

struct AioConfig {
  int64_t block_size = 1 << 20;  // bytes per request piece
  int64_t queue_depth = 8;       // requests in flight per ring
  int64_t thread_count = 1;      // rings, one thread each
  bool single_submit = false;    // submit requests one at a time instead of batched
  bool overlap_events = true;    // submit new requests while reaping completions
};

// DeepSpeed's tensorboard and csv_monitor sections: files written under
// output_path/job_name (output_path "": the working directory).
struct MonitorConfig {
  bool enabled = false;
  std::string output_path;
  std::string job_name = "DeepSpeedJobName";
};

// DeepSpeed's activation_checkpointing section. zinf's GPT checkpoints
// every layer's input (or keeps every activation: `zinf train
// --activations`); cpu_checkpointing keeps those inputs in pinned host
// memory rather than on the device (`--activations offload`). DeepSpeed
// offloads only activations partitioned across model-parallel ranks; zinf
// does it on one GPU too. The section's other keys are accepted and not
// acted on.
struct ActivationCheckpointingConfig {
  bool cpu_checkpointing = false;
};

struct Config {
  int64_t train_batch_size = 1;
  int64_t train_micro_batch_size_per_gpu = 1;
  int64_t gradient_accumulation_steps = 1;
  double gradient_clipping = 0.0;  // 0: off
  int64_t steps_per_print = 10;
  bool wall_clock_breakdown = false;
  Fp16Config fp16;
  Bf16Config bf16;
  OptimizerConfig optimizer;
  SchedulerConfig scheduler;
  ZeroConfig zero;
  AioConfig aio;
  MonitorConfig tensorboard;
  MonitorConfig csv_monitor;
  ActivationCheckpointingConfig activation_checkpointing;

  // Which of the three batch keys the file set (with a number); the others
  // are derived by ResolveAuto from train_batch_size = micro * accum * world.
  bool batch_given[3] = {false, false, false};
  // JSON paths whose value was "auto", resolved by ResolveAuto.
  std::vector<std::string> auto_keys;
  // JSON paths the file gave a value for ("auto" included): a TrainerArgs
  // value may fill a key the file left out but must agree with one it set.
  std::vector<std::string> given_keys;
  // DeepSpeed keys present in the file that zinf does not act on (see
  // IgnoredKeyReason).
  std::vector<std::string> ignored_keys;
  // Where the config came from ("<string>" or a file path), for messages.
  std::string source = "<string>";

  bool offloads_to_nvme() const {
    return zero.offload_param.device == OffloadDevice::kNvme || zero.offload_optimizer.device == OffloadDevice::kNvme;
  }
};

// Parses DeepSpeed JSON text (comments allowed) into a Config with every
// default filled; "auto" values stay to be resolved (ResolveAuto). `source`
// names the text in errors and becomes Config::source. Errors are
// kInvalidArgument starting with `source`: text that is not JSON (with its
// line and column) or a top level that is not an object, alone; else every
// problem with a key at once (a repeated key among them), "<source>: N
// error(s) in config" and one per line, each starting with the key's JSON
// path. Keys zinf does not act on are not errors: they are listed in
// Config::ignored_keys.
StatusOr<Config> ParseConfig(std::string_view json_text, std::string source = "<string>");
// Reads and parses a file (ParseConfig with the path as `source`); a file
// that cannot be read is an error naming it.
StatusOr<Config> LoadConfigFile(const std::string& path);

// Why zinf does not act on the ignored key `path` (an entry of
// Config::ignored_keys), when there is more to say than "not implemented":
// for wandb and comet, network services, the monitors zinf writes instead.
// Empty for every other key.
std::string_view IgnoredKeyReason(std::string_view path);

// The HuggingFace TrainingArguments that fill DeepSpeed's "auto" keys, as
// `zinf train` and `config-check` take them (--lr, --weight-decay, ...);
// unset: the TrainingArguments default. Each value's range is its key's.
struct TrainerArgs {
  std::optional<double> lr;             // --lr: optimizer.params.lr, scheduler warmup_max_lr
  std::optional<double> weight_decay;   // --weight-decay: optimizer.params.weight_decay
  std::optional<double> adam_beta1;     // --adam-beta1: optimizer.params.betas[0]
  std::optional<double> adam_beta2;     // --adam-beta2: optimizer.params.betas[1]
  std::optional<double> adam_epsilon;   // --adam-epsilon: optimizer.params.eps
  std::optional<double> max_grad_norm;  // --max-grad-norm: gradient_clipping
  std::optional<int64_t> warmup_steps;  // --warmup-steps: scheduler.params.warmup_num_steps
  std::optional<int64_t> micro_batch;   // --micro-batch: train_micro_batch_size_per_gpu
  std::optional<int64_t> grad_accum;    // --grad-accum: gradient_accumulation_steps
};

// What "auto" and the batch rule can be worked out from.
struct AutoContext {
  int world_size = 1;
  std::optional<int64_t> hidden_size;  // from the model
  std::optional<int64_t> total_steps;  // from `zinf train --steps`
  TrainerArgs trainer;
};

// One value ResolveAuto chose: `key: from -> value (rule)`, where `from` is
// "auto", or "default X" for a key the file left out that a flag filled.
struct AutoResolution {
  std::string key;    // JSON path
  std::string from;   // "auto" or "default <value>"
  std::string value;  // as JSON
  std::string rule;   // where the value came from ("--lr", "HF default learning_rate", ...)
};

// Fills the batch keys from train_batch_size = micro * accum * world_size
// (DeepSpeed's rule: any two determine the third; one alone takes the other
// as 1 where it can) and resolves each "auto". Errors when the batch keys
// disagree, or when an "auto" needs something `ctx` does not have.
//
// Rules for "auto" (the HF Trainer's, DeepSpeed's integration in
// transformers, where it fills the key; "flag or D": the TrainerArgs value,
// else the TrainingArguments default D):
//   train_micro_batch_size_per_gpu:       --micro-batch or 8
//   gradient_accumulation_steps:          --grad-accum or 1
//   train_batch_size:                     micro * accum * world_size
//   optimizer.params.lr:                  --lr or 5e-5
//   optimizer.params.betas:               [--adam-beta1 or 0.9, --adam-beta2 or 0.999]
//   optimizer.params.eps:                 --adam-epsilon or 1e-8
//   optimizer.params.weight_decay:        --weight-decay or 0
//   gradient_clipping:                    --max-grad-norm or 1.0
//   scheduler.params.warmup_min_lr:       0
//   scheduler.params.warmup_max_lr:       optimizer.params.lr (as resolved)
//   scheduler.params.warmup_num_steps:    --warmup-steps or 0
//   zero_optimization.reduce_bucket_size:                 hidden_size^2
//   zero_optimization.stage3_prefetch_bucket_size:        0.9 * hidden_size^2
//   zero_optimization.stage3_param_persistence_threshold: 10 * hidden_size
//   zero_optimization.allgather_bucket_size:              hidden_size^2
//   scheduler.params.total_num_steps:                     the run's step count
//   fp16.enabled: false;  bf16.enabled: true unless fp16 is enabled
//   aio.thread_count: number of distinct nvme paths (at least 1)
// A TrainerArgs value given for a key the file set to a number must equal it
// (the HF Trainer refuses such a mismatch too: which one was meant?); for a
// key the file left out, it is the value. `resolutions`, when given, gets one
// entry per value chosen, in key order of the rules above.
Status ResolveAuto(Config& config, const AutoContext& ctx, std::vector<AutoResolution>* resolutions = nullptr);

// Every field as JSON text (the resolved config), for `zinf config-check`.
std::string ConfigToJson(const Config& config, int indent = 2);
// Only what differs from a default Config (ParseConfig of a config naming
// only the same zero_optimization.stage: some defaults follow it), plus
// zero_optimization.stage, the offload devices, the optimizer's and
// scheduler's types and the per-GPU batch keys, which say what the config is: a short file a user can read, for `zinf
// plan --write-config`. ParseConfig gives `config` back.
std::string ConfigChangesToJson(const Config& config, int indent = 2);

}  // namespace zinf
