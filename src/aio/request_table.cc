#include "aio/request_table.h"

#include <optional>
#include <string>

#include "core/check.h"

namespace zinf::aio {

RequestTable::RequestTable(int capacity) : slots_(capacity) {}

StatusOr<IoTicket> RequestTable::Allocate(IoOp op, std::span<const IoSegment> segments, int parts, int64_t pieces,
                                          uint32_t* slot_index) {
  std::lock_guard lock(mu_);
  if (!sticky_.ok()) {
    return Status::Aborted(std::string(IoOpName(op)) +
                           " refused: an earlier I/O error is sticky: " + sticky_.ToString());
  }
  const std::optional<uint32_t> taken = slots_.Acquire();
  if (!taken) {
    return Status::ResourceExhausted(std::string(IoOpName(op)) + " refused: " + std::to_string(slots_.capacity()) +
                                     " requests outstanding (max_requests); wait on some first");
  }
  const uint32_t index = *taken;
  Slot& s = slots_[index];
  s.op = op;
  s.segments.assign(segments.begin(), segments.end());
  s.total_pieces = pieces;
  s.failed.store(false, std::memory_order_relaxed);
  s.parts_left = parts;
  s.status = Status::Ok();
  if (parts > 0) ++pending_;
  *slot_index = index;
  return IoTicket{slots_.HandleOf(index)};
}

void RequestTable::FinishPart(uint32_t index, const Status& status) {
  bool wake = false;
  {
    std::lock_guard lock(mu_);
    Slot& s = slots_[index];
    ZINF_CHECK_MSG(slots_.in_use(index) && s.parts_left > 0, "FinishPart on a slot with no parts left");
    if (!status.ok()) {
      s.failed.store(true, std::memory_order_relaxed);
      if (s.status.ok()) s.status = status;
      if (sticky_.ok()) sticky_ = status;
    }
    if (--s.parts_left == 0) {
      --pending_;
      wake = true;
    }
  }
  if (wake) done_cv_.notify_all();
}

uint32_t RequestTable::SlotOf(IoTicket ticket) const {
  ZINF_CHECK_MSG(slots_.InRange(ticket.id), "IoTicket does not belong to this engine");
  const std::optional<uint32_t> index = slots_.Find(ticket.id);
  ZINF_CHECK_MSG(index.has_value(), "IoTicket already waited on (or never issued)");
  return *index;
}

Status RequestTable::Wait(IoTicket ticket) {
  std::unique_lock lock(mu_);
  const uint32_t index = SlotOf(ticket);
  done_cv_.wait(lock, [&] { return slots_[index].parts_left == 0; });
  Status st = slots_[index].status;
  slots_.Release(index);
  return st;
}

bool RequestTable::IsDone(IoTicket ticket) {
  std::lock_guard lock(mu_);
  return slots_[SlotOf(ticket)].parts_left == 0;
}

Status RequestTable::WaitAll() {
  std::unique_lock lock(mu_);
  done_cv_.wait(lock, [&] { return pending_ == 0; });
  Status first;
  for (uint32_t i = 0; i < static_cast<uint32_t>(slots_.capacity()); ++i) {
    if (!slots_.in_use(i)) continue;
    if (first.ok() && !slots_[i].status.ok()) first = slots_[i].status;
    slots_.Release(i);
  }
  return first;
}

Status RequestTable::sticky_error() const {
  std::lock_guard lock(mu_);
  return sticky_;
}

int RequestTable::outstanding() const {
  std::lock_guard lock(mu_);
  return slots_.in_use_count();
}

}  // namespace zinf::aio
