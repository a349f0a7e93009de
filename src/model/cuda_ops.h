// CudaOps: model::Ops<float> over kernels/cuda_kernels.h on a CUDA device.
//
// The Ops own one stream of the device (Device::CreateStream) and a cuBLAS
// handle bound to it; every kernel, copy and memset is enqueued there, in
// call order, and returns at once. The first error of any kind (a launch, a
// cuBLAS call, a copy, a fault seen at synchronisation) is kept and returned
// by the next Synchronize(), which then clears it; later calls still enqueue
// (a fault poisons the CUDA context anyway, so they fail too).
//
// Copies: CopyToDevice waits until the copy has finished, so `host_src` may
// be reused as soon as it returns (pageable or pinned alike; it is used for
// small inputs such as a batch's tokens). CopyToHost is synchronous, as the
// Ops contract says, and waits for every kernel queued before it.
//
// Matmuls compute in fp32 without TF32, so results stay within float
// rounding of CpuOps<float>; but in the 16-bit compute mode (compute16,
// name "cuda-16"), where the linear layers' matmuls read the engine's
// 16-bit weights as they are (reads_weights16) and run on tensor cores with
// their fp32 operand rounded to the same type (cuda_kernels.h,
// MatmulForward16: fp32 accumulation and results). Everything else stays
// fp32 in both modes. The 16-bit mode holds a cuBLASLt workspace
// (kLtWorkspaceBytes) and operand scratch grown to the largest matmul it
// has run, both from the Device.
//
// Only declared in builds with CUDA kernels (ZINF_HAVE_CUDA_KERNELS).
// Thread-safety: one thread drives a CudaOps; it makes the device's ordinal
// current on that thread before each call.
#pragma once

#include <memory>

#include "model/ops.h"
#include "zinf/status.h"

namespace zinf::model {

#if defined(ZINF_HAVE_CUDA_KERNELS)
// `device` must be a CUDA device and outlive the Ops. kInvalidArgument on a
// host device; a CUDA error (stream, cuBLAS handle) as kInternal; the
// workspace's allocation error (kOutOfMemory under a budget).
StatusOr<std::unique_ptr<Ops<float>>> CreateCudaOps(Device& device, bool compute16 = false);
#endif

}  // namespace zinf::model
