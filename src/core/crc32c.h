// CRC-32C (Castagnoli), the checksum of swap-file extents and checkpoints.
//
// Uses the SSE4.2 crc32 instruction when the CPU has it (chosen at run time)
// and a table otherwise; both give the same values. Extend() continues a
// running checksum so large buffers can be summed piecewise.
//
// Thread-safety: pure functions.
#pragma once

#include <cstddef>
#include <cstdint>

namespace zinf {

// crc of `data` continuing from `crc` (0 to start).
uint32_t Crc32cExtend(uint32_t crc, const void* data, size_t bytes);
inline uint32_t Crc32c(const void* data, size_t bytes) { return Crc32cExtend(0, data, bytes); }

}  // namespace zinf
