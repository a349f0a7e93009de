// CreateDevice and host pinning: the run-time choice between CUDA and host.
#include <sys/mman.h>

#include <algorithm>
#include <cerrno>
#include <iterator>

#include "core/check.h"
#include "core/log.h"
#include "core/units.h"
#include "device/cuda_device.h"
#include "device/device.h"

namespace zinf {

StatusOr<void*> Device::Allocate(size_t bytes) {
  // What cudaMalloc guarantees: 256-byte alignment.
  const auto rounded = static_cast<size_t>(AlignUp(static_cast<int64_t>(std::max<size_t>(bytes, 1)), 256));
  while (true) {
    if (void* kept = TakeCached(rounded, /*wait=*/false)) return kept;
    StatusOr<void*> p = AllocateBytes(rounded);
    if (p.ok()) {
      std::lock_guard lock(mu_);
      live_.emplace(reinterpret_cast<uintptr_t>(*p), rounded);
      live_bytes_ += rounded;
      return p;
    }
    if (p.status().code() != StatusCode::kOutOfMemory) return p;
    // One of this size still in use by queued work is waited for; kept
    // allocations of other sizes give way next, then the caller's cache
    // (whose frees may bring back one of this size).
    if (void* kept = TakeCached(rounded, /*wait=*/true)) return kept;
    if (ReleaseLargestCached()) continue;
    if (!reclaimer_ || !reclaimer_()) return p;
  }
}

void Device::Free(void* ptr) { FreeAfter(ptr, std::shared_ptr<Event>()); }

Status Device::FreeAfter(void* ptr, Stream& stream) {
  if (ptr == nullptr) return Status::Ok();
  StatusOr<std::unique_ptr<Event>> done = stream.Record();
  if (!done.ok()) {
    stream.Synchronize().IgnoreError();  // its error is the stream's own, reported by its next call
    Free(ptr);
    return done.status().WithContext("freeing device memory after its stream");
  }
  FreeAfter(ptr, std::shared_ptr<Event>(std::move(done).value()));
  return Status::Ok();
}

void Device::FreeAfter(void* ptr, std::shared_ptr<Event> done) {
  if (ptr == nullptr) return;
  size_t bytes = 0;
  {
    std::lock_guard lock(mu_);
    auto it = live_.find(reinterpret_cast<uintptr_t>(ptr));
    ZINF_CHECK_MSG(it != live_.end(), "Device::Free of a pointer Allocate did not return (or freed twice)");
    bytes = it->second;
    live_.erase(it);
    live_bytes_ -= bytes;
  }
  if (!keeps_freed()) {
    if (done) done->Synchronize().IgnoreError();
    FreeBytes(ptr);
    return;
  }
  std::lock_guard lock(mu_);
  cached_.emplace(bytes, Kept{ptr, std::move(done)});
  cached_bytes_ += bytes;
}

void* Device::TakeCached(size_t bytes, bool wait) {
  Kept taken;
  {
    std::lock_guard lock(mu_);
    auto [first, end] = cached_.equal_range(bytes);
    auto it = first;
    while (it != end && it->second.done && !it->second.done->Finished()) ++it;
    if (it == end && wait) it = first;
    if (it == end) return nullptr;
    taken = std::move(it->second);
    cached_.erase(it);
    cached_bytes_ -= bytes;
    live_.emplace(reinterpret_cast<uintptr_t>(taken.ptr), bytes);
    live_bytes_ += bytes;
  }
  // Taken out of the cache first, so no one else can have it while we wait.
  if (taken.done) taken.done->Synchronize().IgnoreError();
  return taken.ptr;
}

bool Device::ReleaseLargestCached() {
  Kept taken;
  {
    std::lock_guard lock(mu_);
    if (cached_.empty()) return false;
    auto it = std::prev(cached_.end());
    taken = std::move(it->second);
    cached_bytes_ -= it->first;
    cached_.erase(it);
  }
  if (taken.done) taken.done->Synchronize().IgnoreError();
  FreeBytes(taken.ptr);
  return true;
}

void Device::ReleaseCached() {
  while (ReleaseLargestCached()) {
  }
}

size_t Device::bytes_in_use() const {
  std::lock_guard lock(mu_);
  return live_bytes_;
}

size_t Device::bytes_cached() const {
  std::lock_guard lock(mu_);
  return cached_bytes_;
}

bool Device::IsLiveRange(uintptr_t addr, size_t bytes) const {
  std::lock_guard lock(mu_);
  auto it = live_.upper_bound(addr);
  if (it == live_.begin()) return false;
  --it;
  return addr >= it->first && addr + bytes <= it->first + it->second;
}

std::string_view DeviceKindName(DeviceKind kind) { return kind == DeviceKind::kCuda ? "cuda" : "host"; }

StatusOr<std::unique_ptr<Device>> CreateDevice(const DeviceOptions& options) {
  using Choice = DeviceOptions::Choice;
  if (options.choice == Choice::kHost) return CreateHostDevice(options.host_budget_bytes);
  int count = CudaDeviceCount();
  if (count > 0) {
    if (options.cuda_ordinal < 0 || options.cuda_ordinal >= count) {
      return Status::InvalidArgument("cuda device " + std::to_string(options.cuda_ordinal) + " does not exist (" +
                                     std::to_string(count) + " visible)");
    }
    return CreateCudaDevice(options.cuda_ordinal, options.cuda_budget_bytes);
  }
  if (options.choice == Choice::kCuda) {
    return Status::Unavailable(CudaCompiledIn() ? "no CUDA GPU is visible (" + CudaUnavailableReason() + ")"
                                                : "this zinf was built without CUDA (ZINF_CUDA=OFF or no toolkit)");
  }
  Log("device").info("no GPU: the host stands in for the device{}",
                     options.host_budget_bytes ? " with a memory budget" : "");
  return CreateHostDevice(options.host_budget_bytes);
}

Status PinHostMemory(void* ptr, size_t bytes) {
  if (bytes == 0) return Status::Ok();
  if (CudaDeviceCount() > 0) return CudaHostRegister(ptr, bytes);
  if (mlock(ptr, bytes) != 0) return ErrnoStatus(errno, "mlock", {}, -1, static_cast<int64_t>(bytes));
  return Status::Ok();
}

Status UnpinHostMemory(void* ptr, size_t bytes) {
  if (bytes == 0) return Status::Ok();
  if (CudaDeviceCount() > 0) return CudaHostUnregister(ptr);
  if (munlock(ptr, bytes) != 0) return ErrnoStatus(errno, "munlock", {}, -1, static_cast<int64_t>(bytes));
  return Status::Ok();
}

}  // namespace zinf
