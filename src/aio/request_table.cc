#include "aio/request_table.h"

#include <string>

#include "core/check.h"

namespace zinf::aio {

RequestTable::RequestTable(int capacity) : slots_(capacity) {
  ZINF_CHECK(capacity > 0);
  free_.reserve(capacity);
  for (int i = capacity - 1; i >= 0; --i) free_.push_back(static_cast<uint32_t>(i));
}

StatusOr<IoTicket> RequestTable::Allocate(IoOp op, std::span<const IoSegment> segments, int parts,
                                          int64_t pieces, uint32_t* slot_index) {
  std::lock_guard lock(mu_);
  if (!sticky_.ok()) {
    return Status::Aborted(std::string(IoOpName(op)) + " refused: an earlier I/O error is sticky: " +
                           sticky_.ToString());
  }
  if (free_.empty()) {
    return Status::ResourceExhausted(std::string(IoOpName(op)) + " refused: " +
                                     std::to_string(slots_.size()) +
                                     " requests outstanding (max_requests); wait on some first");
  }
  const uint32_t index = free_.back();
  free_.pop_back();
  Slot& s = slots_[index];
  s.op = op;
  s.segments.assign(segments.begin(), segments.end());
  s.total_pieces = pieces;
  s.failed.store(false, std::memory_order_relaxed);
  s.in_use = true;
  s.parts_left = parts;
  s.status = Status::Ok();
  if (parts > 0) ++pending_;
  *slot_index = index;
  return IoTicket{(uint64_t{s.generation} << 32) | (index + 1)};
}

void RequestTable::FinishPart(uint32_t index, const Status& status) {
  bool wake = false;
  {
    std::lock_guard lock(mu_);
    Slot& s = slots_[index];
    ZINF_CHECK_MSG(s.in_use && s.parts_left > 0, "FinishPart on a slot with no parts left");
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
  const uint64_t low = ticket.id & 0xffffffffu;
  ZINF_CHECK_MSG(low >= 1 && low <= slots_.size(), "IoTicket does not belong to this engine");
  const uint32_t index = static_cast<uint32_t>(low - 1);
  const Slot& s = slots_[index];
  ZINF_CHECK_MSG(s.in_use && s.generation == static_cast<uint32_t>(ticket.id >> 32),
                 "IoTicket already waited on (or never issued)");
  return index;
}

void RequestTable::Release(uint32_t index) {
  Slot& s = slots_[index];
  s.in_use = false;
  ++s.generation;
  if (s.generation == 0) s.generation = 1;
  free_.push_back(index);
}

Status RequestTable::Wait(IoTicket ticket) {
  std::unique_lock lock(mu_);
  const uint32_t index = SlotOf(ticket);
  done_cv_.wait(lock, [&] { return slots_[index].parts_left == 0; });
  Status st = slots_[index].status;
  Release(index);
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
  for (uint32_t i = 0; i < slots_.size(); ++i) {
    if (!slots_[i].in_use) continue;
    if (first.ok() && !slots_[i].status.ok()) first = slots_[i].status;
    Release(i);
  }
  return first;
}

Status RequestTable::sticky_error() const {
  std::lock_guard lock(mu_);
  return sticky_;
}

int RequestTable::outstanding() const {
  std::lock_guard lock(mu_);
  return static_cast<int>(slots_.size() - free_.size());
}

}  // namespace zinf::aio
