// Token files (format, atomic write, every corruption refused with the file
// named), the byte tokenizer, the built-in corpus and the DataLoader.
#include "model/data.h"

#include <stdlib.h>

#include <cmath>
#include <cstdlib>
#include <fstream>
#include <iterator>
#include <map>
#include <set>
#include <string>
#include <vector>

#include <gtest/gtest.h>

#include "core/fs.h"
#include "model/model_test_util.h"

namespace zinf::model {
namespace {

using testing::ReadBytes;
using testing::TempDir;
using testing::WriteBytes;

// A token file's bytes built by hand: header ints, then raw token bytes
// (uint16 for version 1, else uint32).
std::string MakeTokenFile(int32_t magic, int32_t version, int32_t count, const std::vector<uint32_t>& tokens) {
  const int width = version == 1 ? 2 : 4;
  std::string b(1024, '\0');
  auto put = [&b](size_t at, int32_t v) {
    const auto u = static_cast<uint32_t>(v);
    for (int i = 0; i < 4; ++i) b[at + static_cast<size_t>(i)] = static_cast<char>((u >> (8 * i)) & 0xFF);
  };
  put(0, magic);
  put(4, version);
  put(8, count);
  for (uint32_t t : tokens) {
    for (int i = 0; i < width; ++i) b.push_back(static_cast<char>((t >> (8 * i)) & 0xFF));
  }
  return b;
}

void ExpectError(const StatusOr<std::vector<uint32_t>>& r, StatusCode code, const std::string& path,
                 const std::string& words) {
  ASSERT_FALSE(r.ok());
  EXPECT_EQ(r.status().code(), code) << r.status().ToString();
  EXPECT_NE(r.status().message().find(path), std::string::npos) << r.status().ToString();
  EXPECT_NE(r.status().message().find(words), std::string::npos) << r.status().ToString();
}

// ---------------------------------------------------------------------------
// Token files

TEST(TokenFile, RoundTrip) {
  TempDir dir;
  const std::string path = dir.Sub("t.bin");
  const std::vector<uint32_t> tokens = {0, 1, 255, 256, 257, 50256, 65535, 7};
  ASSERT_TRUE(WriteTokenFile(path, tokens).ok());
  auto back = ReadTokenFile(path);
  ASSERT_TRUE(back.ok()) << back.status().ToString();
  EXPECT_EQ(*back, tokens);
  // Nothing but the file itself is left in the directory.
  auto entries = ListDirectory(dir.path());
  ASSERT_TRUE(entries.ok());
  EXPECT_EQ(*entries, std::vector<std::string>{"t.bin"});
}

TEST(TokenFile, EmptyRoundTrip) {
  TempDir dir;
  const std::string path = dir.Sub("empty.bin");
  ASSERT_TRUE(WriteTokenFile(path, {}).ok());
  auto back = ReadTokenFile(path);
  ASSERT_TRUE(back.ok()) << back.status().ToString();
  EXPECT_TRUE(back->empty());
}

TEST(TokenFile, OverwriteReplacesWholeFile) {
  TempDir dir;
  const std::string path = dir.Sub("t.bin");
  ASSERT_TRUE(WriteTokenFile(path, std::vector<uint32_t>(1000, 9)).ok());
  ASSERT_TRUE(WriteTokenFile(path, std::vector<uint32_t>{1, 2}).ok());
  auto back = ReadTokenFile(path);
  ASSERT_TRUE(back.ok()) << back.status().ToString();
  EXPECT_EQ(*back, (std::vector<uint32_t>{1, 2}));
}

// The layout llm.c's data scripts write: 256 int32 (magic, version, count,
// zeros), then uint16 tokens, all little-endian.
TEST(TokenFile, HeaderLayoutIsLlmcByteExact) {
  TempDir dir;
  const std::string path = dir.Sub("t.bin");
  ASSERT_TRUE(WriteTokenFile(path, std::vector<uint32_t>{0x0102, 0xBEEF, 256}).ok());
  const std::string b = ReadBytes(path);
  ASSERT_EQ(b.size(), 1024u + 6u);
  std::string want(1024, '\0');
  const unsigned char head[12] = {0x88, 0xD8, 0x34, 0x01,   // 20240520
                                  0x01, 0x00, 0x00, 0x00,   // version 1
                                  0x03, 0x00, 0x00, 0x00};  // 3 tokens
  for (int i = 0; i < 12; ++i) want[static_cast<size_t>(i)] = static_cast<char>(head[i]);
  want += std::string("\x02\x01\xEF\xBE\x00\x01", 6);
  EXPECT_EQ(b, want);
  EXPECT_EQ(b, MakeTokenFile(20240520, 1, 3, {0x0102, 0xBEEF, 256}));
}

TEST(TokenFile, ReadsAHandBuiltFile) {
  TempDir dir;
  const std::string path = dir.Sub("llmc.bin");
  WriteBytes(path, MakeTokenFile(20240520, 1, 4, {50256, 464, 2068, 13}));
  auto back = ReadTokenFile(path, 50257);
  ASSERT_TRUE(back.ok()) << back.status().ToString();
  EXPECT_EQ(*back, (std::vector<uint32_t>{50256, 464, 2068, 13}));
}

TEST(TokenFile, MissingIsNotFound) {
  TempDir dir;
  const std::string path = dir.Sub("nope.bin");
  ExpectError(ReadTokenFile(path), StatusCode::kNotFound, path, "");
}

TEST(TokenFile, BadMagic) {
  TempDir dir;
  const std::string path = dir.Sub("t.bin");
  WriteBytes(path, MakeTokenFile(20240521, 1, 2, {1, 2}));
  ExpectError(ReadTokenFile(path), StatusCode::kCorruption, path, "magic");
}

TEST(TokenFile, OtherVersion) {
  TempDir dir;
  const std::string path = dir.Sub("t.bin");
  WriteBytes(path, MakeTokenFile(20240520, 3, 1, {1}));
  ExpectError(ReadTokenFile(path), StatusCode::kCorruption, path, "version 3");
  // llm.c's Llama 3 magic with a version other than its 7.
  WriteBytes(path, MakeTokenFile(20240801, 1, 1, {1}));
  ExpectError(ReadTokenFile(path), StatusCode::kCorruption, path, "version 1 of magic 20240801");
}

// Version 2: the same header, uint32 tokens; the writer takes it only when a
// token needs more than 16 bits.
TEST(TokenFile, Version2HoldsIdsPast65535) {
  TempDir dir;
  const std::string path = dir.Sub("t.bin");
  const std::vector<uint32_t> tokens = {0, 65535, 65536, 128000, 151643, 0xFFFFFFFFu, 7};
  ASSERT_TRUE(WriteTokenFile(path, tokens).ok());
  const std::string b = ReadBytes(path);
  ASSERT_EQ(b.size(), 1024u + 4 * tokens.size());
  EXPECT_EQ(b, MakeTokenFile(20240520, 2, static_cast<int32_t>(tokens.size()), tokens));
  auto back = ReadTokenFile(path);
  ASSERT_TRUE(back.ok()) << back.status().ToString();
  EXPECT_EQ(*back, tokens);
}

TEST(TokenFile, WriterPicksVersion1WhenEveryIdFits16Bits) {
  TempDir dir;
  const std::string path = dir.Sub("t.bin");
  const std::vector<uint32_t> tokens = {0, 65535, 3};
  ASSERT_TRUE(WriteTokenFile(path, tokens).ok());
  EXPECT_EQ(ReadBytes(path), MakeTokenFile(20240520, 1, 3, tokens));
  // Asked for explicitly, either width holds them.
  ASSERT_TRUE(WriteTokenFile(path, tokens, TokenFileFormat::kUint32).ok());
  EXPECT_EQ(ReadBytes(path), MakeTokenFile(20240520, 2, 3, tokens));
  EXPECT_EQ(*ReadTokenFile(path), tokens);
  // uint16 asked for but a token does not fit: refused by index, nothing written.
  Status st = WriteTokenFile(dir.Sub("u.bin"), std::vector<uint32_t>{1, 70000}, TokenFileFormat::kUint16);
  ASSERT_FALSE(st.ok());
  EXPECT_NE(st.message().find("token 1 is 70000"), std::string::npos) << st.ToString();
  EXPECT_FALSE(PathExists(dir.Sub("u.bin")));
}

TEST(TokenFile, ReadsLlmcLlama3Files) {
  TempDir dir;
  const std::string path = dir.Sub("llama3.bin");
  WriteBytes(path, MakeTokenFile(20240801, 7, 3, {128000, 9906, 128001}));
  auto back = ReadTokenFile(path, 128256);
  ASSERT_TRUE(back.ok()) << back.status().ToString();
  EXPECT_EQ(*back, (std::vector<uint32_t>{128000, 9906, 128001}));
}

TEST(TokenFile, Version2TruncatedAndSizeMismatch) {
  TempDir dir;
  const std::string path = dir.Sub("t.bin");
  // Three uint32 tokens with one byte missing: a count right for uint16
  // would not be enough.
  std::string b = MakeTokenFile(20240520, 2, 3, {1, 70000, 3});
  b.pop_back();
  WriteBytes(path, b);
  ExpectError(ReadTokenFile(path), StatusCode::kCorruption, path, "truncated: the header says 3 tokens of 4 bytes");
  // Version 1's byte count under a version 2 header.
  WriteBytes(path, MakeTokenFile(20240520, 1, 4, {1, 2, 3, 4}).replace(4, 1, "\x02"));
  ExpectError(ReadTokenFile(path), StatusCode::kCorruption, path, "truncated");
  WriteBytes(path, MakeTokenFile(20240520, 2, 1, {1, 2}));
  ExpectError(ReadTokenFile(path), StatusCode::kCorruption, path, "size mismatch");
}

TEST(TokenFile, Version2TokenOutsideVocabularyNamesItsIndexAndOffset) {
  TempDir dir;
  const std::string path = dir.Sub("t.bin");
  ASSERT_TRUE(WriteTokenFile(path, std::vector<uint32_t>{5, 128255, 128256, 3}).ok());
  ExpectError(ReadTokenFile(path, 128256), StatusCode::kInvalidArgument, path, "token 2 (byte offset 1032) is 128256");
  EXPECT_TRUE(ReadTokenFile(path, 128257).ok());
}

TEST(TokenFile, TruncatedHeader) {
  TempDir dir;
  const std::string path = dir.Sub("t.bin");
  WriteBytes(path, MakeTokenFile(20240520, 1, 0, {}).substr(0, 1000));
  ExpectError(ReadTokenFile(path), StatusCode::kCorruption, path, "truncated header");
  WriteBytes(path, "");
  ExpectError(ReadTokenFile(path), StatusCode::kCorruption, path, "truncated header");
}

TEST(TokenFile, TruncatedTokens) {
  TempDir dir;
  const std::string path = dir.Sub("t.bin");
  WriteBytes(path, MakeTokenFile(20240520, 1, 10, {1, 2, 3, 4, 5}));
  ExpectError(ReadTokenFile(path), StatusCode::kCorruption, path, "truncated");
  // Half a token at the end.
  std::string b = MakeTokenFile(20240520, 1, 3, {1, 2, 3});
  b.pop_back();
  WriteBytes(path, b);
  ExpectError(ReadTokenFile(path), StatusCode::kCorruption, path, "truncated");
}

TEST(TokenFile, SizeDisagreesWithCount) {
  TempDir dir;
  const std::string path = dir.Sub("t.bin");
  WriteBytes(path, MakeTokenFile(20240520, 1, 2, {1, 2, 3}));
  ExpectError(ReadTokenFile(path), StatusCode::kCorruption, path, "size mismatch");
  WriteBytes(path, MakeTokenFile(20240520, 1, 2, {1, 2}) + "x");
  ExpectError(ReadTokenFile(path), StatusCode::kCorruption, path, "size mismatch");
}

TEST(TokenFile, NegativeCount) {
  TempDir dir;
  const std::string path = dir.Sub("t.bin");
  WriteBytes(path, MakeTokenFile(20240520, 1, -1, {}));
  ExpectError(ReadTokenFile(path), StatusCode::kCorruption, path, "negative");
}

TEST(TokenFile, TokenOutsideVocabularyNamesItsIndex) {
  TempDir dir;
  const std::string path = dir.Sub("t.bin");
  ASSERT_TRUE(WriteTokenFile(path, std::vector<uint32_t>{5, 256, 257, 3}).ok());
  ExpectError(ReadTokenFile(path, 257), StatusCode::kInvalidArgument, path, "token 2 ");
  EXPECT_TRUE(ReadTokenFile(path, 258).ok());
  EXPECT_TRUE(ReadTokenFile(path, 0).ok());  // no check
}

TEST(TokenFile, WriteIntoMissingDirectoryFailsCleanly) {
  TempDir dir;
  const std::string path = dir.Sub("no/such/dir/t.bin");
  Status st = WriteTokenFile(path, std::vector<uint32_t>{1});
  ASSERT_FALSE(st.ok());
  EXPECT_NE(st.message().find(path), std::string::npos) << st.ToString();
}

// ---------------------------------------------------------------------------
// Byte tokenizer

TEST(ByteTokenizer, RoundTripsEveryByte) {
  std::string text;
  for (int c = 0; c < 256; ++c) text.push_back(static_cast<char>(c));
  text += "h\xC3\xA9llo, world\n";
  const std::vector<uint32_t> tokens = ByteTokenizer::Encode(text);
  ASSERT_EQ(tokens.size(), text.size());
  for (size_t i = 0; i < 256; ++i) EXPECT_EQ(tokens[i], i);
  EXPECT_EQ(ByteTokenizer::Decode(tokens), text);
}

TEST(ByteTokenizer, EndOfTextAndOutOfRange) {
  const std::vector<uint32_t> tokens = {'a', ByteTokenizer::kEndOfText, 'b', 257, 50000, 'c'};
  EXPECT_EQ(ByteTokenizer::Decode(tokens), "a\n\nb??c");
  EXPECT_EQ(ByteTokenizer::kVocabSize, 257);
}

// ---------------------------------------------------------------------------
// Built-in corpus

TEST(Corpus, DeterministicInSeed) {
  EXPECT_EQ(GenerateCorpus(50000, 7), GenerateCorpus(50000, 7));
  EXPECT_NE(GenerateCorpus(50000, 7), GenerateCorpus(50000, 8));
  EXPECT_EQ(BuiltinCorpusTokens(50000, 7), BuiltinCorpusTokens(50000, 7));
}

// Pins the generator itself: the same seed gives the same text with any
// compiler and standard library (no std distributions, no unsequenced draws).
TEST(Corpus, GoldenPrefix) {
  const std::string text = GenerateCorpus(4096, 1);
  EXPECT_EQ(text.substr(0, 62), "The yellow cup\nIn the evening, David went to the village. \"Whe");
}

TEST(Corpus, ExactlyTheRequestedSize) {
  for (int64_t bytes : {0, 1, 7, 1000, 123457}) {
    EXPECT_EQ(static_cast<int64_t>(GenerateCorpus(bytes, 3).size()), bytes) << bytes;
  }
  EXPECT_TRUE(GenerateCorpus(-5, 3).empty());
  // A longer corpus starts with the shorter one.
  EXPECT_EQ(GenerateCorpus(100000, 3).substr(0, 5000), GenerateCorpus(5000, 3));
}

TEST(Corpus, DocumentsSeparatedByEndOfText) {
  const int64_t bytes = 200000;
  const std::string text = GenerateCorpus(bytes, 11);
  const std::vector<uint32_t> tokens = BuiltinCorpusTokens(bytes, 11);
  int64_t documents = 0;
  for (uint32_t t : tokens) {
    ASSERT_LT(t, ByteTokenizer::kVocabSize);
    documents += t == ByteTokenizer::kEndOfText;
  }
  EXPECT_GT(documents, 100);
  // Every "\n\n" became one token, nothing else changed.
  EXPECT_EQ(static_cast<int64_t>(tokens.size()), bytes - documents);
  EXPECT_EQ(ByteTokenizer::Decode(tokens), text);
  // Plain printable ASCII and newlines only.
  for (char c : text) ASSERT_TRUE(c == '\n' || (c >= 32 && c < 127)) << static_cast<int>(c);
  // No empty documents.
  for (size_t i = 1; i < tokens.size(); ++i) {
    ASSERT_FALSE(tokens[i] == ByteTokenizer::kEndOfText && tokens[i - 1] == ByteTokenizer::kEndOfText);
  }
}

// Learnable: even a bigram model beats the unigram entropy by far; a
// transformer that also sees context does much better.
TEST(Corpus, FarBelowUnigramEntropy) {
  const std::vector<uint32_t> tokens = BuiltinCorpusTokens(1 << 20, 5);
  std::vector<double> uni(257, 0);
  std::vector<std::vector<double>> bi(257, std::vector<double>(257, 0));
  for (size_t i = 0; i < tokens.size(); ++i) {
    uni[tokens[i]] += 1;
    if (i > 0) bi[tokens[i - 1]][tokens[i]] += 1;
  }
  const double n = static_cast<double>(tokens.size());
  double h1 = 0, h2 = 0;
  for (int a = 0; a < 257; ++a) {
    if (uni[static_cast<size_t>(a)] > 0)
      h1 -= uni[static_cast<size_t>(a)] / n * std::log2(uni[static_cast<size_t>(a)] / n);
    double row = 0;
    for (double c : bi[static_cast<size_t>(a)]) row += c;
    for (double c : bi[static_cast<size_t>(a)]) {
      if (c > 0) h2 -= c / (n - 1) * std::log2(c / row);
    }
  }
  EXPECT_GT(h1, 3.5);
  EXPECT_LT(h2, h1 - 1.0) << "unigram " << h1 << " bits, bigram " << h2 << " bits";
}

// ---------------------------------------------------------------------------
// DataLoader

// tokens[i] = i, so a sample's first input is its start offset.
std::vector<uint32_t> Iota(size_t n) {
  std::vector<uint32_t> t(n);
  for (size_t i = 0; i < n; ++i) t[i] = static_cast<uint32_t>(i);
  return t;
}

struct Batch {
  std::vector<int32_t> inputs, targets;
  bool operator==(const Batch&) const = default;
};

Batch NextBatch(DataLoader& loader, int batch, int seq_len) {
  Batch b{std::vector<int32_t>(static_cast<size_t>(batch * seq_len)),
          std::vector<int32_t>(static_cast<size_t>(batch * seq_len))};
  loader.Next(b.inputs.data(), b.targets.data());
  return b;
}

// A mapped file is read in place, 16 or 32 bits a token, and reads as the
// copy does; the loader gives the same batches from either.
TEST(TokenFile, MappedTokensReadAsTheCopy) {
  TempDir dir;
  std::vector<uint32_t> tokens(1000);
  for (size_t i = 0; i < tokens.size(); ++i) tokens[i] = static_cast<uint32_t>((i * 7919) % 50257);
  for (TokenFileFormat format : {TokenFileFormat::kUint16, TokenFileFormat::kUint32}) {
    const std::string path = dir.Sub(format == TokenFileFormat::kUint16 ? "t16.bin" : "t32.bin");
    ASSERT_TRUE(WriteTokenFile(path, tokens, format).ok());
    auto mapped = Tokens::Map(path, 50257);
    ASSERT_TRUE(mapped.ok()) << mapped.status().ToString();
    const TokenView v = mapped->view();
    EXPECT_EQ(v.width, format == TokenFileFormat::kUint16 ? 2 : 4);
    ASSERT_EQ(v.size(), static_cast<int64_t>(tokens.size()));
    for (int64_t i = 0; i < v.size(); ++i) ASSERT_EQ(v[i], tokens[static_cast<size_t>(i)]) << i;
    EXPECT_EQ(v.Sub(10, 3)[2], tokens[12]);
    Tokens moved = std::move(mapped).value();  // the view stays valid
    auto a = DataLoader::Create(moved.view(), 2, 16, 9);
    auto b = DataLoader::Create(tokens, 2, 16, 9);
    ASSERT_TRUE(a.ok() && b.ok());
    std::vector<int32_t> ai(32), at(32), bi(32), bt(32);
    for (int k = 0; k < 40; ++k) {
      a->Next(ai.data(), at.data());
      b->Next(bi.data(), bt.data());
      ASSERT_EQ(ai, bi);
      ASSERT_EQ(at, bt);
    }
    const Status vocab = Tokens::Map(path, 50000).status();
    EXPECT_EQ(vocab.code(), StatusCode::kInvalidArgument) << vocab.ToString();
  }
  const Tokens held(std::vector<uint32_t>{5, 6, 7});
  EXPECT_EQ(held.view()[2], 7u);
}

// The identity checkpoints record, fixed (computed apart from zinf, with
// the standard CRC-32C): 70000 ids that fit 16 bits CRC'd as uint16 whether
// the file holds them in 2 or 4 bytes (a 32-bit file's in chunks of 65536),
// ids past 16 bits as uint32 with " width=32", and none.
TEST(TokenFile, IdentityIsTheTokensNotTheFile) {
  TempDir dir;
  std::vector<uint32_t> tokens(70000);
  for (size_t i = 0; i < tokens.size(); ++i) tokens[i] = static_cast<uint32_t>((i * 7919) % 50257);
  const std::string narrow = "tokens=70000 crc32c=acde96c8";
  EXPECT_EQ(TokenIdentity(tokens), narrow);
  for (TokenFileFormat format : {TokenFileFormat::kUint16, TokenFileFormat::kUint32}) {
    ASSERT_TRUE(WriteTokenFile(dir.Sub("t.bin"), tokens, format).ok());
    auto mapped = Tokens::Map(dir.Sub("t.bin"));
    ASSERT_TRUE(mapped.ok()) << mapped.status().ToString();
    EXPECT_EQ(TokenIdentity(mapped->view()), narrow);
    // Taken in the check's pass when Map checks a vocabulary.
    auto checked = Tokens::Map(dir.Sub("t.bin"), 50257);
    ASSERT_TRUE(checked.ok()) << checked.status().ToString();
    EXPECT_EQ(checked->Identity(), narrow);
  }
  const std::vector<uint32_t> wide = {1, 70000, 3};
  EXPECT_EQ(TokenIdentity(wide), "tokens=3 crc32c=f02df23c width=32");
  // An id past 16 bits in the second run of a 32-bit file.
  std::vector<uint32_t> late = tokens;
  late[65536 + 5] = 70000;  // the identity is taken in runs of 65536 tokens
  ASSERT_TRUE(WriteTokenFile(dir.Sub("w.bin"), late, TokenFileFormat::kUint32).ok());
  auto wide_file = Tokens::Map(dir.Sub("w.bin"), 70001);
  ASSERT_TRUE(wide_file.ok()) << wide_file.status().ToString();
  EXPECT_EQ(wide_file->Identity(), TokenIdentity(late));
  EXPECT_NE(wide_file->Identity().find(" width=32"), std::string::npos);
  EXPECT_EQ(TokenIdentity(TokenView()), "tokens=0 crc32c=00000000");
}

TEST(DataLoader, RejectsBadArguments) {
  const std::vector<uint32_t> tokens = Iota(100);
  EXPECT_EQ(DataLoader::Create(tokens, 0, 8, 1).status().code(), StatusCode::kInvalidArgument);
  EXPECT_EQ(DataLoader::Create(tokens, 2, 0, 1).status().code(), StatusCode::kInvalidArgument);
  EXPECT_EQ(DataLoader::Create(tokens, 2, 8, 1, 2, 2).status().code(), StatusCode::kInvalidArgument);
  EXPECT_EQ(DataLoader::Create(tokens, 2, 8, 1, -1, 2).status().code(), StatusCode::kInvalidArgument);
  EXPECT_EQ(DataLoader::Create({}, 1, 8, 1).status().code(), StatusCode::kInvalidArgument);
  // 100 tokens = 12 samples of 8 + 1: one global batch of 12 fits, 13 does not.
  EXPECT_TRUE(DataLoader::Create(tokens, 12, 8, 1).ok());
  EXPECT_TRUE(DataLoader::Create(tokens, 4, 8, 1, 2, 3).ok());
  auto too_big = DataLoader::Create(tokens, 13, 8, 1);
  ASSERT_FALSE(too_big.ok());
  EXPECT_EQ(too_big.status().code(), StatusCode::kInvalidArgument);
  EXPECT_NE(too_big.status().message().find("global batch"), std::string::npos) << too_big.status().ToString();
  EXPECT_EQ(DataLoader::Create(tokens, 5, 8, 1, 0, 3).status().code(), StatusCode::kInvalidArgument);
}

TEST(DataLoader, SamplesAtMultiplesOfSeqLenAndTargetsShiftedByOne) {
  const int batch = 3, seq_len = 16;
  const std::vector<uint32_t> tokens = Iota(16 * 40 + 1);  // exactly 40 samples
  auto loader = DataLoader::Create(tokens, batch, seq_len, 42);
  ASSERT_TRUE(loader.ok()) << loader.status().ToString();
  EXPECT_EQ(loader->batches_per_epoch(), 13);  // 40 / 3, the partial 14th is skipped
  for (int step = 0; step < 30; ++step) {
    const Batch b = NextBatch(*loader, batch, seq_len);
    for (int r = 0; r < batch; ++r) {
      const int32_t start = b.inputs[static_cast<size_t>(r * seq_len)];
      EXPECT_EQ(start % seq_len, 0);
      for (int t = 0; t < seq_len; ++t) {
        EXPECT_EQ(b.inputs[static_cast<size_t>(r * seq_len + t)], start + t);
        EXPECT_EQ(b.targets[static_cast<size_t>(r * seq_len + t)], start + t + 1);
      }
    }
  }
}

TEST(DataLoader, LastSampleUsesTheFinalToken) {
  // 2 * 4 + 1 tokens: two samples, the second's last target is token 8.
  const std::vector<uint32_t> tokens = Iota(9);
  auto loader = DataLoader::Create(tokens, 2, 4, 1);
  ASSERT_TRUE(loader.ok());
  const Batch b = NextBatch(*loader, 2, 4);
  std::set<int32_t> last_targets = {b.targets[3], b.targets[7]};
  EXPECT_EQ(last_targets, (std::set<int32_t>{4, 8}));
}

TEST(DataLoader, DeterministicInSeed) {
  const std::vector<uint32_t> tokens = Iota(5000);
  auto a = DataLoader::Create(tokens, 4, 10, 9);
  auto b = DataLoader::Create(tokens, 4, 10, 9);
  auto c = DataLoader::Create(tokens, 4, 10, 10);
  ASSERT_TRUE(a.ok() && b.ok() && c.ok());
  bool differs = false;
  for (int i = 0; i < 300; ++i) {  // crosses two epoch boundaries (124 per epoch)
    const Batch ba = NextBatch(*a, 4, 10);
    EXPECT_EQ(ba, NextBatch(*b, 4, 10));
    differs |= !(ba == NextBatch(*c, 4, 10));
  }
  EXPECT_TRUE(differs);
}

// The sample starts of one epoch of a single-rank loader.
std::vector<int32_t> EpochStarts(DataLoader& loader, int batch, int seq_len) {
  std::vector<int32_t> starts;
  const int64_t epoch = loader.position().epoch;
  for (int64_t i = 0; i < loader.batches_per_epoch(); ++i) {
    const Batch b = NextBatch(loader, batch, seq_len);
    for (int r = 0; r < batch; ++r) starts.push_back(b.inputs[static_cast<size_t>(r * seq_len)]);
  }
  EXPECT_EQ(loader.position(), (LoaderPosition{epoch + 1, 0}));
  return starts;
}

TEST(DataLoader, EachSampleOncePerEpochAndEpochsReshuffle) {
  const int batch = 5, seq_len = 8;
  const std::vector<uint32_t> tokens = Iota(8 * 50 + 1);  // 50 samples = 10 batches
  auto loader = DataLoader::Create(tokens, batch, seq_len, 3);
  ASSERT_TRUE(loader.ok());
  ASSERT_EQ(loader->batches_per_epoch(), 10);
  std::set<int32_t> all;
  for (int32_t s = 0; s < 50; ++s) all.insert(s * seq_len);
  const std::vector<int32_t> e0 = EpochStarts(*loader, batch, seq_len);
  const std::vector<int32_t> e1 = EpochStarts(*loader, batch, seq_len);
  const std::vector<int32_t> e2 = EpochStarts(*loader, batch, seq_len);
  for (const auto* e : {&e0, &e1, &e2}) {
    ASSERT_EQ(e->size(), 50u);
    EXPECT_EQ(std::set<int32_t>(e->begin(), e->end()), all);
  }
  EXPECT_NE(e0, e1);
  EXPECT_NE(e1, e2);
  // Not the identity order either.
  std::vector<int32_t> sorted(all.begin(), all.end());
  EXPECT_NE(e0, sorted);
}

TEST(DataLoader, PartialGlobalBatchSkippedEachEpoch) {
  const int batch = 4, seq_len = 8;
  const std::vector<uint32_t> tokens = Iota(8 * 23 + 1);  // 23 samples: 5 batches, 3 left over
  auto loader = DataLoader::Create(tokens, batch, seq_len, 8);
  ASSERT_TRUE(loader.ok());
  ASSERT_EQ(loader->batches_per_epoch(), 5);
  const std::vector<int32_t> e0 = EpochStarts(*loader, batch, seq_len);
  EXPECT_EQ(std::set<int32_t>(e0.begin(), e0.end()).size(), 20u);
  // A different 3 are left out of the next epoch (with high probability).
  const std::vector<int32_t> e1 = EpochStarts(*loader, batch, seq_len);
  EXPECT_NE(std::set<int32_t>(e0.begin(), e0.end()), std::set<int32_t>(e1.begin(), e1.end()));
}

TEST(DataLoader, RanksAreDisjointAndTogetherTheGlobalBatch) {
  const int batch = 2, seq_len = 6, world = 3;
  const std::vector<uint32_t> tokens = Iota(6 * 61 + 1);  // 61 samples: 10 global batches of 6
  auto single = DataLoader::Create(tokens, batch * world, seq_len, 77);
  ASSERT_TRUE(single.ok());
  std::vector<DataLoader> ranks;
  for (int r = 0; r < world; ++r) {
    auto l = DataLoader::Create(tokens, batch, seq_len, 77, r, world);
    ASSERT_TRUE(l.ok()) << l.status().ToString();
    EXPECT_EQ(l->batches_per_epoch(), single->batches_per_epoch());
    ranks.push_back(std::move(l).value());
  }
  for (int step = 0; step < 25; ++step) {  // crosses epoch boundaries
    const Batch global = NextBatch(*single, batch * world, seq_len);
    std::set<int32_t> seen;
    for (int r = 0; r < world; ++r) {
      const Batch mine = NextBatch(ranks[static_cast<size_t>(r)], batch, seq_len);
      const auto n = static_cast<size_t>(batch * seq_len);
      const auto at = static_cast<long>(static_cast<size_t>(r) * n);
      EXPECT_TRUE(std::equal(mine.inputs.begin(), mine.inputs.end(), global.inputs.begin() + at));
      EXPECT_TRUE(std::equal(mine.targets.begin(), mine.targets.end(), global.targets.begin() + at));
      for (int b = 0; b < batch; ++b) seen.insert(mine.inputs[static_cast<size_t>(b * seq_len)]);
      EXPECT_EQ(ranks[static_cast<size_t>(r)].position(), single->position());
    }
    EXPECT_EQ(seen.size(), static_cast<size_t>(batch * world)) << "ranks overlap at step " << step;
  }
}

TEST(DataLoader, SeekToSavedPositionContinuesIdentically) {
  const int batch = 3, seq_len = 7;
  const std::vector<uint32_t> tokens = Iota(7 * 40 + 3);  // 40 samples, 13 batches per epoch
  for (int skip : {0, 5, 12, 13, 30}) {
    auto first = DataLoader::Create(tokens, batch, seq_len, 5);
    ASSERT_TRUE(first.ok());
    for (int i = 0; i < skip; ++i) NextBatch(*first, batch, seq_len);
    const LoaderPosition saved = first->position();
    std::vector<Batch> expected;
    for (int i = 0; i < 20; ++i) expected.push_back(NextBatch(*first, batch, seq_len));

    auto resumed = DataLoader::Create(tokens, batch, seq_len, 5);
    ASSERT_TRUE(resumed.ok());
    ASSERT_TRUE(resumed->Seek(saved).ok());
    EXPECT_EQ(resumed->position(), saved);
    for (int i = 0; i < 20; ++i)
      ASSERT_EQ(NextBatch(*resumed, batch, seq_len), expected[static_cast<size_t>(i)]) << skip;
  }
}

TEST(DataLoader, SeekBackToAnEarlierEpoch) {
  const std::vector<uint32_t> tokens = Iota(4 * 30 + 1);
  auto loader = DataLoader::Create(tokens, 2, 4, 1);
  ASSERT_TRUE(loader.ok());
  const Batch first = NextBatch(*loader, 2, 4);
  for (int i = 0; i < 40; ++i) NextBatch(*loader, 2, 4);
  ASSERT_GT(loader->position().epoch, 0);
  ASSERT_TRUE(loader->Seek({0, 0}).ok());
  EXPECT_EQ(NextBatch(*loader, 2, 4), first);
}

TEST(DataLoader, SeekPastTheEpochEndIsRefused) {
  const std::vector<uint32_t> tokens = Iota(4 * 30 + 1);
  auto loader = DataLoader::Create(tokens, 2, 4, 1);
  ASSERT_TRUE(loader.ok());
  ASSERT_EQ(loader->batches_per_epoch(), 15);
  EXPECT_EQ(loader->Seek({0, 15}).code(), StatusCode::kInvalidArgument);
  EXPECT_EQ(loader->Seek({0, -1}).code(), StatusCode::kInvalidArgument);
  EXPECT_EQ(loader->Seek({-1, 0}).code(), StatusCode::kInvalidArgument);
  EXPECT_EQ(loader->position(), (LoaderPosition{0, 0}));
  EXPECT_TRUE(loader->Seek({3, 14}).ok());
}

TEST(DataLoader, WorksOnTheBuiltinCorpus) {
  const std::vector<uint32_t> tokens = BuiltinCorpusTokens(100000, 1);
  auto loader = DataLoader::Create(tokens, 4, 64, 1);
  ASSERT_TRUE(loader.ok());
  const Batch b = NextBatch(*loader, 4, 64);
  for (int32_t t : b.inputs) EXPECT_LT(t, ByteTokenizer::kVocabSize);
}

// Sequential order (llm.c's loader): batch k of rank r is the B*T + 1
// tokens from (k*W + r)*B*T, inputs the first B*T, targets shifted by one;
// the epoch wraps to the start when the next global batch does not fit.
TEST(DataLoader, SequentialIsFileOrderAndWraps) {
  const int batch = 2, seq = 4;
  const std::vector<uint32_t> tokens = Iota(3 * batch * seq + 5);  // 3 batches and a tail of 4 spare tokens
  auto loader = DataLoader::Create(tokens, batch, seq, 99, 0, 1, DataOrder::kSequential);
  ASSERT_TRUE(loader.ok()) << loader.status().ToString();
  ASSERT_EQ(loader->batches_per_epoch(), 3);
  for (int round = 0; round < 2; ++round) {
    for (int k = 0; k < 3; ++k) {
      const Batch b = NextBatch(*loader, batch, seq);
      for (int i = 0; i < batch * seq; ++i) {
        ASSERT_EQ(b.inputs[static_cast<size_t>(i)], k * batch * seq + i) << "round " << round << " batch " << k;
        ASSERT_EQ(b.targets[static_cast<size_t>(i)], k * batch * seq + i + 1);
      }
    }
    EXPECT_EQ(loader->position(), (LoaderPosition{round + 1, 0}));
  }
}

TEST(DataLoader, SequentialRanksTakeConsecutiveShares) {
  const int batch = 2, seq = 3, world = 3;
  const std::vector<uint32_t> tokens = Iota(2 * world * batch * seq + 1);
  for (int rank = 0; rank < world; ++rank) {
    auto loader = DataLoader::Create(tokens, batch, seq, 1, rank, world, DataOrder::kSequential);
    ASSERT_TRUE(loader.ok()) << loader.status().ToString();
    for (int k = 0; k < 2; ++k) {
      const Batch b = NextBatch(*loader, batch, seq);
      EXPECT_EQ(b.inputs[0], (k * world + rank) * batch * seq) << "rank " << rank << " batch " << k;
      EXPECT_EQ(b.targets.back(), (k * world + rank + 1) * batch * seq);
    }
  }
}

TEST(DataLoader, SequentialIgnoresTheSeedAndSeeks) {
  const std::vector<uint32_t> tokens = Iota(1000);
  auto a = DataLoader::Create(tokens, 2, 8, 1, 0, 1, DataOrder::kSequential);
  auto b = DataLoader::Create(tokens, 2, 8, 2, 0, 1, DataOrder::kSequential);
  ASSERT_TRUE(a.ok() && b.ok());
  for (int i = 0; i < 100; ++i) ASSERT_EQ(NextBatch(*a, 2, 8), NextBatch(*b, 2, 8));
  const LoaderPosition saved = a->position();
  const Batch want = NextBatch(*a, 2, 8);
  auto c = DataLoader::Create(tokens, 2, 8, 3, 0, 1, DataOrder::kSequential);
  ASSERT_TRUE(c->Seek(saved).ok());
  EXPECT_EQ(NextBatch(*c, 2, 8), want);
}

TEST(DataLoader, ParseDataOrder) {
  EXPECT_EQ(*ParseDataOrder("shuffled"), DataOrder::kShuffled);
  EXPECT_EQ(*ParseDataOrder("sequential"), DataOrder::kSequential);
  EXPECT_STREQ(DataOrderName(DataOrder::kSequential), "sequential");
  auto bad = ParseDataOrder("random");
  ASSERT_FALSE(bad.ok());
  EXPECT_NE(bad.status().message().find("'random'"), std::string::npos);
}

}  // namespace
}  // namespace zinf::model
