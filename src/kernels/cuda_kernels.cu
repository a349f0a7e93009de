// CUDA kernels of the reference GPT (see cuda_kernels.h for the contract).
//
// Design: simple and obviously right before fast. Elementwise kernels are
// grid-stride loops over int64 indices; row kernels (LayerNorm, softmax) give
// one warp to a row; cross-entropy gives one block to a row (V is large);
// column sums (dweight, dbias) give one 32-column tile to a block and reduce
// its 32 row-strided partial sums in a fixed order. Nothing uses atomics, so
// every result is the same run to run. Matmuls go to cuBLAS in fp32; a
// row-major helper (RowMajorGemm) hides cuBLAS's column-major convention.
#include <cublas_v2.h>
#include <cuda_bf16.h>
#include <cuda_fp16.h>
#include <cuda_runtime.h>

#include <algorithm>
#include <climits>
#include <cmath>
#include <string>

#include "kernels/cuda_common.cuh"
#include "kernels/cuda_kernels.h"

namespace zinf::kernels::cuda {
namespace {

Status BlasError(cublasStatus_t st, const char* what) {
  if (st == CUBLAS_STATUS_SUCCESS) return Status::Ok();
  return Status::Internal(std::string("cublas ") + what + ": " + cublasGetStatusName(st) + ": " +
                          cublasGetStatusString(st));
}

__device__ __forceinline__ float WarpMax(float v) {
  for (int offset = 16; offset > 0; offset >>= 1) v = fmaxf(v, __shfl_xor_sync(kFullMask, v, offset));
  return v;
}

// Sum (or max) over the block; every thread gets the result. `shared` holds
// 32 floats. Must be reached by all threads of the block.
__device__ float BlockSum(float v, float* shared) {
  const int lane = threadIdx.x & 31, warp = threadIdx.x >> 5, warps = blockDim.x >> 5;
  v = WarpSum(v);
  __syncthreads();  // an earlier call's readers are done with `shared`
  if (lane == 0) shared[warp] = v;
  __syncthreads();
  return WarpSum(lane < warps ? shared[lane] : 0.0f);
}
__device__ float BlockMax(float v, float* shared) {
  const int lane = threadIdx.x & 31, warp = threadIdx.x >> 5, warps = blockDim.x >> 5;
  v = WarpMax(v);
  __syncthreads();
  if (lane == 0) shared[warp] = v;
  __syncthreads();
  return WarpMax(lane < warps ? shared[lane] : -INFINITY);
}

// Warp `w` of the grid walks rows w, w + warps in grid, ...
#define ZINF_WARP_ROWS(row, rows)                                                                             \
  for (int64_t row = static_cast<int64_t>(blockIdx.x) * (blockDim.x >> 5) + (threadIdx.x >> 5); row < (rows); \
       row += static_cast<int64_t>(gridDim.x) * (blockDim.x >> 5))

// ---- memory ------------------------------------------------------------------

__device__ __forceinline__ float ToFloat(__half x) { return __half2float(x); }
__device__ __forceinline__ float ToFloat(__nv_bfloat16 x) { return __bfloat162float(x); }
__device__ __forceinline__ float ToFloat(double x) { return static_cast<float>(x); }

template <typename S>
__global__ void CastKernel(float* out, const S* src, int64_t n) {
  ZINF_GRID_STRIDE(i, n) out[i] = ToFloat(src[i]);
}

// ---- encoder -------------------------------------------------------------------

__global__ void EncoderForwardKernel(float* out, const int32_t* tokens, const float* wte, const float* wpe, int T,
                                     int C, int64_t total) {
  ZINF_GRID_STRIDE(i, total) {
    const int64_t n = i / C;
    const int c = static_cast<int>(i % C);
    const int t = static_cast<int>(n % T);
    out[i] = wte[static_cast<int64_t>(tokens[n]) * C + c] + wpe[static_cast<int64_t>(t) * C + c];
  }
}

// dwpe[t, c] += dout[b, t, c] for b = 0..B-1, in that order.
__global__ void EncoderBackwardWpeKernel(float* dwpe, const float* dout, int B, int T, int C) {
  const int64_t total = static_cast<int64_t>(T) * C;
  ZINF_GRID_STRIDE(i, total) {
    float acc = dwpe[i];
    for (int b = 0; b < B; ++b) acc += dout[static_cast<int64_t>(b) * total + i];
    dwpe[i] = acc;
  }
}

// Thread (c, g) owns dwte[v, c] for every v with v % groups == g and adds
// the positions n = 0..N-1 whose token it owns, in order: no two threads
// touch one element, so no atomics and a fixed order of additions.
__global__ void EncoderBackwardWteKernel(float* dwte, const float* dout, const int32_t* tokens, int64_t N, int C,
                                         int groups, int32_t padding_token) {
  const int c = blockIdx.x * blockDim.x + threadIdx.x;
  const int g = blockIdx.y;
  if (c >= C) return;
  for (int64_t n = 0; n < N; ++n) {
    const int tok = tokens[n];
    if (tok % groups != g || tok == padding_token) continue;
    float* dst = dwte + static_cast<int64_t>(tok) * C + c;
    *dst += dout[n * C + c];
  }
}
constexpr int kWteGroups = 64;
constexpr int kWteThreads = 128;

// ---- layernorm -----------------------------------------------------------------

__global__ void LayerNormForwardKernel(float* out, float* mean, float* rstd, const float* inp, const float* weight,
                                       const float* bias, int64_t N, int C) {
  const int lane = threadIdx.x & 31;
  ZINF_WARP_ROWS(row, N) {
    const float* x = inp + row * C;
    float sum = 0.0f;
    for (int c = lane; c < C; c += 32) sum += x[c];
    const float m = WarpSum(sum) / C;
    float sq = 0.0f;
    for (int c = lane; c < C; c += 32) {
      const float d = x[c] - m;
      sq += d * d;
    }
    const float var = WarpSum(sq) / C;
    const float r = 1.0f / sqrtf(var + static_cast<float>(kLayerNormEps));
    float* y = out + row * C;
    for (int c = lane; c < C; c += 32) y[c] = (x[c] - m) * r * weight[c] + (bias ? bias[c] : 0.0f);
    if (lane == 0) {
      mean[row] = m;
      rstd[row] = r;
    }
  }
}

// dinp += rstd * (w*dout - mean(w*dout) - xhat * mean(w*dout*xhat)), per row.
__global__ void LayerNormBackwardInputKernel(float* dinp, const float* dout, const float* inp, const float* weight,
                                             const float* mean, const float* rstd, int64_t N, int C) {
  const int lane = threadIdx.x & 31;
  ZINF_WARP_ROWS(row, N) {
    const float* x = inp + row * C;
    const float* dy = dout + row * C;
    const float m = mean[row], r = rstd[row];
    float s1 = 0.0f, s2 = 0.0f;
    for (int c = lane; c < C; c += 32) {
      const float dnorm = weight[c] * dy[c];
      s1 += dnorm;
      s2 += dnorm * (x[c] - m) * r;
    }
    const float mean_dnorm = WarpSum(s1) / C;
    const float mean_dnorm_xhat = WarpSum(s2) / C;
    float* dx = dinp + row * C;
    for (int c = lane; c < C; c += 32) {
      const float xhat = (x[c] - m) * r;
      dx[c] += r * (weight[c] * dy[c] - mean_dnorm - xhat * mean_dnorm_xhat);
    }
  }
}

// Column sums over N rows, one 32-column tile per block of 32 x 32 threads:
// thread (tx, ty) sums rows ty, ty+32, ... of column tile*32+tx; row ty = 0
// then adds the 32 partials in order. With `inp` (LayerNorm; RMSNorm without
// `mean`), also sum dout * xhat into dweight; without it, only sum dout into
// dbias.
__global__ void ColumnSumsKernel(float* dweight, float* dbias, const float* dout, const float* inp, const float* mean,
                                 const float* rstd, int64_t N, int C) {
  __shared__ float part_w[32][33];
  __shared__ float part_b[32][33];
  const int tx = threadIdx.x, ty = threadIdx.y;
  const int col = blockIdx.x * 32 + tx;
  float sw = 0.0f, sb = 0.0f;
  if (col < C) {
    for (int64_t n = ty; n < N; n += 32) {
      const float g = dout[n * C + col];
      sb += g;
      if (inp) sw += mean ? g * (inp[n * C + col] - mean[n]) * rstd[n] : g * (inp[n * C + col] * rstd[n]);
    }
  }
  part_w[ty][tx] = sw;
  part_b[ty][tx] = sb;
  __syncthreads();
  if (ty == 0 && col < C) {
    float tw = 0.0f, tb = 0.0f;
    for (int k = 0; k < 32; ++k) {
      tw += part_w[k][tx];
      tb += part_b[k][tx];
    }
    if (dweight) dweight[col] += tw;
    if (dbias) dbias[col] += tb;
  }
}

// ---- matmul --------------------------------------------------------------------

__global__ void AddBiasKernel(float* out, const float* bias, int64_t N, int OC) {
  const int64_t total = N * OC;
  ZINF_GRID_STRIDE(i, total) out[i] += bias[i % OC];
}

// Row-major C[M, N] (leading dim ldc) = alpha * op(A)[M, K] op(B)[K, N] + beta * C,
// `batch` times with the given element strides. A row-major matrix is its
// transpose in cuBLAS's column-major view, so this computes
// C^T = op(B)^T op(A)^T: cuBLAS gets B first, with the same transpose flags.
// lda / ldb are the row lengths of A and B as stored.
Status RowMajorGemm(CudaBlas& blas, bool trans_a, bool trans_b, int M, int N, int K, float alpha, const float* A,
                    int lda, int64_t stride_a, const float* B, int ldb, int64_t stride_b, float beta, float* C, int ldc,
                    int64_t stride_c, int batch, const char* name) {
  auto handle = static_cast<cublasHandle_t>(blas.handle());
  const cublasComputeType_t compute = blas.allow_tf32() ? CUBLAS_COMPUTE_32F_FAST_TF32 : CUBLAS_COMPUTE_32F;
  const cublasOperation_t op_b = trans_b ? CUBLAS_OP_T : CUBLAS_OP_N;
  const cublasOperation_t op_a = trans_a ? CUBLAS_OP_T : CUBLAS_OP_N;
  cublasStatus_t st;
  if (batch == 1) {
    st = cublasGemmEx(handle, op_b, op_a, N, M, K, &alpha, B, CUDA_R_32F, ldb, A, CUDA_R_32F, lda, &beta, C, CUDA_R_32F,
                      ldc, compute, CUBLAS_GEMM_DEFAULT);
  } else {
    st = cublasGemmStridedBatchedEx(handle, op_b, op_a, N, M, K, &alpha, B, CUDA_R_32F, ldb, stride_b, A, CUDA_R_32F,
                                    lda, stride_a, &beta, C, CUDA_R_32F, ldc, stride_c, batch, compute,
                                    CUBLAS_GEMM_DEFAULT);
  }
  return BlasError(st, name);
}

Status CheckIntSize(int64_t v, const char* what) {
  if (v < 0 || v > INT_MAX)
    return Status::InvalidArgument(std::string("cuda kernels: ") + what + " = " + std::to_string(v) +
                                   " does not fit cuBLAS's int");
  return Status::Ok();
}

// ---- attention -----------------------------------------------------------------

struct AttentionShape {
  int B, T, C, NH, hs;
  int64_t per_tensor() const { return static_cast<int64_t>(B) * T * C; }  // [B, NH, T, hs]
};

// Decodes i over [B, NH, T, hs] into its offset in a [B, T, row_len] tensor
// at column h*hs + d (qkv: row_len 3C, q part; out/dout: row_len C).
__device__ __forceinline__ int64_t BhtdToRow(int64_t i, int T, int NH, int hs, int row_len) {
  const int d = static_cast<int>(i % hs);
  const int64_t bht = i / hs;
  const int t = static_cast<int>(bht % T);
  const int64_t bh = bht / T;
  const int h = static_cast<int>(bh % NH);
  const int64_t b = bh / NH;
  return (b * T + t) * row_len + static_cast<int64_t>(h) * hs + d;
}

__global__ void PermuteQkvKernel(float* q, float* k, float* v, const float* qkv, int T, int C, int NH, int hs,
                                 int64_t total) {
  ZINF_GRID_STRIDE(i, total) {
    const int64_t src = BhtdToRow(i, T, NH, hs, 3 * C);
    q[i] = qkv[src];
    k[i] = qkv[src + C];
    v[i] = qkv[src + 2 * C];
  }
}

__global__ void AccumulateQkvKernel(float* dqkv, const float* dq, const float* dk, const float* dv, int T, int C,
                                    int NH, int hs, int64_t total) {
  ZINF_GRID_STRIDE(i, total) {
    const int64_t dst = BhtdToRow(i, T, NH, hs, 3 * C);
    dqkv[dst] += dq[i];
    dqkv[dst + C] += dk[i];
    dqkv[dst + 2 * C] += dv[i];
  }
}

// out [B, T, C] = y [B, NH, T, hs] with heads concatenated.
__global__ void UnpermuteKernel(float* out, const float* y, int T, int C, int NH, int hs, int64_t total) {
  ZINF_GRID_STRIDE(i, total) out[BhtdToRow(i, T, NH, hs, C)] = y[i];
}

// dy [B, NH, T, hs] = dout [B, T, C] split into heads.
__global__ void PermuteOutKernel(float* dy, const float* dout, int T, int C, int NH, int hs, int64_t total) {
  ZINF_GRID_STRIDE(i, total) dy[i] = dout[BhtdToRow(i, T, NH, hs, C)];
}

// The first key query t sees (`window` 0: none, cpu_kernels.h).
__device__ __forceinline__ int FirstKey(int t, int window) { return window > 0 ? max(0, t - window + 1) : 0; }

// A scaled score x through the softcap (`cap` > 0: cap * tanh(x / cap); 0: none).
__device__ __forceinline__ float SoftcapOf(float x, float cap) { return cap > 0.0f ? cap * tanhf(x / cap) : x; }

// In place over att [rows = B*NH*T, T] holding scaled q.k: row r (query
// t = r % T) becomes softmax over keys FirstKey(t) .. t of the (capped)
// scores, zeros elsewhere; with `sinks` [NH] (or null) head h's sink logit
// joins the sum (cpu_kernels.h). The shuffles in WarpMax / WarpSum make
// every lane finish reading before any lane writes.
__global__ void CausalSoftmaxKernel(float* att, int64_t rows, int T, int NH, int window, float softcap,
                                    const float* sinks) {
  const int lane = threadIdx.x & 31;
  ZINF_WARP_ROWS(r, rows) {
    const int t = static_cast<int>(r % T), lo = FirstKey(t, window);
    float* row = att + r * T;
    float mx = -INFINITY;
    for (int s = lo + lane; s <= t; s += 32) mx = fmaxf(mx, SoftcapOf(row[s], softcap));
    mx = WarpMax(mx);
    const float sink = sinks != nullptr ? sinks[r / T % NH] : -INFINITY;
    mx = fmaxf(mx, sink);
    float sum = 0.0f;
    for (int s = lo + lane; s <= t; s += 32) sum += expf(SoftcapOf(row[s], softcap) - mx);
    const float inv = 1.0f / (WarpSum(sum) + (sinks != nullptr ? expf(sink - mx) : 0.0f));
    for (int s = lane; s < T; s += 32) row[s] = s >= lo && s <= t ? expf(SoftcapOf(row[s], softcap) - mx) * inv : 0.0f;
  }
}

// In place over datt: dpreatt[t, s] = att[t, s] * (datt[t, s] - sum_s' att[t, s'] datt[t, s'])
// for the keys s query t sees, 0 elsewhere (the 1/sqrt(hs) scale is applied by the GEMMs after);
// with a softcap, times 1 - tanh(scores[t, s] / softcap)^2 (`scores`: the scaled q.k again).
// `sink_terms` (or null) [rows] gets each row's p_sink * dot, p_sink = 1 - the row's sum.
__global__ void CausalSoftmaxBackwardKernel(float* datt, const float* att, const float* scores, int64_t rows, int T,
                                            int window, float softcap, float* sink_terms) {
  const int lane = threadIdx.x & 31;
  ZINF_WARP_ROWS(r, rows) {
    const int t = static_cast<int>(r % T), lo = FirstKey(t, window);
    float* g = datt + r * T;
    const float* p = att + r * T;
    float dot = 0.0f, mass = 0.0f;
    for (int s = lo + lane; s <= t; s += 32) {
      dot += p[s] * g[s];
      mass += p[s];
    }
    dot = WarpSum(dot);
    if (sink_terms != nullptr) {
      mass = WarpSum(mass);
      if (lane == 0) sink_terms[r] = (1.0f - mass) * dot;
    }
    for (int s = lane; s < T; s += 32) {
      float v = 0.0f;
      if (s >= lo && s <= t) {
        v = p[s] * (g[s] - dot);
        if (softcap > 0.0f) {
          const float u = tanhf(scores[r * T + s] / softcap);
          v *= 1.0f - u * u;
        }
      }
      g[s] = v;
    }
  }
}

// dsinks[h] -= the sum of head h's rows' sink terms [B, NH, T]: a warp
// per head, lanes strided over its rows in a fixed order (the same bits
// run to run).
__global__ void SinkGradKernel(float* dsinks, const float* sink_terms, int B, int NH, int T) {
  const int lane = threadIdx.x & 31;
  ZINF_WARP_ROWS(h, NH) {
    float sum = 0.0f;
    for (int64_t i = lane; i < int64_t{B} * T; i += 32) {
      const int64_t b = i / T, t = i % T;
      sum += sink_terms[(b * NH + h) * T + t];
    }
    sum = WarpSum(sum);
    if (lane == 0) dsinks[h] -= sum;
  }
}

__global__ void SoftcapForwardKernel(float* x, float cap, int64_t n) {
  ZINF_GRID_STRIDE(i, n) x[i] = cap * tanhf(x[i] / cap);
}

__global__ void SoftcapBackwardKernel(float* dx, const float* y, float cap, int64_t n) {
  ZINF_GRID_STRIDE(i, n) {
    const float u = y[i] / cap;
    dx[i] *= 1.0f - u * u;
  }
}

// ---- elementwise ---------------------------------------------------------------

__global__ void GeluForwardKernel(float* out, const float* inp, int64_t n) {
  ZINF_GRID_STRIDE(i, n) out[i] = GeluTanh(inp[i]);
}

__global__ void GeluBackwardKernel(float* dinp, const float* inp, const float* dout, int64_t n) {
  ZINF_GRID_STRIDE(i, n) dinp[i] += GeluTanhGrad(inp[i]) * dout[i];
}

__global__ void ResidualKernel(float* out, const float* a, const float* b, int64_t n) {
  ZINF_GRID_STRIDE(i, n) out[i] = a[i] + b[i];
}

__global__ void AccumulateKernel(float* y, const float* x, int64_t n) { ZINF_GRID_STRIDE(i, n) y[i] += x[i]; }

__global__ void ScaleKernel(float* x, float s, int64_t n) { ZINF_GRID_STRIDE(i, n) x[i] *= s; }

// ---- cross-entropy -------------------------------------------------------------

// One block per row (every thread of a block walks the same rows, so the
// block reductions are reached by all of them).
__global__ void CrossEntropyKernel(float* losses, float* dlogits, const float* logits, const int32_t* targets,
                                   int64_t N, int V, int Vp, float dloss) {
  __shared__ float shared[32];
  for (int64_t n = blockIdx.x; n < N; n += gridDim.x) {
    const float* x = logits + n * Vp;
    const int target = targets[n];
    float mx = -INFINITY;
    for (int v = threadIdx.x; v < V; v += blockDim.x) mx = fmaxf(mx, x[v]);
    mx = BlockMax(mx, shared);
    float sum = 0.0f;
    for (int v = threadIdx.x; v < V; v += blockDim.x) sum += expf(x[v] - mx);
    sum = BlockSum(sum, shared);
    if (threadIdx.x == 0) {
      // -log(exp(x_t - mx) / sum); a target out of range gives NaN, not a wild read.
      losses[n] = (target >= 0 && target < V) ? logf(sum) + mx - x[target] : NAN;
    }
    if (dlogits) {
      const float inv = 1.0f / sum;
      float* d = dlogits + n * Vp;
      for (int v = threadIdx.x; v < V; v += blockDim.x) {
        const float p = expf(x[v] - mx) * inv;
        d[v] += (p - (v == target ? 1.0f : 0.0f)) * dloss;
      }
    }
  }
}

}  // namespace

Status LaunchColumnSums(float* dweight, float* dbias, const float* dout, const float* inp, const float* mean,
                        const float* rstd, int64_t N, int C, cudaStream_t s, const char* name) {
  if ((dweight == nullptr && dbias == nullptr) || C == 0) return Status::Ok();
  ColumnSumsKernel<<<(C + 31) / 32, dim3(32, 32), 0, s>>>(dweight, dbias, dout, inp, mean, rstd, N, C);
  return LaunchStatus(name);
}

// ---- public ------------------------------------------------------------------

StatusOr<int> GetDevice() {
  int ordinal = 0;
  ZINF_RETURN_IF_ERROR(CudaError(cudaGetDevice(&ordinal), "get device"));
  return ordinal;
}

Status SetDevice(int ordinal) { return CudaError(cudaSetDevice(ordinal), "set device"); }

StatusOr<std::unique_ptr<CudaBlas>> CudaBlas::Create(void* stream, bool allow_tf32) {
  cublasHandle_t handle = nullptr;
  ZINF_RETURN_IF_ERROR(BlasError(cublasCreate(&handle), "create"));
  std::unique_ptr<CudaBlas> blas(new CudaBlas(handle, stream, allow_tf32));
  ZINF_RETURN_IF_ERROR(BlasError(cublasSetStream(handle, AsStream(stream)), "set stream"));
  ZINF_RETURN_IF_ERROR(BlasError(cublasSetPointerMode(handle, CUBLAS_POINTER_MODE_HOST), "set pointer mode"));
  // The compute type of each call decides TF32; the math mode agrees with it.
  ZINF_RETURN_IF_ERROR(BlasError(
      cublasSetMathMode(handle, allow_tf32 ? CUBLAS_TF32_TENSOR_OP_MATH : CUBLAS_DEFAULT_MATH), "set math mode"));
  return StatusOr<std::unique_ptr<CudaBlas>>(std::move(blas));
}

CudaBlas::~CudaBlas() {
  if (handle_) cublasDestroy(static_cast<cublasHandle_t>(handle_));
}

Status Zero(float* p, int64_t n, void* stream) {
  if (n <= 0) return Status::Ok();
  return CudaError(cudaMemsetAsync(p, 0, static_cast<size_t>(n) * sizeof(float), AsStream(stream)), "zero");
}

Status CastIn(float* out, const void* src, ElementType src_type, int64_t n, void* stream) {
  if (n <= 0) return Status::Ok();
  const cudaStream_t s = AsStream(stream);
  const unsigned grid = GridFor(n, kThreads);
  switch (src_type) {
    case ElementType::kF32:
      if (out == src) return Status::Ok();
      return CudaError(cudaMemcpyAsync(out, src, static_cast<size_t>(n) * sizeof(float), cudaMemcpyDeviceToDevice, s),
                       "cast_in f32 copy");
    case ElementType::kF16:
      CastKernel<<<grid, kThreads, 0, s>>>(out, static_cast<const __half*>(src), n);
      return LaunchStatus("cast_in f16");
    case ElementType::kBf16:
      CastKernel<<<grid, kThreads, 0, s>>>(out, static_cast<const __nv_bfloat16*>(src), n);
      return LaunchStatus("cast_in bf16");
    case ElementType::kF64:
      CastKernel<<<grid, kThreads, 0, s>>>(out, static_cast<const double*>(src), n);
      return LaunchStatus("cast_in f64");
    case ElementType::kU8:
    case ElementType::kI64: break;
  }
  return Status::InvalidArgument("cuda cast_in: unknown source type");
}

Status EncoderForward(float* out, const int32_t* tokens, const float* wte, const float* wpe, int B, int T_, int C,
                      void* stream) {
  const int64_t total = static_cast<int64_t>(B) * T_ * C;
  if (total <= 0) return Status::Ok();
  EncoderForwardKernel<<<GridFor(total, kThreads), kThreads, 0, AsStream(stream)>>>(out, tokens, wte, wpe, T_, C,
                                                                                    total);
  return LaunchStatus("encoder_forward");
}

Status EncoderBackward(float* dwte, float* dwpe, const float* dout, const int32_t* tokens, int B, int T_, int C,
                       int32_t padding_token, void* stream) {
  const int64_t N = static_cast<int64_t>(B) * T_;
  if (N <= 0 || C <= 0) return Status::Ok();
  const cudaStream_t s = AsStream(stream);
  dim3 grid((C + kWteThreads - 1) / kWteThreads, kWteGroups);
  EncoderBackwardWteKernel<<<grid, kWteThreads, 0, s>>>(dwte, dout, tokens, N, C, kWteGroups, padding_token);
  ZINF_RETURN_IF_ERROR(LaunchStatus("encoder_backward dwte"));
  EncoderBackwardWpeKernel<<<GridFor(static_cast<int64_t>(T_) * C, kThreads), kThreads, 0, s>>>(dwpe, dout, B, T_, C);
  return LaunchStatus("encoder_backward dwpe");
}

Status LayerNormForward(float* out, float* mean, float* rstd, const float* inp, const float* weight, const float* bias,
                        int64_t N, int C, void* stream) {
  if (N <= 0 || C <= 0) return Status::Ok();
  LayerNormForwardKernel<<<GridFor(N, kWarpsPerBlock), kThreads, 0, AsStream(stream)>>>(out, mean, rstd, inp, weight,
                                                                                        bias, N, C);
  return LaunchStatus("layernorm_forward");
}

Status LayerNormBackward(float* dinp, float* dweight, float* dbias, const float* dout, const float* inp,
                         const float* weight, const float* mean, const float* rstd, int64_t N, int C, void* stream) {
  if (N <= 0 || C <= 0) return Status::Ok();
  const cudaStream_t s = AsStream(stream);
  LayerNormBackwardInputKernel<<<GridFor(N, kWarpsPerBlock), kThreads, 0, s>>>(dinp, dout, inp, weight, mean, rstd, N,
                                                                               C);
  ZINF_RETURN_IF_ERROR(LaunchStatus("layernorm_backward dinp"));
  if (dweight == nullptr) {  // dbias only: no need to read inp
    return LaunchColumnSums(nullptr, dbias, dout, nullptr, nullptr, nullptr, N, C, s, "layernorm_backward dbias");
  }
  return LaunchColumnSums(dweight, dbias, dout, inp, mean, rstd, N, C, s, "layernorm_backward dweight");
}

Status MatmulForward(CudaBlas& blas, float* out, const float* inp, const float* weight, const float* bias, int64_t N,
                     int C, int OC) {
  ZINF_RETURN_IF_ERROR(CheckIntSize(N, "matmul N"));
  if (N == 0 || OC <= 0) return Status::Ok();
  const int n = static_cast<int>(N);
  // out [N, OC] = inp [N, C] @ weight^T, weight stored [OC, C].
  ZINF_RETURN_IF_ERROR(
      RowMajorGemm(blas, false, true, n, OC, C, 1.0f, inp, C, 0, weight, C, 0, 0.0f, out, OC, 0, 1, "matmul_forward"));
  return AddBias(out, bias, N, OC, blas.stream());
}

Status AddBias(float* out, const float* bias, int64_t N, int OC, void* stream) {
  if (bias == nullptr || N * OC <= 0) return Status::Ok();
  AddBiasKernel<<<GridFor(N * OC, kThreads), kThreads, 0, AsStream(stream)>>>(out, bias, N, OC);
  return LaunchStatus("matmul bias");
}

Status AddBiasGradient(float* dbias, const float* dout, int64_t N, int OC, void* stream) {
  return LaunchColumnSums(nullptr, dbias, dout, nullptr, nullptr, nullptr, N, OC, AsStream(stream), "matmul dbias");
}

Status MatmulBackward(CudaBlas& blas, float* dinp, float* dweight, float* dbias, const float* dout, const float* inp,
                      const float* weight, int64_t N, int C, int OC) {
  ZINF_RETURN_IF_ERROR(CheckIntSize(N, "matmul N"));
  if (N == 0 || OC <= 0 || C <= 0) return Status::Ok();
  const int n = static_cast<int>(N);
  // dinp [N, C] += dout [N, OC] @ weight [OC, C].
  ZINF_RETURN_IF_ERROR(RowMajorGemm(blas, false, false, n, C, OC, 1.0f, dout, OC, 0, weight, C, 0, 1.0f, dinp, C, 0, 1,
                                    "matmul_backward dinp"));
  // dweight [OC, C] += dout^T [OC, N] @ inp [N, C]; dout stored [N, OC].
  ZINF_RETURN_IF_ERROR(RowMajorGemm(blas, true, false, OC, C, n, 1.0f, dout, OC, 0, inp, C, 0, 1.0f, dweight, C, 0, 1,
                                    "matmul_backward dweight"));
  return AddBiasGradient(dbias, dout, N, OC, blas.stream());
}

int64_t AttentionScratchElems(int B, int T_, int C, int NH, float softcap) {
  return 7 * static_cast<int64_t>(B) * T_ * C + (softcap > 0.0f ? 2 : 1) * static_cast<int64_t>(B) * NH * T_ * T_;
}

namespace {
Status CheckAttention(int C, int NH, int window, float softcap) {
  if (NH <= 0 || C % NH != 0) return Status::InvalidArgument("cuda attention: C must be a multiple of NH");
  if (window < 0) return Status::InvalidArgument("cuda attention: negative window " + std::to_string(window));
  if (!(softcap >= 0.0f)) return Status::InvalidArgument("cuda attention: softcap must be >= 0 (0: none)");
  return Status::Ok();
}
}  // namespace

Status AttentionForward(CudaBlas& blas, float* out, float* att, float* scratch, const float* qkv, int B, int T_, int C,
                        int NH, int window, float softcap, const float* sinks) {
  ZINF_RETURN_IF_ERROR(CheckAttention(C, NH, window, softcap));
  const AttentionShape sh{B, T_, C, NH, C / NH};
  const int64_t per = sh.per_tensor();
  if (per <= 0) return Status::Ok();
  const cudaStream_t s = AsStream(blas.stream());
  float* q = scratch;
  float* k = scratch + per;
  float* v = scratch + 2 * per;
  float* y = scratch + 6 * per;  // the dy slot
  const int batch = B * NH;
  const int64_t tt = static_cast<int64_t>(T_) * T_;
  const int64_t ths = static_cast<int64_t>(T_) * sh.hs;
  const float scale = 1.0f / sqrtf(static_cast<float>(sh.hs));

  PermuteQkvKernel<<<GridFor(per, kThreads), kThreads, 0, s>>>(q, k, v, qkv, T_, C, NH, sh.hs, per);
  ZINF_RETURN_IF_ERROR(LaunchStatus("attention_forward permute"));
  // att [T, T] = scale * q [T, hs] @ k^T, per (b, h).
  ZINF_RETURN_IF_ERROR(RowMajorGemm(blas, false, true, T_, T_, sh.hs, scale, q, sh.hs, ths, k, sh.hs, ths, 0.0f, att,
                                    T_, tt, batch, "attention_forward q@k^T"));
  const int64_t rows = static_cast<int64_t>(batch) * T_;
  CausalSoftmaxKernel<<<GridFor(rows, kWarpsPerBlock), kThreads, 0, s>>>(att, rows, T_, NH, window, softcap, sinks);
  ZINF_RETURN_IF_ERROR(LaunchStatus("attention_forward softmax"));
  // y [T, hs] = att [T, T] @ v [T, hs].
  ZINF_RETURN_IF_ERROR(RowMajorGemm(blas, false, false, T_, sh.hs, T_, 1.0f, att, T_, tt, v, sh.hs, ths, 0.0f, y, sh.hs,
                                    ths, batch, "attention_forward att@v"));
  UnpermuteKernel<<<GridFor(per, kThreads), kThreads, 0, s>>>(out, y, T_, C, NH, sh.hs, per);
  return LaunchStatus("attention_forward unpermute");
}

Status AttentionBackward(CudaBlas& blas, float* dqkv, float* scratch, const float* dout, const float* qkv,
                         const float* att, int B, int T_, int C, int NH, int window, float softcap, float* dsinks) {
  ZINF_RETURN_IF_ERROR(CheckAttention(C, NH, window, softcap));
  const AttentionShape sh{B, T_, C, NH, C / NH};
  const int64_t per = sh.per_tensor();
  if (per <= 0) return Status::Ok();
  const cudaStream_t s = AsStream(blas.stream());
  float* q = scratch;
  float* k = scratch + per;
  float* v = scratch + 2 * per;
  float* dq = scratch + 3 * per;
  float* dk = scratch + 4 * per;
  float* dv = scratch + 5 * per;
  float* dy = scratch + 6 * per;
  float* datt = scratch + 7 * per;
  const int batch = B * NH;
  const int hs = sh.hs;
  const int64_t tt = static_cast<int64_t>(T_) * T_;
  float* scores = softcap > 0.0f ? datt + batch * tt : nullptr;  // the softcap's slot
  const int64_t ths = static_cast<int64_t>(T_) * hs;
  const float scale = 1.0f / sqrtf(static_cast<float>(hs));

  PermuteQkvKernel<<<GridFor(per, kThreads), kThreads, 0, s>>>(q, k, v, qkv, T_, C, NH, hs, per);
  ZINF_RETURN_IF_ERROR(LaunchStatus("attention_backward permute qkv"));
  PermuteOutKernel<<<GridFor(per, kThreads), kThreads, 0, s>>>(dy, dout, T_, C, NH, hs, per);
  ZINF_RETURN_IF_ERROR(LaunchStatus("attention_backward permute dout"));
  // datt [T, T] = dy [T, hs] @ v^T.
  ZINF_RETURN_IF_ERROR(RowMajorGemm(blas, false, true, T_, T_, hs, 1.0f, dy, hs, ths, v, hs, ths, 0.0f, datt, T_, tt,
                                    batch, "attention_backward dy@v^T"));
  // dv [T, hs] = att^T [T, T] @ dy [T, hs].
  ZINF_RETURN_IF_ERROR(RowMajorGemm(blas, true, false, T_, hs, T_, 1.0f, att, T_, tt, dy, hs, ths, 0.0f, dv, hs, ths,
                                    batch, "attention_backward att^T@dy"));
  if (scores != nullptr) {  // the scaled scores again, for the cap's derivative
    ZINF_RETURN_IF_ERROR(RowMajorGemm(blas, false, true, T_, T_, hs, scale, q, hs, ths, k, hs, ths, 0.0f, scores, T_,
                                      tt, batch, "attention_backward q@k^T"));
  }
  const int64_t rows = static_cast<int64_t>(batch) * T_;
  // The sinks' per-row terms in the dq slot (free until dq's GEMM), B*NH*T <= B*T*C.
  float* sink_terms = dsinks != nullptr ? dq : nullptr;
  CausalSoftmaxBackwardKernel<<<GridFor(rows, kWarpsPerBlock), kThreads, 0, s>>>(datt, att, scores, rows, T_, window,
                                                                                 softcap, sink_terms);
  ZINF_RETURN_IF_ERROR(LaunchStatus("attention_backward softmax"));
  if (dsinks != nullptr) {
    SinkGradKernel<<<GridFor(NH, kWarpsPerBlock), kThreads, 0, s>>>(dsinks, sink_terms, B, NH, T_);
    ZINF_RETURN_IF_ERROR(LaunchStatus("attention_backward sinks"));
  }
  // dq [T, hs] = scale * dpreatt [T, T] @ k [T, hs].
  ZINF_RETURN_IF_ERROR(RowMajorGemm(blas, false, false, T_, hs, T_, scale, datt, T_, tt, k, hs, ths, 0.0f, dq, hs, ths,
                                    batch, "attention_backward dpreatt@k"));
  // dk [T, hs] = scale * dpreatt^T [T, T] @ q [T, hs].
  ZINF_RETURN_IF_ERROR(RowMajorGemm(blas, true, false, T_, hs, T_, scale, datt, T_, tt, q, hs, ths, 0.0f, dk, hs, ths,
                                    batch, "attention_backward dpreatt^T@q"));
  AccumulateQkvKernel<<<GridFor(per, kThreads), kThreads, 0, s>>>(dqkv, dq, dk, dv, T_, C, NH, hs, per);
  return LaunchStatus("attention_backward accumulate dqkv");
}

Status SoftcapForward(float* x, float cap, int64_t n, void* stream) {
  if (!(cap > 0.0f)) return Status::InvalidArgument("softcap_forward: cap must be > 0");
  if (n <= 0) return Status::Ok();
  SoftcapForwardKernel<<<GridFor(n, kThreads), kThreads, 0, AsStream(stream)>>>(x, cap, n);
  return LaunchStatus("softcap_forward");
}

Status SoftcapBackward(float* dx, const float* y, float cap, int64_t n, void* stream) {
  if (!(cap > 0.0f)) return Status::InvalidArgument("softcap_backward: cap must be > 0");
  if (n <= 0) return Status::Ok();
  SoftcapBackwardKernel<<<GridFor(n, kThreads), kThreads, 0, AsStream(stream)>>>(dx, y, cap, n);
  return LaunchStatus("softcap_backward");
}

Status GeluForward(float* out, const float* inp, int64_t n, void* stream) {
  if (n <= 0) return Status::Ok();
  GeluForwardKernel<<<GridFor(n, kThreads), kThreads, 0, AsStream(stream)>>>(out, inp, n);
  return LaunchStatus("gelu_forward");
}

Status GeluBackward(float* dinp, const float* inp, const float* dout, int64_t n, void* stream) {
  if (n <= 0) return Status::Ok();
  GeluBackwardKernel<<<GridFor(n, kThreads), kThreads, 0, AsStream(stream)>>>(dinp, inp, dout, n);
  return LaunchStatus("gelu_backward");
}

Status ResidualForward(float* out, const float* a, const float* b, int64_t n, void* stream) {
  if (n <= 0) return Status::Ok();
  ResidualKernel<<<GridFor(n, kThreads), kThreads, 0, AsStream(stream)>>>(out, a, b, n);
  return LaunchStatus("residual_forward");
}

Status Accumulate(float* y, const float* x, int64_t n, void* stream) {
  if (n <= 0) return Status::Ok();
  AccumulateKernel<<<GridFor(n, kThreads), kThreads, 0, AsStream(stream)>>>(y, x, n);
  return LaunchStatus("accumulate");
}

Status Scale(float* x, float s, int64_t n, void* stream) {
  if (n <= 0) return Status::Ok();
  ScaleKernel<<<GridFor(n, kThreads), kThreads, 0, AsStream(stream)>>>(x, s, n);
  return LaunchStatus("scale");
}

Status CrossEntropyForwardBackward(float* losses, float* dlogits, const float* logits, const int32_t* targets,
                                   int64_t N, int V, int Vp, float dloss, void* stream) {
  if (N <= 0) return Status::Ok();
  if (V <= 0 || V > Vp) return Status::InvalidArgument("cuda cross_entropy: need 0 < V <= Vp");
  constexpr int kCeThreads = 512;
  CrossEntropyKernel<<<GridFor(N, 1), kCeThreads, 0, AsStream(stream)>>>(losses, dlogits, logits, targets, N, V, Vp,
                                                                         dloss);
  return LaunchStatus("cross_entropy");
}

}  // namespace zinf::kernels::cuda
