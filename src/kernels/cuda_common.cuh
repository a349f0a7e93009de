// What the CUDA kernel files (*.cu here) share: launch geometry for
// grid-stride loops, the launch and runtime errors as Status, the warp sum,
// and the column sums' launch (defined in cuda_kernels.cu). Included by .cu
// files only (it holds device code).
#pragma once

#include <cuda_runtime.h>

#include <algorithm>
#include <cstdint>
#include <string>

#include "zinf/status.h"

namespace zinf::kernels::cuda {

inline constexpr int kThreads = 256;  // threads per block of 1-D kernels
inline constexpr int kWarpsPerBlock = kThreads / 32;
inline constexpr int64_t kMaxBlocks = 65536;  // grid-stride loops cover the rest
inline constexpr unsigned kFullMask = 0xffffffffu;

#define ZINF_GRID_STRIDE(i, n)                                                           \
  for (int64_t i = static_cast<int64_t>(blockIdx.x) * blockDim.x + threadIdx.x; i < (n); \
       i += static_cast<int64_t>(gridDim.x) * blockDim.x)

inline Status CudaError(cudaError_t err, const char* what) {
  if (err == cudaSuccess) return Status::Ok();
  return Status::Internal(std::string("cuda ") + what + ": " + cudaGetErrorName(err) + ": " + cudaGetErrorString(err));
}

// The status of the launch just made on this thread.
inline Status LaunchStatus(const char* kernel) { return CudaError(cudaGetLastError(), kernel); }

inline cudaStream_t AsStream(void* s) { return static_cast<cudaStream_t>(s); }

// Blocks for a grid-stride loop over `n` items with `per_block` items per
// block: at least one, at most kMaxBlocks.
inline unsigned GridFor(int64_t n, int64_t per_block) {
  return static_cast<unsigned>(std::max<int64_t>(1, std::min<int64_t>((n + per_block - 1) / per_block, kMaxBlocks)));
}

// GELU, tanh approximation (cpu_kernels.h), and its derivative.
inline constexpr float kGeluScale = 0.7978845608028654f;  // sqrt(2 / pi)
inline constexpr float kGeluCubic = 0.044715f;
__device__ __forceinline__ float GeluTanh(float x) {
  const float u = kGeluScale * (x + kGeluCubic * x * x * x);
  return 0.5f * x * (1.0f + tanhf(u));
}
__device__ __forceinline__ float GeluTanhGrad(float x) {
  const float u = kGeluScale * (x + kGeluCubic * x * x * x);
  const float th = tanhf(u);
  const float du_dx = kGeluScale * (1.0f + 3.0f * kGeluCubic * x * x);
  return 0.5f * (1.0f + th) + 0.5f * x * (1.0f - th * th) * du_dx;
}

__device__ __forceinline__ float WarpSum(float v) {
  for (int offset = 16; offset > 0; offset >>= 1) v += __shfl_xor_sync(kFullMask, v, offset);
  return v;
}

// Column sums over the N rows of [N, C] arrays (cuda_kernels.cu), the same
// bits run to run: dbias += sum_n dout, and with `inp` dweight += sum_n dout
// * xhat, xhat = (inp - mean) * rstd (LayerNorm) or inp * rstd without
// `mean` (RMSNorm). A null dweight or dbias is skipped.
Status LaunchColumnSums(float* dweight, float* dbias, const float* dout, const float* inp, const float* mean,
                        const float* rstd, int64_t N, int C, cudaStream_t s, const char* name);

}  // namespace zinf::kernels::cuda
