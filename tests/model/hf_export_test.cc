// Hugging Face folders out (hf_export.h): exporting the weights read from
// each fixture (tests/model/hf) gives the source's tensors back: byte for
// byte in F32 from an F32 checkpoint, under the same names, shapes and
// layouts (GPT-2 Conv1D transposed back, vocabulary padding dropped);
// shards with their index read back as the same model; zinf's own GPT
// becomes a GPT2LMHeadModel that OpenHfCheckpoint reads as the same model.
#include "model/hf_export.h"

#include <cstdlib>
#include <filesystem>
#include <string>
#include <utility>
#include <vector>

#include <gtest/gtest.h>
#include <nlohmann/json.hpp>

#include "model/gpt.h"
#include "model/hf_checkpoint.h"
#include "model/model_test_util.h"
#include "model/safetensors.h"

namespace zinf::model {
namespace {

using testing::FixtureDir;
using testing::TempDir;

BlockReader ReaderOf(const HfCheckpoint& ckpt, const GptConfig& model) {
  return [&ckpt, model](BlockId b, std::vector<std::vector<float>>* master) {
    ZINF_ASSIGN_OR_RETURN(*master, ReadHfBlock(ckpt, model, b));
    return Status::Ok();
  };
}

class HfExportTest : public ::testing::TestWithParam<const char*> {};

// F32 fixtures: every tensor byte-identical; the config copied.
// Exports fixture `fixture` in `dtype` to `out`; the source's and the
// export's model.safetensors into *src_file and *out_file.
void ExportFixture(const std::string& fixture, const std::string& dtype, const std::string& out,
                   SafetensorsFile* src_file, SafetensorsFile* out_file) {
  const std::string src = FixtureDir(fixture);
  auto ckpt = OpenHfCheckpoint(src);
  ASSERT_TRUE(ckpt.ok()) << ckpt.status().ToString();
  auto model = HfModelAtSeqLen(*ckpt, 0);
  ASSERT_TRUE(model.ok()) << model.status().ToString();
  ASSERT_TRUE(ExportHfFolder(out, *model, &*ckpt, dtype, ReaderOf(*ckpt, *model)).ok());
  auto a = ReadSafetensors(src + "/model.safetensors");
  auto b = ReadSafetensors(out + "/model.safetensors");
  ASSERT_TRUE(a.ok() && b.ok()) << b.status().ToString();
  *src_file = std::move(*a);
  *out_file = std::move(*b);
}

TEST_P(HfExportTest, F32ExportOfF32CheckpointIsByteIdentical) {
  TempDir tmp;
  const std::string src = FixtureDir(GetParam()), out = tmp.path() + "/out";
  SafetensorsFile source, exported;
  ASSERT_NO_FATAL_FAILURE(ExportFixture(GetParam(), "F32", out, &source, &exported));
  const SafetensorsFile *a = &source, *b = &exported;
  ASSERT_EQ(a->tensors.size(), b->tensors.size());
  for (const SafetensorsFile::Tensor& t : a->tensors) {
    const SafetensorsFile::Tensor* e = b->Find(t.name);
    ASSERT_NE(e, nullptr) << t.name;
    EXPECT_EQ(e->dtype, "F32") << t.name;
    EXPECT_EQ(e->shape, t.shape) << t.name;
    EXPECT_TRUE(e->data == t.data) << t.name << " differs";
  }
  EXPECT_EQ(testing::ReadBytes(out + "/config.json"), testing::ReadBytes(src + "/config.json"));
  EXPECT_FALSE(std::filesystem::exists(out + "/model.safetensors.index.json"));
}

INSTANTIATE_TEST_SUITE_P(F32Fixtures, HfExportTest,
                         ::testing::Values("gpt2", "llama", "qwen3", "phi3", "phi3-longrope", "gemma3", "gemma2",
                                           "granite", "qwen3-yarn", "exaone4", "seed-oss", "glm", "ernie4_5",
                                           "qwen3_moe", "olmoe", "qwen2_moe", "qwen3_moe-dense", "glm4_moe",
                                           "ernie4_5_moe", "deepseek_v3", "deepseek_v2"));

// A 16-bit export keeps the weight and selection bias of a router with
// one in F32, as transformers saves GLM-4.5's and ERNIE 4.5's (the F32
// fixture's bytes as they are; ERNIE's bias as its row [1, E]); the other
// matrices are BF16.
TEST(HfExportTest, Bf16ExportKeepsBiasedRoutersInF32) {
  for (const auto& [fixture, bias] :
       {std::pair{"glm4_moe", "model.layers.2.mlp.gate.e_score_correction_bias"},
        std::pair{"ernie4_5_moe", "model.layers.2.mlp.moe_statics.e_score_correction_bias"},
        std::pair{"deepseek_v3", "model.layers.2.mlp.gate.e_score_correction_bias"}}) {
    SCOPED_TRACE(fixture);
    TempDir tmp;
    const std::string out = tmp.path() + "/out";
    SafetensorsFile source, exported;
    ASSERT_NO_FATAL_FAILURE(ExportFixture(fixture, "BF16", out, &source, &exported));
    const SafetensorsFile *a = &source, *b = &exported;
    for (const char* name : {"model.layers.1.mlp.gate.weight", bias}) {
      const SafetensorsFile::Tensor* e = b->Find(name);
      ASSERT_NE(e, nullptr) << name;
      EXPECT_EQ(e->dtype, "F32") << name;
      EXPECT_EQ(e->shape, a->Find(name)->shape) << name;
      EXPECT_TRUE(e->data == a->Find(name)->data) << name;
    }
    EXPECT_EQ(b->Find("model.layers.1.mlp.experts.0.gate_proj.weight")->dtype, "BF16");
    EXPECT_EQ(b->Find("model.layers.0.mlp.gate_proj.weight")->dtype, "BF16");  // the dense layer's
    auto back = OpenHfCheckpoint(out);                                         // and it reads back
    ASSERT_TRUE(back.ok()) << back.status().ToString();
  }
}

// Small shards: several files and an index naming every tensor once; the
// folder opens as the same model with the same fp32 weights (the BF16
// fixture exported BF16, the F32 one with fused projections F32: the stored
// values round-trip exactly; a fused tensor's parts stay in one shard).
// Tokenizer files present in the source are copied.
class HfExportShardsTest : public ::testing::TestWithParam<std::pair<const char*, const char*>> {};

TEST_P(HfExportShardsTest, ShardedFolderReadsBackAsTheSameModel) {
  const auto [fixture, dtype] = GetParam();
  TempDir tmp;
  const std::string src = tmp.path() + "/src", out = tmp.path() + "/out";
  std::filesystem::copy(FixtureDir(fixture), src, std::filesystem::copy_options::recursive);
  testing::WriteBytes(src + "/tokenizer.json", "{\"version\": \"1.0\"}");
  auto ckpt = OpenHfCheckpoint(src);
  ASSERT_TRUE(ckpt.ok()) << ckpt.status().ToString();
  auto model = HfModelAtSeqLen(*ckpt, 0);
  ASSERT_TRUE(model.ok());
  ASSERT_TRUE(ExportHfFolder(out, *model, &*ckpt, dtype, ReaderOf(*ckpt, *model), /*max_shard_bytes=*/4096).ok());
  EXPECT_FALSE(std::filesystem::exists(out + "/model.safetensors"));
  EXPECT_EQ(testing::ReadBytes(out + "/tokenizer.json"), "{\"version\": \"1.0\"}");
  // Exported again unsharded into the same folder: the old index goes.
  const std::string again = tmp.path() + "/again";
  std::filesystem::copy(out, again, std::filesystem::copy_options::recursive);
  ASSERT_TRUE(ExportHfFolder(again, *model, &*ckpt, dtype, ReaderOf(*ckpt, *model)).ok());
  EXPECT_TRUE(std::filesystem::exists(again + "/model.safetensors"));
  EXPECT_FALSE(std::filesystem::exists(again + "/model.safetensors.index.json"));
  const auto index = nlohmann::json::parse(testing::ReadBytes(out + "/model.safetensors.index.json"));
  EXPECT_EQ(index["weight_map"].size(), ckpt->tensors.size());
  std::set<std::string> shards;
  for (const auto& [name, file] : index["weight_map"].items()) shards.insert(file.get<std::string>());
  EXPECT_GT(shards.size(), 2u);
  for (const std::string& s : shards) {
    auto f = ReadSafetensors(out + "/" + s);
    ASSERT_TRUE(f.ok()) << f.status().ToString();
    int64_t bytes = 0;
    for (const auto& t : f->tensors) bytes += static_cast<int64_t>(t.data.size());
    EXPECT_TRUE(bytes <= 4096 || f->tensors.size() == 1) << s << " holds " << bytes << " bytes";
  }
  auto back = OpenHfCheckpoint(out);
  ASSERT_TRUE(back.ok()) << back.status().ToString();
  for (BlockId b = 0; b <= HeadBlock(*model); ++b) {
    auto x = ReadHfBlock(*ckpt, *model, b);
    auto y = ReadHfBlock(*back, *model, b);
    ASSERT_TRUE(x.ok() && y.ok());
    EXPECT_TRUE(*x == *y) << "block " << b;
  }
}

INSTANTIATE_TEST_SUITE_P(Fixtures, HfExportShardsTest,
                         ::testing::Values(std::pair{"qwen2", "BF16"}, std::pair{"phi3", "F32"},
                                           std::pair{"smollm3", "BF16"}, std::pair{"gemma", "BF16"},
                                           std::pair{"gemma3-mm", "BF16"}, std::pair{"glm4", "BF16"},
                                           std::pair{"mixtral", "BF16"}, std::pair{"dots1", "BF16"}));

// A multimodal Gemma 3 exported F32: its language model in F32, the vision
// tower's and projector's tensors (not part of the model) byte for byte and
// in their own dtype, beside them; the processor's files copied.
TEST(HfExportTest, MultimodalExportKeepsTheVisionTensorsAsTheyAre) {
  TempDir tmp;
  const std::string src = tmp.path() + "/src", out = tmp.path() + "/out";
  std::filesystem::copy(FixtureDir("gemma3-mm"), src, std::filesystem::copy_options::recursive);
  testing::WriteBytes(src + "/preprocessor_config.json", "{}");
  auto ckpt = OpenHfCheckpoint(src);
  ASSERT_TRUE(ckpt.ok()) << ckpt.status().ToString();
  ASSERT_FALSE(ckpt->kept.empty());
  auto model = HfModelAtSeqLen(*ckpt, 0);
  ASSERT_TRUE(model.ok());
  ASSERT_TRUE(ExportHfFolder(out, *model, &*ckpt, "F32", ReaderOf(*ckpt, *model)).ok());
  auto a = ReadSafetensors(src + "/model.safetensors");
  auto b = ReadSafetensors(out + "/model.safetensors");
  ASSERT_TRUE(a.ok() && b.ok()) << b.status().ToString();
  ASSERT_EQ(a->tensors.size(), b->tensors.size());
  int kept = 0;
  for (const SafetensorsFile::Tensor& t : a->tensors) {
    const SafetensorsFile::Tensor* e = b->Find(t.name);
    ASSERT_NE(e, nullptr) << t.name;
    EXPECT_EQ(e->shape, t.shape) << t.name;
    if (t.name.rfind("language_model.", 0) == 0) {
      EXPECT_EQ(e->dtype, "F32") << t.name;
    } else {
      ++kept;
      EXPECT_EQ(e->dtype, t.dtype) << t.name;
      EXPECT_TRUE(e->data == t.data) << t.name << " differs";
    }
  }
  EXPECT_EQ(kept, static_cast<int>(ckpt->kept.size()));
  EXPECT_EQ(testing::ReadBytes(out + "/preprocessor_config.json"), "{}");
  auto back = OpenHfCheckpoint(out);
  ASSERT_TRUE(back.ok()) << back.status().ToString();
  EXPECT_EQ(back->kept, ckpt->kept);
  // Into its own folder: the vision tensors would be read from files being rewritten.
  const Status self = ExportHfFolder(src + "/.", *model, &*ckpt, "F32", ReaderOf(*ckpt, *model));
  EXPECT_EQ(self.code(), StatusCode::kInvalidArgument);
  EXPECT_NE(self.message().find("the source folder itself"), std::string::npos) << self.ToString();
  EXPECT_EQ(testing::ReadBytes(src + "/model.safetensors"),
            testing::ReadBytes(FixtureDir("gemma3-mm") + "/model.safetensors"));
}

// zinf's own GPT: a GPT2LMHeadModel folder that reads back as the same
// model (untied, so the head is exported too), weights equal.
TEST(HfExportOwnGptTest, OwnGptBecomesGpt2Folder) {
  TempDir tmp;
  const std::string out = tmp.path() + "/out";
  auto m = LoadGptConfig("tiny");
  ASSERT_TRUE(m.ok());
  GptConfig model = *m;
  model.tied_embeddings = false;
  const std::vector<BlockSpec> specs = GptBlockSpecs(model);
  auto weights = [&](BlockId b, std::vector<std::vector<float>>* w) {
    w->clear();
    for (size_t t = 0; t < specs[b].tensors.size(); ++t) {
      std::vector<float> v(static_cast<size_t>(specs[b].tensors[t].numel()));
      for (size_t i = 0; i < v.size(); ++i) v[i] = static_cast<float>((b * 31 + t * 7 + i) % 97) / 97.0f;
      // The padding rows are not exported; they read back as 0.
      const bool vocab = (b == kEmbedBlock && t == kWte) || (b == HeadBlock(model) && t == kLmHead);
      if (vocab) std::fill(v.begin() + static_cast<int64_t>(model.vocab_size) * model.n_embd, v.end(), 0.0f);
      w->push_back(std::move(v));
    }
    return Status::Ok();
  };
  ASSERT_TRUE(ExportHfFolder(out, model, nullptr, "F32", weights).ok());
  auto back = OpenHfCheckpoint(out);
  ASSERT_TRUE(back.ok()) << back.status().ToString();
  EXPECT_EQ(back->architecture, "GPT2LMHeadModel");
  auto again = HfModelAtSeqLen(*back, 0);
  ASSERT_TRUE(again.ok());
  EXPECT_EQ(GptConfigToJson(*again), GptConfigToJson(model));
  for (BlockId b = 0; b <= HeadBlock(model); ++b) {
    auto y = ReadHfBlock(*back, model, b);
    ASSERT_TRUE(y.ok());
    std::vector<std::vector<float>> w;
    ASSERT_TRUE(weights(b, &w).ok());
    EXPECT_TRUE(*y == w) << "block " << b;
  }
}

TEST(HfExportErrorsTest, UnknownDtypeIsNamed) {
  TempDir tmp;
  auto m = LoadGptConfig("tiny");
  ASSERT_TRUE(m.ok());
  const Status s = ExportHfFolder(tmp.path() + "/out", *m, nullptr, "F64", nullptr);
  EXPECT_EQ(s.code(), StatusCode::kInvalidArgument);
  EXPECT_NE(s.ToString().find("F64"), std::string::npos);
}

}  // namespace
}  // namespace zinf::model
