#include "zero3/prefetch_coordinator.h"

#include <unordered_set>

namespace zinf::zero3 {

PrefetchCoordinator::PrefetchCoordinator(const PrefetchOptions& options, std::vector<int64_t> block_elems)
    : options_(options), block_elems_(std::move(block_elems)) {}

void PrefetchCoordinator::OnAcquire(int block) {
  if (!replaying_) {
    trace_.push_back(block);
    return;
  }
  if (cursor_ < trace_.size() && trace_[cursor_] == block) {
    ++cursor_;
    return;
  }
  // The order changed: keep what matched, record the rest of this step.
  ++order_changes_;
  trace_.resize(cursor_);
  trace_.push_back(block);
  replaying_ = false;
}

void PrefetchCoordinator::OnStepEnd() {
  if (replaying_ && cursor_ != trace_.size()) {
    ++order_changes_;
    trace_.resize(cursor_);
  }
  replaying_ = !trace_.empty();
  cursor_ = 0;
}

std::vector<int> PrefetchCoordinator::Upcoming(int64_t window_elems, const std::function<bool(int)>& skip) const {
  std::vector<int> out;
  if (!replaying_) return out;
  std::unordered_set<int> seen;
  int64_t elems = 0;
  for (size_t i = cursor_; i < trace_.size(); ++i) {
    const int b = trace_[i];
    if (!seen.insert(b).second || skip(b)) continue;
    elems += block_elems_[static_cast<size_t>(b)];
    if (elems > window_elems && !out.empty()) break;
    out.push_back(b);
    if (elems >= window_elems) break;
  }
  return out;
}

int64_t PrefetchCoordinator::NextUseDistance(int block) const {
  if (!replaying_) return kNever;
  int64_t elems = 0;
  for (size_t i = cursor_; i < trace_.size(); ++i) {
    if (trace_[i] == block) return elems;
    elems += block_elems_[static_cast<size_t>(trace_[i])];
  }
  return kNever;
}

}  // namespace zinf::zero3
