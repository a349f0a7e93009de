// "auto" as the HuggingFace Trainer fills it: from TrainerArgs (the flags
// --lr, --micro-batch, ...) when given, else TrainingArguments' defaults; a
// flag against a number the file set is an error, as in HF.
#include <cstdlib>
#include <fstream>
#include <sstream>
#include <string>
#include <vector>

#include <gtest/gtest.h>

#include "core/config_test_util.h"
#include "zinf/config.h"

namespace zinf {
namespace {

using test_support::MustParse;

// The HF docs' ZeRO-3 config: every value the Trainer fills is "auto".
std::string HfZero3Text() {
  const char* src = std::getenv("ZINF_SOURCE_DIR");
  std::ifstream in(std::string(src ? src : ".") + "/tests/cli/hf-zero3-auto.json");
  EXPECT_TRUE(in.good()) << "set ZINF_SOURCE_DIR";
  std::stringstream buf;
  buf << in.rdbuf();
  return buf.str();
}

AutoContext Ctx(int world, std::optional<int64_t> hidden = 768, TrainerArgs args = {}) {
  AutoContext ctx;
  ctx.world_size = world;
  ctx.hidden_size = hidden;
  ctx.trainer = args;
  return ctx;
}

// The resolution of `key`, or a failure naming it.
const AutoResolution* Find(const std::vector<AutoResolution>& rs, const std::string& key) {
  for (const AutoResolution& r : rs) {
    if (r.key == key) return &r;
  }
  ADD_FAILURE() << "no resolution for " << key;
  return nullptr;
}

std::string Line(const std::vector<AutoResolution>& rs, const std::string& key) {
  const AutoResolution* r = Find(rs, key);
  return r ? r->key + ": " + r->from + " -> " + r->value + " (" + r->rule + ")" : "";
}

TEST(ConfigTrainerTest, HfDocsZero3ConfigTakesTrainingArgumentsDefaults) {
  Config c = MustParse(HfZero3Text());
  EXPECT_EQ(c.auto_keys.size(), 16u);
  std::vector<AutoResolution> rs;
  Status s = ResolveAuto(c, Ctx(2), &rs);
  ASSERT_TRUE(s.ok()) << s.ToString();
  EXPECT_EQ(rs.size(), 16u);  // one line per "auto"
  EXPECT_EQ(c.optimizer.lr, 5e-5);
  EXPECT_EQ(c.optimizer.beta1, 0.9);
  EXPECT_EQ(c.optimizer.beta2, 0.999);
  EXPECT_EQ(c.optimizer.eps, 1e-8);
  EXPECT_EQ(c.optimizer.weight_decay, 0.0);
  EXPECT_EQ(c.gradient_clipping, 1.0);
  EXPECT_EQ(c.scheduler.warmup_min_lr, 0.0);
  EXPECT_EQ(c.scheduler.warmup_max_lr, 5e-5);
  EXPECT_EQ(c.scheduler.warmup_num_steps, 0);
  EXPECT_EQ(c.train_micro_batch_size_per_gpu, 8);
  EXPECT_EQ(c.gradient_accumulation_steps, 1);
  EXPECT_EQ(c.train_batch_size, 16);
  EXPECT_FALSE(c.fp16.enabled);
  EXPECT_TRUE(c.bf16.enabled);
  EXPECT_EQ(c.zero.reduce_bucket_size, 768 * 768);
  EXPECT_EQ(c.zero.stage3_prefetch_bucket_size, static_cast<int64_t>(0.9 * 768 * 768));
  EXPECT_EQ(c.zero.stage3_param_persistence_threshold, 7680);
  EXPECT_EQ(Line(rs, "optimizer.params.lr"),
            "optimizer.params.lr: auto -> 5e-05 (HF TrainingArguments default learning_rate)");
  EXPECT_EQ(Line(rs, "optimizer.params.betas"),
            "optimizer.params.betas: auto -> [0.9,0.999] (HF TrainingArguments defaults adam_beta1, adam_beta2)");
  EXPECT_EQ(Line(rs, "train_batch_size"), "train_batch_size: auto -> 16 (micro 8 x accumulation 1 x world 2)");
  EXPECT_EQ(Line(rs, "scheduler.params.warmup_max_lr"),
            "scheduler.params.warmup_max_lr: auto -> 5e-05 (optimizer.params.lr)");
  EXPECT_EQ(Line(rs, "gradient_clipping"),
            "gradient_clipping: auto -> 1.0 (HF TrainingArguments default max_grad_norm)");
  EXPECT_EQ(Line(rs, "zero_optimization.reduce_bucket_size"),
            "zero_optimization.reduce_bucket_size: auto -> 589824 (hidden_size^2, hidden size 768)");

  // What config-check prints parses back and resolves to itself.
  const std::string printed = ConfigToJson(c);
  Config again = MustParse(printed);
  ASSERT_TRUE(ResolveAuto(again, Ctx(2)).ok());
  EXPECT_EQ(ConfigToJson(again), printed);
}

TEST(ConfigTrainerTest, HfDocsZero3ConfigNeedsTheModelForItsBuckets) {
  Config c = MustParse(HfZero3Text());
  Status s = ResolveAuto(c, Ctx(1, std::nullopt));
  ASSERT_FALSE(s.ok());
  EXPECT_NE(s.message().find("zero_optimization.reduce_bucket_size: \"auto\" is worked out from the model's hidden"),
            std::string::npos)
      << s.message();
}

// Each flag sets its "auto" key, one at a time.
TEST(ConfigTrainerTest, EachFlagFillsItsAutoKey) {
  struct Case {
    const char* flag;
    void (*set)(TrainerArgs&);
    bool (*check)(const Config&);
    const char* key;
  };
  const Case cases[] = {
      {"--lr", [](TrainerArgs& a) { a.lr = 3e-4; },
       [](const Config& c) { return c.optimizer.lr == 3e-4 && c.scheduler.warmup_max_lr == 3e-4; },
       "optimizer.params.lr"},
      {"--weight-decay", [](TrainerArgs& a) { a.weight_decay = 0.1; },
       [](const Config& c) { return c.optimizer.weight_decay == 0.1; }, "optimizer.params.weight_decay"},
      {"--adam-beta1", [](TrainerArgs& a) { a.adam_beta1 = 0.8; },
       [](const Config& c) { return c.optimizer.beta1 == 0.8 && c.optimizer.beta2 == 0.999; },
       "optimizer.params.betas"},
      {"--adam-beta2", [](TrainerArgs& a) { a.adam_beta2 = 0.95; },
       [](const Config& c) { return c.optimizer.beta1 == 0.9 && c.optimizer.beta2 == 0.95; }, "optimizer.params.betas"},
      {"--adam-epsilon", [](TrainerArgs& a) { a.adam_epsilon = 1e-6; },
       [](const Config& c) { return c.optimizer.eps == 1e-6; }, "optimizer.params.eps"},
      {"--max-grad-norm", [](TrainerArgs& a) { a.max_grad_norm = 0.5; },
       [](const Config& c) { return c.gradient_clipping == 0.5; }, "gradient_clipping"},
      {"--warmup-steps", [](TrainerArgs& a) { a.warmup_steps = 40; },
       [](const Config& c) { return c.scheduler.warmup_num_steps == 40; }, "scheduler.params.warmup_num_steps"},
      {"--micro-batch", [](TrainerArgs& a) { a.micro_batch = 3; },
       [](const Config& c) { return c.train_micro_batch_size_per_gpu == 3 && c.train_batch_size == 6; },
       "train_micro_batch_size_per_gpu"},
      {"--grad-accum", [](TrainerArgs& a) { a.grad_accum = 4; },
       [](const Config& c) { return c.gradient_accumulation_steps == 4 && c.train_batch_size == 64; },
       "gradient_accumulation_steps"},
  };
  for (const Case& k : cases) {
    SCOPED_TRACE(k.flag);
    Config c = MustParse(HfZero3Text());
    TrainerArgs args;
    k.set(args);
    std::vector<AutoResolution> rs;
    Status s = ResolveAuto(c, Ctx(2, 768, args), &rs);
    ASSERT_TRUE(s.ok()) << s.ToString();
    EXPECT_TRUE(k.check(c));
    const AutoResolution* r = Find(rs, k.key);
    ASSERT_NE(r, nullptr);
    EXPECT_EQ(r->from, "auto");
    EXPECT_NE(r->rule.find(k.flag), std::string::npos) << r->rule;
  }
}

// A flag fills a key the file left out; the line says what it replaced.
TEST(ConfigTrainerTest, FlagFillsAKeyTheFileLeftOut) {
  Config c = MustParse(R"({"optimizer": {"type": "AdamW", "params": {}},
      "scheduler": {"type": "WarmupLR", "params": {}}})");
  TrainerArgs a;
  a.lr = 2e-4;
  a.max_grad_norm = 0.25;
  a.warmup_steps = 7;
  a.micro_batch = 2;
  a.grad_accum = 3;
  std::vector<AutoResolution> rs;
  ASSERT_TRUE(ResolveAuto(c, Ctx(1, std::nullopt, a), &rs).ok());
  EXPECT_EQ(c.optimizer.lr, 2e-4);
  EXPECT_EQ(c.scheduler.warmup_max_lr, 2e-4);  // the schedule peaks at the flag's lr, not DeepSpeed's 1e-3
  EXPECT_EQ(c.gradient_clipping, 0.25);
  EXPECT_EQ(c.scheduler.warmup_num_steps, 7);
  EXPECT_EQ(c.train_batch_size, 6);
  EXPECT_EQ(Line(rs, "optimizer.params.lr"), "optimizer.params.lr: default 0.001 -> 0.0002 (--lr)");
  EXPECT_EQ(Line(rs, "gradient_clipping"), "gradient_clipping: default 0.0 -> 0.25 (--max-grad-norm)");
}

// A flag that disagrees with a number in the file is refused, naming both
// (the HF Trainer refuses it too); one that agrees is fine.
TEST(ConfigTrainerTest, FlagAgainstANumberInTheFileIsAnError) {
  const std::string text = R"({"train_micro_batch_size_per_gpu": 4, "gradient_clipping": 1.0,
      "optimizer": {"type": "AdamW", "params": {"lr": 3e-4, "betas": [0.9, 0.95]}},
      "scheduler": {"type": "WarmupLR", "params": {"warmup_max_lr": 3e-4, "warmup_num_steps": 10}}})";
  TrainerArgs agree;
  agree.lr = 3e-4;
  agree.adam_beta2 = 0.95;
  agree.micro_batch = 4;
  agree.max_grad_norm = 1.0;
  agree.warmup_steps = 10;
  Config ok = MustParse(text);
  EXPECT_TRUE(ResolveAuto(ok, Ctx(1, std::nullopt, agree)).ok());

  TrainerArgs disagree;
  disagree.lr = 1e-3;
  disagree.adam_beta2 = 0.999;
  disagree.micro_batch = 8;
  disagree.max_grad_norm = 0.5;
  disagree.warmup_steps = 20;
  Config bad = MustParse(text);
  Status s = ResolveAuto(bad, Ctx(1, std::nullopt, disagree));
  ASSERT_FALSE(s.ok());
  for (const char* fragment : {"optimizer.params.lr: the config sets 0.0003 but --lr is 0.001",
                               "scheduler.params.warmup_max_lr: the config sets 0.0003 but --lr is 0.001",
                               "optimizer.params.betas[1]: the config sets 0.95 but --adam-beta2 is 0.999",
                               "train_micro_batch_size_per_gpu: the config sets 4 but --micro-batch is 8",
                               "gradient_clipping: the config sets 1.0 but --max-grad-norm is 0.5",
                               "scheduler.params.warmup_num_steps: the config sets 10 but --warmup-steps is 20"}) {
    EXPECT_NE(s.message().find(fragment), std::string::npos) << fragment << "\n" << s.message();
  }
}

TEST(ConfigTrainerTest, WarmupMaxLrFollowsTheConfigsLr) {
  Config c = MustParse(R"({"optimizer": {"type": "AdamW", "params": {"lr": 6e-4}},
      "scheduler": {"type": "WarmupDecayLR", "params": {"warmup_max_lr": "auto", "warmup_min_lr": "auto",
                    "total_num_steps": 100}}})");
  ASSERT_TRUE(ResolveAuto(c, Ctx(1)).ok());
  EXPECT_EQ(c.scheduler.warmup_max_lr, 6e-4);
  EXPECT_EQ(c.scheduler.warmup_min_lr, 0.0);
}

TEST(ConfigTrainerTest, WarmupStepsWithoutASchedulerIsAnError) {
  Config c = MustParse("{}");
  TrainerArgs a;
  a.warmup_steps = 5;
  Status s = ResolveAuto(c, Ctx(1, std::nullopt, a));
  ASSERT_FALSE(s.ok());
  EXPECT_NE(s.message().find("--warmup-steps needs a scheduler"), std::string::npos) << s.message();
}

// HF fills micro and accumulation and checks train_batch_size against them.
TEST(ConfigTrainerTest, AutoMicroBatchMustAgreeWithAGivenTrainBatch) {
  Config c = MustParse(R"({"train_batch_size": 12, "train_micro_batch_size_per_gpu": "auto"})");
  Status s = ResolveAuto(c, Ctx(1));
  ASSERT_FALSE(s.ok());
  EXPECT_NE(s.message().find("train_batch_size: 12 is not divisible by train_micro_batch_size_per_gpu (8)"),
            std::string::npos)
      << s.message();
  Config d = MustParse(R"({"train_batch_size": 12, "train_micro_batch_size_per_gpu": "auto"})");
  TrainerArgs a;
  a.micro_batch = 3;
  ASSERT_TRUE(ResolveAuto(d, Ctx(2, 768, a)).ok());
  EXPECT_EQ(d.gradient_accumulation_steps, 2);
}

}  // namespace
}  // namespace zinf
