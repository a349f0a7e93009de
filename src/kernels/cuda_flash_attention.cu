// Fused causal attention on tensor cores (contract in cuda_kernels.h).
//
// Design. FlashAttention's algorithm (Dao et al., 2022; the FA2 split of
// the backward): the T x T scores never reach global memory. A block of
// four warps takes a tile of 64 rows (queries in the forward and in the dq
// pass, keys in the dk/dv pass) of one (batch, head) and walks the other
// side's 64-row tiles that the causal mask (and a sliding window) leaves; each warp owns 16 of the
// block's rows. q, k, v and dout are read from their fp32 activations and
// rounded to bf16 into shared memory; the matmuls are WMMA 16x16x16 bf16
// with fp32 accumulators; the score tile goes through shared memory in fp32,
// where one lane pair per row masks, exponentiates and writes P (or dS)
// back as bf16 for the next matmul. Forward: an online softmax per row (a
// running max and sum, the output rescaled when the max grows); saves each
// row's log-sum-exp. Backward: D = rowsum(bf16(dout) * out) first; one pass per
// key tile recomputes P = exp(s - lse) and sums dv += P^T dout and
// dk += dS^T q; a second pass per query tile recomputes them again and sums
// dq += dS k. A softcap (Gemma 2) turns each visible score s into cap *
// tanh(s / cap) before the softmax; the backward's dS is then times 1 -
// tanh^2, recomputed beside P. Two passes rather than atomics keep the sums' order fixed:
// the results are the same bits run to run.
// bf16 in both 16-bit modes: the fp16 mode's gradients carry the loss
// scale, and bf16 has fp32's range.
#include <cuda_bf16.h>
#include <cuda_runtime.h>
#include <mma.h>

#include <cmath>
#include <cstdint>
#include <string>

#include "kernels/cuda_common.cuh"
#include "kernels/cuda_flash_attention_kernels.cuh"
#include "kernels/cuda_kernels.h"

namespace zinf::kernels::cuda {

namespace {

// The kernels' dynamic shared memory above 48 KiB must be asked for once
// per kernel and device.
template <typename Kernel>
Status AllowSharedMemory(Kernel kernel, size_t bytes, const char* what) {
  return CudaError(cudaFuncSetAttribute(kernel, cudaFuncAttributeMaxDynamicSharedMemorySize, static_cast<int>(bytes)),
                   what);
}

template <int HS>
Status Forward(float* out, float* lse, const float* qkv, int B, int T, int C, int NH, int window, float softcap,
               cudaStream_t s) {
  const size_t bytes = flash::Layout<HS>::kForwardBytes;
  ZINF_RETURN_IF_ERROR(
      AllowSharedMemory(flash::FlashForwardKernel<HS>, bytes, "flash_attention_forward shared memory"));
  const dim3 grid((T + flash::kTile - 1) / flash::kTile, B * NH);
  const float scale = 1.0f / sqrtf(static_cast<float>(HS));
  flash::FlashForwardKernel<HS>
      <<<grid, flash::kFlashThreads, bytes, s>>>(out, lse, qkv, T, C, NH, scale, window, softcap);
  return LaunchStatus("flash_attention_forward");
}

template <int HS>
Status Backward(float* dqkv, float* d, const float* dout, const float* qkv, const float* lse, int B, int T, int C,
                int NH, int window, float softcap, cudaStream_t s) {
  const size_t bytes = flash::Layout<HS>::kBackwardBytes;
  ZINF_RETURN_IF_ERROR(
      AllowSharedMemory(flash::FlashBackwardKvKernel<HS>, bytes, "flash_attention_backward shared memory"));
  ZINF_RETURN_IF_ERROR(
      AllowSharedMemory(flash::FlashBackwardQKernel<HS>, bytes, "flash_attention_backward shared memory"));
  const dim3 grid((T + flash::kTile - 1) / flash::kTile, B * NH);
  const float scale = 1.0f / sqrtf(static_cast<float>(HS));
  flash::FlashBackwardKvKernel<HS>
      <<<grid, flash::kFlashThreads, bytes, s>>>(dqkv, dout, qkv, lse, d, T, C, NH, scale, window, softcap);
  ZINF_RETURN_IF_ERROR(LaunchStatus("flash_attention_backward dk dv"));
  flash::FlashBackwardQKernel<HS>
      <<<grid, flash::kFlashThreads, bytes, s>>>(dqkv, dout, qkv, lse, d, T, C, NH, scale, window, softcap);
  return LaunchStatus("flash_attention_backward dq");
}

size_t SharedBytes(int hs) {
  switch (hs) {
    case 16: return std::max(flash::Layout<16>::kForwardBytes, flash::Layout<16>::kBackwardBytes);
    case 32: return std::max(flash::Layout<32>::kForwardBytes, flash::Layout<32>::kBackwardBytes);
    case 64: return std::max(flash::Layout<64>::kForwardBytes, flash::Layout<64>::kBackwardBytes);
    case 128: return std::max(flash::Layout<128>::kForwardBytes, flash::Layout<128>::kBackwardBytes);
    default: return 0;
  }
}

Status CheckShape(const char* what, int B, int T, int C, int NH, int window, float softcap) {
  if (B < 0 || T < 0 || window < 0) {
    return Status::InvalidArgument(std::string(what) + ": negative batch " + std::to_string(B) + ", length " +
                                   std::to_string(T) + " or window " + std::to_string(window));
  }
  if (!(softcap >= 0.0f)) return Status::InvalidArgument(std::string(what) + ": softcap must be >= 0 (0: none)");
  if (NH <= 0 || C % NH != 0 || SharedBytes(C / NH) == 0) {
    return Status::InvalidArgument(std::string(what) + ": head size " + std::to_string(NH > 0 ? C / NH : 0) + " (C " +
                                   std::to_string(C) + ", NH " + std::to_string(NH) +
                                   ") is not one of 16, 32, 64, 128");
  }
  if (static_cast<int64_t>(B) * NH > 65535) {
    return Status::InvalidArgument(std::string(what) + ": B * NH " + std::to_string(int64_t{B} * NH) +
                                   " over the grid's 65535");
  }
  return Status::Ok();
}

}  // namespace

bool FlashAttentionSupported(int C, int NH, int ordinal) {
  if (NH <= 0 || C % NH != 0) return false;
  const size_t bytes = SharedBytes(C / NH);
  if (bytes == 0) return false;
  int optin = 0;
  if (cudaDeviceGetAttribute(&optin, cudaDevAttrMaxSharedMemoryPerBlockOptin, ordinal) != cudaSuccess) {
    cudaGetLastError();  // not sticky: clear it
    return false;
  }
  return bytes <= static_cast<size_t>(optin);
}

Status FlashAttentionForward(float* out, float* lse, const float* qkv, int B, int T_, int C, int NH, int window,
                             float softcap, void* stream) {
  ZINF_RETURN_IF_ERROR(CheckShape("flash_attention_forward", B, T_, C, NH, window, softcap));
  if (static_cast<int64_t>(B) * T_ == 0) return Status::Ok();
  if (window >= T_) window = 0;  // none (and the tile bounds stay far from overflow)
  const cudaStream_t s = AsStream(stream);
  switch (C / NH) {
    case 16: return Forward<16>(out, lse, qkv, B, T_, C, NH, window, softcap, s);
    case 32: return Forward<32>(out, lse, qkv, B, T_, C, NH, window, softcap, s);
    case 64: return Forward<64>(out, lse, qkv, B, T_, C, NH, window, softcap, s);
    default: return Forward<128>(out, lse, qkv, B, T_, C, NH, window, softcap, s);
  }
}

Status FlashAttentionBackward(float* dqkv, float* scratch, const float* dout, const float* qkv, const float* out,
                              const float* lse, int B, int T_, int C, int NH, int window, float softcap, void* stream) {
  ZINF_RETURN_IF_ERROR(CheckShape("flash_attention_backward", B, T_, C, NH, window, softcap));
  const int64_t rows = static_cast<int64_t>(B) * NH * T_;
  if (rows == 0) return Status::Ok();
  if (window >= T_) window = 0;
  const cudaStream_t s = AsStream(stream);
  flash::FlashRowDotKernel<<<GridFor(rows, kWarpsPerBlock), kThreads, 0, s>>>(scratch, dout, out, T_, C, NH, C / NH,
                                                                              rows);
  ZINF_RETURN_IF_ERROR(LaunchStatus("flash_attention_backward dout.out"));
  switch (C / NH) {
    case 16: return Backward<16>(dqkv, scratch, dout, qkv, lse, B, T_, C, NH, window, softcap, s);
    case 32: return Backward<32>(dqkv, scratch, dout, qkv, lse, B, T_, C, NH, window, softcap, s);
    case 64: return Backward<64>(dqkv, scratch, dout, qkv, lse, B, T_, C, NH, window, softcap, s);
    default: return Backward<128>(dqkv, scratch, dout, qkv, lse, B, T_, C, NH, window, softcap, s);
  }
}

}  // namespace zinf::kernels::cuda
