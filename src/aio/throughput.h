// Timed sequential passes and data patterns: what `zinf bench aio`,
// `zinf tune aio` and `zinf nvme-check` measure with.
//
// A pass moves [0, bytes) of a target sequentially, one request per buffer,
// keeping every buffer's request outstanding (waiting on the oldest before
// reusing its buffer), and is timed from the first submit to the last
// completion. The engine splits each request into block_size pieces over its
// rings, so the device sees thread_count x queue_depth pieces in flight when
// buffers x request size cover that many.
//
// Thread-safety: plain functions; a pass drives its target from the calling
// thread.
#pragma once

#include <cstdint>
#include <functional>
#include <span>

#include "aio/io_engine.h"
#include "aio/pinned_pool.h"

namespace zinf::aio {

// Where a pass sends its requests: an engine's file (EngineTarget), or a
// caller's adapter (tune aio's over a swap store striped over its paths).
struct PassTarget {
  std::function<StatusOr<IoTicket>(IoOp op, int64_t offset, void* buffer, int64_t length)> submit;
  std::function<Status(IoTicket ticket)> wait;
};
PassTarget EngineTarget(IoEngine& engine, FileId file);

struct PassResult {
  int64_t bytes = 0;
  double seconds = 0;
  double gbps() const { return seconds > 0 ? static_cast<double>(bytes) / seconds / 1e9 : 0; }
};

// One timed pass of `op` over [0, bytes) in requests of at most
// buffers[i].size() bytes. For writes, `fill` (when set) is called on each
// buffer before its request goes out -- untimed only in the sense that it is
// cheap next to the I/O; pass a null function to write whatever the buffers
// hold. For reads, `check` (when set) is called on each buffer after its
// request completed; its error ends the pass.
StatusOr<PassResult> TimedPass(
    const PassTarget& target, IoOp op, int64_t bytes, std::span<PinnedBuffer> buffers,
    const std::function<void(char* data, int64_t offset, int64_t length)>& fill = {},
    const std::function<Status(const char* data, int64_t offset, int64_t length)>& check = {});

// Writes a pattern that encodes each 8-byte word's absolute offset and `seed`.
void FillPattern(char* data, int64_t offset, int64_t length, uint64_t seed);
// OK, or kCorruption naming the first offset whose bytes differ from the pattern.
Status CheckPattern(const char* data, int64_t offset, int64_t length, uint64_t seed, std::string_view what);

}  // namespace zinf::aio
