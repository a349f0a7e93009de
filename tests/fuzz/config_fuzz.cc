// libFuzzer target for the two JSON config parsers: the DeepSpeed config
// (ParseConfig, ResolveAuto, ConfigToJson) and the model config
// (ParseGptConfig, GptConfigToJson).
//
// A finding is a crash, a sanitizer report (the target is built with ASan and
// UBSan), an exception escaping a parser, or one of the properties below
// failing (FUZZ_CHECK aborts, which libFuzzer records as a crash):
//
//   * ParseConfig never throws; a rejection is kInvalidArgument naming the
//     source.
//   * A config that parses is within the documented ranges.
//   * ConfigToJson of what was parsed (still holding "auto") parses again and
//     prints the same text; so does ConfigChangesToJson of a resolved config
//     (parsed and resolved again, it prints as the resolved config).
//   * For each fixed AutoContext under which ResolveAuto succeeds: the batch
//     rule holds, nothing is left "auto", and the resolved config printed by
//     ConfigToJson parses, resolves under the same context, and prints the
//     same text (a stable round trip).
//   * ParseGptConfig on the same bytes: a model config that parses is
//     consistent and GptConfigToJson round-trips it.
//
// Run it through ctest (label fuzz, tests/fuzz/run_fuzz.sh), or by hand:
//   build/tests/fuzz/clang/config_fuzz -dict=tests/fuzz/config.dict CORPUS_DIR configs tests/fuzz/corpus
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <optional>
#include <string>
#include <string_view>

#include "model/gpt.h"
#include "zinf/config.h"

namespace {

#define FUZZ_CHECK(cond, what)                    \
  do {                                            \
    if (!(cond)) ::Fail(#cond, __LINE__, (what)); \
  } while (0)

[[noreturn]] void Fail(const char* cond, int line, const std::string& what) {
  std::fprintf(stderr, "config_fuzz.cc:%d: property failed: %s\n%s\n", line, cond, what.c_str());
  std::abort();
}

// Ranges ParseConfig promises (include/zinf/config.h and the README).
void CheckRanges(const zinf::Config& c, const std::string& text) {
  FUZZ_CHECK(c.train_batch_size >= 1 && c.train_micro_batch_size_per_gpu >= 1 && c.gradient_accumulation_steps >= 1,
             text);
  FUZZ_CHECK(c.gradient_clipping >= 0 && c.steps_per_print >= 1, text);
  FUZZ_CHECK(!(c.fp16.enabled && c.bf16.enabled), text);
  FUZZ_CHECK(c.fp16.loss_scale >= 0 && c.fp16.min_loss_scale > 0, text);
  FUZZ_CHECK(c.fp16.initial_scale_power >= 0 && c.fp16.initial_scale_power <= 64, text);
  FUZZ_CHECK(c.fp16.loss_scale_window >= 1 && c.fp16.hysteresis >= 1, text);
  const zinf::OptimizerConfig& o = c.optimizer;
  FUZZ_CHECK(o.lr >= 0 && o.beta1 >= 0 && o.beta1 < 1 && o.beta2 >= 0 && o.beta2 < 1, text);
  FUZZ_CHECK(o.eps > 0 && o.eps <= 1 && o.weight_decay >= 0, text);
  FUZZ_CHECK(o.type == zinf::OptimizerType::kAdam || o.adam_w_mode, text);
  const zinf::SchedulerConfig& s = c.scheduler;
  FUZZ_CHECK(s.warmup_num_steps >= 0 && s.total_num_steps >= 0, text);
  const zinf::ZeroConfig& z = c.zero;
  FUZZ_CHECK(z.stage >= 0 && z.stage <= 3, text);
  FUZZ_CHECK(z.reduce_bucket_size >= 1 && z.allgather_bucket_size >= 1 && z.sub_group_size >= 1, text);
  FUZZ_CHECK(z.stage3_prefetch_bucket_size >= 0 && z.stage3_param_persistence_threshold >= 0, text);
  FUZZ_CHECK(z.offload_param.buffer_count >= 1 && z.offload_param.buffer_size >= 1, text);
  FUZZ_CHECK(z.offload_optimizer.buffer_count >= 1 && z.offload_optimizer.ratio == 1.0, text);
  for (const auto* op : {&z.offload_param.nvme_paths, &z.offload_optimizer.nvme_paths}) {
    for (const std::string& p : *op) FUZZ_CHECK(!p.empty(), text);
  }
  FUZZ_CHECK(z.offload_param.device != zinf::OffloadDevice::kNvme || !z.offload_param.nvme_paths.empty(), text);
  FUZZ_CHECK(z.offload_optimizer.device != zinf::OffloadDevice::kNvme || !z.offload_optimizer.nvme_paths.empty(), text);
  FUZZ_CHECK(z.offload_param.device == zinf::OffloadDevice::kNone || z.stage == 3, text);
  FUZZ_CHECK(c.aio.block_size >= 512 && c.aio.block_size % 512 == 0 && c.aio.block_size <= (int64_t{1} << 30), text);
  FUZZ_CHECK(c.aio.queue_depth >= 1 && c.aio.queue_depth <= 4096, text);
  FUZZ_CHECK(c.aio.thread_count >= 1 && c.aio.thread_count <= 256, text);
}

void CheckResolved(const zinf::Config& parsed, const zinf::AutoContext& ctx, const std::string& text) {
  zinf::Config c = parsed;
  zinf::Status st = zinf::ResolveAuto(c, ctx);
  if (!st.ok()) {
    FUZZ_CHECK(st.code() == zinf::StatusCode::kInvalidArgument && !st.message().empty(), text);
    return;
  }
  FUZZ_CHECK(c.auto_keys.empty(), text);
  FUZZ_CHECK(c.train_batch_size == c.train_micro_batch_size_per_gpu * c.gradient_accumulation_steps * ctx.world_size,
             text);
  CheckRanges(c, text);
  if (c.scheduler.type == zinf::SchedulerType::kWarmupDecayLR ||
      c.scheduler.type == zinf::SchedulerType::kWarmupCosineLR) {
    FUZZ_CHECK(c.scheduler.total_num_steps >= 1, text);
  }

  // Printed (in full, or as the changes from the defaults that `zinf plan
  // --write-config` writes), parsed and resolved again: the same config.
  const std::string printed = zinf::ConfigToJson(c);
  auto reprinted = [&](const char* what, const std::string& json_text) {
    auto again = zinf::ParseConfig(json_text, what);
    FUZZ_CHECK(again.ok(),
               text + "\n-- " + what + " --\n" + json_text + "\n-- which fails with --\n" + again.status().message());
    zinf::Status resolved = zinf::ResolveAuto(*again, ctx);
    FUZZ_CHECK(resolved.ok(),
               text + "\n-- " + what + " --\n" + json_text + "\n-- which fails to resolve --\n" + resolved.message());
    return zinf::ConfigToJson(*again);
  };
  const std::string full = reprinted("printed", printed);
  FUZZ_CHECK(full == printed, text + "\n-- printed as --\n" + printed + "\n-- then as --\n" + full);
  const std::string changes = zinf::ConfigChangesToJson(c);
  FUZZ_CHECK(reprinted("changes", changes) == printed, text + "\n-- changes --\n" + changes);
}

void FuzzConfig(std::string_view input) {
  const std::string text(input);
  auto parsed = zinf::ParseConfig(input, "fuzz");
  if (!parsed.ok()) {
    FUZZ_CHECK(parsed.status().code() == zinf::StatusCode::kInvalidArgument, text);
    FUZZ_CHECK(parsed.status().message().rfind("fuzz: ", 0) == 0, text + "\n" + parsed.status().message());
    return;
  }
  CheckRanges(*parsed, text);

  // What config-check would print before resolving: "auto" stays "auto".
  const std::string printed = zinf::ConfigToJson(*parsed);
  auto again = zinf::ParseConfig(printed, "printed");
  FUZZ_CHECK(again.ok(),
             text + "\n-- printed as --\n" + printed + "\n-- which fails with --\n" + again.status().message());
  FUZZ_CHECK(zinf::ConfigToJson(*again) == printed, text + "\n-- printed as --\n" + printed);

  // Fixed contexts: nothing known (nvme-check, tune), a trainer's (a model
  // and a step count, two ranks), and an odd world size for the batch rule.
  zinf::AutoContext bare;
  zinf::AutoContext trainer;
  trainer.world_size = 2;
  trainer.hidden_size = 768;
  trainer.total_steps = 5000;
  zinf::AutoContext odd;
  odd.world_size = 3;
  odd.hidden_size = 1;
  odd.total_steps = 1;
  for (const zinf::AutoContext* ctx : {&bare, &trainer, &odd}) CheckResolved(*parsed, *ctx, text);
}

void FuzzGptConfig(std::string_view input) {
  const std::string text(input);
  auto parsed = zinf::model::ParseGptConfig(text, "fuzz");
  if (!parsed.ok()) {
    FUZZ_CHECK(parsed.status().code() == zinf::StatusCode::kInvalidArgument, text);
    return;
  }
  const zinf::model::GptConfig& c = *parsed;
  FUZZ_CHECK(c.vocab_size >= 1 && c.seq_len >= 1 && c.n_layer >= 1 && c.n_head >= 1 && c.n_embd >= 1, text);
  FUZZ_CHECK(c.n_embd % c.n_head == 0, text);
  FUZZ_CHECK(
      c.padded_vocab_size >= c.vocab_size && c.padded_vocab_size % 64 == 0 && c.padded_vocab_size - c.vocab_size < 64,
      text);
  FUZZ_CHECK(c.NumParameters() > 0, text);
  const std::string printed = zinf::model::GptConfigToJson(c);
  auto again = zinf::model::ParseGptConfig(printed, "printed");
  FUZZ_CHECK(again.ok(), text + "\n-- printed as --\n" + printed);
  FUZZ_CHECK(zinf::model::GptConfigToJson(*again) == printed, text + "\n-- printed as --\n" + printed);
}

}  // namespace

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  const std::string_view input(reinterpret_cast<const char*>(data), size);
  FuzzConfig(input);
  FuzzGptConfig(input);
  return 0;
}
