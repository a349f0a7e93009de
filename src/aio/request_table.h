// RequestTable: the bounded set of outstanding requests behind IoTickets,
// shared by the engines.
//
// A slot holds one request from Submit until its ticket is waited on. A
// request is done when all of its parts (one per worker ring it was spread
// over) have finished; the first error of any part is the request's status
// and, the first time any request fails, the table's sticky error. The slots
// and tickets are a HandleTable (handle_table.h): bounded, allocated up front,
// a slot's segment vector keeps its capacity between uses, and a spent or
// forged ticket is caught by a check instead of waiting on someone else's
// request.
//
// Thread-safety: every method may be called from any thread (one lock, which
// also covers the HandleTable). A slot's op, segments, total_pieces and
// rotation may be read by workers between Allocate and the last FinishPart
// without the lock (the submitter writes them before handing the slot over).
#pragma once

#include <atomic>
#include <condition_variable>
#include <cstdint>
#include <mutex>
#include <span>
#include <vector>

#include "aio/handle_table.h"
#include "aio/io_engine.h"
#include "zinf/status.h"

namespace zinf::aio {

class RequestTable {
 public:
  explicit RequestTable(int capacity);
  RequestTable(const RequestTable&) = delete;
  RequestTable& operator=(const RequestTable&) = delete;

  struct Slot {
    IoOp op = IoOp::kRead;
    std::vector<IoSegment> segments;  // copied at Submit; capacity reused
    int64_t total_pieces = 0;
    int rotation = 0;                 // which worker takes piece 0
    std::atomic<bool> failed{false};  // set on the first failed part: stop issuing pieces
    // Guarded by the table's lock:
    int parts_left = 0;
    Status status;
  };

  // Reserves a slot for a request of `op` over `segments`, split into
  // `parts` parts. kResourceExhausted when every slot is taken, kAborted
  // when an error is sticky.
  StatusOr<IoTicket> Allocate(IoOp op, std::span<const IoSegment> segments, int parts, int64_t pieces,
                              uint32_t* slot_index);
  Slot& slot(uint32_t index) { return slots_[index]; }

  // A part of request `slot_index` has finished with `status`. The last part
  // completes the request and wakes its waiters.
  void FinishPart(uint32_t slot_index, const Status& status);

  Status Wait(IoTicket ticket);
  bool IsDone(IoTicket ticket);
  Status WaitAll();
  Status sticky_error() const;
  int outstanding() const;

 private:
  uint32_t SlotOf(IoTicket ticket) const;  // checks the ticket; lock held

  mutable std::mutex mu_;
  std::condition_variable done_cv_;
  HandleTable<Slot> slots_;  // guarded by mu_ (see HandleTable)
  int pending_ = 0;          // allocated and not yet done
  Status sticky_;
};

}  // namespace zinf::aio
