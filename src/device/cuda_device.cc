// CudaDevice: the device layer on the CUDA runtime.
//
// Plain C++ against the runtime API (no kernels here: those live in
// src/kernels and are compiled by nvcc). Compiled only when the toolkit is
// found; cuda_stub.cc stands in otherwise.
#include <cuda_runtime_api.h>

#include <map>
#include <mutex>
#include <vector>

#include "core/check.h"
#include "core/units.h"
#include "device/cuda_device.h"

namespace zinf {
namespace {

Status CudaStatus(cudaError_t err, const char* what) {
  if (err == cudaSuccess) return Status::Ok();
  std::string msg = std::string("cuda ") + what + ": " + cudaGetErrorName(err) + ": " + cudaGetErrorString(err);
  if (err == cudaErrorMemoryAllocation) return Status::OutOfMemory(std::move(msg));
  if (err == cudaErrorInvalidValue || err == cudaErrorInvalidDevicePointer)
    return Status::InvalidArgument(std::move(msg));
  return Status::Internal(std::move(msg));
}

class CudaEvent final : public Event {
 public:
  explicit CudaEvent(cudaEvent_t e) : event_(e) {}
  ~CudaEvent() override { cudaEventDestroy(event_); }
  StatusOr<bool> Query() override {
    cudaError_t err = cudaEventQuery(event_);
    if (err == cudaErrorNotReady) {
      cudaGetLastError();  // not an error: cleared, or the next kernel's launch check would report it
      return false;
    }
    ZINF_RETURN_IF_ERROR(CudaStatus(err, "event query"));
    return true;
  }
  Status Synchronize() override { return CudaStatus(cudaEventSynchronize(event_), "event synchronize"); }
  cudaEvent_t get() const { return event_; }

 private:
  cudaEvent_t event_;
};

// An event recorded on `stream` of GPU `ordinal`.
StatusOr<std::unique_ptr<Event>> RecordEvent(int ordinal, cudaStream_t stream) {
  cudaSetDevice(ordinal);
  cudaEvent_t e;
  ZINF_RETURN_IF_ERROR(CudaStatus(cudaEventCreateWithFlags(&e, cudaEventDisableTiming), "event create"));
  auto event = std::make_unique<CudaEvent>(e);
  ZINF_RETURN_IF_ERROR(CudaStatus(cudaEventRecord(e, stream), "event record"));
  return std::unique_ptr<Event>(std::move(event));
}

// Makes `stream` of GPU `ordinal` wait for `event` (one of this device's).
Status StreamWaitEvent(int ordinal, cudaStream_t stream, Event& event) {
  auto* cuda_event = dynamic_cast<CudaEvent*>(&event);
  if (cuda_event == nullptr) return Status::InvalidArgument("cuda stream wait: event from another device");
  cudaSetDevice(ordinal);
  return CudaStatus(cudaStreamWaitEvent(stream, cuda_event->get(), 0), "stream wait event");
}

class CudaStream final : public Stream {
 public:
  CudaStream(int ordinal, cudaStream_t s) : ordinal_(ordinal), stream_(s) {}
  ~CudaStream() override {
    cudaSetDevice(ordinal_);
    cudaStreamSynchronize(stream_);
    cudaStreamDestroy(stream_);
  }

  Status CopyAsync(void* dst, const void* src, size_t bytes, CopyDirection dir) override {
    if (bytes == 0) return Status::Ok();
    cudaMemcpyKind kind = dir == CopyDirection::kHostToDevice   ? cudaMemcpyHostToDevice
                          : dir == CopyDirection::kDeviceToHost ? cudaMemcpyDeviceToHost
                                                                : cudaMemcpyDeviceToDevice;
    cudaSetDevice(ordinal_);
    return CudaStatus(cudaMemcpyAsync(dst, src, bytes, kind, stream_), "memcpy async");
  }
  Status MemsetAsync(void* dst, int value, size_t bytes) override {
    if (bytes == 0) return Status::Ok();
    cudaSetDevice(ordinal_);
    return CudaStatus(cudaMemsetAsync(dst, value, bytes, stream_), "memset async");
  }
  Status LaunchHostFunc(std::function<void()> fn) override {
    auto* heap_fn = new std::function<void()>(std::move(fn));
    cudaSetDevice(ordinal_);
    cudaError_t err = cudaLaunchHostFunc(
        stream_,
        [](void* arg) {
          auto* f = static_cast<std::function<void()>*>(arg);
          (*f)();
          delete f;
        },
        heap_fn);
    if (err != cudaSuccess) delete heap_fn;
    return CudaStatus(err, "launch host func");
  }
  StatusOr<std::unique_ptr<Event>> Record() override { return RecordEvent(ordinal_, stream_); }
  Status Wait(Event& event) override { return StreamWaitEvent(ordinal_, stream_, event); }
  Status Synchronize() override {
    cudaSetDevice(ordinal_);
    return CudaStatus(cudaStreamSynchronize(stream_), "stream synchronize");
  }
  void* native_handle() override { return stream_; }

 private:
  int ordinal_;
  cudaStream_t stream_;
};

// Timing events recorded on one stream: the pool grows to the most marks
// between two Collects and is reused after.
class CudaTimer final : public StreamTimer {
 public:
  CudaTimer(int ordinal, cudaStream_t stream) : ordinal_(ordinal), stream_(stream) {}
  ~CudaTimer() override {
    cudaSetDevice(ordinal_);
    if (used_ > 0) cudaEventSynchronize(events_[used_ - 1]);
    for (cudaEvent_t e : events_) cudaEventDestroy(e);
  }

  Status Mark() override {
    cudaSetDevice(ordinal_);
    if (used_ == events_.size()) {
      cudaEvent_t e;
      ZINF_RETURN_IF_ERROR(CudaStatus(cudaEventCreate(&e), "timer event create"));
      events_.push_back(e);
    }
    ZINF_RETURN_IF_ERROR(CudaStatus(cudaEventRecord(events_[used_], stream_), "timer event record"));
    ++used_;
    return Status::Ok();
  }

  StatusOr<std::vector<double>> Collect() override {
    std::vector<double> seconds;
    if (used_ == 0) return seconds;
    cudaSetDevice(ordinal_);
    const size_t n = used_;
    used_ = 0;
    ZINF_RETURN_IF_ERROR(CudaStatus(cudaEventSynchronize(events_[n - 1]), "timer event synchronize"));
    seconds.reserve(n);
    for (size_t i = 0; i < n; ++i) {
      float ms = 0.0f;
      ZINF_RETURN_IF_ERROR(CudaStatus(cudaEventElapsedTime(&ms, events_[0], events_[i]), "timer elapsed time"));
      seconds.push_back(static_cast<double>(ms) / 1e3);
    }
    return seconds;
  }

 private:
  int ordinal_;
  cudaStream_t stream_;
  std::vector<cudaEvent_t> events_;
  size_t used_ = 0;  // events_[0, used_) are this round's marks
};

class CudaDevice final : public Device {
 public:
  CudaDevice(int ordinal, size_t budget, size_t total, std::string name)
      : ordinal_(ordinal), capacity_(budget ? std::min(budget, total) : total), name_(std::move(name)) {}
  ~CudaDevice() override {
    std::lock_guard lock(mu_);
    cudaSetDevice(ordinal_);
    for (auto& [p, bytes] : allocations_) cudaFree(p);
  }

  DeviceKind kind() const override { return DeviceKind::kCuda; }
  std::string name() const override { return name_; }

  size_t capacity_bytes() const override { return capacity_; }
  // Kept, not cudaFree'd (which waits for the whole device): see
  // Device::Allocate; FreeAfter's events guard reuse by queued work.
  bool keeps_freed() const override { return true; }

  StatusOr<std::unique_ptr<Stream>> CreateStream() override {
    cudaSetDevice(ordinal_);
    cudaStream_t s;
    ZINF_RETURN_IF_ERROR(CudaStatus(cudaStreamCreateWithFlags(&s, cudaStreamNonBlocking), "stream create"));
    return std::unique_ptr<Stream>(new CudaStream(ordinal_, s));
  }
  StatusOr<std::unique_ptr<Event>> RecordOn(void* stream) override {
    if (stream == nullptr) return Status::InvalidArgument("cuda RecordOn: null stream");
    return RecordEvent(ordinal_, static_cast<cudaStream_t>(stream));
  }
  Status WaitOn(void* stream, Event& event) override {
    if (stream == nullptr) return Status::InvalidArgument("cuda WaitOn: null stream");
    return StreamWaitEvent(ordinal_, static_cast<cudaStream_t>(stream), event);
  }
  StatusOr<std::unique_ptr<StreamTimer>> CreateTimer(void* stream) override {
    if (stream == nullptr) return Status::InvalidArgument("cuda CreateTimer: null stream");
    return std::unique_ptr<StreamTimer>(new CudaTimer(ordinal_, static_cast<cudaStream_t>(stream)));
  }
  Status Synchronize() override {
    cudaSetDevice(ordinal_);
    return CudaStatus(cudaDeviceSynchronize(), "device synchronize");
  }

 protected:
  StatusOr<void*> AllocateBytes(size_t bytes) override {
    {
      std::lock_guard lock(mu_);
      if (in_use_ + bytes > capacity_) {
        return Status::OutOfMemory("cuda:" + std::to_string(ordinal_) + ": cannot allocate " +
                                   FormatBytes(static_cast<int64_t>(bytes)) + ": " +
                                   FormatBytes(static_cast<int64_t>(in_use_)) + " of " +
                                   FormatBytes(static_cast<int64_t>(capacity_)) + " in use");
      }
      in_use_ += bytes;
    }
    cudaSetDevice(ordinal_);
    void* p = nullptr;
    cudaError_t err = cudaMalloc(&p, std::max<size_t>(bytes, 1));
    if (err != cudaSuccess) cudaGetLastError();  // returned below; the next kernel's launch check must not see it
    std::lock_guard lock(mu_);
    if (err != cudaSuccess) {
      in_use_ -= bytes;
      return CudaStatus(err, ("malloc " + FormatBytes(static_cast<int64_t>(bytes))).c_str());
    }
    allocations_.emplace(p, bytes);
    return p;
  }
  void FreeBytes(void* ptr) override {
    std::lock_guard lock(mu_);
    auto it = allocations_.find(ptr);
    ZINF_CHECK_MSG(it != allocations_.end(), "CudaDevice::FreeBytes of a pointer it did not allocate");
    in_use_ -= it->second;
    allocations_.erase(it);
    cudaSetDevice(ordinal_);
    cudaFree(ptr);
  }

 private:
  const int ordinal_;
  const size_t capacity_;
  const std::string name_;
  mutable std::mutex mu_;
  size_t in_use_ = 0;                    // guarded by mu_
  std::map<void*, size_t> allocations_;  // guarded by mu_
};

struct Probe {
  int count = 0;
  std::string reason;
};

const Probe& GetProbe() {
  static const Probe probe = [] {
    Probe p;
    cudaError_t err = cudaGetDeviceCount(&p.count);
    if (err != cudaSuccess) {
      p.count = 0;
      p.reason = cudaGetErrorString(err);
      cudaGetLastError();  // clear it
    } else if (p.count == 0) {
      p.reason = "no CUDA devices";
    }
    return p;
  }();
  return probe;
}

}  // namespace

bool CudaCompiledIn() { return true; }
int CudaDeviceCount() { return GetProbe().count; }
std::string CudaUnavailableReason() { return GetProbe().reason; }

StatusOr<std::unique_ptr<Device>> CreateCudaDevice(int ordinal, size_t budget_bytes) {
  ZINF_RETURN_IF_ERROR(CudaStatus(cudaSetDevice(ordinal), "set device"));
  cudaDeviceProp prop{};
  ZINF_RETURN_IF_ERROR(CudaStatus(cudaGetDeviceProperties(&prop, ordinal), "get device properties"));
  size_t free_bytes = 0, total_bytes = 0;
  ZINF_RETURN_IF_ERROR(CudaStatus(cudaMemGetInfo(&free_bytes, &total_bytes), "mem get info"));
  std::string name = std::string(prop.name) + " (cuda:" + std::to_string(ordinal) + ")";
  if (budget_bytes) name += " budget " + FormatBytes(static_cast<int64_t>(budget_bytes));
  return std::unique_ptr<Device>(new CudaDevice(ordinal, budget_bytes, free_bytes, std::move(name)));
}

Status CudaHostRegister(void* ptr, size_t bytes) {
  return CudaStatus(cudaHostRegister(ptr, bytes, cudaHostRegisterDefault), "host register");
}
Status CudaHostUnregister(void* ptr) { return CudaStatus(cudaHostUnregister(ptr), "host unregister"); }

}  // namespace zinf
