// Tokenizers against the Python libraries, id for id: the fixtures and the
// reference ids come from tests/model/make_tokenizer_fixtures.py (HF
// `tokenizers` for the byte-level BPEs in GPT-2's, Llama 3's and Qwen2's
// styles and the byte-fallback BPEs converted from SentencePiece (Llama 2's
// legacy form, the Metaspace form), `sentencepiece` for tokenizer.model) on
// a multilingual text.
#include "model/tokenizer.h"

#include <gtest/gtest.h>

#include <algorithm>

#include <nlohmann/json.hpp>
#include <string>
#include <vector>

#include "core/fs.h"
#include "model/model_test_util.h"

namespace zinf::model {
namespace {

using testing::ReadBytes;
using testing::TempDir;
using testing::WriteBytes;

std::string Fixtures() { return ZINF_TOKENIZER_FIXTURES; }

nlohmann::json Reference() { return nlohmann::json::parse(ReadBytes(Fixtures() + "/reference.json")); }

class TokenizerParity : public ::testing::TestWithParam<const char*> {};

TEST_P(TokenizerParity, IdsEqualThePythonLibrarysIdForId) {
  const std::string name = GetParam();
  const nlohmann::json ref = Reference();
  auto tok = Tokenizer::Load(Fixtures() + "/" + name);
  ASSERT_TRUE(tok.ok()) << tok.status().ToString();
  // A fixture may have a text of its own.
  const std::string text = ref[name].value("text", ref["text"].get<std::string>());
  auto ids = (*tok)->Encode(text);
  ASSERT_TRUE(ids.ok()) << ids.status().ToString();
  const std::vector<uint32_t> want = ref[name]["ids"].get<std::vector<uint32_t>>();
  ASSERT_EQ(ids->size(), want.size());
  for (size_t i = 0; i < want.size(); ++i) ASSERT_EQ((*ids)[i], want[i]) << name << ": id " << i;
  EXPECT_EQ((*tok)->eos_id(), ref[name]["eos"].get<uint32_t>());
  EXPECT_GT((*tok)->vocab_size(), static_cast<int64_t>((*tok)->eos_id()));
  // Encoding again (now from the word cache) gives the same.
  EXPECT_EQ(*(*tok)->Encode(text), *ids);
}

INSTANTIATE_TEST_SUITE_P(Fixtures, TokenizerParity,
                         ::testing::Values("gpt2", "llama3", "qwen2", "sp", "llama2", "metaspace"));

// The byte-fallback fixtures exercise what they are for: characters outside
// the vocabulary as <0xNN> tokens, and (metaspace/, which lacks <0xF0>)
// fused <unk>s.
TEST(Tokenizer, ByteFallbackGivesByteTokensAndFusedUnk) {
  auto tok = Tokenizer::Load(Fixtures() + "/llama2");
  ASSERT_TRUE(tok.ok()) << tok.status().ToString();
  EXPECT_NE((*tok)->description().find("byte fallback"), std::string::npos) << (*tok)->description();
  EXPECT_EQ((*tok)->eos_token(), "</s>");
  // "☃" (E2 98 83) is not in the training text: three byte tokens, ids
  // 3 + byte (the vocabulary's order: <unk>, <s>, </s>, <0x00>...).
  auto snow = (*tok)->Encode("\u2603");
  ASSERT_TRUE(snow.ok()) << snow.status().ToString();
  const std::vector<uint32_t> bytes = {3 + 0xE2, 3 + 0x98, 3 + 0x83};
  ASSERT_GE(snow->size(), 3u);
  EXPECT_EQ(std::vector<uint32_t>(snow->end() - 3, snow->end()), bytes);

  auto meta = Tokenizer::Load(Fixtures() + "/metaspace");
  ASSERT_TRUE(meta.ok()) << meta.status().ToString();
  // Two 4-byte characters in a row: one <unk> (id 0).
  auto unk = (*meta)->Encode("\U0001D518\U0001D52B");
  ASSERT_TRUE(unk.ok()) << unk.status().ToString();
  EXPECT_EQ(std::count(unk->begin(), unk->end(), 0u), 1) << unk->size();
}

TEST(Tokenizer, LoadsATokenizerJsonFileDirectly) {
  auto tok = Tokenizer::Load(Fixtures() + "/llama3/tokenizer.json");
  ASSERT_TRUE(tok.ok()) << tok.status().ToString();
  EXPECT_EQ((*tok)->eos_token(), "<|end_of_text|>");  // from tokenizer_config.json beside it
  EXPECT_EQ((*tok)->eos_id(), 128001u);
  EXPECT_NE((*tok)->description().find("byte-level BPE"), std::string::npos);
}

TEST(Tokenizer, EosOverride) {
  auto tok = Tokenizer::Load(Fixtures() + "/qwen2", "<|im_end|>");
  ASSERT_TRUE(tok.ok()) << tok.status().ToString();
  EXPECT_EQ((*tok)->eos_id(), 151645u);
  auto bad = Tokenizer::Load(Fixtures() + "/qwen2", "<|nope|>");
  ASSERT_FALSE(bad.ok());
  EXPECT_NE(bad.status().message().find("<|nope|>"), std::string::npos) << bad.status().ToString();
}

TEST(Tokenizer, SpecialTokensInTheTextAreOneId) {
  auto tok = Tokenizer::Load(Fixtures() + "/gpt2");
  ASSERT_TRUE(tok.ok()) << tok.status().ToString();
  auto ids = (*tok)->Encode("a<|endoftext|><|endoftext|>b");
  ASSERT_TRUE(ids.ok());
  ASSERT_EQ(ids->size(), 4u);
  EXPECT_EQ((*ids)[1], (*tok)->eos_id());
  EXPECT_EQ((*ids)[2], (*tok)->eos_id());
  EXPECT_TRUE((*tok)->Encode("").value().empty());
}

TEST(Tokenizer, BadUtf8NamesTheByte) {
  auto tok = Tokenizer::Load(Fixtures() + "/llama3");
  ASSERT_TRUE(tok.ok()) << tok.status().ToString();
  auto ids = (*tok)->Encode("abc\xC3(def");
  ASSERT_FALSE(ids.ok());
  EXPECT_NE(ids.status().message().find("not UTF-8 at byte 3"), std::string::npos) << ids.status().ToString();
}

TEST(Tokenizer, MissingFilesAreNotFound) {
  TempDir dir;
  EXPECT_EQ(Tokenizer::Load(dir.Sub("nope")).status().code(), StatusCode::kNotFound);
  auto empty = Tokenizer::Load(dir.path());
  EXPECT_EQ(empty.status().code(), StatusCode::kNotFound);
  EXPECT_NE(empty.status().message().find("neither tokenizer.model nor tokenizer.json"), std::string::npos);
}

// A part this reader does not implement is refused by name, not guessed.
TEST(Tokenizer, UnsupportedPartsAreNamed) {
  TempDir dir;
  const nlohmann::json base = nlohmann::json::parse(ReadBytes(Fixtures() + "/gpt2/tokenizer.json"));
  struct Case {
    const char* pointer;
    nlohmann::json value;
    const char* words;
  };
  const Case cases[] = {
      {"/normalizer", {{"type", "Lowercase"}}, "normalizer"},
      {"/pre_tokenizer", {{"type", "Whitespace"}}, "pre_tokenizer type \"Whitespace\""},
      {"/model/type", "WordPiece", "model.type must be \"BPE\""},
      {"/model/continuing_subword_prefix", "##", "continuing_subword_prefix"},
      {"/normalizer", {{"type", "Replace"}, {"pattern", {{"Regex", " +"}}}, {"content", "_"}}, "normalizer Replace"},
      {"/pre_tokenizer", {{"type", "Metaspace"}, {"prepend_scheme", "sometimes"}}, "prepend_scheme"},
      {"/pre_tokenizer",
       {{"type", "Split"}, {"pattern", {{"Regex", "("}}}, {"behavior", "Isolated"}},
       "regex does not compile"},
  };
  for (const Case& c : cases) {
    nlohmann::json j = base;
    j[nlohmann::json::json_pointer(c.pointer)] = c.value;
    const std::string path = dir.Sub("tokenizer.json");
    WriteBytes(path, j.dump());
    auto tok = Tokenizer::Load(path);
    ASSERT_FALSE(tok.ok()) << c.pointer;
    EXPECT_EQ(tok.status().code(), StatusCode::kInvalidArgument) << tok.status().ToString();
    EXPECT_NE(tok.status().message().find(c.words), std::string::npos) << tok.status().ToString();
    EXPECT_NE(tok.status().message().find(path), std::string::npos) << tok.status().ToString();
  }
}

}  // namespace
}  // namespace zinf::model
