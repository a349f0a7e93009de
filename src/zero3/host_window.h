// HostWindow: one aligned (pinned) host buffer with the pool that owns it:
// the engine's fixed host windows (gradient accumulator, new parameters,
// gradient staging, the cpu parameter home).
//
// Thread-safety: the buffer may be read and written from any thread the
// owner hands it to; the object itself is thread-compatible.
#pragma once

#include <algorithm>
#include <cstdint>
#include <memory>
#include <string>
#include <utility>

#include "aio/pinned_pool.h"
#include "zinf/status.h"

namespace zinf::zero3 {

struct HostWindow {
  std::unique_ptr<aio::PinnedPool> pool;  // declared first: outlives buffer
  aio::PinnedBuffer buffer;

  char* data() const { return buffer.data(); }

  // `bytes` (at least one 4 KiB page), 4 KiB aligned, pinned when `pin`
  // (pinning that fails is logged once and the buffer stays pageable).
  static StatusOr<HostWindow> Create(int64_t bytes, bool pin, const std::string& name) {
    aio::PinnedPoolOptions o;
    o.buffer_count = 1;
    o.buffer_bytes = std::max<int64_t>(bytes, 4096);
    o.pin = pin;
    o.huge_pages = false;
    o.name = name;
    HostWindow w;
    ZINF_ASSIGN_OR_RETURN(w.pool, aio::PinnedPool::Create(o));
    w.buffer = w.pool->Acquire();
    return w;
  }
};

}  // namespace zinf::zero3
