// HostDevice: see device.h. Private to src/device (and its tests).
#pragma once

#include <map>
#include <memory>
#include <mutex>
#include <vector>

#include "device/device.h"

namespace zinf {

struct StreamState;

class HostDevice final : public Device {
 public:
  // budget_bytes 0: no budget beyond physical memory.
  explicit HostDevice(size_t budget_bytes);
  ~HostDevice() override;  // frees what callers leaked; streams must be gone

  DeviceKind kind() const override { return DeviceKind::kHost; }
  std::string name() const override;
  size_t capacity_bytes() const override { return budget_bytes_; }
  // Not under AddressSanitizer: there a freed block goes back to the heap at
  // once, so that a late access is reported.
  bool keeps_freed() const override;
  StatusOr<std::unique_ptr<Stream>> CreateStream() override;
  StatusOr<std::unique_ptr<Event>> RecordOn(void* stream) override;
  Status WaitOn(void* stream, Event& event) override;
  StatusOr<std::unique_ptr<StreamTimer>> CreateTimer(void* stream) override;
  Status Synchronize() override;

  // OK when [ptr, ptr+bytes) lies inside one live allocation (not a freed
  // one kept for reuse).
  Status CheckRange(const void* ptr, size_t bytes, const char* what) const;

 protected:
  StatusOr<void*> AllocateBytes(size_t bytes) override;
  void FreeBytes(void* ptr) override;

 private:
  const size_t budget_bytes_;
  const bool has_budget_;
  mutable std::mutex mu_;
  size_t held_ = 0;                                  // guarded by mu_: live and kept bytes
  std::map<uintptr_t, size_t> allocations_;          // guarded by mu_: address -> rounded size
  std::vector<std::weak_ptr<StreamState>> streams_;  // guarded by mu_

  // The live stream `stream` names (RecordOn's argument), or null.
  std::shared_ptr<StreamState> Live(const void* stream) const;
};

}  // namespace zinf
