// HandleTable<T>: the bounded, generation-checked table of in-flight work
// behind the handles callers wait on -- IoTickets (RequestTable, under every
// engine) and SwapHandles (swap::SwapStore).
//
// Bounded: `capacity` slots, allocated once. Acquire takes a free slot (none
// left: nullopt, and the caller says kResourceExhausted in its own words);
// Release gives it back. A slot's T stays in place between uses, so vectors
// in it keep the capacity they grew to and the steady state does not
// allocate; the owner resets what it needs at Acquire.
//
// Generation-checked: a handle is (generation << 32) | (index + 1), never 0.
// Release bumps the slot's generation, so a handle kept past its Release (a
// ticket waited on twice, or one from before the slot was reused) no longer
// matches and Find refuses it instead of naming somebody else's work. The
// generation skips 0 when it wraps; only a handle held across 2^32 - 1 reuses
// of its slot could match again.
//
// Thread-safety: none of its own; one lock of the owner covers every call
// that takes, gives back or looks up a slot (Acquire, Release, Find,
// HandleOf, in_use, in_use_count), because the owner keeps state of its own
// that must change together with them. RequestTable calls them under its mu_
// from submitting threads, waiting threads and the io_uring workers;
// SwapStore under its mu_ from any thread. operator[] on a slot the caller
// has acquired and not yet released may be used without that lock (the slots
// never move); who else may touch the T then is the owner's contract.
#pragma once

#include <cstdint>
#include <optional>
#include <vector>

#include "core/check.h"

namespace zinf::aio {

template <typename T>
class HandleTable {
 public:
  // `first_generation` (not 0) lets a test start near the wrap.
  explicit HandleTable(int capacity, uint32_t first_generation = 1) : slots_(static_cast<size_t>(capacity)) {
    ZINF_CHECK(capacity > 0);
    ZINF_CHECK(first_generation != 0);
    free_.reserve(slots_.size());
    for (size_t i = slots_.size(); i-- > 0;) {
      slots_[i].generation = first_generation;
      free_.push_back(static_cast<uint32_t>(i));  // lowest index on top
    }
  }
  HandleTable(const HandleTable&) = delete;
  HandleTable& operator=(const HandleTable&) = delete;

  int capacity() const { return static_cast<int>(slots_.size()); }
  int in_use_count() const { return static_cast<int>(slots_.size() - free_.size()); }

  // Takes a free slot and returns its index; nullopt when all are in use.
  std::optional<uint32_t> Acquire() {
    if (free_.empty()) return std::nullopt;
    const uint32_t index = free_.back();
    free_.pop_back();
    slots_[index].in_use = true;
    return index;
  }

  // Gives slot `index` back; every handle naming it becomes stale. Checked:
  // the slot must be in use (a double release is a programmer error).
  void Release(uint32_t index) {
    ZINF_CHECK_MSG(index < slots_.size() && slots_[index].in_use, "HandleTable: release of a slot not in use");
    Slot& s = slots_[index];
    s.in_use = false;
    if (++s.generation == 0) s.generation = 1;
    free_.push_back(index);
  }

  // The handle naming in-use slot `index` (checked).
  uint64_t HandleOf(uint32_t index) const {
    ZINF_CHECK_MSG(in_use(index), "HandleTable: handle of a slot not in use");
    return (uint64_t{slots_[index].generation} << 32) | (uint64_t{index} + 1);
  }

  // The index of the in-use slot `handle` names; nullopt for a stale handle
  // (released, or from before a reuse) and for one this table never issued.
  std::optional<uint32_t> Find(uint64_t handle) const {
    if (!InRange(handle)) return std::nullopt;
    const uint32_t index = static_cast<uint32_t>((handle & 0xffffffffu) - 1);
    const Slot& s = slots_[index];
    if (!s.in_use || s.generation != static_cast<uint32_t>(handle >> 32)) return std::nullopt;
    return index;
  }

  // Whether `handle` could name a slot of this table at all (its index part
  // is in range), live or stale: tells a forged handle from a spent one.
  bool InRange(uint64_t handle) const {
    const uint64_t low = handle & 0xffffffffu;
    return low >= 1 && low <= slots_.size();
  }

  bool in_use(uint32_t index) const { return index < slots_.size() && slots_[index].in_use; }

  T& operator[](uint32_t index) { return slots_[index].value; }
  const T& operator[](uint32_t index) const { return slots_[index].value; }

 private:
  struct Slot {
    T value{};
    uint32_t generation = 1;
    bool in_use = false;
  };
  std::vector<Slot> slots_;     // size fixed at construction
  std::vector<uint32_t> free_;  // stack of free indices
};

}  // namespace zinf::aio
