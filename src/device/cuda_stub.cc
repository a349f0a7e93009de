// Built instead of cuda_device.cc when zinf is compiled without CUDA.
#include "device/cuda_device.h"

namespace zinf {

bool CudaCompiledIn() { return false; }
int CudaDeviceCount() { return 0; }
std::string CudaUnavailableReason() { return "built without CUDA"; }
StatusOr<std::unique_ptr<Device>> CreateCudaDevice(int, size_t) {
  return Status::Unavailable("this zinf was built without CUDA");
}
Status CudaHostRegister(void*, size_t) { return Status::Unavailable("this zinf was built without CUDA"); }
Status CudaHostUnregister(void*) { return Status::Unavailable("this zinf was built without CUDA"); }

}  // namespace zinf
