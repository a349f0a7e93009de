// Fused causal attention on tensor cores (contract in cuda_kernels.h).
//
// Design. FlashAttention's algorithm (Dao et al., 2022; the FA2 split of
// the backward): the T x T scores never reach global memory. A block of
// four warps takes a tile of 64 rows (queries in the forward and in the dq
// pass, keys in the dk/dv pass) of one (batch, head) and walks the other
// side's 64-row tiles that the causal mask leaves; each warp owns 16 of the
// block's rows. q, k, v and dout are read from their fp32 activations and
// rounded to bf16 into shared memory; the matmuls are WMMA 16x16x16 bf16
// with fp32 accumulators; the score tile goes through shared memory in fp32,
// where one lane pair per row masks, exponentiates and writes P (or dS)
// back as bf16 for the next matmul. Forward: an online softmax per row (a
// running max and sum, the output rescaled when the max grows); saves each
// row's log-sum-exp. Backward: D = rowsum(bf16(dout) * out) first; one pass per
// key tile recomputes P = exp(s - lse) and sums dv += P^T dout and
// dk += dS^T q; a second pass per query tile recomputes them again and sums
// dq += dS k. Two passes rather than atomics keep the sums' order fixed:
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
#include "kernels/cuda_kernels.h"

namespace zinf::kernels::cuda {

namespace {

namespace wmma = nvcuda::wmma;
using bf16 = __nv_bfloat16;

constexpr int kTile = 64;  // rows of a tile, both sides
constexpr int kFlashWarps = kTile / 16;
constexpr int kFlashThreads = 32 * kFlashWarps;
constexpr int kLdS = kTile + 4;  // fp32 score tile row stride (floats)
constexpr int kLdP = kTile + 8;  // bf16 probability tile row stride

using FragA = wmma::fragment<wmma::matrix_a, 16, 16, 16, bf16, wmma::row_major>;
using FragBRow = wmma::fragment<wmma::matrix_b, 16, 16, 16, bf16, wmma::row_major>;
using FragBCol = wmma::fragment<wmma::matrix_b, 16, 16, 16, bf16, wmma::col_major>;
using FragAcc = wmma::fragment<wmma::accumulator, 16, 16, 16, float>;

// Shared-memory layout per head size: the row strides are padded (bf16 by
// 8, fp32 by 4) against bank conflicts and keep every 16-row, 16-column
// fragment 32-byte aligned, as WMMA requires.
template <int HS>
struct Layout {
  static constexpr int kLd16 = HS + 8;  // bf16 [64][HS] tile
  static constexpr int kLdO = HS + 4;   // fp32 [64][HS] tile
  static constexpr int kTile16 = kTile * kLd16;
  static constexpr int kTileP = kTile * kLdP;
  static constexpr int kTileS = kTile * kLdS;
  // Forward: q, k, v; P; scores; the output; each row's sum.
  static constexpr size_t kForwardBytes =
      (3 * kTile16 + kTileP) * sizeof(bf16) + (kTileS + kTile * kLdO + kTile) * sizeof(float);
  // Backward passes: four bf16 tiles; two of P/dS; two score tiles (which
  // also hold the epilogue's [64][HS] fp32 tile: 2 * kTileS >= kTile *
  // kLdO for HS <= 128); lse and D of the query rows.
  static constexpr size_t kBackwardBytes =
      (4 * kTile16 + 2 * kTileP) * sizeof(bf16) + (2 * kTileS + 2 * kTile) * sizeof(float);
  static_assert(HS % 16 == 0 && HS <= 128, "head size: a multiple of 16, at most 128");
  static_assert(2 * kTileS >= kTile * kLdO, "the epilogue tile fits in the score tiles");
};

// dst [64][HS] (row stride kLd16) = bf16 of rows row0 .. row0+63 of a
// [T, row_stride] fp32 tensor starting at `src` (the head's column), zero
// past T. Consecutive threads read consecutive columns.
template <int HS>
__device__ __forceinline__ void LoadTile16(bf16* dst, const float* src, int64_t row_stride, int row0, int T) {
  for (int i = threadIdx.x; i < kTile * HS; i += kFlashThreads) {
    const int r = i / HS, c = i % HS;
    const int t = row0 + r;
    dst[r * Layout<HS>::kLd16 + c] = __float2bfloat16_rn(t < T ? src[static_cast<int64_t>(t) * row_stride + c] : 0.0f);
  }
}

// The warp's 16 x 64 tile at `out` (row stride kLdS) = a_rows [16][HS] @
// b_rows^T, where b_rows is [64][HS] (both bf16, row stride kLd16).
template <int HS>
__device__ __forceinline__ void RowsTimesTilesT(float* out, const bf16* a_rows, const bf16* b_rows) {
  constexpr int kLd = Layout<HS>::kLd16;
  for (int n = 0; n < kTile / 16; ++n) {
    FragAcc acc;
    wmma::fill_fragment(acc, 0.0f);
    for (int k = 0; k < HS / 16; ++k) {
      FragA a;
      FragBCol b;
      wmma::load_matrix_sync(a, a_rows + k * 16, kLd);
      wmma::load_matrix_sync(b, b_rows + n * 16 * kLd + k * 16, kLd);
      wmma::mma_sync(acc, a, b, acc);
    }
    wmma::store_matrix_sync(out + n * 16, acc, kLdS, wmma::mem_row_major);
  }
}

// acc[n] (the warp's 16 x HS, in HS/16 fragments) += p_rows [16][64] (bf16,
// row stride kLdP) @ tile [64][HS] (bf16, row stride kLd16).
template <int HS>
__device__ __forceinline__ void AccumulateRowsTimesTile(FragAcc* acc, const bf16* p_rows, const bf16* tile) {
  constexpr int kLd = Layout<HS>::kLd16;
  for (int k = 0; k < kTile / 16; ++k) {
    FragA a;
    wmma::load_matrix_sync(a, p_rows + k * 16, kLdP);
    for (int n = 0; n < HS / 16; ++n) {
      FragBRow b;
      wmma::load_matrix_sync(b, tile + k * 16 * kLd + n * 16, kLd);
      wmma::mma_sync(acc[n], a, b, acc[n]);
    }
  }
}

// dst rows (row stride row_stride; row r at tile row row0 + r, skipped past
// T) += scale * the warp's fragments acc[HS/16], staged through `stage`
// (the warp's [16][kLdO] fp32). Consecutive lanes write consecutive columns.
template <int HS>
__device__ __forceinline__ void AddRows(float* dst, int64_t row_stride, int row0, int T, float scale,
                                        const FragAcc* acc, float* stage) {
  constexpr int kLdO = Layout<HS>::kLdO;
  for (int n = 0; n < HS / 16; ++n) wmma::store_matrix_sync(stage + n * 16, acc[n], kLdO, wmma::mem_row_major);
  __syncwarp();
  for (int i = threadIdx.x % 32; i < 16 * HS; i += 32) {
    const int r = i / HS, c = i % HS;
    if (row0 + r < T) dst[static_cast<int64_t>(row0 + r) * row_stride + c] += scale * stage[r * kLdO + c];
  }
  __syncwarp();
}

// Grid (query tiles, B * NH), the longest rows (last tiles) first.
template <int HS>
__global__ void __launch_bounds__(kFlashThreads)
    FlashForwardKernel(float* out, float* lse, const float* qkv, int T, int C, int NH, float scale) {
  using L = Layout<HS>;
  extern __shared__ __align__(128) unsigned char smem[];
  bf16* sq = reinterpret_cast<bf16*>(smem);
  bf16* sk = sq + L::kTile16;
  bf16* sv = sk + L::kTile16;
  bf16* sp = sv + L::kTile16;
  float* ss = reinterpret_cast<float*>(sp + L::kTileP);
  float* so = ss + L::kTileS;
  float* row_sum = so + kTile * L::kLdO;

  const int qt = static_cast<int>(gridDim.x) - 1 - static_cast<int>(blockIdx.x);
  const int bh = blockIdx.y, b = bh / NH, h = bh % NH;
  const int warp = threadIdx.x / 32, lane = threadIdx.x % 32;
  const int64_t C3 = 3 * static_cast<int64_t>(C);
  const float* base = qkv + static_cast<int64_t>(b) * T * C3 + static_cast<int64_t>(h) * HS;
  const int q0 = qt * kTile;
  LoadTile16<HS>(sq, base, C3, q0, T);
  for (int i = threadIdx.x; i < kTile * L::kLdO; i += kFlashThreads) so[i] = 0.0f;

  // Lane pair (lane / 2) owns row `row` of the tile; each lane half its columns.
  const int row = warp * 16 + lane / 2, half = lane % 2;
  const int qi = q0 + row;
  float m = -INFINITY, l = 0.0f;
  for (int kt = 0; kt <= qt; ++kt) {
    const int k0 = kt * kTile;
    __syncthreads();  // the last tile's readers are done (and the first loads visible)
    LoadTile16<HS>(sk, base + C, C3, k0, T);
    LoadTile16<HS>(sv, base + 2 * static_cast<int64_t>(C), C3, k0, T);
    __syncthreads();
    RowsTimesTilesT<HS>(ss + warp * 16 * kLdS, sq + warp * 16 * L::kLd16, sk);
    __syncwarp();

    float* srow = ss + row * kLdS + half * 32;
    float mx = -INFINITY;
    for (int j = 0; j < 32; ++j) {
      const int kj = k0 + half * 32 + j;
      const float s = kj <= qi && kj < T ? srow[j] * scale : -INFINITY;
      srow[j] = s;
      mx = fmaxf(mx, s);
    }
    mx = fmaxf(mx, __shfl_xor_sync(kFullMask, mx, 1));
    const float m_new = fmaxf(m, mx);
    const float m_use = m_new == -INFINITY ? 0.0f : m_new;  // a row masked so far: all terms 0
    const float alpha = expf(m - m_use);
    float sum = 0.0f;
    bf16* prow = sp + row * kLdP + half * 32;
    for (int j = 0; j < 32; ++j) {
      const float p = expf(srow[j] - m_use);
      prow[j] = __float2bfloat16_rn(p);
      sum += p;
    }
    sum += __shfl_xor_sync(kFullMask, sum, 1);
    l = l * alpha + sum;
    m = m_new;
    float* orow = so + row * L::kLdO + half * (HS / 2);
    for (int c = 0; c < HS / 2; ++c) orow[c] *= alpha;
    __syncwarp();

    FragAcc acc[HS / 16];
    float* o_rows = so + warp * 16 * L::kLdO;
    for (int n = 0; n < HS / 16; ++n) wmma::load_matrix_sync(acc[n], o_rows + n * 16, L::kLdO, wmma::mem_row_major);
    AccumulateRowsTimesTile<HS>(acc, sp + warp * 16 * kLdP, sv);
    for (int n = 0; n < HS / 16; ++n) wmma::store_matrix_sync(o_rows + n * 16, acc[n], L::kLdO, wmma::mem_row_major);
    __syncwarp();
  }
  if (half == 0) {
    row_sum[row] = l;
    if (qi < T) lse[static_cast<int64_t>(bh) * T + qi] = m + logf(l);
  }
  __syncwarp();
  for (int i = lane; i < 16 * HS; i += 32) {
    const int r = warp * 16 + i / HS, c = i % HS;
    const int t = q0 + r;
    if (t < T) {
      out[(static_cast<int64_t>(b) * T + t) * C + static_cast<int64_t>(h) * HS + c] = so[r * L::kLdO + c] / row_sum[r];
    }
  }
}

// d[bh * T + t] = bf16(dout) . out over the head's channels; one warp a
// row. dout rounded as the matmuls see it: D is then sum_j P_j dP_j of the
// rounded operands, and a row whose keys all give dP = D (one key) gets a
// zero dS, as the exact gradient does.
__global__ void FlashRowDotKernel(float* d, const float* dout, const float* out, int T, int C, int NH, int hs,
                                  int64_t rows) {
  const int lane = threadIdx.x % 32;
  for (int64_t r = (static_cast<int64_t>(blockIdx.x) * blockDim.x + threadIdx.x) / 32; r < rows;
       r += static_cast<int64_t>(gridDim.x) * blockDim.x / 32) {
    const int t = static_cast<int>(r % T);
    const int64_t bh = r / T;
    const int64_t off = (bh / NH * T + t) * C + bh % NH * hs;
    float s = 0.0f;
    for (int c = lane; c < hs; c += 32) s += __bfloat162float(__float2bfloat16_rn(dout[off + c])) * out[off + c];
    s = WarpSum(s);
    if (lane == 0) d[r] = s;
  }
}

// The backward passes' shared memory.
template <int HS>
struct BackwardSmem {
  bf16 *own_a, *own_b;      // the block's own tile: k, v (dk/dv pass); q, dout (dq pass)
  bf16 *other_a, *other_b;  // the walked tile: q, dout; k, v
  bf16 *p, *ds;             // P and dS (or their transposes), [64][kLdP]
  float *s, *dp;            // scores and dP (or transposes), [64][kLdS]
  float *lse, *d;           // of the query rows in the tile
  __device__ explicit BackwardSmem(unsigned char* smem) {
    using L = Layout<HS>;
    own_a = reinterpret_cast<bf16*>(smem);
    own_b = own_a + L::kTile16;
    other_a = own_b + L::kTile16;
    other_b = other_a + L::kTile16;
    p = other_b + L::kTile16;
    ds = p + L::kTileP;
    s = reinterpret_cast<float*>(ds + L::kTileP);
    dp = s + L::kTileS;
    lse = dp + L::kTileS;
    d = lse + kTile;
  }
};

__device__ __forceinline__ void LoadRowStats(float* lse_s, float* d_s, const float* lse, const float* d, int64_t bh,
                                             int row0, int T) {
  for (int i = threadIdx.x; i < kTile; i += kFlashThreads) {
    const int t = row0 + i;
    lse_s[i] = t < T ? lse[bh * T + t] : 0.0f;
    d_s[i] = t < T ? d[bh * T + t] : 0.0f;
  }
}

// dk and dv of one key tile: grid (key tiles, B * NH); key tile kt meets
// query tiles kt .. last. Warp w owns keys 16w .. 16w+15 of the tile and
// works on transposes: S^T = k q^T, dP^T = v dout^T.
template <int HS>
__global__ void __launch_bounds__(kFlashThreads)
    FlashBackwardKvKernel(float* dqkv, const float* dout, const float* qkv, const float* lse, const float* d, int T,
                          int C, int NH, float scale) {
  using L = Layout<HS>;
  extern __shared__ __align__(128) unsigned char smem[];
  const BackwardSmem<HS> sm(smem);
  const int kt = blockIdx.x, bh = blockIdx.y, b = bh / NH, h = bh % NH;
  const int warp = threadIdx.x / 32, lane = threadIdx.x % 32;
  const int64_t C3 = 3 * static_cast<int64_t>(C);
  const int64_t head = static_cast<int64_t>(h) * HS;
  const float* qkv_b = qkv + static_cast<int64_t>(b) * T * C3 + head;
  const float* dout_b = dout + static_cast<int64_t>(b) * T * C + head;
  const int k0 = kt * kTile;
  LoadTile16<HS>(sm.own_a, qkv_b + C, C3, k0, T);
  LoadTile16<HS>(sm.own_b, qkv_b + 2 * static_cast<int64_t>(C), C3, k0, T);
  FragAcc dk[HS / 16], dv[HS / 16];
  for (int n = 0; n < HS / 16; ++n) {
    wmma::fill_fragment(dk[n], 0.0f);
    wmma::fill_fragment(dv[n], 0.0f);
  }
  const int row = warp * 16 + lane / 2, half = lane % 2;
  const int kj = k0 + row;
  const int q_tiles = (T + kTile - 1) / kTile;
  for (int qt = kt; qt < q_tiles; ++qt) {
    const int q0 = qt * kTile;
    __syncthreads();
    LoadTile16<HS>(sm.other_a, qkv_b, C3, q0, T);
    LoadTile16<HS>(sm.other_b, dout_b, C, q0, T);
    LoadRowStats(sm.lse, sm.d, lse, d, bh, q0, T);
    __syncthreads();
    const bf16* k_rows = sm.own_a + warp * 16 * L::kLd16;
    const bf16* v_rows = sm.own_b + warp * 16 * L::kLd16;
    RowsTimesTilesT<HS>(sm.s + warp * 16 * kLdS, k_rows, sm.other_a);
    RowsTimesTilesT<HS>(sm.dp + warp * 16 * kLdS, v_rows, sm.other_b);
    __syncwarp();
    for (int j = 0; j < 32; ++j) {
      const int c = half * 32 + j, qi = q0 + c;
      const int at = row * kLdS + c;
      const float p = kj <= qi && qi < T && kj < T ? expf(sm.s[at] * scale - sm.lse[c]) : 0.0f;
      sm.p[row * kLdP + c] = __float2bfloat16_rn(p);
      sm.ds[row * kLdP + c] = __float2bfloat16_rn(p * (sm.dp[at] - sm.d[c]));
    }
    __syncwarp();
    AccumulateRowsTimesTile<HS>(dv, sm.p + warp * 16 * kLdP, sm.other_b);
    AccumulateRowsTimesTile<HS>(dk, sm.ds + warp * 16 * kLdP, sm.other_a);
  }
  __syncthreads();  // the epilogue's stage spans the score tiles of every warp
  float* stage = sm.s + warp * 16 * L::kLdO;
  float* dqkv_b = dqkv + static_cast<int64_t>(b) * T * C3 + head;
  AddRows<HS>(dqkv_b + C, C3, k0 + warp * 16, T, scale, dk, stage);
  AddRows<HS>(dqkv_b + 2 * static_cast<int64_t>(C), C3, k0 + warp * 16, T, 1.0f, dv, stage);
}

// dq of one query tile: grid (query tiles, B * NH), the longest rows first;
// query tile qt meets key tiles 0 .. qt. Warp w owns queries 16w .. 16w+15.
template <int HS>
__global__ void __launch_bounds__(kFlashThreads)
    FlashBackwardQKernel(float* dqkv, const float* dout, const float* qkv, const float* lse, const float* d, int T,
                         int C, int NH, float scale) {
  using L = Layout<HS>;
  extern __shared__ __align__(128) unsigned char smem[];
  const BackwardSmem<HS> sm(smem);
  const int qt = static_cast<int>(gridDim.x) - 1 - static_cast<int>(blockIdx.x);
  const int bh = blockIdx.y, b = bh / NH, h = bh % NH;
  const int warp = threadIdx.x / 32, lane = threadIdx.x % 32;
  const int64_t C3 = 3 * static_cast<int64_t>(C);
  const int64_t head = static_cast<int64_t>(h) * HS;
  const float* qkv_b = qkv + static_cast<int64_t>(b) * T * C3 + head;
  const int q0 = qt * kTile;
  LoadTile16<HS>(sm.own_a, qkv_b, C3, q0, T);
  LoadTile16<HS>(sm.own_b, dout + static_cast<int64_t>(b) * T * C + head, C, q0, T);
  LoadRowStats(sm.lse, sm.d, lse, d, bh, q0, T);
  FragAcc dq[HS / 16];
  for (int n = 0; n < HS / 16; ++n) wmma::fill_fragment(dq[n], 0.0f);
  const int row = warp * 16 + lane / 2, half = lane % 2;
  const int qi = q0 + row;
  for (int kt = 0; kt <= qt; ++kt) {
    const int k0 = kt * kTile;
    __syncthreads();
    LoadTile16<HS>(sm.other_a, qkv_b + C, C3, k0, T);
    LoadTile16<HS>(sm.other_b, qkv_b + 2 * static_cast<int64_t>(C), C3, k0, T);
    __syncthreads();
    RowsTimesTilesT<HS>(sm.s + warp * 16 * kLdS, sm.own_a + warp * 16 * L::kLd16, sm.other_a);
    RowsTimesTilesT<HS>(sm.dp + warp * 16 * kLdS, sm.own_b + warp * 16 * L::kLd16, sm.other_b);
    __syncwarp();
    for (int j = 0; j < 32; ++j) {
      const int c = half * 32 + j, kj = k0 + c;
      const int at = row * kLdS + c;
      const float p = kj <= qi && kj < T ? expf(sm.s[at] * scale - sm.lse[row]) : 0.0f;
      sm.ds[row * kLdP + c] = __float2bfloat16_rn(p * (sm.dp[at] - sm.d[row]));
    }
    __syncwarp();
    AccumulateRowsTimesTile<HS>(dq, sm.ds + warp * 16 * kLdP, sm.other_a);
  }
  __syncthreads();
  AddRows<HS>(dqkv + static_cast<int64_t>(b) * T * C3 + head, C3, q0 + warp * 16, T, scale, dq,
              sm.s + warp * 16 * L::kLdO);
}

// The kernels' dynamic shared memory above 48 KiB must be asked for once
// per kernel and device.
template <typename Kernel>
Status AllowSharedMemory(Kernel kernel, size_t bytes, const char* what) {
  return CudaError(cudaFuncSetAttribute(kernel, cudaFuncAttributeMaxDynamicSharedMemorySize, static_cast<int>(bytes)),
                   what);
}

template <int HS>
Status Forward(float* out, float* lse, const float* qkv, int B, int T, int C, int NH, cudaStream_t s) {
  const size_t bytes = Layout<HS>::kForwardBytes;
  ZINF_RETURN_IF_ERROR(AllowSharedMemory(FlashForwardKernel<HS>, bytes, "flash_attention_forward shared memory"));
  const dim3 grid((T + kTile - 1) / kTile, B * NH);
  const float scale = 1.0f / sqrtf(static_cast<float>(HS));
  FlashForwardKernel<HS><<<grid, kFlashThreads, bytes, s>>>(out, lse, qkv, T, C, NH, scale);
  return LaunchStatus("flash_attention_forward");
}

template <int HS>
Status Backward(float* dqkv, float* d, const float* dout, const float* qkv, const float* lse, int B, int T, int C,
                int NH, cudaStream_t s) {
  const size_t bytes = Layout<HS>::kBackwardBytes;
  ZINF_RETURN_IF_ERROR(AllowSharedMemory(FlashBackwardKvKernel<HS>, bytes, "flash_attention_backward shared memory"));
  ZINF_RETURN_IF_ERROR(AllowSharedMemory(FlashBackwardQKernel<HS>, bytes, "flash_attention_backward shared memory"));
  const dim3 grid((T + kTile - 1) / kTile, B * NH);
  const float scale = 1.0f / sqrtf(static_cast<float>(HS));
  FlashBackwardKvKernel<HS><<<grid, kFlashThreads, bytes, s>>>(dqkv, dout, qkv, lse, d, T, C, NH, scale);
  ZINF_RETURN_IF_ERROR(LaunchStatus("flash_attention_backward dk dv"));
  FlashBackwardQKernel<HS><<<grid, kFlashThreads, bytes, s>>>(dqkv, dout, qkv, lse, d, T, C, NH, scale);
  return LaunchStatus("flash_attention_backward dq");
}

size_t SharedBytes(int hs) {
  switch (hs) {
    case 16: return std::max(Layout<16>::kForwardBytes, Layout<16>::kBackwardBytes);
    case 32: return std::max(Layout<32>::kForwardBytes, Layout<32>::kBackwardBytes);
    case 64: return std::max(Layout<64>::kForwardBytes, Layout<64>::kBackwardBytes);
    case 128: return std::max(Layout<128>::kForwardBytes, Layout<128>::kBackwardBytes);
    default: return 0;
  }
}

Status CheckShape(const char* what, int B, int T, int C, int NH) {
  if (B < 0 || T < 0 || NH <= 0 || C % NH != 0 || SharedBytes(C / NH) == 0) {
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

Status FlashAttentionForward(float* out, float* lse, const float* qkv, int B, int T_, int C, int NH, void* stream) {
  ZINF_RETURN_IF_ERROR(CheckShape("flash_attention_forward", B, T_, C, NH));
  if (static_cast<int64_t>(B) * T_ == 0) return Status::Ok();
  const cudaStream_t s = AsStream(stream);
  switch (C / NH) {
    case 16: return Forward<16>(out, lse, qkv, B, T_, C, NH, s);
    case 32: return Forward<32>(out, lse, qkv, B, T_, C, NH, s);
    case 64: return Forward<64>(out, lse, qkv, B, T_, C, NH, s);
    default: return Forward<128>(out, lse, qkv, B, T_, C, NH, s);
  }
}

Status FlashAttentionBackward(float* dqkv, float* scratch, const float* dout, const float* qkv, const float* out,
                              const float* lse, int B, int T_, int C, int NH, void* stream) {
  ZINF_RETURN_IF_ERROR(CheckShape("flash_attention_backward", B, T_, C, NH));
  const int64_t rows = static_cast<int64_t>(B) * NH * T_;
  if (rows == 0) return Status::Ok();
  const cudaStream_t s = AsStream(stream);
  FlashRowDotKernel<<<GridFor(rows, kWarpsPerBlock), kThreads, 0, s>>>(scratch, dout, out, T_, C, NH, C / NH, rows);
  ZINF_RETURN_IF_ERROR(LaunchStatus("flash_attention_backward dout.out"));
  switch (C / NH) {
    case 16: return Backward<16>(dqkv, scratch, dout, qkv, lse, B, T_, C, NH, s);
    case 32: return Backward<32>(dqkv, scratch, dout, qkv, lse, B, T_, C, NH, s);
    case 64: return Backward<64>(dqkv, scratch, dout, qkv, lse, B, T_, C, NH, s);
    default: return Backward<128>(dqkv, scratch, dout, qkv, lse, B, T_, C, NH, s);
  }
}

}  // namespace zinf::kernels::cuda
