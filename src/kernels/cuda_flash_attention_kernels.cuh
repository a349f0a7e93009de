// The fused attention's kernels (cuda_flash_attention.cu, where the design
// is): device code only, in a header so that a host emulation of the CUDA
// features they use can compile them too (tests/kernels/
// flash_attention_emulation_test.cc, which runs them on threads where there
// is no GPU). The includer provides what they use: nvcuda::wmma, the bf16
// type and conversions, the warp shuffles and barriers, kFullMask and
// WarpSum (cuda_common.cuh); and may define ZINF_FLASH_SHARED(name), the
// declaration of the kernels' dynamic shared memory.
#pragma once

#include <cmath>
#include <cstdint>

#ifndef ZINF_FLASH_SHARED
#define ZINF_FLASH_SHARED(name) extern __shared__ __align__(128) unsigned char name[]
#endif

namespace zinf::kernels::cuda::flash {

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

// The elementwise passes over a score tile give each warp row to a lane
// pair, each lane half the row's 64 columns. Lane `half` of the pair owning
// tile row `row` visits column PairColumn(row, half, j) at step j = 0..31:
// its own 32 columns, rotated so that at each step the warp's 32 lanes read
// 32 different banks of an fp32 tile of row stride kLdS (68 = 4 mod 32:
// without the rotation rows r and r + 8, and the two halves, share banks).
__device__ __forceinline__ int PairColumn(int row, int half, int j) {
  return half * 32 + ((j + 2 * half + ((row >> 3) & 1)) & 31);
}

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

// Whether query qi sees key kj: causal, and within a sliding `window` (0:
// none) of it. The tile walks below skip the tiles wholly outside.
__device__ __forceinline__ bool Sees(int qi, int kj, int window) {
  return kj <= qi && (window <= 0 || qi - kj < window);
}
// A visible score x (already scaled) through the softcap, if any (`cap` >
// 0: cap * tanh(x / cap)); *grad, when not null, gets its derivative.
__device__ __forceinline__ float Capped(float x, float cap, float* grad) {
  if (cap <= 0.0f) return x;
  const float u = tanhf(x / cap);
  if (grad != nullptr) *grad = 1.0f - u * u;
  return cap * u;
}
// The first tile of keys a tile of queries from q0 on meets.
__device__ __forceinline__ int FirstKeyTile(int q0, int window) {
  return window > 0 && q0 - window + 1 > 0 ? (q0 - window + 1) / kTile : 0;
}

// Grid row blockIdx.y's (batch, head) and that head's columns of the
// batch's rows: q, k and v in qkv [B, T, 3C] (row stride 3C; k at q + C,
// v at q + 2C); dqkv's alike; and, at `at`, a [B, T, C] tensor's (row
// stride C: out in the forward, dout in the backward).
struct HeadSlice {
  int bh;
  int64_t C, C3, at;
  const float* q;
  float* dq;
  __device__ HeadSlice(float* dqkv, const float* qkv, int T, int C_, int NH, int hs)
      : bh(static_cast<int>(blockIdx.y)), C(C_), C3(3 * static_cast<int64_t>(C_)) {
    const int64_t b = bh / NH, head = static_cast<int64_t>(bh % NH) * hs;
    at = b * T * C + head;
    q = qkv + b * T * C3 + head;
    dq = dqkv == nullptr ? nullptr : dqkv + b * T * C3 + head;
  }
  __device__ const float* k() const { return q + C; }
  __device__ const float* v() const { return q + 2 * C; }
};

// Grid (query tiles, B * NH), the longest rows (last tiles) first.
template <int HS>
__global__ void __launch_bounds__(kFlashThreads)
    FlashForwardKernel(float* out, float* lse, const float* qkv, int T, int C, int NH, float scale, int window,
                       float softcap) {
  using L = Layout<HS>;
  ZINF_FLASH_SHARED(smem);
  bf16* sq = reinterpret_cast<bf16*>(smem);
  bf16* sk = sq + L::kTile16;
  bf16* sv = sk + L::kTile16;
  bf16* sp = sv + L::kTile16;
  float* ss = reinterpret_cast<float*>(sp + L::kTileP);
  float* so = ss + L::kTileS;
  float* row_sum = so + kTile * L::kLdO;

  const HeadSlice head(nullptr, qkv, T, C, NH, HS);
  float* out_rows = out + head.at;
  const int qt = static_cast<int>(gridDim.x) - 1 - static_cast<int>(blockIdx.x);
  const int warp = threadIdx.x / 32, lane = threadIdx.x % 32;
  const int q0 = qt * kTile;
  LoadTile16<HS>(sq, head.q, head.C3, q0, T);
  for (int i = threadIdx.x; i < kTile * L::kLdO; i += kFlashThreads) so[i] = 0.0f;

  // Lane pair (lane / 2) owns row `row` of the tile; each lane half its columns (PairColumn).
  const int row = warp * 16 + lane / 2, half = lane % 2;
  const int qi = q0 + row;
  float m = -INFINITY, l = 0.0f;
  for (int kt = FirstKeyTile(q0, window); kt <= qt; ++kt) {
    const int k0 = kt * kTile;
    __syncthreads();  // the last tile's readers are done (and the first loads visible)
    LoadTile16<HS>(sk, head.k(), head.C3, k0, T);
    LoadTile16<HS>(sv, head.v(), head.C3, k0, T);
    __syncthreads();
    RowsTimesTilesT<HS>(ss + warp * 16 * kLdS, sq + warp * 16 * L::kLd16, sk);
    __syncwarp();

    float* srow = ss + row * kLdS;
    float mx = -INFINITY;
    for (int j = 0; j < 32; ++j) {
      const int c = PairColumn(row, half, j), kj = k0 + c;
      const float s = Sees(qi, kj, window) && kj < T ? Capped(srow[c] * scale, softcap, nullptr) : -INFINITY;
      srow[c] = s;
      mx = fmaxf(mx, s);
    }
    mx = fmaxf(mx, __shfl_xor_sync(kFullMask, mx, 1));
    const float m_new = fmaxf(m, mx);
    const float m_use = m_new == -INFINITY ? 0.0f : m_new;  // a row masked so far: all terms 0
    const float alpha = expf(m - m_use);
    float sum = 0.0f;
    bf16* prow = sp + row * kLdP;
    for (int j = 0; j < 32; ++j) {
      const int c = PairColumn(row, half, j);
      const float p = expf(srow[c] - m_use);
      prow[c] = __float2bfloat16_rn(p);
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
    if (qi < T) lse[static_cast<int64_t>(head.bh) * T + qi] = m + logf(l);
  }
  __syncwarp();
  for (int i = lane; i < 16 * HS; i += 32) {
    const int r = warp * 16 + i / HS, c = i % HS;
    const int t = q0 + r;
    if (t < T) out_rows[static_cast<int64_t>(t) * C + c] = so[r * L::kLdO + c] / row_sum[r];
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
// query tiles kt .. last (the last whose first query sees the tile's last
// key, with a window). Warp w owns keys 16w .. 16w+15 of the tile and
// works on transposes: S^T = k q^T, dP^T = v dout^T.
template <int HS>
__global__ void __launch_bounds__(kFlashThreads)
    FlashBackwardKvKernel(float* dqkv, const float* dout, const float* qkv, const float* lse, const float* d, int T,
                          int C, int NH, float scale, int window, float softcap) {
  using L = Layout<HS>;
  ZINF_FLASH_SHARED(smem);
  const BackwardSmem<HS> sm(smem);
  const HeadSlice head(dqkv, qkv, T, C, NH, HS);
  const int kt = blockIdx.x, warp = threadIdx.x / 32, lane = threadIdx.x % 32;
  const int k0 = kt * kTile;
  LoadTile16<HS>(sm.own_a, head.k(), head.C3, k0, T);
  LoadTile16<HS>(sm.own_b, head.v(), head.C3, k0, T);
  FragAcc dk[HS / 16], dv[HS / 16];
  for (int n = 0; n < HS / 16; ++n) {
    wmma::fill_fragment(dk[n], 0.0f);
    wmma::fill_fragment(dv[n], 0.0f);
  }
  const int row = warp * 16 + lane / 2, half = lane % 2;
  const int kj = k0 + row;
  int q_tiles = (T + kTile - 1) / kTile;
  if (window > 0) {  // the query tile of the last query that sees the tile's last key, and one
    const int seen = (k0 + kTile - 1 + window - 1) / kTile + 1;
    if (seen < q_tiles) q_tiles = seen;
  }
  for (int qt = kt; qt < q_tiles; ++qt) {
    const int q0 = qt * kTile;
    __syncthreads();
    LoadTile16<HS>(sm.other_a, head.q, head.C3, q0, T);
    LoadTile16<HS>(sm.other_b, dout + head.at, C, q0, T);
    LoadRowStats(sm.lse, sm.d, lse, d, head.bh, q0, T);
    __syncthreads();
    const bf16* k_rows = sm.own_a + warp * 16 * L::kLd16;
    const bf16* v_rows = sm.own_b + warp * 16 * L::kLd16;
    RowsTimesTilesT<HS>(sm.s + warp * 16 * kLdS, k_rows, sm.other_a);
    RowsTimesTilesT<HS>(sm.dp + warp * 16 * kLdS, v_rows, sm.other_b);
    __syncwarp();
    for (int j = 0; j < 32; ++j) {
      const int c = PairColumn(row, half, j), qi = q0 + c;
      const int at = row * kLdS + c;
      float grad = 1.0f;  // of the cap
      const bool seen = Sees(qi, kj, window) && qi < T && kj < T;
      const float p = seen ? expf(Capped(sm.s[at] * scale, softcap, &grad) - sm.lse[c]) : 0.0f;
      sm.p[row * kLdP + c] = __float2bfloat16_rn(p);
      sm.ds[row * kLdP + c] = __float2bfloat16_rn(p * (sm.dp[at] - sm.d[c]) * grad);
    }
    __syncwarp();
    AccumulateRowsTimesTile<HS>(dv, sm.p + warp * 16 * kLdP, sm.other_b);
    AccumulateRowsTimesTile<HS>(dk, sm.ds + warp * 16 * kLdP, sm.other_a);
  }
  __syncthreads();  // the epilogue's stage spans the score tiles of every warp
  float* stage = sm.s + warp * 16 * L::kLdO;
  AddRows<HS>(head.dq + C, head.C3, k0 + warp * 16, T, scale, dk, stage);
  AddRows<HS>(head.dq + 2 * head.C, head.C3, k0 + warp * 16, T, 1.0f, dv, stage);
}

// dq of one query tile: grid (query tiles, B * NH), the longest rows first;
// query tile qt meets key tiles FirstKeyTile .. qt. Warp w owns queries
// 16w .. 16w+15.
template <int HS>
__global__ void __launch_bounds__(kFlashThreads)
    FlashBackwardQKernel(float* dqkv, const float* dout, const float* qkv, const float* lse, const float* d, int T,
                         int C, int NH, float scale, int window, float softcap) {
  using L = Layout<HS>;
  ZINF_FLASH_SHARED(smem);
  const BackwardSmem<HS> sm(smem);
  const HeadSlice head(dqkv, qkv, T, C, NH, HS);
  const int qt = static_cast<int>(gridDim.x) - 1 - static_cast<int>(blockIdx.x);
  const int warp = threadIdx.x / 32, lane = threadIdx.x % 32;
  const int q0 = qt * kTile;
  LoadTile16<HS>(sm.own_a, head.q, head.C3, q0, T);
  LoadTile16<HS>(sm.own_b, dout + head.at, C, q0, T);
  LoadRowStats(sm.lse, sm.d, lse, d, head.bh, q0, T);
  FragAcc dq[HS / 16];
  for (int n = 0; n < HS / 16; ++n) wmma::fill_fragment(dq[n], 0.0f);
  const int row = warp * 16 + lane / 2, half = lane % 2;
  const int qi = q0 + row;
  for (int kt = FirstKeyTile(q0, window); kt <= qt; ++kt) {
    const int k0 = kt * kTile;
    __syncthreads();
    LoadTile16<HS>(sm.other_a, head.k(), head.C3, k0, T);
    LoadTile16<HS>(sm.other_b, head.v(), head.C3, k0, T);
    __syncthreads();
    RowsTimesTilesT<HS>(sm.s + warp * 16 * kLdS, sm.own_a + warp * 16 * L::kLd16, sm.other_a);
    RowsTimesTilesT<HS>(sm.dp + warp * 16 * kLdS, sm.own_b + warp * 16 * L::kLd16, sm.other_b);
    __syncwarp();
    for (int j = 0; j < 32; ++j) {
      const int c = PairColumn(row, half, j), kj = k0 + c;
      const int at = row * kLdS + c;
      float grad = 1.0f;  // of the cap
      const bool seen = Sees(qi, kj, window) && kj < T;
      const float p = seen ? expf(Capped(sm.s[at] * scale, softcap, &grad) - sm.lse[row]) : 0.0f;
      sm.ds[row * kLdP + c] = __float2bfloat16_rn(p * (sm.dp[at] - sm.d[row]) * grad);
    }
    __syncwarp();
    AccumulateRowsTimesTile<HS>(dq, sm.ds + warp * 16 * kLdP, sm.other_a);
  }
  __syncthreads();
  AddRows<HS>(head.dq, head.C3, q0 + warp * 16, T, scale, dq, sm.s + warp * 16 * L::kLdO);
}

}  // namespace zinf::kernels::cuda::flash
