// Safetensors export: round trip, the header's shape, byte-for-byte
// agreement with the Python library's files, and refusal of every kind of
// damaged file with the file named.
#include "model/safetensors.h"

#include <stdlib.h>

#include <algorithm>
#include <cstdlib>
#include <cstring>
#include <fstream>
#include <iterator>
#include <string>
#include <vector>

#include <gtest/gtest.h>
#include <nlohmann/json.hpp>

#include "core/fs.h"
#include "model/model_test_util.h"

namespace zinf::model {
namespace {

using testing::ReadBytes;
using testing::TempDir;
using testing::WriteBytes;

template <typename T>
std::span<const std::byte> Bytes(const std::vector<T>& v) {
  return std::as_bytes(std::span<const T>(v));
}

std::vector<std::byte> ToBytes(std::span<const std::byte> s) { return {s.begin(), s.end()}; }

// A file from a header text (padded with spaces to 8 unless `pad` is false)
// and a data buffer.
std::string MakeFile(const std::string& header, const std::string& data, bool pad = true) {
  std::string h = header;
  if (pad) h.append((8 - h.size() % 8) % 8, ' ');
  std::string out(8, '\0');
  for (int i = 0; i < 8; ++i) out[static_cast<size_t>(i)] = static_cast<char>((h.size() >> (8 * i)) & 0xFF);
  return out + h + data;
}

void ExpectCorrupt(const std::string& path, const std::string& words) {
  auto r = ReadSafetensors(path);
  ASSERT_FALSE(r.ok()) << "accepted a damaged file (" << words << ")";
  EXPECT_EQ(r.status().code(), StatusCode::kCorruption) << r.status().ToString();
  EXPECT_NE(r.status().message().find(path), std::string::npos) << r.status().ToString();
  EXPECT_NE(r.status().message().find(words), std::string::npos) << r.status().ToString();
}

TEST(Safetensors, RoundTrip) {
  TempDir dir;
  const std::string path = dir.Sub("w.safetensors");
  const std::vector<float> wte = {1.5f, -2.0f, 3.25f, 0.0f, 1e-7f, -1e30f};
  const std::vector<uint16_t> ln = {0x3C00, 0xBC00, 0x7BFF};  // F16 1, -1, 65504
  const std::vector<uint16_t> bf = {0x3F80, 0x4000};          // BF16 1, 2
  const std::vector<float> scalar = {42.0f};
  std::vector<SafetensorsTensor> tensors = {
      {"transformer.wte.weight", "F32", {3, 2}, Bytes(wte)},
      {"transformer.h.0.ln_1.weight", "F16", {3}, Bytes(ln)},
      {"lm_head.weight", "BF16", {1, 2}, Bytes(bf)},
      {"scale", "F32", {}, Bytes(scalar)},
      {"empty", "F32", {0, 4}, {}},
  };
  const std::map<std::string, std::string> meta = {{"format", "pt"}, {"zinf.step", "120"}};
  ASSERT_TRUE(WriteSafetensors(path, tensors, meta).ok());
  auto entries = ListDirectory(dir.path());
  ASSERT_TRUE(entries.ok());
  EXPECT_EQ(*entries, std::vector<std::string>{"w.safetensors"});  // no temporary left

  auto file = ReadSafetensors(path);
  ASSERT_TRUE(file.ok()) << file.status().ToString();
  EXPECT_EQ(file->metadata, meta);
  ASSERT_EQ(file->tensors.size(), tensors.size());
  for (const SafetensorsTensor& want : tensors) {
    const SafetensorsFile::Tensor* got = file->Find(want.name);
    ASSERT_NE(got, nullptr) << want.name;
    EXPECT_EQ(got->dtype, want.dtype);
    EXPECT_EQ(got->shape, want.shape);
    EXPECT_EQ(got->data, ToBytes(want.data)) << want.name;
  }
  EXPECT_EQ(file->Find("nope"), nullptr);
  // Data order: F32 tensors (by name), then BF16, then F16.
  std::vector<std::string> order;
  for (const auto& t : file->tensors) order.push_back(t.name);
  EXPECT_EQ(order, (std::vector<std::string>{"empty", "scale", "transformer.wte.weight", "lm_head.weight",
                                             "transformer.h.0.ln_1.weight"}));
}

TEST(Safetensors, NoTensorsNoMetadata) {
  TempDir dir;
  const std::string path = dir.Sub("e.safetensors");
  ASSERT_TRUE(WriteSafetensors(path, {}, {}).ok());
  EXPECT_EQ(ReadBytes(path), MakeFile("{}", ""));
  auto file = ReadSafetensors(path);
  ASSERT_TRUE(file.ok()) << file.status().ToString();
  EXPECT_TRUE(file->tensors.empty());
  EXPECT_TRUE(file->metadata.empty());
}

TEST(Safetensors, HeaderIsAlignedJson) {
  TempDir dir;
  const std::string path = dir.Sub("w.safetensors");
  const std::vector<float> a(5, 1.0f);
  const std::vector<uint16_t> b(3, 7);
  ASSERT_TRUE(WriteSafetensors(path, {{"a", "F32", {5}, Bytes(a)}, {"b", "BF16", {3}, Bytes(b)}}, {{"k", "v"}}).ok());
  const std::string raw = ReadBytes(path);
  ASSERT_GE(raw.size(), 8u);
  uint64_t n = 0;
  for (int i = 7; i >= 0; --i) n = n << 8 | static_cast<unsigned char>(raw[static_cast<size_t>(i)]);
  EXPECT_EQ((8 + n) % 8, 0u);
  ASSERT_EQ(raw.size(), 8 + n + 5 * 4 + 3 * 2);
  const std::string header = raw.substr(8, n);
  const nlohmann::json j = nlohmann::json::parse(header);  // throws (fails the test) if not JSON
  EXPECT_EQ(j["__metadata__"]["k"], "v");
  EXPECT_EQ(j["a"]["dtype"], "F32");
  EXPECT_EQ(j["a"]["shape"], nlohmann::json::array({5}));
  EXPECT_EQ(j["a"]["data_offsets"], nlohmann::json::array({0, 20}));
  EXPECT_EQ(j["b"]["data_offsets"], nlohmann::json::array({20, 26}));
  // Padding is spaces after the closing brace.
  const size_t close = header.rfind('}');
  EXPECT_EQ(header.find_first_not_of(' ', close + 1), std::string::npos);
}

// Bytes the Python library (safetensors 0.8, numpy) wrote for
//   save({"b": f16[1, 2], "a": f32[1, 2], "z": i64[[7]], "c": f32 zeros(0, 3)},
//        metadata={"format": "pt"})
// The writer must produce exactly these, and the reader must load them.
const std::string kPythonHeader =
    R"({"__metadata__":{"format":"pt"},"z":{"dtype":"I64","shape":[1,1],"data_offsets":[0,8]},)"
    R"("a":{"dtype":"F32","shape":[2],"data_offsets":[8,16]},"c":{"dtype":"F32","shape":[0,3],)"
    R"("data_offsets":[16,16]},"b":{"dtype":"F16","shape":[2],"data_offsets":[16,20]}}   )";
const std::string kPythonData =
    std::string("\x07\0\0\0\0\0\0\0", 8) + std::string("\0\0\x80\x3F\0\0\0\x40", 8) + std::string("\0\x3C\0\x40", 4);

std::string PythonFile() {
  std::string out = std::string("\x00\x01\0\0\0\0\0\0", 8);  // header length 256
  return out + kPythonHeader + kPythonData;
}

TEST(Safetensors, MatchesPythonLibraryBytes) {
  ASSERT_EQ(kPythonHeader.size(), 256u);
  TempDir dir;
  const std::string path = dir.Sub("py.safetensors");
  const std::vector<uint16_t> b = {0x3C00, 0x4000};
  const std::vector<float> a = {1.0f, 2.0f};
  const std::vector<int64_t> z = {7};
  ASSERT_TRUE(WriteSafetensors(path,
                               {{"b", "F16", {2}, Bytes(b)},
                                {"a", "F32", {2}, Bytes(a)},
                                {"z", "I64", {1, 1}, Bytes(z)},
                                {"c", "F32", {0, 3}, {}}},
                               {{"format", "pt"}})
                  .ok());
  EXPECT_EQ(ReadBytes(path), PythonFile());
}

TEST(Safetensors, ReadsPythonLibraryFile) {
  TempDir dir;
  const std::string path = dir.Sub("py.safetensors");
  WriteBytes(path, PythonFile());
  auto file = ReadSafetensors(path);
  ASSERT_TRUE(file.ok()) << file.status().ToString();
  EXPECT_EQ(file->metadata, (std::map<std::string, std::string>{{"format", "pt"}}));
  ASSERT_EQ(file->tensors.size(), 4u);
  const auto* a = file->Find("a");
  ASSERT_NE(a, nullptr);
  std::vector<float> av(2);
  ASSERT_EQ(a->data.size(), 8u);
  std::memcpy(av.data(), a->data.data(), 8);
  EXPECT_EQ(av, (std::vector<float>{1.0f, 2.0f}));
  EXPECT_EQ(file->Find("z")->shape, (std::vector<int64_t>{1, 1}));
  EXPECT_EQ(file->Find("c")->shape, (std::vector<int64_t>{0, 3}));
  EXPECT_TRUE(file->Find("c")->data.empty());
  EXPECT_EQ(file->Find("b")->dtype, "F16");
  // Without metadata the Python library leaves "__metadata__" out.
  const std::string no_meta = std::string("\x38\0\0\0\0\0\0\0", 8) +
                              R"({"w":{"dtype":"F32","shape":[1],"data_offsets":[0,4]}}  )" +
                              std::string("\0\0\0\x3F", 4);
  const std::vector<float> w = {0.5f};
  ASSERT_TRUE(WriteSafetensors(path, {{"w", "F32", {1}, Bytes(w)}}, {}).ok());
  EXPECT_EQ(ReadBytes(path), no_meta);
}

TEST(Safetensors, WriterRefusesBadTensors) {
  TempDir dir;
  const std::string path = dir.Sub("w.safetensors");
  const std::vector<float> four(4, 0.0f);
  auto refused = [&](std::vector<SafetensorsTensor> tensors, const std::string& words) {
    Status st = WriteSafetensors(path, tensors, {});
    EXPECT_EQ(st.code(), StatusCode::kInvalidArgument) << words << ": " << st.ToString();
    EXPECT_NE(st.message().find(words), std::string::npos) << st.ToString();
    EXPECT_FALSE(PathExists(path));
  };
  refused({{"x", "F32", {5}, Bytes(four)}}, "needs 20 bytes, given 16");
  refused({{"x", "F16", {4}, Bytes(four)}}, "needs 8 bytes");
  refused({{"x", "F24", {4}, Bytes(four)}}, "unknown dtype F24");
  refused({{"x", "F32", {-4}, Bytes(four)}}, "bad shape");
  refused({{"x", "F32", {4}, Bytes(four)}, {"x", "F32", {2, 2}, Bytes(four)}}, "given twice");
  refused({{"", "F32", {4}, Bytes(four)}}, "not allowed");
  refused({{"__metadata__", "F32", {4}, Bytes(four)}}, "not allowed");
  refused({{"bad\xFFutf8", "F32", {4}, Bytes(four)}}, "cannot encode");
}

// SafetensorsWriter takes the tensors one at a time in any order and ends
// with WriteSafetensors' bytes; ReadSafetensorsTensor reads one back. Until
// Commit the path is untouched, and a writer dropped or refused leaves no
// temporary file.
TEST(Safetensors, StreamedWriterMatchesTheWholeFileWriter) {
  TempDir dir;
  const std::vector<float> a = {1.0f, 2.0f, 3.0f, 4.0f}, b = {-1.0f, 0.5f};
  const std::vector<uint16_t> c = {0x3F80, 0x4000, 0x4040};
  const std::vector<SafetensorsTensor> tensors = {
      {"b", "F32", {2}, Bytes(b)}, {"a", "F32", {2, 2}, Bytes(a)}, {"c", "BF16", {3}, Bytes(c)}};
  const std::map<std::string, std::string> meta = {{"format", "pt"}};
  ASSERT_TRUE(WriteSafetensors(dir.Sub("whole.safetensors"), tensors, meta).ok());
  std::vector<SafetensorsSpec> specs;
  for (const SafetensorsTensor& t : tensors) specs.push_back({t.name, t.dtype, t.shape});
  const std::string path = dir.Sub("streamed.safetensors");
  {
    auto w = SafetensorsWriter::Create(path, specs, meta);
    ASSERT_TRUE(w.ok()) << w.status().ToString();
    ASSERT_TRUE(w->Write("c", Bytes(c)).ok());
    EXPECT_EQ(w->Write("c", Bytes(c)).code(), StatusCode::kInvalidArgument);  // twice
    EXPECT_EQ(w->Write("d", Bytes(c)).code(), StatusCode::kInvalidArgument);  // not declared
    const Status size = w->Write("a", Bytes(b));
    EXPECT_NE(size.message().find("tensor a needs 16 bytes, given 8"), std::string::npos) << size.ToString();
    ASSERT_TRUE(w->Write("a", Bytes(a)).ok());
    const Status missing = w->Commit();
    EXPECT_EQ(missing.code(), StatusCode::kFailedPrecondition);
    EXPECT_NE(missing.message().find("tensor b was never written"), std::string::npos) << missing.ToString();
    EXPECT_FALSE(PathExists(path));
    ASSERT_TRUE(w->Write("b", Bytes(b)).ok());
    ASSERT_TRUE(w->Commit().ok());
  }
  EXPECT_EQ(ReadBytes(path), ReadBytes(dir.Sub("whole.safetensors")));
  auto header = ReadSafetensorsHeader(path);
  ASSERT_TRUE(header.ok()) << header.status().ToString();
  std::vector<std::byte> got(16);
  ASSERT_TRUE(ReadSafetensorsTensor(path, *header->Find("a"), got).ok());
  EXPECT_EQ(got, ToBytes(Bytes(a)));
  EXPECT_EQ(ReadSafetensorsTensor(path, *header->Find("b"), got).code(), StatusCode::kInvalidArgument);
  std::vector<std::byte> part(8);  // a's elements 1 and 2
  ASSERT_TRUE(ReadSafetensorsTensor(path, *header->Find("a"), 4, part).ok());
  EXPECT_EQ(part, std::vector<std::byte>(got.begin() + 4, got.begin() + 12));
  const Status past = ReadSafetensorsTensor(path, *header->Find("a"), 12, part);
  EXPECT_EQ(past.code(), StatusCode::kInvalidArgument);
  EXPECT_NE(past.message().find("bytes [12, 20) of tensor a, which holds 16"), std::string::npos) << past.ToString();
  {
    auto w = SafetensorsWriter::Create(dir.Sub("dropped.safetensors"), specs, meta);
    ASSERT_TRUE(w.ok());
    ASSERT_TRUE(w->Write("a", Bytes(a)).ok());
  }
  auto entries = ListDirectory(dir.path());
  ASSERT_TRUE(entries.ok());
  std::sort(entries->begin(), entries->end());
  EXPECT_EQ(*entries, (std::vector<std::string>{"streamed.safetensors", "whole.safetensors"}));
}

TEST(Safetensors, MissingFileIsNotFound) {
  TempDir dir;
  auto r = ReadSafetensors(dir.Sub("nope.safetensors"));
  ASSERT_FALSE(r.ok());
  EXPECT_EQ(r.status().code(), StatusCode::kNotFound);
  EXPECT_NE(r.status().message().find("nope.safetensors"), std::string::npos);
}

TEST(Safetensors, TruncatedFilesRefused) {
  TempDir dir;
  const std::string path = dir.Sub("t.safetensors");
  const std::string good = PythonFile();
  WriteBytes(path, good.substr(0, 5));
  ExpectCorrupt(path, "truncated");
  WriteBytes(path, good.substr(0, 100));  // inside the header
  ExpectCorrupt(path, "truncated");
  WriteBytes(path, good.substr(0, good.size() - 1));  // the last tensor loses a byte
  ExpectCorrupt(path, "past the end");
  WriteBytes(path, good.substr(0, 8 + 256));  // no data at all
  ExpectCorrupt(path, "past the end");
}

TEST(Safetensors, ImplausibleHeaderLength) {
  TempDir dir;
  const std::string path = dir.Sub("t.safetensors");
  WriteBytes(path, std::string("\xFF\xFF\xFF\xFF\xFF\xFF\xFF\x7F", 8) + "{}");
  ExpectCorrupt(path, "implausible");
}

TEST(Safetensors, BadHeadersRefused) {
  TempDir dir;
  const std::string path = dir.Sub("t.safetensors");
  const std::string data(8, '\0');
  struct Case {
    std::string header;
    std::string words;
  };
  const std::vector<Case> cases = {
      {R"({"a":{"dtype":"F32","shape":[2],"data_offsets":[0,8]})", "not valid JSON"},  // missing brace
      {R"([1,2,3])", "not a JSON object"},
      {R"( {"a":{"dtype":"F32","shape":[2],"data_offsets":[0,8]}})", "not a JSON object"},  // leading space
      {R"({"a":{"dtype":"F32","shape":[2],"data_offsets":[0,8]},})", "not valid JSON"},
      {R"({"a":{"dtype":"F32","shape":[2]}})", "data_offsets"},
      {R"({"a":{"shape":[2],"data_offsets":[0,8]}})", "dtype"},
      {R"({"a":{"dtype":"F32","data_offsets":[0,8]}})", "shape"},
      {R"({"a":{"dtype":"F33","shape":[2],"data_offsets":[0,8]}})", "unknown dtype F33"},
      {R"({"a":{"dtype":"F32","shape":[-2],"data_offsets":[0,8]}})", "bad dimension"},
      {R"({"a":{"dtype":"F32","shape":[2.5],"data_offsets":[0,8]}})", "bad dimension"},
      {R"({"a":{"dtype":"F32","shape":[2],"data_offsets":[0,-8]}})", "data_offsets"},
      {R"({"a":{"dtype":"F32","shape":[2],"data_offsets":[0]}})", "data_offsets"},
      {R"({"a":{"dtype":"F32","shape":[2],"data_offsets":[8,0]}})", "end before"},
      {R"({"a":{"dtype":"F32","shape":[3],"data_offsets":[0,8]}})", "needs 12"},
      {R"({"a":"x"})", "not an object"},
      {R"({"__metadata__":{"k":1},"a":{"dtype":"F32","shape":[2],"data_offsets":[0,8]}})", "__metadata__.k"},
      {R"({"__metadata__":[],"a":{"dtype":"F32","shape":[2],"data_offsets":[0,8]}})", "__metadata__"},
      {R"({"a":{"dtype":"F32","shape":[2],"data_offsets":[0,8]},"a":{"dtype":"F32","shape":[2],"data_offsets":[0,8]}})",
       "twice"},
  };
  for (const Case& c : cases) {
    WriteBytes(path, MakeFile(c.header, data));
    ExpectCorrupt(path, c.words);
  }
  // Padding with anything but spaces.
  WriteBytes(path,
             MakeFile(std::string(R"({"a":{"dtype":"F32","shape":[2],"data_offsets":[0,8]}})") + "xx", data, false));
  ExpectCorrupt(path, "padded with spaces");
}

TEST(Safetensors, OffsetsMustTileTheData) {
  TempDir dir;
  const std::string path = dir.Sub("t.safetensors");
  const std::string two =
      R"({"a":{"dtype":"F32","shape":[2],"data_offsets":[A]},"b":{"dtype":"F32","shape":[2],"data_offsets":[B]}})";
  auto make = [&](const std::string& a, const std::string& b, size_t data_bytes) {
    std::string h = two;
    h.replace(h.find("[A]"), 3, "[" + a + "]");
    h.replace(h.find("[B]"), 3, "[" + b + "]");
    WriteBytes(path, MakeFile(h, std::string(data_bytes, '\x01')));
  };
  make("0,8", "8,16", 16);
  EXPECT_TRUE(ReadSafetensors(path).ok());
  make("8,16", "0,8", 16);  // any order in the header is fine
  EXPECT_TRUE(ReadSafetensors(path).ok());
  make("0,8", "4,12", 16);
  ExpectCorrupt(path, "overlaps");
  make("0,8", "0,8", 16);
  ExpectCorrupt(path, "overlaps");
  make("0,8", "12,20", 20);
  ExpectCorrupt(path, "gap");
  make("0,8", "8,16", 20);
  ExpectCorrupt(path, "follow the last tensor");
  make("0,8", "16,24", 16);
  ExpectCorrupt(path, "past the end");
}

}  // namespace
}  // namespace zinf::model
