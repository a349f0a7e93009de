// Device: the accelerator zinf computes on, or the host standing in for one.
//
// Two implementations, chosen at run time by CreateDevice():
//   * CudaDevice (compiled when the CUDA Toolkit is found; used when a GPU is
//     present): cudaMalloc, streams, events, cudaMemcpyAsync.
//   * HostDevice: "device memory" is host memory under a budget; an
//     allocation past the budget fails with kOutOfMemory like cudaMalloc;
//     every stream is a worker thread that runs its queue in order, so copies
//     really are asynchronous and ordering bugs show up without a GPU.
//
// Pointers returned by Allocate are device pointers: on CUDA they must not be
// dereferenced on the host. Streams and events come from the device that made
// them and must not outlive it.
//
// Thread-safety: Device methods may be called from any thread. A Stream may be
// used from several threads, but work is ordered by enqueue order.
#pragma once

#include <cstddef>
#include <cstdint>
#include <functional>
#include <map>
#include <memory>
#include <mutex>
#include <string>
#include <vector>

#include "zinf/status.h"

namespace zinf {

enum class DeviceKind { kHost, kCuda };
std::string_view DeviceKindName(DeviceKind kind);

enum class CopyDirection { kHostToDevice, kDeviceToHost, kDeviceToDevice };

class Event {
 public:
  virtual ~Event() = default;
  // True when all work recorded before this event has finished.
  virtual StatusOr<bool> Query() = 0;
  // Blocks until the recorded work has finished; returns its first error.
  virtual Status Synchronize() = 0;
  // True when the recorded work has run, or can no longer run (the query
  // failed): nothing it covers is still in use.
  bool Finished() {
    StatusOr<bool> done = Query();
    return !done.ok() || *done;
  }
};

class Stream {
 public:
  virtual ~Stream() = default;
  // Enqueues a copy of `bytes` bytes. Both buffers must stay valid until the
  // copy has finished (Synchronize, or an Event recorded after it). On a GPU,
  // a copy to or from pageable host memory may return only after the stream's
  // earlier work has run (CUDA's rule): pin host buffers (PinHostMemory) that
  // must be copied without waiting.
  virtual Status CopyAsync(void* dst, const void* src, size_t bytes, CopyDirection dir) = 0;
  // Enqueues `bytes` bytes of `value` at device pointer `dst`.
  virtual Status MemsetAsync(void* dst, int value, size_t bytes) = 0;
  // Enqueues a host function, run in stream order (cudaLaunchHostFunc on CUDA).
  // It must not call back into this stream.
  virtual Status LaunchHostFunc(std::function<void()> fn) = 0;
  // Records an event after the work enqueued so far.
  virtual StatusOr<std::unique_ptr<Event>> Record() = 0;
  // Work enqueued after this call waits until `event` has completed.
  virtual Status Wait(Event& event) = 0;
  // Blocks until everything enqueued so far has finished. A failed copy makes
  // the stream's error sticky: it is returned here and by every later call.
  virtual Status Synchronize() = 0;
  // cudaStream_t on CUDA, nullptr on the host device.
  virtual void* native_handle() = 0;
};

// Time stamps on a stream, taken as its work runs, to time that work without
// waiting for it: Mark() stamps the moment the work enqueued so far is done,
// Collect() waits for the last mark and returns each mark's seconds after
// the first, then forgets them. On CUDA, timing events (cudaEventElapsedTime,
// about half a microsecond of resolution), kept and reused; on the host
// device, a stamp the stream's worker takes when it gets there, or the
// calling thread's clock for the null stream (work that runs in place).
// Made by Device::CreateTimer; it must not outlive its stream, and its
// destructor waits for its marks. One thread marks and collects.
class StreamTimer {
 public:
  virtual ~StreamTimer() = default;
  virtual Status Mark() = 0;
  // Seconds from mark 0 to mark i, for every mark since the last Collect;
  // empty when there were none.
  virtual StatusOr<std::vector<double>> Collect() = 0;
};

class Device {
 public:
  virtual ~Device() = default;
  virtual DeviceKind kind() const = 0;
  // "NVIDIA H100 80GB HBM3 (cuda:0)", "host (budget 2.00 GiB)".
  virtual std::string name() const = 0;

  // Allocates device memory, 256-byte aligned. kOutOfMemory past the budget,
  // once the cache of freed allocations and the reclaimer (if one is set)
  // have nothing more to give back.
  //
  // A device that keeps freed allocations (keeps_freed()) hands them out
  // again to a request of the same rounded size: the engine gathers blocks
  // of a few sizes over and over; on the host a fresh allocation page
  // faults on every byte, and on CUDA cudaFree waits for the whole device.
  // An allocation given back with FreeAfter is handed out only once its
  // event has completed (waited for only when nothing else fits). A
  // request that does not fit frees kept allocations first, largest first
  // (each after its event). Kept memory counts against the budget but not
  // in bytes_in_use.
  StatusOr<void*> Allocate(size_t bytes);
  // Frees one allocation held only as a cache (the engine's kept and
  // prefetched blocks) and returns true, or returns false when none is left.
  // Allocate calls it on the allocating thread each time memory runs out,
  // then tries again. At most one is set; an empty one unsets it.
  using Reclaimer = std::function<bool()>;
  void SetReclaimer(Reclaimer reclaimer) { reclaimer_ = std::move(reclaimer); }
  // Gives back what Allocate returned; nullptr is ignored. No work queued on
  // a stream may still use it.
  void Free(void* ptr);
  // Gives it back once the work enqueued on `stream` so far has finished,
  // without waiting for that work: an event recorded on the stream guards
  // its reuse (see Allocate). When no event can be recorded, the stream is
  // waited for, the memory freed, and the recording's error returned.
  Status FreeAfter(void* ptr, Stream& stream);
  // The same with an event the caller recorded after the last work that
  // uses `ptr` (null: as Free). The caller may keep a share of it.
  void FreeAfter(void* ptr, std::shared_ptr<Event> done);
  // Bytes Allocate has handed out and Free has not taken back.
  size_t bytes_in_use() const;
  // Bytes freed and kept for reuse.
  size_t bytes_cached() const;
  // Whether Free keeps allocations for reuse (see Allocate).
  virtual bool keeps_freed() const = 0;
  // Returns every kept allocation to the driver (or the host's heap).
  void ReleaseCached();
  // Bytes this Device may allocate in all (the budget, or the GPU's memory).
  virtual size_t capacity_bytes() const = 0;

  virtual StatusOr<std::unique_ptr<Stream>> CreateStream() = 0;
  // An event recorded after the work enqueued so far on `stream`: how the
  // engine follows work it did not queue (a model's), without waiting for
  // it. On CUDA a cudaStream_t of this GPU (any other non-null value is
  // undefined, as in CUDA; null is refused); on the host device one of its
  // own Streams (a Stream*), anything else kInvalidArgument.
  virtual StatusOr<std::unique_ptr<Event>> RecordOn(void* stream) = 0;
  // Makes `stream` (as RecordOn takes it) run its later work only after
  // `event` (one of this device's) has completed, without blocking the
  // host: how the engine tells a model's stream that memory it reads may
  // be rewritten.
  virtual Status WaitOn(void* stream, Event& event) = 0;
  // A StreamTimer on `stream`, named as RecordOn takes it; on the host device
  // null is allowed too (the calling thread).
  virtual StatusOr<std::unique_ptr<StreamTimer>> CreateTimer(void* stream) = 0;
  // Blocks until all streams are idle.
  virtual Status Synchronize() = 0;

 protected:
  // One allocation attempt of exactly `bytes` (a multiple of 256), counted
  // against the budget until FreeBytes.
  virtual StatusOr<void*> AllocateBytes(size_t bytes) = 0;
  virtual void FreeBytes(void* ptr) = 0;
  // True when [addr, addr+bytes) lies inside one allocation Allocate handed
  // out and Free has not taken back.
  bool IsLiveRange(uintptr_t addr, size_t bytes) const;

 private:
  // A kept allocation of exactly `bytes`: one whose event has completed,
  // or with `wait` the first one, after waiting for its event. Null: none.
  void* TakeCached(size_t bytes, bool wait);
  bool ReleaseLargestCached();

  struct Kept {
    void* ptr = nullptr;
    std::shared_ptr<Event> done;  // null: free to reuse
  };

  Reclaimer reclaimer_;
  mutable std::mutex mu_;
  std::map<uintptr_t, size_t> live_;          // guarded by mu_: address -> rounded size
  std::multimap<size_t, Kept> cached_;        // guarded by mu_: rounded size -> allocation
  size_t live_bytes_ = 0, cached_bytes_ = 0;  // guarded by mu_
};

struct DeviceOptions {
  enum class Choice { kAuto, kCuda, kHost };
  Choice choice = Choice::kAuto;  // auto: CUDA when a GPU is present, else host
  int cuda_ordinal = 0;
  // HostDevice memory budget; 0 means "no budget" (all host memory).
  size_t host_budget_bytes = 0;
  // Caps a CudaDevice below the GPU's memory (to train "beyond" a budget); 0: none.
  size_t cuda_budget_bytes = 0;
};

// Whether this binary was compiled with CUDA and a GPU is visible.
bool CudaCompiledIn();
int CudaDeviceCount();  // 0 when not compiled in or no GPU / driver

StatusOr<std::unique_ptr<Device>> CreateDevice(const DeviceOptions& options);
std::unique_ptr<Device> CreateHostDevice(size_t budget_bytes);

// Page-locks [ptr, ptr+bytes) for fast, asynchronous copies: cudaHostRegister
// when a GPU is present, mlock otherwise. UnpinHostMemory undoes it.
// kUnavailable when neither works (e.g. RLIMIT_MEMLOCK); callers may go on
// with unpinned memory and log once.
Status PinHostMemory(void* ptr, size_t bytes);
Status UnpinHostMemory(void* ptr, size_t bytes);

}  // namespace zinf
