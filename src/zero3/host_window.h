// HostWindow: one aligned (pinned) host buffer with the pool that owns it:
// the engine's fixed host windows (gradient accumulator, new parameters,
// gradient staging, the cpu parameter home).
//
// Thread-safety: the buffer may be read and written from any thread the
// owner hands it to; the object itself is thread-compatible.
#pragma once

#include <cstdint>
#include <memory>

#include "aio/pinned_pool.h"
#include "zinf/status.h"

namespace zinf::zero3 {

struct HostWindow {
  std::unique_ptr<aio::PinnedPool> pool;  // declared first: outlives buffer
  aio::PinnedBuffer buffer;

  char* data() const { return buffer.data(); }

  // The one buffer of a BufferPlan window (`o.buffer_count` 1), pinned per
  // `o.pin` (pinning that fails is logged once and the buffer stays pageable).
  static StatusOr<HostWindow> Create(const aio::PinnedPoolOptions& o) {
    HostWindow w;
    ZINF_ASSIGN_OR_RETURN(w.pool, aio::PinnedPool::Create(o));
    w.buffer = w.pool->Acquire();
    return w;
  }
};

}  // namespace zinf::zero3
