#include "core/crc32c.h"

#include <array>
#include <cstring>

namespace zinf {
namespace {

constexpr uint32_t kPoly = 0x82F63B78u;  // reflected Castagnoli polynomial

constexpr std::array<uint32_t, 256> MakeTable() {
  std::array<uint32_t, 256> t{};
  for (uint32_t i = 0; i < 256; ++i) {
    uint32_t c = i;
    for (int k = 0; k < 8; ++k) c = (c & 1) ? (c >> 1) ^ kPoly : c >> 1;
    t[i] = c;
  }
  return t;
}
constexpr std::array<uint32_t, 256> kTable = MakeTable();

uint32_t ExtendTable(uint32_t crc, const uint8_t* p, size_t n) {
  for (size_t i = 0; i < n; ++i) crc = kTable[(crc ^ p[i]) & 0xFF] ^ (crc >> 8);
  return crc;
}

#if defined(__x86_64__)
__attribute__((target("sse4.2"))) uint32_t ExtendHw(uint32_t crc, const uint8_t* p, size_t n) {
  uint64_t c = crc;
  while (n >= 8) {
    uint64_t v;
    std::memcpy(&v, p, 8);
    c = __builtin_ia32_crc32di(c, v);
    p += 8;
    n -= 8;
  }
  uint32_t c32 = static_cast<uint32_t>(c);
  while (n > 0) {
    c32 = __builtin_ia32_crc32qi(c32, *p++);
    --n;
  }
  return c32;
}

// Three streams at once: the crc32 instruction has a latency of three
// cycles and a throughput of one, so one dependent chain runs at a third of
// the unit's speed. Each round checksums three lanes of kLane bytes side by
// side and joins them with the CRC's linearity: the register after lane B
// is shift(a) ^ b, where shift(x) is x carried through kLane zero bytes.
constexpr size_t kLane = 4096;

// shift(x) for the raw register, as four byte-indexed tables.
struct LaneShift {
  std::array<std::array<uint32_t, 256>, 4> t{};
  uint32_t operator()(uint32_t x) const {
    return t[0][x & 0xFF] ^ t[1][(x >> 8) & 0xFF] ^ t[2][(x >> 16) & 0xFF] ^ t[3][x >> 24];
  }
};

LaneShift MakeLaneShift() {
  std::array<uint32_t, 32> basis{};  // shift(1 << j)
  for (int j = 0; j < 32; ++j) {
    uint32_t c = 1u << j;
    for (size_t i = 0; i < kLane; ++i) c = kTable[c & 0xFF] ^ (c >> 8);
    basis[static_cast<size_t>(j)] = c;
  }
  LaneShift s;
  for (size_t i = 0; i < 4; ++i) {
    for (uint32_t b = 0; b < 256; ++b) {
      uint32_t v = 0;
      for (size_t j = 0; j < 8; ++j) {
        if ((b >> j) & 1) v ^= basis[8 * i + j];
      }
      s.t[i][b] = v;
    }
  }
  return s;
}

__attribute__((target("sse4.2"))) uint32_t ExtendHw3(uint32_t crc, const uint8_t* p, size_t n) {
  static const LaneShift shift = MakeLaneShift();
  while (n >= 3 * kLane) {
    uint64_t a = crc, b = 0, c = 0;
    for (size_t i = 0; i < kLane; i += 8) {
      uint64_t va, vb, vc;
      std::memcpy(&va, p + i, 8);
      std::memcpy(&vb, p + kLane + i, 8);
      std::memcpy(&vc, p + 2 * kLane + i, 8);
      a = __builtin_ia32_crc32di(a, va);
      b = __builtin_ia32_crc32di(b, vb);
      c = __builtin_ia32_crc32di(c, vc);
    }
    crc = shift(shift(static_cast<uint32_t>(a)) ^ static_cast<uint32_t>(b)) ^ static_cast<uint32_t>(c);
    p += 3 * kLane;
    n -= 3 * kLane;
  }
  return ExtendHw(crc, p, n);
}

bool HaveHw() {
  static const bool have = __builtin_cpu_supports("sse4.2");
  return have;
}
#endif

}  // namespace

uint32_t Crc32cExtend(uint32_t crc, const void* data, size_t bytes) {
  const auto* p = static_cast<const uint8_t*>(data);
  crc = ~crc;
#if defined(__x86_64__)
  crc = HaveHw() ? ExtendHw3(crc, p, bytes) : ExtendTable(crc, p, bytes);
#else
  crc = ExtendTable(crc, p, bytes);
#endif
  return ~crc;
}

namespace internal {
// For tests: the table path, whatever the CPU has.
uint32_t Crc32cExtendPortable(uint32_t crc, const void* data, size_t bytes) {
  return ~ExtendTable(~crc, static_cast<const uint8_t*>(data), bytes);
}
}  // namespace internal

}  // namespace zinf
