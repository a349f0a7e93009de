// A host emulation of the CUDA features the fused attention's kernels use
// (src/kernels/cuda_flash_attention_kernels.cuh), so that their code runs
// where there is no GPU: each CUDA thread of a block is a std::thread, run
// block after block; __syncthreads and __syncwarp are barriers, the warp
// shuffle an exchange through a per-warp array; WMMA fragments hold the
// whole 16 x 16 tile in every lane (a superset of the hardware's share) and
// every load/store checks WMMA's rules (32-byte aligned pointers, ldm a
// multiple of 16 bytes, inside the launch's dynamic shared memory, which
// starts as 0xff bytes, so reads of what nothing wrote show as NaN).
// mma_sync sums in fp32 in k order; the tensor cores' order and rounding
// are not modelled (the GPU test, CudaFlashAttentionTest, checks those).
// For tests only; include before the kernels' header.
#pragma once
#include <barrier>
#include <cmath>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <functional>
#include <memory>
#include <thread>
#include <type_traits>
#include <vector>

#define __global__
#define __device__
#define __forceinline__ inline
#define __launch_bounds__(x)
#define ZINF_FLASH_SHARED(name) unsigned char* name = g_smem

struct Dim3 {
  unsigned x = 1, y = 1, z = 1;
};
inline thread_local Dim3 threadIdx, blockIdx;
inline Dim3 gridDim, blockDim;
inline unsigned char* g_smem = nullptr;
inline size_t g_smem_bytes = 0;

struct WarpCtx {
  std::unique_ptr<std::barrier<>> bar;
  float xch[32];
  float buf[256];
};
inline std::barrier<>* g_block_bar = nullptr;
inline std::vector<WarpCtx>* g_warps = nullptr;

inline float* WarpBuf() { return (*g_warps)[threadIdx.x / 32].buf; }
inline void __syncthreads() { g_block_bar->arrive_and_wait(); }
inline void __syncwarp(unsigned = 0xffffffffu) { (*g_warps)[threadIdx.x / 32].bar->arrive_and_wait(); }
inline float __shfl_xor_sync(unsigned, float v, int off) {
  WarpCtx& w = (*g_warps)[threadIdx.x / 32];
  const int lane = threadIdx.x % 32;
  w.xch[lane] = v;
  w.bar->arrive_and_wait();
  const float r = w.xch[lane ^ off];
  w.bar->arrive_and_wait();
  return r;
}

struct __nv_bfloat16 {
  uint16_t bits;
};
inline __nv_bfloat16 __float2bfloat16_rn(float f) {
  uint32_t u;
  std::memcpy(&u, &f, 4);
  __nv_bfloat16 r;
  if (std::isnan(f)) {
    r.bits = 0x7fc0;
    return r;
  }
  const uint32_t lsb = (u >> 16) & 1;
  u += 0x7fff + lsb;
  r.bits = static_cast<uint16_t>(u >> 16);
  return r;
}
inline float __bfloat162float(__nv_bfloat16 b) {
  uint32_t u = static_cast<uint32_t>(b.bits) << 16;
  float f;
  std::memcpy(&f, &u, 4);
  return f;
}
inline float bfround(float f) { return __bfloat162float(__float2bfloat16_rn(f)); }

// Checks a 16x16 access at p (element size es, stride ldm elements) lies in
// the dynamic shared memory and meets WMMA's alignment rules.
inline void CheckWmma(const void* p, unsigned ldm, size_t es) {
  const auto base = reinterpret_cast<uintptr_t>(g_smem);
  const auto a = reinterpret_cast<uintptr_t>(p);
  if ((a - base) % 32 != 0) {
    std::fprintf(stderr, "WMMA pointer not 32-byte aligned: offset %zu\n", static_cast<size_t>(a - base));
    std::abort();
  }
  if ((ldm * es) % 16 != 0) {
    std::fprintf(stderr, "WMMA ldm %u not a multiple of 16 bytes\n", ldm);
    std::abort();
  }
  const size_t last = (a - base) + (15 * static_cast<size_t>(ldm) + 16) * es;
  if (a < base || last > g_smem_bytes) {
    std::fprintf(stderr, "WMMA access past shared memory: end %zu > %zu\n", last, g_smem_bytes);
    std::abort();
  }
}

namespace nvcuda::wmma {
struct matrix_a {};
struct matrix_b {};
struct accumulator {};
struct row_major {};
struct col_major {};
enum layout_t { mem_row_major, mem_col_major };
template <class Use, int M, int N, int K, class T, class Layout = void>
struct fragment {
  float x[256];  // [r][c] of the 16x16 (a: [i][k], b: [k][n], acc: [i][j])
};
template <class Use, class T, class L>
inline void fill_fragment(fragment<Use, 16, 16, 16, T, L>& f, float v) {
  for (float& e : f.x) e = v;
}
// Every lane reads the whole tile (a superset of what the hardware lane reads).
template <class L>
inline void load_matrix_sync(fragment<matrix_a, 16, 16, 16, __nv_bfloat16, L>& f, const __nv_bfloat16* p,
                             unsigned ldm) {
  static_assert(std::is_same_v<L, row_major>);
  CheckWmma(p, ldm, 2);
  for (int i = 0; i < 16; ++i)
    for (int k = 0; k < 16; ++k) f.x[i * 16 + k] = __bfloat162float(p[i * ldm + k]);
}
inline void load_matrix_sync(fragment<matrix_b, 16, 16, 16, __nv_bfloat16, row_major>& f, const __nv_bfloat16* p,
                             unsigned ldm) {
  CheckWmma(p, ldm, 2);
  for (int k = 0; k < 16; ++k)
    for (int n = 0; n < 16; ++n) f.x[k * 16 + n] = __bfloat162float(p[k * ldm + n]);
}
inline void load_matrix_sync(fragment<matrix_b, 16, 16, 16, __nv_bfloat16, col_major>& f, const __nv_bfloat16* p,
                             unsigned ldm) {
  CheckWmma(p, ldm, 2);
  for (int k = 0; k < 16; ++k)
    for (int n = 0; n < 16; ++n) f.x[k * 16 + n] = __bfloat162float(p[k + n * ldm]);
}
inline void load_matrix_sync(fragment<accumulator, 16, 16, 16, float, void>& f, const float* p, unsigned ldm,
                             layout_t l) {
  if (l != mem_row_major) std::abort();  // the kernels use row-major accumulators only
  CheckWmma(p, ldm, 4);
  // Lane e % 32 reads element e (the share it also stores), then the warp
  // swaps the values so every lane holds the whole tile.
  float* buf = WarpBuf();
  const int lane = threadIdx.x % 32;
  for (int e = lane; e < 256; e += 32) buf[e] = p[(e / 16) * ldm + e % 16];
  __syncwarp();
  for (int e = 0; e < 256; ++e) f.x[e] = buf[e];
  __syncwarp();
}
// Each lane writes its share (element e by lane e % 32).
inline void store_matrix_sync(float* p, const fragment<accumulator, 16, 16, 16, float, void>& f, unsigned ldm,
                              layout_t l) {
  if (l != mem_row_major) std::abort();  // the kernels use row-major accumulators only
  CheckWmma(p, ldm, 4);
  const int lane = threadIdx.x % 32;
  for (int e = lane; e < 256; e += 32) p[(e / 16) * ldm + e % 16] = f.x[e];
}
template <class LA, class LB>
inline void mma_sync(fragment<accumulator, 16, 16, 16, float, void>& d,
                     const fragment<matrix_a, 16, 16, 16, __nv_bfloat16, LA>& a,
                     const fragment<matrix_b, 16, 16, 16, __nv_bfloat16, LB>& b,
                     const fragment<accumulator, 16, 16, 16, float, void>& c) {
  float out[256];
  for (int i = 0; i < 16; ++i)
    for (int j = 0; j < 16; ++j) {
      float s = c.x[i * 16 + j];
      for (int k = 0; k < 16; ++k) s += a.x[i * 16 + k] * b.x[k * 16 + j];
      out[i * 16 + j] = s;
    }
  std::memcpy(d.x, out, sizeof(out));
}
}  // namespace nvcuda::wmma

namespace zinf::kernels::cuda {
inline constexpr unsigned kFullMask = 0xffffffffu;
inline float WarpSum(float v) {
  for (int offset = 16; offset > 0; offset >>= 1) v += __shfl_xor_sync(kFullMask, v, offset);
  return v;
}
}  // namespace zinf::kernels::cuda

// Runs `kernel` over the grid, block by block, a std::thread per CUDA thread.
inline void Launch(Dim3 grid, unsigned threads, size_t smem_bytes, const std::function<void()>& kernel) {
  gridDim = grid;
  blockDim = Dim3{threads, 1, 1};
  for (unsigned by = 0; by < grid.y; ++by)
    for (unsigned bx = 0; bx < grid.x; ++bx) {
      std::vector<unsigned char> smem_holder;
      unsigned char* sm = nullptr;
      if (smem_bytes) {
        // aligned_alloc of exactly the bytes: ASan sees overruns.
        void* mem = nullptr;
        if (posix_memalign(&mem, 128, smem_bytes) != 0) std::abort();
        sm = static_cast<unsigned char*>(mem);
        std::memset(sm, 0xff, smem_bytes);  // NaN-ish garbage, as uninitialised shared memory
      }
      g_smem = sm;
      g_smem_bytes = smem_bytes;
      std::barrier<> block_bar(threads);
      std::vector<WarpCtx> warps(threads / 32);
      for (auto& w : warps) w.bar = std::make_unique<std::barrier<>>(32);
      g_block_bar = &block_bar;
      g_warps = &warps;
      std::vector<std::thread> ts;
      for (unsigned t = 0; t < threads; ++t)
        ts.emplace_back([&, t] {
          threadIdx = Dim3{t, 0, 0};
          blockIdx = Dim3{bx, by, 0};
          kernel();
        });
      for (auto& t : ts) t.join();
      std::free(sm);
    }
}
