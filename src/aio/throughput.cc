#include "aio/throughput.h"

#include <chrono>
#include <cstring>
#include <string>
#include <vector>

namespace zinf::aio {

PassTarget EngineTarget(IoEngine& engine, FileId file) {
  PassTarget t;
  t.submit = [&engine, file](IoOp op, int64_t offset, void* buffer, int64_t length) {
    return engine.Submit(op, IoSegment{file, offset, length, buffer});
  };
  t.wait = [&engine](IoTicket ticket) { return engine.Wait(ticket); };
  return t;
}

StatusOr<PassResult> TimedPass(const PassTarget& target, IoOp op, int64_t bytes, std::span<PinnedBuffer> buffers,
                               const std::function<void(char*, int64_t, int64_t)>& fill,
                               const std::function<Status(const char*, int64_t, int64_t)>& check) {
  if (buffers.empty()) return Status::InvalidArgument("a timed pass needs at least one buffer");
  struct Outstanding {
    IoTicket ticket;
    int64_t offset = 0;
    int64_t length = 0;
  };
  std::vector<Outstanding> slots(buffers.size());
  Status first;
  auto retire = [&](size_t i) {
    if (!slots[i].ticket.valid()) return;
    Status st = target.wait(slots[i].ticket);
    slots[i].ticket = IoTicket{};
    if (st.ok() && check) st = check(buffers[i].data(), slots[i].offset, slots[i].length);
    if (first.ok() && !st.ok()) first = st;
  };
  const auto start = std::chrono::steady_clock::now();
  size_t next = 0;
  for (int64_t pos = 0; pos < bytes && first.ok(); next = (next + 1) % buffers.size()) {
    retire(next);
    if (!first.ok()) break;
    const int64_t len = std::min<int64_t>(buffers[next].size(), bytes - pos);
    if (op == IoOp::kWrite && fill) fill(buffers[next].data(), pos, len);
    auto t = target.submit(op, pos, buffers[next].data(), len);
    if (!t.ok()) {
      first = t.status();
      break;
    }
    slots[next] = {*t, pos, len};
    pos += len;
  }
  for (size_t i = 0; i < slots.size(); ++i) retire((next + i) % slots.size());
  const auto stop = std::chrono::steady_clock::now();
  if (!first.ok()) return first;
  PassResult r;
  r.bytes = bytes;
  r.seconds = std::chrono::duration<double>(stop - start).count();
  return r;
}

namespace {
inline uint64_t PatternWord(int64_t offset, uint64_t seed) {
  uint64_t z = static_cast<uint64_t>(offset) * 0x9e3779b97f4a7c15ull + seed;
  z = (z ^ (z >> 31)) * 0xbf58476d1ce4e5b9ull;
  return z ^ (z >> 29);
}
}  // namespace

void FillPattern(char* data, int64_t offset, int64_t length, uint64_t seed) {
  int64_t i = 0;
  for (; i < length; ++i) {
    const int64_t at = offset + i;
    if (at % 8 == 0 && length - i >= 8) break;
    data[i] = static_cast<char>(PatternWord(at & ~int64_t{7}, seed) >> (8 * (at & 7)));
  }
  for (; i + 8 <= length; i += 8) {
    const uint64_t w = PatternWord(offset + i, seed);
    std::memcpy(data + i, &w, 8);
  }
  for (; i < length; ++i) {
    const int64_t at = offset + i;
    data[i] = static_cast<char>(PatternWord(at & ~int64_t{7}, seed) >> (8 * (at & 7)));
  }
}

Status CheckPattern(const char* data, int64_t offset, int64_t length, uint64_t seed, std::string_view what) {
  constexpr int64_t kChunk = 4096;
  char expect[kChunk];
  for (int64_t i = 0; i < length; i += kChunk) {
    const int64_t n = std::min(kChunk, length - i);
    FillPattern(expect, offset + i, n, seed);
    if (std::memcmp(expect, data + i, static_cast<size_t>(n)) != 0) {
      int64_t j = 0;
      while (expect[j] == data[i + j]) ++j;
      return Status::Corruption(std::string(what) + ": wrong bytes read back at offset " +
                                std::to_string(offset + i + j));
    }
  }
  return Status::Ok();
}

}  // namespace zinf::aio
