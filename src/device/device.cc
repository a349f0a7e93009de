// CreateDevice and host pinning: the run-time choice between CUDA and host.
#include <sys/mman.h>

#include <cerrno>

#include "core/log.h"
#include "device/cuda_device.h"
#include "device/device.h"

namespace zinf {

StatusOr<void*> Device::Allocate(size_t bytes) {
  while (true) {
    StatusOr<void*> p = AllocateBytes(bytes);
    if (p.ok() || p.status().code() != StatusCode::kOutOfMemory || !reclaimer_ || !reclaimer_()) return p;
  }
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
