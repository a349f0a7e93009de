// cli/tensorboard_monitor: event files as the TFRecord and Event formats
// define them. The test reads the file with its own decoder: framing (uint64
// length, masked CRC-32C of the length, data, masked CRC-32C of the data),
// then the protocol buffer wire format (varint keys, fixed64 / fixed32 /
// length-delimited fields) of Event, Summary and Summary.Value.
#include "cli/tensorboard_monitor.h"

#include <dirent.h>

#include <cmath>
#include <cstring>
#include <map>
#include <string>
#include <vector>

#include <gtest/gtest.h>

#include "core/crc32c.h"
#include "temp_dir.h"
#include "testing/text.h"

namespace zinf::cli {
namespace {

using test_support::ReadAll;

// The spec's mask, written out here independently of the writer.
uint32_t Mask(uint32_t crc) { return ((crc >> 15) | (crc << 17)) + 0xa282ead8u; }

template <typename T>
T Load(const std::string& s, size_t at) {
  T v;
  std::memcpy(&v, s.data() + at, sizeof(T));
  return v;
}

// Splits a TFRecord file into its records' data, checking both CRCs.
std::vector<std::string> ReadRecords(const std::string& bytes) {
  std::vector<std::string> out;
  size_t at = 0;
  while (at < bytes.size()) {
    EXPECT_LE(at + 12, bytes.size()) << "truncated header at " << at;
    if (at + 12 > bytes.size()) break;
    const uint64_t len = Load<uint64_t>(bytes, at);
    EXPECT_EQ(Load<uint32_t>(bytes, at + 8), Mask(Crc32c(bytes.data() + at, 8))) << "length CRC at " << at;
    EXPECT_LE(at + 12 + len + 4, bytes.size()) << "truncated record at " << at;
    if (at + 12 + len + 4 > bytes.size()) break;
    const std::string data = bytes.substr(at + 12, len);
    EXPECT_EQ(Load<uint32_t>(bytes, at + 12 + len), Mask(Crc32c(data.data(), data.size()))) << "data CRC at " << at;
    out.push_back(data);
    at += 12 + len + 4;
  }
  return out;
}

// A protocol buffer message as field number -> raw values (varints as their
// number in `varint`, everything else as bytes).
struct Field {
  int wire_type = 0;
  uint64_t varint = 0;
  std::string bytes;
};
std::multimap<int, Field> Decode(const std::string& m) {
  std::multimap<int, Field> out;
  size_t at = 0;
  auto varint = [&] {
    uint64_t v = 0;
    for (int shift = 0; at < m.size(); shift += 7) {
      const uint8_t b = static_cast<uint8_t>(m[at++]);
      v |= static_cast<uint64_t>(b & 0x7f) << shift;
      if (!(b & 0x80)) break;
    }
    return v;
  };
  while (at < m.size()) {
    const uint64_t key = varint();
    Field f;
    f.wire_type = static_cast<int>(key & 7);
    switch (f.wire_type) {
      case 0: f.varint = varint(); break;
      case 1:
        f.bytes = m.substr(at, 8);
        at += 8;
        break;
      case 5:
        f.bytes = m.substr(at, 4);
        at += 4;
        break;
      case 2: {
        const uint64_t n = varint();
        f.bytes = m.substr(at, n);
        at += n;
        break;
      }
      default: ADD_FAILURE() << "wire type " << f.wire_type; return out;
    }
    out.emplace(static_cast<int>(key >> 3), f);
  }
  return out;
}

struct Event {
  double wall_time = 0;
  int64_t step = 0;
  std::string file_version;
  std::vector<std::pair<std::string, float>> scalars;
};
Event DecodeEvent(const std::string& data) {
  Event e;
  for (const auto& [field, f] : Decode(data)) {
    if (field == 1) {
      EXPECT_EQ(f.wire_type, 1);
      e.wall_time = Load<double>(f.bytes, 0);
    } else if (field == 2) {
      EXPECT_EQ(f.wire_type, 0);
      e.step = static_cast<int64_t>(f.varint);
    } else if (field == 3) {
      e.file_version = f.bytes;
    } else if (field == 5) {
      for (const auto& [vfield, value] : Decode(f.bytes)) {
        EXPECT_EQ(vfield, 1);  // Summary.value
        std::string tag;
        float simple = std::nanf("");
        for (const auto& [k, x] : Decode(value.bytes)) {
          if (k == 1) tag = x.bytes;
          if (k == 2) {
            EXPECT_EQ(x.wire_type, 5);
            simple = Load<float>(x.bytes, 0);
          }
        }
        e.scalars.emplace_back(tag, simple);
      }
    } else {
      ADD_FAILURE() << "unexpected Event field " << field;
    }
  }
  return e;
}

std::vector<std::string> EventFiles(const std::string& dir) {
  std::vector<std::string> out;
  DIR* d = opendir(dir.c_str());
  if (d == nullptr) return out;
  while (dirent* e = readdir(d)) {
    if (std::strncmp(e->d_name, "events.out.tfevents.", 20) == 0) out.push_back(dir + "/" + e->d_name);
  }
  closedir(d);
  return out;
}

TEST(TensorBoardMonitorTest, FramingCrcsAndScalarsFollowTheFormat) {
  test_support::TempDir dir("tfevents");
  const std::string logdir = dir.path() + "/out/job";
  const int kSteps = 4;
  {
    TensorBoardMonitor tb;
    ASSERT_TRUE(tb.Open(logdir).ok());
    ASSERT_TRUE(tb.OnEval(0, 0, 6.5).ok());
    for (int i = 1; i <= kSteps; ++i) {
      StepMetrics m;
      m.step = i;
      m.samples = 8 * i;
      m.loss = 6.0 - 0.25 * i;
      m.lr = 1e-4 * i;
      m.grad_norm = 2.0;
      m.loss_scale = 65536;
      m.tokens_per_second = 1000.0 * i;
      m.total_seconds = 0.5;
      m.compute_seconds = 0.25;
      m.nvme_seconds = 0.125;
      ASSERT_TRUE(tb.OnStep(m).ok());
    }
  }
  const auto files = EventFiles(logdir);
  ASSERT_EQ(files.size(), 1u);
  const auto records = ReadRecords(ReadAll(files[0]));
  ASSERT_EQ(records.size(), 2u + kSteps);  // file_version, one evaluation, one per step
  const Event first = DecodeEvent(records[0]);
  EXPECT_EQ(first.file_version, "brain.Event:2");
  EXPECT_GT(first.wall_time, 1.6e9);
  const Event eval = DecodeEvent(records[1]);
  ASSERT_EQ(eval.scalars.size(), 1u);
  EXPECT_EQ(eval.scalars[0].first, "Eval/Samples/eval_loss");
  EXPECT_EQ(eval.scalars[0].second, 6.5f);
  for (int i = 1; i <= kSteps; ++i) {
    const Event e = DecodeEvent(records[1 + i]);
    EXPECT_EQ(e.step, 8 * i) << "the step of a record is the samples trained on, as DeepSpeed's";
    EXPECT_GE(e.wall_time, first.wall_time);
    std::map<std::string, float> by_tag(e.scalars.begin(), e.scalars.end());
    EXPECT_EQ(by_tag.size(), e.scalars.size()) << "a tag twice";
    EXPECT_EQ(by_tag["Train/Samples/train_loss"], static_cast<float>(6.0 - 0.25 * i));
    EXPECT_EQ(by_tag["Train/Samples/lr"], static_cast<float>(1e-4 * i));
    EXPECT_EQ(by_tag["Train/Samples/loss_scale"], 65536.0f);
    EXPECT_EQ(by_tag["Train/Samples/grad_norm"], 2.0f);
    EXPECT_EQ(by_tag["Train/Samples/tokens_per_second"], 1000.0f * i);
    EXPECT_EQ(by_tag["Train/Samples/samples"], 8.0f * i);
    EXPECT_EQ(by_tag["Train/Samples/step"], static_cast<float>(i));
    EXPECT_EQ(by_tag["Train/Samples/elapsed_time_ms_total"], 500.0f);
    EXPECT_EQ(by_tag["Train/Samples/elapsed_time_ms_compute"], 250.0f);
    EXPECT_EQ(by_tag["Train/Samples/elapsed_time_ms_nvme_wait"], 125.0f);
    for (const char* part : {"pcie_wait", "comm", "optimizer"}) {
      EXPECT_EQ(by_tag.count(std::string("Train/Samples/elapsed_time_ms_") + part), 1u) << part;
    }
  }
}

TEST(TensorBoardMonitorTest, ACorruptRecordIsCaughtByItsCrc) {
  // The checker above is not vacuous: a flipped bit in a record's data or
  // length fails its CRC.
  std::string frame = FrameTfRecord(EncodeFileVersionEvent(1.7e9));
  EXPECT_EQ(Load<uint32_t>(frame, frame.size() - 4), Mask(Crc32c(frame.data() + 12, frame.size() - 16)));
  EXPECT_EQ(MaskedCrc32c("abc"), Mask(Crc32c("abc", 3)));
  frame[14] ^= 1;
  EXPECT_NE(Load<uint32_t>(frame, frame.size() - 4), Mask(Crc32c(frame.data() + 12, frame.size() - 16)));
}

TEST(TensorBoardMonitorTest, TwoRunsInOneSecondGetTwoFiles) {
  test_support::TempDir dir("tfevents2");
  TensorBoardMonitor a, b;
  ASSERT_TRUE(a.Open(dir.path()).ok());
  ASSERT_TRUE(b.Open(dir.path()).ok());
  EXPECT_NE(a.path(), b.path());
  EXPECT_EQ(EventFiles(dir.path()).size(), 2u);
}

}  // namespace
}  // namespace zinf::cli
