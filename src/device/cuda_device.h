// CUDA entry points of the device layer. Without CUDA compiled in they exist
// and report "unavailable", so callers need no #ifdefs.
#pragma once

#include <memory>
#include <string>

#include "device/device.h"

namespace zinf {

// Why no GPU is usable ("CUDA driver version is insufficient", ...).
std::string CudaUnavailableReason();
StatusOr<std::unique_ptr<Device>> CreateCudaDevice(int ordinal, size_t budget_bytes);
Status CudaHostRegister(void* ptr, size_t bytes);
Status CudaHostUnregister(void* ptr);

}  // namespace zinf
