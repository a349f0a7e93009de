// zinf train --export DIR as a user runs it, on the fixtures of
// tests/model/hf: `--steps 0` writes the loaded weights unchanged (an F32
// export of an F32 checkpoint holds the source's tensors byte for byte,
// read back with the safetensors reader), and the folder of a 1-step run
// loads in zinf (--model DIR) to the same held-out loss, to the last bit,
// as the trained weights evaluated at the end of that run; --from-config
// trains a folder's architecture from random weights.
#include <cstdlib>
#include <random>
#include <sstream>
#include <string>
#include <vector>

#include <gtest/gtest.h>

#include "model/data.h"
#include "model/safetensors.h"
#include "temp_dir.h"
#include "testing/text.h"

namespace zinf {
namespace {

using test_support::ReadAll;

std::string SourceDir() {
  const char* root = std::getenv("ZINF_SOURCE_DIR");
  return root != nullptr ? root : ".";
}

// Runs zinf with `args`; its output goes to `log`.
int Zinf(const std::string& args, const std::string& log) {
  const std::string cmd = std::string("'") + ZINF_BIN + "' " + args + " > '" + log + "' 2>&1";
  return std::system(cmd.c_str());
}

// The last "eval_loss" value of a metrics file, as printed (full precision).
std::string LastEvalLoss(const std::string& path) {
  std::istringstream in(ReadAll(path));
  std::string line, last;
  const std::string key = "\"eval_loss\":";
  while (std::getline(in, line)) {
    const size_t at = line.find(key);
    if (at != std::string::npos) last = line.substr(at + key.size(), line.find(',', at) - at - key.size());
  }
  return last;
}

// 4000 random tokens, below every fixture's vocabulary, at `path`.
void WriteTokens(const std::string& path) {
  std::mt19937 gen(7);
  std::vector<uint32_t> ids(4000);
  for (uint32_t& id : ids) id = gen() % 100;
  ASSERT_TRUE(model::WriteTokenFile(path, ids).ok());
}

class HfExportCliTest : public ::testing::TestWithParam<const char*> {
 protected:
  void SetUp() override { WriteTokens(tokens_); }
  std::string Train(const std::string& model, const std::string& more) {
    return "train --config '" + SourceDir() + "/tests/cli/hf-export.json' --device host --data '" + tokens_ +
           "' --model '" + model + "' " + more;
  }
  test_support::TempDir tmp_;
  const std::string tokens_ = tmp_.path() + "/tokens.bin";
};

TEST_P(HfExportCliTest, StepsZeroExportIsByteIdentical) {
  const std::string src = SourceDir() + "/tests/model/hf/" + GetParam(), out = tmp_.path() + "/out";
  const std::string log = tmp_.path() + "/log";
  ASSERT_EQ(Zinf(Train(src, "--steps 0 --holdout 0 --export '" + out + "' --export-dtype F32"), log), 0)
      << ReadAll(log);
  auto a = model::ReadSafetensors(src + "/model.safetensors");
  auto b = model::ReadSafetensors(out + "/model.safetensors");
  ASSERT_TRUE(a.ok() && b.ok()) << b.status().ToString();
  ASSERT_EQ(a->tensors.size(), b->tensors.size());
  for (const auto& t : a->tensors) {
    const auto* e = b->Find(t.name);
    ASSERT_NE(e, nullptr) << t.name;
    EXPECT_EQ(e->shape, t.shape) << t.name;
    EXPECT_TRUE(e->dtype == t.dtype && e->data == t.data) << t.name << " differs";
  }
  EXPECT_EQ(ReadAll(out + "/config.json"), ReadAll(src + "/config.json"));
}

TEST_P(HfExportCliTest, TrainedExportReloadsToTheSameLoss) {
  const std::string src = SourceDir() + "/tests/model/hf/" + GetParam(), out = tmp_.path() + "/out";
  const std::string log = tmp_.path() + "/log", m1 = tmp_.path() + "/m1.jsonl", m2 = tmp_.path() + "/m2.jsonl";
  ASSERT_EQ(
      Zinf(Train(src, "--steps 1 --holdout 0.1 --metrics '" + m1 + "' --export '" + out + "' --export-dtype F32"), log),
      0)
      << ReadAll(log);
  ASSERT_EQ(Zinf(Train(out, "--steps 0 --holdout 0.1 --metrics '" + m2 + "'"), log), 0) << ReadAll(log);
  const std::string trained = LastEvalLoss(m1), reloaded = LastEvalLoss(m2);
  ASSERT_FALSE(trained.empty()) << ReadAll(m1);
  EXPECT_EQ(reloaded, trained);
  // The step changed the weights: the loss before it differs.
  std::istringstream first(ReadAll(m1));
  std::string line;
  std::getline(first, line);
  EXPECT_EQ(line.find("\"eval_loss\":" + trained + ","), std::string::npos) << "the step changed nothing: " << line;
}

// --from-config: the fixture's config.json alone (no weights in the
// folder) trains that architecture from random weights; the export is a
// folder of its kind (the same config.json, the source's tensor names,
// shapes and dtypes, other values) and reloads to the run's last held-out
// loss. Without the flag such a folder is refused, saying the flag's name.
TEST_P(HfExportCliTest, FromConfigTrainsTheArchitectureFromRandomWeights) {
  const std::string src = SourceDir() + "/tests/model/hf/" + GetParam(), cfg = tmp_.path() + "/cfg";
  const std::string out = tmp_.path() + "/out", log = tmp_.path() + "/log";
  const std::string m1 = tmp_.path() + "/m1.jsonl", m2 = tmp_.path() + "/m2.jsonl";
  ASSERT_EQ(std::system(("mkdir -p '" + cfg + "' && cp '" + src + "/config.json' '" + cfg + "/'").c_str()), 0);
  ASSERT_NE(Zinf(Train(cfg, "--steps 1"), log), 0);
  EXPECT_NE(ReadAll(log).find("--from-config"), std::string::npos) << ReadAll(log);
  ASSERT_EQ(Zinf(Train(cfg, "--from-config --steps 1 --holdout 0.1 --metrics '" + m1 + "' --export '" + out +
                                "' --export-dtype F32"),
                 log),
            0)
      << ReadAll(log);
  EXPECT_NE(ReadAll(log).find("random weights"), std::string::npos) << ReadAll(log);
  EXPECT_EQ(ReadAll(out + "/config.json"), ReadAll(src + "/config.json"));
  auto a = model::ReadSafetensors(src + "/model.safetensors");
  auto b = model::ReadSafetensors(out + "/model.safetensors");
  ASSERT_TRUE(a.ok() && b.ok()) << b.status().ToString();
  ASSERT_EQ(a->tensors.size(), b->tensors.size());
  bool same_values = true;
  for (const auto& t : a->tensors) {
    const auto* e = b->Find(t.name);
    ASSERT_NE(e, nullptr) << t.name;
    EXPECT_EQ(e->shape, t.shape) << t.name;
    EXPECT_EQ(e->dtype, t.dtype) << t.name;
    same_values &= e->data == t.data;
  }
  EXPECT_FALSE(same_values) << "the random weights are the fixture's";
  ASSERT_EQ(Zinf(Train(out, "--steps 0 --holdout 0.1 --metrics '" + m2 + "'"), log), 0) << ReadAll(log);
  const std::string trained = LastEvalLoss(m1);
  ASSERT_FALSE(trained.empty()) << ReadAll(m1);
  EXPECT_EQ(LastEvalLoss(m2), trained);
}

INSTANTIATE_TEST_SUITE_P(F32Fixtures, HfExportCliTest, ::testing::Values("gpt2", "llama", "qwen3", "phi3"));

// Around a --from-config run: zinf plan reads the folder without weights;
// zinf eval --from-config scores the random weights (saying so) and, with
// --resume, the run's checkpoint; an export into a folder that holds
// weights --from-config did not read is refused.
TEST(FromConfigCliTest, PlanEvalAndAnExportOverUnreadWeights) {
  test_support::TempDir tmp;
  const std::string src = SourceDir() + "/tests/model/hf/llama", cfg = tmp.path() + "/cfg";
  const std::string log = tmp.path() + "/log", tokens = tmp.path() + "/tokens.bin", save = tmp.path() + "/save";
  WriteTokens(tokens);
  ASSERT_EQ(std::system(("mkdir -p '" + cfg + "' && cp '" + src + "/config.json' '" + cfg + "/'").c_str()), 0);
  ASSERT_EQ(Zinf("plan --model '" + cfg + "' --seq-len 16 --gpu-mem 8G --cpu-mem 16G", log), 0) << ReadAll(log);
  const std::string train = "train --config '" + SourceDir() + "/tests/cli/hf-export.json' --device host --data '" +
                            tokens + "' --model '" + cfg + "' --from-config ";
  ASSERT_EQ(Zinf(train + "--steps 2 --save-dir '" + save + "'", log), 0) << ReadAll(log);
  const std::string eval = "eval --device host --data '" + tokens + "' --model '" + cfg + "' --from-config ";
  ASSERT_EQ(Zinf(eval, log), 0) << ReadAll(log);
  const std::string random = ReadAll(log);
  EXPECT_NE(random.find("initial weights (seed"), std::string::npos) << random;
  ASSERT_EQ(Zinf(eval + "--resume '" + save + "'", log), 0) << ReadAll(log);
  const std::string trained = ReadAll(log);
  EXPECT_NE(trained.find("checkpoint"), std::string::npos) << trained;
  const auto loss = [](const std::string& out) { return out.substr(out.find("\nloss ") + 1, 16); };
  ASSERT_NE(random.find("\nloss "), std::string::npos) << random;
  ASSERT_NE(trained.find("\nloss "), std::string::npos) << trained;
  EXPECT_NE(loss(random), loss(trained));
  ASSERT_EQ(std::system(("cp '" + src + "/model.safetensors' '" + cfg + "/'").c_str()), 0);
  ASSERT_NE(Zinf(train + "--steps 0 --export '" + cfg + "'", log), 0);
  EXPECT_NE(ReadAll(log).find("holds weights of its own"), std::string::npos) << ReadAll(log);
}

// --from-config is for a HF folder, and not a multimodal one (its export
// would need the vision side's weights); each refusal says why.
TEST(FromConfigCliTest, ABuiltInAndAMultimodalFolderAreRefused) {
  test_support::TempDir tmp;
  const std::string log = tmp.path() + "/log", config = SourceDir() + "/tests/cli/hf-export.json";
  ASSERT_NE(Zinf("train --config '" + config + "' --device host --model tiny --from-config --steps 1", log), 0);
  EXPECT_NE(ReadAll(log).find("--from-config needs a Hugging Face model folder"), std::string::npos) << ReadAll(log);
  const std::string cfg = tmp.path() + "/mm";
  ASSERT_EQ(std::system(("mkdir -p '" + cfg + "' && cp '" + SourceDir() + "/tests/model/hf/gemma3-mm/config.json' '" +
                         cfg + "/'")
                            .c_str()),
            0);
  ASSERT_NE(Zinf("train --config '" + config + "' --device host --model '" + cfg + "' --from-config --steps 1", log),
            0);
  EXPECT_NE(ReadAll(log).find("vision side has no weights"), std::string::npos) << ReadAll(log);
  // Without the flag, the folder's missing weights are named, not the flag.
  ASSERT_NE(Zinf("train --config '" + config + "' --device host --model '" + cfg + "' --steps 1", log), 0);
  EXPECT_NE(ReadAll(log).find("safetensors"), std::string::npos) << ReadAll(log);
  EXPECT_EQ(ReadAll(log).find("--from-config"), std::string::npos) << ReadAll(log);
}

}  // namespace
}  // namespace zinf
