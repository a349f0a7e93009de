#include "core/crc32c.h"

#include <algorithm>
#include <random>
#include <string>
#include <vector>

#include <gtest/gtest.h>

namespace zinf {
namespace internal {
uint32_t Crc32cExtendPortable(uint32_t crc, const void* data, size_t bytes);
}
namespace {

TEST(Crc32cTest, KnownVectors) {
  // RFC 3720 (iSCSI) B.4 and the customary check value.
  EXPECT_EQ(Crc32c("123456789", 9), 0xE3069283u);
  std::vector<uint8_t> zeros(32, 0), ones(32, 0xFF), inc(32);
  for (int i = 0; i < 32; ++i) inc[i] = static_cast<uint8_t>(i);
  EXPECT_EQ(Crc32c(zeros.data(), 32), 0x8A9136AAu);
  EXPECT_EQ(Crc32c(ones.data(), 32), 0x62A8AB43u);
  EXPECT_EQ(Crc32c(inc.data(), 32), 0x46DD794Eu);
  EXPECT_EQ(Crc32c(nullptr, 0), 0u);
}

TEST(Crc32cTest, ExtendEqualsWholeAndHardwareEqualsTable) {
  std::mt19937_64 rng(42);
  std::vector<uint8_t> buf(100'003);
  for (auto& b : buf) b = static_cast<uint8_t>(rng());
  uint32_t whole = Crc32c(buf.data(), buf.size());
  EXPECT_EQ(whole, internal::Crc32cExtendPortable(0, buf.data(), buf.size()));
  for (size_t cut : {size_t{0}, size_t{1}, size_t{7}, size_t{4096}, size_t{99'999}}) {
    uint32_t part = Crc32cExtend(Crc32c(buf.data(), cut), buf.data() + cut, buf.size() - cut);
    EXPECT_EQ(part, whole) << "cut at " << cut;
  }
  buf[5000] ^= 0x10;
  EXPECT_NE(Crc32c(buf.data(), buf.size()), whole);
}

// The hardware path checksums three 4 KiB lanes at a time and joins them;
// lengths around those rounds, from any starting value, match the table.
TEST(Crc32cTest, ThreeLaneRoundsMatchTheTable) {
#if defined(__x86_64__)
  if (!__builtin_cpu_supports("sse4.2")) GTEST_SKIP() << "no SSE4.2: the table path serves every length";
#else
  GTEST_SKIP() << "not x86-64: the table path serves every length";
#endif
  std::mt19937_64 rng(7);
  std::vector<uint8_t> buf(5 * 12288 + 100);
  for (auto& b : buf) b = static_cast<uint8_t>(rng());
  for (size_t n :
       {size_t{12287}, size_t{12288}, size_t{12289}, size_t{24576}, size_t{24576 + 4095}, size_t{5 * 12288 + 100}}) {
    for (uint32_t start : {0u, 0xDEADBEEFu}) {
      for (size_t offset : {size_t{0}, size_t{3}}) {
        const size_t len = std::min(n, buf.size() - offset);
        EXPECT_EQ(Crc32cExtend(start, buf.data() + offset, len),
                  internal::Crc32cExtendPortable(start, buf.data() + offset, len))
            << "length " << len << " from " << offset << ", start " << start;
      }
    }
  }
}

}  // namespace
}  // namespace zinf
