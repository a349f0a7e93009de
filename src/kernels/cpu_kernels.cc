// CPU kernels of the reference GPT (see cpu_kernels.h).
//
// Two concerns shape this file. Correctness first: every backward kernel is
// written so that no two threads ever write the same output element, which
// keeps the results deterministic (same bits for the same inputs whatever the
// thread count's schedule) and race-free without atomics. Where a natural
// loop over positions would make threads collide (embedding rows picked by
// repeated tokens, LayerNorm weights summed over rows, attention keys shared
// by later queries) the loop is turned around to run over the outputs.
//
// Speed second, and only where it matters: the matmuls carry nearly all of the
// floating-point work of a training step, so they go through one register-
// tiled kernel (an MR x NR block of outputs kept in registers while the
// reduction runs, the NR axis contiguous so it vectorizes). It is compiled
// for the baseline ISA, for AVX2+FMA and (float, with a larger tile) for
// AVX-512, picked at run time, because the build does not assume the
// machine it will run on; the FMA paths give the same bits. Everything
// else is a plain OpenMP loop; reductions use double accumulators so that
// the float kernels stay close to the double reference.
#include "kernels/cpu_kernels.h"

#include <algorithm>
#include <atomic>
#include <bit>
#include <cmath>
#include <cstring>
#include <type_traits>
#include <vector>

#include <omp.h>

#if defined(__x86_64__) && defined(__GNUC__)
#include <immintrin.h>
#endif

#include "core/check.h"
#include "core/half.h"
#include "kernels/cpu_vector.h"

namespace zinf::kernels {

namespace cpu {

void SetThreads(int threads) { omp_set_num_threads(std::max(1, threads)); }
int Threads() { return omp_get_max_threads(); }
namespace {
// LimitIsa's limit, read by HaveAvx2 and HaveAvx512.
std::atomic<int> isa_limit{static_cast<int>(Isa::kAvx512)};
}  // namespace
Isa LimitIsa(Isa isa) { return static_cast<Isa>(isa_limit.exchange(static_cast<int>(isa))); }

namespace internal {
bool HaveAvx2() {
#if defined(ZINF_KERNELS_X86)
  static const bool have = __builtin_cpu_supports("avx2") && __builtin_cpu_supports("fma");
  return have && isa_limit.load(std::memory_order_relaxed) >= static_cast<int>(Isa::kAvx2);
#else
  return false;
#endif
}

bool HaveAvx512() {
#if defined(ZINF_KERNELS_X86)
  static const bool have = __builtin_cpu_supports("avx2") && __builtin_cpu_supports("fma") &&
                           __builtin_cpu_supports("avx512f") && __builtin_cpu_supports("avx512vl");
  return have && isa_limit.load(std::memory_order_relaxed) >= static_cast<int>(Isa::kAvx512);
#else
  return false;
#endif
}
}  // namespace internal
namespace {

using internal::ExpFloat;
using internal::Gelu;
using internal::GeluGrad;
using internal::HaveAvx2;
using internal::HaveAvx512;
using internal::SumLanes;
using internal::Tanh;
using internal::Vectorized;
using internal::VectorizedChunks;
using internal::WorthThreads;

// ---------------------------------------------------------------- matmul core

// Register tile: MR rows of A times NR contiguous columns of B. NR is one
// 64-byte line of T (two AVX2 registers), MR = 4 keeps 8 accumulators plus
// the operands within the 16 vector registers of AVX2.
constexpr int kMr = 4;
template <typename T>
constexpr int Nr() {
  return static_cast<int>(64 / sizeof(T));
}

// C[0:mr, 0:nr] += A * B over k, on packed operands: a[p*MR + i] is A(i, p)
// and b[p*NR + j] is B(p, j) (both zero-padded to full MR / NR), so the loop
// reads two sequential streams and has no branches. `kFused`: each step is
// a fused multiply-add, written out (the FMA paths), so the bits do not
// depend on whether the optimizer level contracts `+= a * b` (-O1, the
// sanitizer builds', does not). `set`: C = A * B, C's old values neither
// read nor kept (the sum is the same chain, stored instead of added).
template <typename T, int MR, int NR, bool kFused>
ZINF_NO_ASAN ZINF_ALWAYS_INLINE void MicroTile(T* c, int64_t ldc, const T* a, const T* b, int64_t k, int mr, int nr,
                                               bool set) {
  T acc[MR][NR];
  for (int i = 0; i < MR; ++i)
    for (int j = 0; j < NR; ++j) acc[i][j] = T(0);
  for (int64_t p = 0; p < k; ++p) {
    const T* bp = b + p * NR;
    const T* ap = a + p * MR;
    for (int i = 0; i < MR; ++i) {
      const T ai = ap[i];
      if constexpr (kFused) {
        // The builtin, not std::fma: it is expanded in place (vfmadd on the
        // FMA targets) even where std::fma's wrapper could not be inlined
        // (into the uninstrumented micro-tiles of the sanitizer builds).
        if constexpr (std::is_same_v<T, float>) {
#pragma omp simd
          for (int j = 0; j < NR; ++j) acc[i][j] = __builtin_fmaf(ai, bp[j], acc[i][j]);
        } else {
#pragma omp simd
          for (int j = 0; j < NR; ++j) acc[i][j] = __builtin_fma(ai, bp[j], acc[i][j]);
        }
      } else {
#pragma omp simd
        for (int j = 0; j < NR; ++j) acc[i][j] += ai * bp[j];
      }
    }
  }
  if (nr == NR) {
    for (int i = 0; i < mr; ++i) {
      T* ci = c + i * ldc;
      if (set) {
#pragma omp simd
        for (int j = 0; j < NR; ++j) ci[j] = acc[i][j];
      } else {
#pragma omp simd
        for (int j = 0; j < NR; ++j) ci[j] += acc[i][j];
      }
    }
  } else {
    for (int i = 0; i < mr; ++i) {
      for (int j = 0; j < nr; ++j) {
        if (set) {
          c[i * ldc + j] = acc[i][j];
        } else {
          c[i * ldc + j] += acc[i][j];
        }
      }
    }
  }
}

// C[m, n] += Apack * Bpack (`set`: =): m rows in micro-panels of MR (apack
// holds ceil(m / MR) panels of k * MR), n columns in micro-panels of NR
// (bpack holds ceil(n / NR) panels of k * NR). Single-threaded; callers
// give each thread its own block of C.
template <typename T, int MR, int NR, bool kFused>
ZINF_NO_ASAN ZINF_ALWAYS_INLINE void PackedBlockBody(T* c, int64_t ldc, const T* apack, const T* bpack, int64_t m,
                                                     int64_t n, int64_t k, bool set) {
  for (int64_t i0 = 0; i0 < m; i0 += MR) {
    const int mr = static_cast<int>(std::min<int64_t>(MR, m - i0));
    const T* a = apack + (i0 / MR) * k * MR;
    for (int64_t j0 = 0; j0 < n; j0 += NR) {
      const int nr = static_cast<int>(std::min<int64_t>(NR, n - j0));
      MicroTile<T, MR, NR, kFused>(c + i0 * ldc + j0, ldc, a, bpack + (j0 / NR) * k * NR, k, mr, nr, set);
    }
  }
}

template <typename T>
ZINF_NO_ASAN void PackedBlockGeneric(T* c, int64_t ldc, const T* apack, const T* bpack, int64_t m, int64_t n, int64_t k,
                                     bool set) {
  PackedBlockBody<T, kMr, Nr<T>(), false>(c, ldc, apack, bpack, m, n, k, set);
}

#if defined(ZINF_KERNELS_X86)
template <typename T>
ZINF_NO_ASAN ZINF_TARGET_AVX2 void PackedBlockAvx2(T* c, int64_t ldc, const T* apack, const T* bpack, int64_t m,
                                                   int64_t n, int64_t k, bool set) {
  PackedBlockBody<T, kMr, Nr<T>(), true>(c, ldc, apack, bpack, m, n, k, set);
}

// AVX-512 (float): 32 vector registers hold an 8 x 32 tile (16 zmm
// accumulators), so each broadcast of A feeds two FMAs and each load of B
// eight, where the AVX2 tile loads six operands for eight FMAs. Every
// element of C is still one FMA chain over the slab in p order, started
// from zero and added to C once: the same bits as the AVX2 tile.
constexpr int kMr512 = 8;
constexpr int kNr512 = 32;
ZINF_NO_ASAN ZINF_TARGET_AVX512 void PackedBlockAvx512(float* c, int64_t ldc, const float* apack, const float* bpack,
                                                       int64_t m, int64_t n, int64_t k, bool set) {
  PackedBlockBody<float, kMr512, kNr512, true>(c, ldc, apack, bpack, m, n, k, set);
}
#endif

template <typename T>
void PackedBlock(T* c, int64_t ldc, const T* apack, const T* bpack, int64_t m, int64_t n, int64_t k, bool set) {
#if defined(ZINF_KERNELS_X86)
  if (HaveAvx2()) return PackedBlockAvx2<T>(c, ldc, apack, bpack, m, n, k, set);
#endif
  PackedBlockGeneric<T>(c, ldc, apack, bpack, m, n, k, set);
}

// Blocking: a thread computes a kRowBlock x kColBlock block of C over a slab
// of kDepthBlock of the reduction; its packed A and B (64 KiB each for
// float) sit in L2 while the micro-tiles stream them through L1.
constexpr int64_t kRowBlock = 64;  // a multiple of every tile's MR
constexpr int64_t kColBlock = 64;  // a multiple of every tile's NR
constexpr int64_t kDepthBlock = 256;

inline int64_t CeilDiv(int64_t a, int64_t b) { return (a + b - 1) / b; }

// Buffers of the calling thread, grown as needed and kept (OpenMP pool
// threads live across calls, so these are allocated once per thread, not
// once per kernel call).
enum ThreadBufferSlot {
  kPackA,            // a thread's packed A panel
  kPackB,            // its packed B panel
  kPackSharedA,      // an A slab the caller shares with its team
  kAttentionScores,  // a fused attention item's rows x T scores (probabilities, dS)
  kAttentionGrads,   // and their gradient (dp; P in the dk/dv pass)
  kLossExps,         // one position's exps over the vocabulary
  kThreadBufferSlots
};
template <typename T>
T* ThreadBuffer(ThreadBufferSlot slot, size_t elems) {
  thread_local std::vector<T> buffers[kThreadBufferSlots];
  if (buffers[slot].size() < elems) buffers[slot].resize(elems);
  return buffers[slot].data();
}

// What the B operand's elements are stored as: T itself, or a 16-bit float
// type (a weight as the engine holds it), widened to float while it is
// packed, so no float copy of it is ever written; the values are those a
// cast to float gives, and so are the bits of the product.
template <typename T>
struct PlainB {
  using Elem = T;
  static T Get(T x) { return x; }
};
struct Bf16B {
  using Elem = uint16_t;
  static float Get(uint16_t x) { return Bf16ToFloat(x); }
};
struct F16B {
  using Elem = uint16_t;
  static float Get(uint16_t x) { return HalfToFloat(x); }
};

#if defined(ZINF_KERNELS_X86)
// A 16 x 16 block of floats transposed in registers: r[i] holds row i on
// entry and column i on return. Three rounds of shuffles: pairs of rows
// within 128-bit lanes, then groups of four, then the lanes themselves.
// (The zero-masked forms with every lane kept: GCC 12 warns that the
// unmasked ones' undefined pass-through may be used uninitialized.)
ZINF_TARGET_AVX512 ZINF_ALWAYS_INLINE void Transpose16x16(__m512 r[16]) {
  constexpr __mmask16 kAll = 0xFFFF;
  __m512 t[16];
  for (int i = 0; i < 16; i += 2) {
    t[i] = _mm512_maskz_unpacklo_ps(kAll, r[i], r[i + 1]);
    t[i + 1] = _mm512_maskz_unpackhi_ps(kAll, r[i], r[i + 1]);
  }
  // u[4g + q] holds, in lane L, column 4L + q of rows 4g .. 4g + 3.
  __m512 u[16];
  for (int g = 0; g < 16; g += 4) {
    u[g] = _mm512_shuffle_ps(t[g], t[g + 2], 0x44);
    u[g + 1] = _mm512_shuffle_ps(t[g], t[g + 2], 0xEE);
    u[g + 2] = _mm512_shuffle_ps(t[g + 1], t[g + 3], 0x44);
    u[g + 3] = _mm512_shuffle_ps(t[g + 1], t[g + 3], 0xEE);
  }
  for (int q = 0; q < 4; ++q) {
    const __m512 even01 = _mm512_maskz_shuffle_f32x4(kAll, u[q], u[4 + q], 0x88);  // lanes 0, 2 of row groups 0, 1
    const __m512 odd01 = _mm512_maskz_shuffle_f32x4(kAll, u[q], u[4 + q], 0xDD);   // lanes 1, 3
    const __m512 even23 = _mm512_maskz_shuffle_f32x4(kAll, u[8 + q], u[12 + q], 0x88);
    const __m512 odd23 = _mm512_maskz_shuffle_f32x4(kAll, u[8 + q], u[12 + q], 0xDD);
    r[q] = _mm512_maskz_shuffle_f32x4(kAll, even01, even23, 0x88);      // lane 0: column q
    r[4 + q] = _mm512_maskz_shuffle_f32x4(kAll, odd01, odd23, 0x88);    // lane 1: column 4 + q
    r[8 + q] = _mm512_maskz_shuffle_f32x4(kAll, even01, even23, 0xDD);  // lane 2: column 8 + q
    r[12 + q] = _mm512_maskz_shuffle_f32x4(kAll, odd01, odd23, 0xDD);   // lane 3: column 12 + q
  }
}

// Sixteen elements of B's source widened to float: a float, or a bf16 (the
// top half of a float, so the shift gives Bf16ToFloat's bits).
template <typename BSrc>
ZINF_TARGET_AVX512 ZINF_ALWAYS_INLINE __m512 Load16AsFloat(const typename BSrc::Elem* p) {
  if constexpr (std::is_same_v<typename BSrc::Elem, float>) {
    return _mm512_loadu_ps(p);
  } else {
    const __m256i h = _mm256_loadu_si256(reinterpret_cast<const __m256i*>(p));
    constexpr __mmask16 kAll = 0xFFFF;
    return _mm512_castsi512_ps(_mm512_maskz_slli_epi32(kAll, _mm512_maskz_cvtepu16_epi32(kAll, h), 16));
  }
}

// The AVX-512 tile's B panel from a transposed operand (the forward's
// weight, B(p, j) = src[p + j * ld]): dst[p * 32 + j] for 32 columns and p
// in [0, kb), sixteen columns by sixteen p at a time through registers, so
// each source row is read sixteen elements at a time and each panel row
// written whole; a tail of kb % 16 goes element by element. The same values
// as the element loop (a copy or an exact widening) in about half its time
// (the rest is waiting for the weight to come from memory).
template <typename BSrc>
ZINF_TARGET_AVX512 void PackTransposedPanelAvx512(float* dst, const typename BSrc::Elem* src, int64_t ld, int64_t kb) {
  constexpr int64_t kNr = kNr512;
  constexpr int64_t kPrefetchStride = 64 / static_cast<int64_t>(sizeof(typename BSrc::Elem));  // a cache line
  const int64_t body = kb - kb % 16;
  __m512 r[16];
  for (int64_t j0 = 0; j0 < kNr; j0 += 16) {
    for (int64_t p0 = 0; p0 < body; p0 += 16) {
      // The rows are far apart (a weight's row each), too many streams for
      // the hardware prefetcher: ask for each row's line after next.
      if (p0 % kPrefetchStride == 0 && p0 + 2 * kPrefetchStride < kb) {
        for (int i = 0; i < 16; ++i) _mm_prefetch(src + p0 + 2 * kPrefetchStride + (j0 + i) * ld, _MM_HINT_T0);
      }
      for (int i = 0; i < 16; ++i) r[i] = Load16AsFloat<BSrc>(src + p0 + (j0 + i) * ld);
      Transpose16x16(r);
      for (int i = 0; i < 16; ++i) _mm512_storeu_ps(dst + (p0 + i) * kNr + j0, r[i]);
    }
  }
  for (int64_t p = body; p < kb; ++p) {
    for (int64_t j = 0; j < kNr; ++j) dst[p * kNr + j] = BSrc::Get(src[p + j * ld]);
  }
}
#endif

// The A slab of one row block (mb rows from `as`, A(i, p) = as[i*a_rs +
// p*a_cs], p < kb) in MR-row micro-panels: dst[(i/MR)*kb*MR + p*MR + i%MR],
// zero-padded to whole panels.
template <typename T, int MR>
void PackRowBlock(T* dst, const T* as, int64_t a_rs, int64_t a_cs, int64_t mb, int64_t kb) {
  for (int64_t ip = 0; ip < mb; ip += MR) {
    T* panel = dst + (ip / MR) * kb * MR;
    const int64_t h = std::min<int64_t>(MR, mb - ip);
    if (a_cs == 1) {
      for (int64_t i = 0; i < MR; ++i) {
        if (i < h) {
          for (int64_t p = 0; p < kb; ++p) panel[p * MR + i] = as[(ip + i) * a_rs + p];
        } else {
          for (int64_t p = 0; p < kb; ++p) panel[p * MR + i] = T(0);
        }
      }
    } else {
      for (int64_t p = 0; p < kb; ++p) {
        for (int64_t i = 0; i < h; ++i) panel[p * MR + i] = as[(ip + i) * a_rs + p * a_cs];
        for (int64_t i = h; i < MR; ++i) panel[p * MR + i] = T(0);
      }
    }
  }
}

// C [M, Ncols] (row stride ldc) += A (M x K) * B (K x Ncols), where
// A(i, p) = a[i*a_rs + p*a_cs] and B(p, j) = BSrc::Get(b[p*b_rs + j*b_cs]):
// any of the three matmuls of a linear layer, by strides. Parallel over
// blocks of C; the reduction runs slab after slab, so every element of C is
// summed in a fixed order whatever the thread count (deterministic).
// `set`: C = A * B; the first slab's sums are stored rather than added, so
// C is neither zeroed nor read (the bits of zeroing it first: a sum started
// from +0 is never -0, so storing it equals adding it to a zero).
//
// MR x NR is the register tile of `block`, the packed panels' widths.
// `kRegisterTranspose`: full panels of a transposed B are packed by
// PackTransposedPanelAvx512 (the AVX-512 float tile, NR 32; Gemm decides).
template <typename T, int MR, int NR, void (*block)(T*, int64_t, const T*, const T*, int64_t, int64_t, int64_t, bool),
          typename BSrc, bool kRegisterTranspose = false>
void GemmTiled(T* c, int64_t ldc, const T* a, int64_t a_rs, int64_t a_cs, const typename BSrc::Elem* b, int64_t b_rs,
               int64_t b_cs, int64_t M, int64_t Ncols, int64_t K, bool set) {
  static_assert(kRowBlock % MR == 0 && kColBlock % NR == 0);
  if (K == 0 && set) {  // an empty sum: no slab stores it
    for (int64_t i = 0; i < M; ++i) std::fill(c + i * ldc, c + i * ldc + Ncols, T(0));
    return;
  }
  const int64_t row_blocks = CeilDiv(M, kRowBlock);
  const int64_t col_blocks = CeilDiv(Ncols, kColBlock);
  const int64_t items = row_blocks * col_blocks;
  // With several row blocks and several column panels, each item would
  // pack its own A slab (consecutive items share the B panel, not the
  // rows): the weight gradient's shape, many rows of dout^T over a short
  // reduction, where that packing took about a fifth of the time. The
  // whole A slab is then packed once per slab, by all threads, into one
  // buffer that every item reads (the same packed values, so the same
  // bits).
  const bool shared_a = row_blocks > 1 && col_blocks > 1;
  T* const apack_all =
      shared_a ? ThreadBuffer<T>(kPackSharedA, static_cast<size_t>(row_blocks * kRowBlock * std::min(kDepthBlock, K)))
               : nullptr;
  // Inside a parallel region (the fused attention's work items) it runs on
  // the calling thread alone.
#pragma omp parallel if (WorthThreads(M * Ncols * K) && !omp_in_parallel())
  {
    T* const apack = shared_a ? nullptr : ThreadBuffer<T>(kPackA, static_cast<size_t>(kRowBlock * kDepthBlock));
    T* const bpack = ThreadBuffer<T>(kPackB, static_cast<size_t>(kColBlock * kDepthBlock));
    for (int64_t k0 = 0; k0 < K; k0 += kDepthBlock) {
      const int64_t kb = std::min(kDepthBlock, K - k0);
      if (shared_a) {
        // This loop's barrier: every row block is packed before any item
        // reads it. The items loop's barrier: the previous slab's items
        // are done before the slab is packed over.
#pragma omp for schedule(static)
        for (int64_t r = 0; r < row_blocks; ++r) {
          PackRowBlock<T, MR>(apack_all + r * kRowBlock * kb, a + r * kRowBlock * a_rs + k0 * a_cs, a_rs, a_cs,
                              std::min(kRowBlock, M - r * kRowBlock), kb);
        }
      }
      int64_t packed_panel = -1, packed_rows = -1;
      // Column-panel-major items: a thread's consecutive items share the
      // packed B panel, and with one row block (a few token rows, the
      // usual shape) the packed A slab as well.
#pragma omp for schedule(static)
      for (int64_t item = 0; item < items; ++item) {
        const int64_t j0 = (item / row_blocks) * kColBlock;
        const int64_t i0 = (item % row_blocks) * kRowBlock;
        const int64_t nb = std::min(kColBlock, Ncols - j0);
        const int64_t mb = std::min(kRowBlock, M - i0);
        if (packed_panel != j0) {
          const typename BSrc::Elem* bs = b + k0 * b_rs + j0 * b_cs;
          for (int64_t jp = 0; jp < nb; jp += NR) {
            T* dst = bpack + (jp / NR) * kb * NR;
            const int64_t w = std::min<int64_t>(NR, nb - jp);
            if (b_cs == 1) {
              for (int64_t p = 0; p < kb; ++p) {
                for (int64_t j = 0; j < w; ++j) dst[p * NR + j] = BSrc::Get(bs[p * b_rs + jp + j]);
                for (int64_t j = w; j < NR; ++j) dst[p * NR + j] = T(0);
              }
            } else {
#if defined(ZINF_KERNELS_X86)
              if constexpr (kRegisterTranspose) {
                static_assert(NR == kNr512 && std::is_same_v<T, float>);
                if (b_rs == 1 && w == NR) {
                  PackTransposedPanelAvx512<BSrc>(dst, bs + jp * b_cs, b_cs, kb);
                  continue;
                }
              }
#endif
              for (int64_t j = 0; j < NR; ++j) {
                if (j < w) {
                  // A transposed weight (the forward's): each row's
                  // slab is a short run that the hardware's prefetch
                  // starts too late on; ask for the row after next.
                  constexpr int64_t kLineElems = 64 / static_cast<int64_t>(sizeof(typename BSrc::Elem));
                  if (b_rs == 1 && j + 2 < w) {
                    for (int64_t p = 0; p < kb; p += kLineElems) __builtin_prefetch(bs + p + (jp + j + 2) * b_cs);
                  }
                  for (int64_t p = 0; p < kb; ++p) dst[p * NR + j] = BSrc::Get(bs[p * b_rs + (jp + j) * b_cs]);
                } else {
                  for (int64_t p = 0; p < kb; ++p) dst[p * NR + j] = T(0);
                }
              }
            }
          }
          packed_panel = j0;
        }
        const T* rows = shared_a ? apack_all + (i0 / kRowBlock) * kRowBlock * kb : apack;
        if (!shared_a && packed_rows != i0) {
          PackRowBlock<T, MR>(apack, a + i0 * a_rs + k0 * a_cs, a_rs, a_cs, mb, kb);
          packed_rows = i0;
        }
        block(c + i0 * ldc + j0, ldc, rows, bpack, mb, nb, kb, set && k0 == 0);
      }
    }
  }
}

template <typename T, typename BSrc = PlainB<T>>
void Gemm(T* c, int64_t ldc, const T* a, int64_t a_rs, int64_t a_cs, const typename BSrc::Elem* b, int64_t b_rs,
          int64_t b_cs, int64_t M, int64_t Ncols, int64_t K, bool set = false) {
#if defined(ZINF_KERNELS_X86)
  if constexpr (std::is_same_v<T, float>) {
    if (HaveAvx512()) {
      // f16 keeps the element loop: the hardware widening quiets signalling
      // NaNs, HalfToFloat does not.
      constexpr bool kRegisterTranspose = !std::is_same_v<BSrc, F16B>;
      return GemmTiled<float, kMr512, kNr512, PackedBlockAvx512, BSrc, kRegisterTranspose>(
          c, ldc, a, a_rs, a_cs, b, b_rs, b_cs, M, Ncols, K, set);
    }
  }
#endif
  GemmTiled<T, kMr, Nr<T>(), PackedBlock<T>, BSrc>(c, ldc, a, a_rs, a_cs, b, b_rs, b_cs, M, Ncols, K, set);
}

// ---------------------------------------------------------------- casts

// out[i] = f(in[i]), on the threads where n is worth them (a short run,
// as TransposeCast's tiles make, enters no parallel region: even one with
// a false `if` costs the runtime's team set-up); memcpy per element, so
// `out` and `in` need no alignment (a safetensors payload's offsets are
// any byte).
template <typename To, typename From, typename F>
void Convert(void* out, const void* in, int64_t n, F f) {
  auto* o = static_cast<std::byte*>(out);
  const auto* s = static_cast<const std::byte*>(in);
  auto one = [&](int64_t i) {
    From x;
    std::memcpy(&x, s + sizeof(From) * i, sizeof(From));
    const To y = f(x);
    std::memcpy(o + sizeof(To) * i, &y, sizeof(To));
  };
  if (!WorthThreads(n)) {
    for (int64_t i = 0; i < n; ++i) one(i);
    return;
  }
#pragma omp parallel for schedule(static)
  for (int64_t i = 0; i < n; ++i) one(i);
}

}  // namespace

void CastOut(void* out, ElementType out_type, const float* src, int64_t n) {
  if (n == 0) return;
  switch (out_type) {
    case ElementType::kF32: std::memcpy(out, src, static_cast<size_t>(n) * sizeof(float)); return;
    // Lambdas, not the functions' pointers: the conversion inlines (and vectorizes).
    case ElementType::kBf16: Convert<uint16_t, float>(out, src, n, [](float x) { return FloatToBf16(x); }); return;
    case ElementType::kF16: Convert<uint16_t, float>(out, src, n, [](float x) { return FloatToHalf(x); }); return;
    case ElementType::kF64:
    case ElementType::kU8:
    case ElementType::kI64: break;
  }
  ZINF_CHECK_MSG(false, "CastOut: the destination must be f32, bf16 or f16");
}

template <typename T>
void CastIn(T* out, const void* src, ElementType src_type, int64_t n) {
  switch (src_type) {
    case ElementType::kF32: Convert<T, float>(out, src, n, [](float x) { return static_cast<T>(x); }); return;
    case ElementType::kF64: Convert<T, double>(out, src, n, [](double x) { return static_cast<T>(x); }); return;
    case ElementType::kBf16:
      Convert<T, uint16_t>(out, src, n, [](uint16_t x) { return static_cast<T>(Bf16ToFloat(x)); });
      return;
    case ElementType::kF16:
      Convert<T, uint16_t>(out, src, n, [](uint16_t x) { return static_cast<T>(HalfToFloat(x)); });
      return;
    case ElementType::kU8:
    case ElementType::kI64: break;
  }
  ZINF_CHECK_MSG(false, "CastIn: the source must be f32, f64, bf16 or f16");
}

void TransposeCast(void* dst, ElementType dst_type, const void* src, ElementType src_type, int64_t rows, int64_t cols,
                   int64_t col0, int64_t col1) {
  constexpr int64_t kTile = 64;
  const int64_t src_size = ElementSizeBytes(src_type), dst_size = ElementSizeBytes(dst_type);
  const auto* s = static_cast<const std::byte*>(src);
  auto* d = static_cast<std::byte*>(dst);
  // A tile's column stripe: its source rows' pieces read as float (each a
  // run of the source), transposed in the cache, written as runs of the
  // destination.
  auto stripe = [&](int64_t c0) {
    const int64_t c1 = std::min(c0 + kTile, col1);
    float in[kTile][kTile], out[kTile][kTile];
    for (int64_t r0 = 0; r0 < rows; r0 += kTile) {
      const int64_t r1 = std::min(r0 + kTile, rows);
      for (int64_t r = r0; r < r1; ++r) CastIn(in[r - r0], s + (r * cols + c0) * src_size, src_type, c1 - c0);
      for (int64_t c = c0; c < c1; ++c) {
        for (int64_t r = r0; r < r1; ++r) out[c - c0][r - r0] = in[r - r0][c - c0];
        CastOut(d + ((c - col0) * rows + r0) * dst_size, dst_type, out[c - c0], r1 - r0);
      }
    }
  };
  if (!WorthThreads((col1 - col0) * rows)) {  // no parallel region at all (see Convert)
    for (int64_t c0 = col0; c0 < col1; c0 += kTile) stripe(c0);
    return;
  }
#pragma omp parallel for schedule(static)
  for (int64_t c0 = col0; c0 < col1; c0 += kTile) stripe(c0);
}

// ---------------------------------------------------------------- encoder

template <typename T>
void EncoderForward(T* out, const int32_t* tokens, const T* wte, const T* wpe, int B, int T_, int C) {
  const int64_t N = static_cast<int64_t>(B) * T_;
#pragma omp parallel for schedule(static) if (WorthThreads(N * C))
  for (int64_t n = 0; n < N; ++n) {
    const T* e = wte + static_cast<int64_t>(tokens[n]) * C;
    const T* p = wpe + (n % T_) * static_cast<int64_t>(C);
    T* o = out + n * C;
    for (int c = 0; c < C; ++c) o[c] = e[c] + p[c];
  }
}

template <typename T>
void EncoderBackward(T* dwte, T* dwpe, const T* dout, const int32_t* tokens, int B, int T_, int C,
                     int32_t padding_token) {
  // Repeated tokens hit the same dwte row, so threads split the channels,
  // not the positions; each thread walks all positions in order.
  const int64_t N = static_cast<int64_t>(B) * T_;
  constexpr int kChunk = 16;
#pragma omp parallel for schedule(static) if (WorthThreads(N * C))
  for (int c0 = 0; c0 < C; c0 += kChunk) {
    const int c1 = std::min(C, c0 + kChunk);
    for (int64_t n = 0; n < N; ++n) {
      const T* d = dout + n * C;
      T* p = dwpe + (n % T_) * static_cast<int64_t>(C);
      for (int c = c0; c < c1; ++c) p[c] += d[c];
      if (tokens[n] == padding_token) continue;
      T* e = dwte + static_cast<int64_t>(tokens[n]) * C;
      for (int c = c0; c < c1; ++c) e[c] += d[c];
    }
  }
}

// ---------------------------------------------------------------- layernorm

template <typename T>
void LayerNormForward(T* out, T* mean, T* rstd, const T* inp, const T* weight, const T* bias, int64_t N, int C) {
#pragma omp parallel for schedule(static) if (WorthThreads(N * C))
  for (int64_t n = 0; n < N; ++n) {
    const T* x = inp + n * C;
    double m = 0.0;
    for (int c = 0; c < C; ++c) m += x[c];
    m /= C;
    double v = 0.0;
    for (int c = 0; c < C; ++c) {
      const double d = x[c] - m;
      v += d * d;
    }
    v /= C;
    const double s = 1.0 / std::sqrt(v + kLayerNormEps);
    T* o = out + n * C;
    for (int c = 0; c < C; ++c) o[c] = static_cast<T>((x[c] - m) * s) * weight[c] + bias[c];
    mean[n] = static_cast<T>(m);
    rstd[n] = static_cast<T>(s);
  }
}

template <typename T>
void LayerNormBackward(T* dinp, T* dweight, T* dbias, const T* dout, const T* inp, const T* weight, const T* mean,
                       const T* rstd, int64_t N, int C) {
  // dinp: rows are independent. With xhat = (x - mean) * rstd and
  // g = dout * weight: dx = rstd * (g - mean(g) - xhat * mean(g * xhat)).
#pragma omp parallel for schedule(static) if (WorthThreads(N * C))
  for (int64_t n = 0; n < N; ++n) {
    const T* x = inp + n * C;
    const T* d = dout + n * C;
    const T m = mean[n];
    const T s = rstd[n];
    double g_mean = 0.0, gx_mean = 0.0;
    for (int c = 0; c < C; ++c) {
      const T g = d[c] * weight[c];
      g_mean += g;
      gx_mean += g * ((x[c] - m) * s);
    }
    g_mean /= C;
    gx_mean /= C;
    T* dx = dinp + n * C;
    for (int c = 0; c < C; ++c) {
      const T xhat = (x[c] - m) * s;
      const T g = d[c] * weight[c];
      dx[c] += s * (g - static_cast<T>(g_mean) - xhat * static_cast<T>(gx_mean));
    }
  }
  // dweight, dbias: sums over rows; threads split the channels.
  constexpr int kChunk = 16;
#pragma omp parallel for schedule(static) if (WorthThreads(N * C))
  for (int c0 = 0; c0 < C; c0 += kChunk) {
    const int c1 = std::min(C, c0 + kChunk);
    double dw[kChunk] = {}, db[kChunk] = {};
    for (int64_t n = 0; n < N; ++n) {
      const T* x = inp + n * C;
      const T* d = dout + n * C;
      const T m = mean[n];
      const T s = rstd[n];
      for (int c = c0; c < c1; ++c) {
        dw[c - c0] += d[c] * ((x[c] - m) * s);
        db[c - c0] += d[c];
      }
    }
    for (int c = c0; c < c1; ++c) {
      dweight[c] += static_cast<T>(dw[c - c0]);
      dbias[c] += static_cast<T>(db[c - c0]);
    }
  }
}

// ---------------------------------------------------------------- matmul

namespace {

template <typename T, typename BSrc>
void MatmulForwardFrom(T* out, const T* inp, const typename BSrc::Elem* weight, const T* bias, int64_t N, int C,
                       int OC) {
#pragma omp parallel for schedule(static) if (WorthThreads(N * OC))
  for (int64_t n = 0; n < N; ++n) {
    T* o = out + n * OC;
    if (bias != nullptr) {
      std::memcpy(o, bias, sizeof(T) * OC);
    } else {
      std::fill(o, o + OC, T(0));
    }
  }
  // out [N, OC] += inp [N, C] @ weight^T: B(c, o) = weight[o*C + c].
  Gemm<T, BSrc>(out, OC, inp, C, 1, weight, 1, C, N, OC, C);
}

template <typename T, typename BSrc>
void MatmulBackwardFrom(T* dinp, T* dweight, T* dbias, const T* dout, const T* inp, const typename BSrc::Elem* weight,
                        int64_t N, int C, int OC, GradMode mode) {
  const bool set = mode == GradMode::kSet;
  // dinp [N, C] += dout [N, OC] @ weight [OC, C].
  Gemm<T, BSrc>(dinp, C, dout, OC, 1, weight, C, 1, N, C, OC);
  // dweight [OC, C] += (set: =) dout^T [OC, N] @ inp [N, C]: A(o, n) = dout[n*OC + o].
  Gemm<T>(dweight, C, dout, 1, OC, inp, C, 1, OC, C, N, set);
  if (dbias != nullptr) {
#pragma omp parallel for schedule(static) if (WorthThreads(N * OC))
    for (int64_t o0 = 0; o0 < OC; o0 += kColBlock) {
      const int64_t o1 = std::min<int64_t>(OC, o0 + kColBlock);
      double acc[kColBlock] = {};
      for (int64_t n = 0; n < N; ++n) {
        const T* d = dout + n * OC;
        for (int64_t o = o0; o < o1; ++o) acc[o - o0] += d[o];
      }
      for (int64_t o = o0; o < o1; ++o) {
        dbias[o] = set ? static_cast<T>(acc[o - o0]) : dbias[o] + static_cast<T>(acc[o - o0]);
      }
    }
  }
}

}  // namespace

template <typename T>
void MatmulForward(T* out, const T* inp, const T* weight, const T* bias, int64_t N, int C, int OC) {
  MatmulForwardFrom<T, PlainB<T>>(out, inp, weight, bias, N, C, OC);
}

template <typename T>
void MatmulBackward(T* dinp, T* dweight, T* dbias, const T* dout, const T* inp, const T* weight, int64_t N, int C,
                    int OC, GradMode mode) {
  MatmulBackwardFrom<T, PlainB<T>>(dinp, dweight, dbias, dout, inp, weight, N, C, OC, mode);
}

void MatmulForward16(float* out, const float* inp, const uint16_t* weight, ElementType weight_type, const float* bias,
                     int64_t N, int C, int OC) {
  ZINF_CHECK_MSG(IsWeight16(weight_type), "MatmulForward16: the weight must be bf16 or f16");
  if (weight_type == ElementType::kBf16) return MatmulForwardFrom<float, Bf16B>(out, inp, weight, bias, N, C, OC);
  MatmulForwardFrom<float, F16B>(out, inp, weight, bias, N, C, OC);
}

void MatmulBackward16(float* dinp, float* dweight, float* dbias, const float* dout, const float* inp,
                      const uint16_t* weight, ElementType weight_type, int64_t N, int C, int OC, GradMode mode) {
  ZINF_CHECK_MSG(IsWeight16(weight_type), "MatmulBackward16: the weight must be bf16 or f16");
  if (weight_type == ElementType::kBf16) {
    return MatmulBackwardFrom<float, Bf16B>(dinp, dweight, dbias, dout, inp, weight, N, C, OC, mode);
  }
  MatmulBackwardFrom<float, F16B>(dinp, dweight, dbias, dout, inp, weight, N, C, OC, mode);
}

void RoundTo16(float* x, int64_t n, ElementType type) {
  ZINF_CHECK_MSG(IsWeight16(type), "RoundTo16: the type must be bf16 or f16");
  const bool bf16 = type == ElementType::kBf16;
#pragma omp parallel for schedule(static) if (WorthThreads(n))
  for (int64_t i = 0; i < n; ++i) x[i] = bf16 ? Bf16ToFloat(FloatToBf16(x[i])) : HalfToFloat(FloatToHalf(x[i]));
}

// ---------------------------------------------------------------- attention

namespace {
// `window` as the loops below take it: 0 unless it leaves some key out
// (one of T or more is none; it keeps t + window from overflowing).
inline int InEffect(int window, int T_) { return window > 0 && window < T_ ? window : 0; }
// The first key query t sees (cpu_kernels.h: `window` 0 is none).
inline int FirstKey(int t, int window) { return window > 0 ? std::max(0, t - window + 1) : 0; }
// One past the last query that sees key t2.
inline int EndQuery(int t2, int window, int T_) { return window > 0 ? std::min(T_, t2 + window) : T_; }
}  // namespace

template <typename T>
void AttentionForward(T* out, T* att, const T* qkv, int B, int T_, int C, int NH, int window, float softcap,
                      const T* sinks) {
  window = InEffect(window, T_);
  const int hs = C / NH;
  const int64_t C3 = 3 * static_cast<int64_t>(C);
  const T scale = static_cast<T>(1.0 / std::sqrt(static_cast<double>(hs)));
  const T cap = static_cast<T>(softcap);
#pragma omp parallel for collapse(3) schedule(static) if (WorthThreads(int64_t{B} * T_ * T_ * C))
  for (int b = 0; b < B; ++b) {
    for (int h = 0; h < NH; ++h) {
      for (int t = 0; t < T_; ++t) {
        const T* q = qkv + (static_cast<int64_t>(b) * T_ + t) * C3 + h * hs;
        T* a = att + ((static_cast<int64_t>(b) * NH + h) * T_ + t) * T_;
        const int lo = FirstKey(t, window);
        T maxv = -INFINITY;
        for (int t2 = lo; t2 <= t; ++t2) {
          const T* k = qkv + (static_cast<int64_t>(b) * T_ + t2) * C3 + C + h * hs;
          T s = T(0);
          for (int i = 0; i < hs; ++i) s += q[i] * k[i];
          s *= scale;
          if (cap > T(0)) s = cap * std::tanh(s / cap);
          a[t2] = s;
          maxv = std::max(maxv, s);
        }
        if (sinks != nullptr) maxv = std::max(maxv, sinks[h]);
        double sum = sinks != nullptr ? static_cast<double>(std::exp(sinks[h] - maxv)) : 0.0;
        for (int t2 = lo; t2 <= t; ++t2) {
          a[t2] = std::exp(a[t2] - maxv);
          sum += a[t2];
        }
        const T inv = static_cast<T>(1.0 / sum);
        for (int t2 = lo; t2 <= t; ++t2) a[t2] *= inv;
        std::fill(a, a + lo, T(0));
        std::fill(a + t + 1, a + T_, T(0));
        T* o = out + (static_cast<int64_t>(b) * T_ + t) * C + h * hs;
        for (int i = 0; i < hs; ++i) o[i] = T(0);
        for (int t2 = lo; t2 <= t; ++t2) {
          const T* v = qkv + (static_cast<int64_t>(b) * T_ + t2) * C3 + 2 * C + h * hs;
          const T w = a[t2];
          for (int i = 0; i < hs; ++i) o[i] += w * v[i];
        }
      }
    }
  }
}

template <typename T>
void AttentionBackward(T* dqkv, T* scratch, const T* dout, const T* qkv, const T* att, int B, int T_, int C, int NH,
                       int window, float softcap, T* dsinks) {
  // Two passes so that each thread owns what it writes. Pass 1, per query
  // row t: the gradient of the pre-softmax scores (kept in scratch) and dq[t].
  // Pass 2, per key row t2: dk[t2] and dv[t2], summed over the queries
  // that attended to it (t2 .. EndQuery - 1).
  window = InEffect(window, T_);
  const int hs = C / NH;
  const int64_t C3 = 3 * static_cast<int64_t>(C);
  const T scale = static_cast<T>(1.0 / std::sqrt(static_cast<double>(hs)));
  const T cap = static_cast<T>(softcap);
  // With sinks: each row's p_sink * D (D = sum_j att[j] d att[j], which is
  // dout . out), summed per head after the pass.
  std::vector<double> sink_terms(dsinks != nullptr ? static_cast<size_t>(B) * NH * T_ : 0);
#pragma omp parallel for collapse(3) schedule(static) if (WorthThreads(int64_t{B} * T_ * T_ * C))
  for (int b = 0; b < B; ++b) {
    for (int h = 0; h < NH; ++h) {
      for (int t = 0; t < T_; ++t) {
        const int64_t row = ((static_cast<int64_t>(b) * NH + h) * T_ + t) * T_;
        const T* q = qkv + (static_cast<int64_t>(b) * T_ + t) * C3 + h * hs;
        const T* a = att + row;
        T* dpre = scratch + row;
        const T* d = dout + (static_cast<int64_t>(b) * T_ + t) * C + h * hs;
        // d att[t2] = dout . v[t2]; softmax backward:
        // d pre[t2] = att[t2] * (d att[t2] - sum_j att[j] d att[j]).
        const int lo = FirstKey(t, window);
        double dot = 0.0;
        for (int t2 = lo; t2 <= t; ++t2) {
          const T* v = qkv + (static_cast<int64_t>(b) * T_ + t2) * C3 + 2 * C + h * hs;
          T s = T(0);
          for (int i = 0; i < hs; ++i) s += d[i] * v[i];
          dpre[t2] = s;
          dot += a[t2] * s;
        }
        if (dsinks != nullptr) {  // p_sink = 1 - the row's probabilities
          double p = 1.0;
          for (int t2 = lo; t2 <= t; ++t2) p -= a[t2];
          sink_terms[row / T_] = p * dot;
        }
        for (int t2 = lo; t2 <= t; ++t2) {
          dpre[t2] = a[t2] * (dpre[t2] - static_cast<T>(dot)) * scale;
          if (cap > T(0)) {  // through the cap: times 1 - tanh(s / cap)^2, s recomputed
            const T* k = qkv + (static_cast<int64_t>(b) * T_ + t2) * C3 + C + h * hs;
            T s = T(0);
            for (int i = 0; i < hs; ++i) s += q[i] * k[i];
            const T u = std::tanh(s * scale / cap);
            dpre[t2] *= T(1) - u * u;
          }
        }
        std::fill(dpre, dpre + lo, T(0));
        std::fill(dpre + t + 1, dpre + T_, T(0));
        T* dq = dqkv + (static_cast<int64_t>(b) * T_ + t) * C3 + h * hs;
        for (int t2 = lo; t2 <= t; ++t2) {
          const T* k = qkv + (static_cast<int64_t>(b) * T_ + t2) * C3 + C + h * hs;
          const T w = dpre[t2];
          for (int i = 0; i < hs; ++i) dq[i] += w * k[i];
        }
      }
    }
  }
  if (dsinks != nullptr) {
    for (int h = 0; h < NH; ++h) {
      double sum = 0.0;
      for (int b = 0; b < B; ++b) {
        for (int t = 0; t < T_; ++t) sum += sink_terms[(static_cast<int64_t>(b) * NH + h) * T_ + t];
      }
      dsinks[h] -= static_cast<T>(sum);
    }
  }
#pragma omp parallel for collapse(3) schedule(static) if (WorthThreads(int64_t{B} * T_ * T_ * C))
  for (int b = 0; b < B; ++b) {
    for (int h = 0; h < NH; ++h) {
      for (int t2 = 0; t2 < T_; ++t2) {
        const int64_t pos2 = (static_cast<int64_t>(b) * T_ + t2) * C3;
        T* dk = dqkv + pos2 + C + h * hs;
        T* dv = dqkv + pos2 + 2 * C + h * hs;
        for (int t = t2, end = EndQuery(t2, window, T_); t < end; ++t) {
          const int64_t row = ((static_cast<int64_t>(b) * NH + h) * T_ + t) * T_;
          const T* q = qkv + (static_cast<int64_t>(b) * T_ + t) * C3 + h * hs;
          const T* d = dout + (static_cast<int64_t>(b) * T_ + t) * C + h * hs;
          const T wk = scratch[row + t2];
          const T wv = att[row + t2];
          for (int i = 0; i < hs; ++i) {
            dk[i] += wk * q[i];
            dv[i] += wv * d[i];
          }
        }
      }
    }
  }
}

// ---------------------------------------------------------------- fused attention

namespace {

// Query rows (the forward, the dq pass) or key rows (the dk/dv pass) of one
// work item: its scores against every key (query) it meets, rows x T at
// most, stay in the thread's cache while they become probabilities.
constexpr int kAttentionRows = 64;

template <typename T>
ZINF_ALWAYS_INLINE T AttentionExp(T x) {
  if constexpr (std::is_same_v<T, float>) {
    return ExpFloat(x);
  } else {
    return std::exp(x);
  }
}

// The element-wise work on a block's rows, between its matmuls, run
// Vectorized (once per work item) so that the exp vectorizes at the machine's
// width; the one sum in fixed lanes, so the bits do not depend on the ISA
// (the matmuls' differ only between the baseline and the FMA paths).
struct AttentionRowOps {
  // row[first, n) = softmax(row[first, n) * scale), or with a cap
  // softmax(cap * tanh(row * scale / cap)), the rest of row[0, width) = 0;
  // returns the log-sum-exp. A `sink` (or null) joins the sum, not the row.
  template <typename T>
  static ZINF_ALWAYS_INLINE T Softmax(T* row, int first, int n, int width, T scale, T cap, const T* sink) {
    if (cap > T(0)) {
      const T to_cap = scale / cap;
#pragma omp simd
      for (int j = first; j < n; ++j) row[j] = cap * Tanh<T>(row[j] * to_cap);
      scale = T(1);
    }
    T m = row[first];
#pragma omp simd reduction(max : m)
    for (int j = first; j < n; ++j) m = row[j] > m ? row[j] : m;
    if (sink != nullptr) m = std::max(m, *sink / scale);  // the sink is a logit already scaled
#pragma omp simd
    for (int j = first; j < n; ++j) row[j] = AttentionExp<T>((row[j] - m) * scale);
    const T sum = SumLanes<T>(row + first, n - first) + (sink != nullptr ? std::exp(*sink - m * scale) : T(0));
    const T inv = T(1) / sum;
#pragma omp simd
    for (int j = first; j < n; ++j) row[j] *= inv;
    std::fill(row, row + first, T(0));
    std::fill(row + n, row + width, T(0));
    return m * scale + std::log(sum);
  }
  // The scores' gradient from the scores s and dp = dout . v: with the
  // probability p = exp(s * scale - lse) recomputed, s becomes
  // p * (dp - D) * scale and, if kKeepP, dp becomes p. With a cap, p =
  // exp(cap * u - lse) and the gradient is times 1 - u^2, u = tanh(s *
  // scale / cap). `lse` and `D` are per
  // entry (stride 1: a key's row, entries are queries) or one value
  // (stride 0: a query's row). Entries outside [first, n) are past the
  // causal edge or outside the window: zero in both.
  template <bool kKeepP, typename T>
  static ZINF_ALWAYS_INLINE void ScoreGrad(T* s, T* dp, int first, int n, int width, T scale, T cap, const T* lse,
                                           const T* D, int stride) {
    std::fill(s, s + first, T(0));
    if constexpr (kKeepP) std::fill(dp, dp + first, T(0));
    if (cap > T(0)) {
      const T to_cap = scale / cap;
#pragma omp simd
      for (int j = first; j < n; ++j) {
        const T u = Tanh<T>(s[j] * to_cap);
        const T p = AttentionExp<T>(cap * u - lse[j * stride]);
        s[j] = p * (dp[j] - D[j * stride]) * (T(1) - u * u) * scale;
        if constexpr (kKeepP) dp[j] = p;
      }
    } else {
#pragma omp simd
      for (int j = first; j < n; ++j) {
        const T p = AttentionExp<T>(s[j] * scale - lse[j * stride]);
        s[j] = p * (dp[j] - D[j * stride]) * scale;
        if constexpr (kKeepP) dp[j] = p;
      }
    }
    std::fill(s + n, s + width, T(0));
    if constexpr (kKeepP) std::fill(dp + n, dp + width, T(0));
  }
};

// The (batch, head) pairs' rows in blocks of kAttentionRows: item i is
// block i % blocks of pair i / blocks.
struct AttentionItems {
  int B, T, C, NH, hs, blocks;
  int64_t C3;
  AttentionItems(int B_, int T_, int C_, int NH_)
      : B(B_),
        T(T_),
        C(C_),
        NH(NH_),
        hs(C_ / NH_),
        blocks((T_ + kAttentionRows - 1) / kAttentionRows),
        C3(3 * int64_t{C_}) {}
  int64_t count() const { return int64_t{B} * NH * blocks; }
  // Where item i's batch's qkv / [B, T, C] rows start, its head's offset
  // in a row, its first row and row count, and its (b, h) row of lse and D.
  struct Item {
    int64_t qkv, btc, bh;
    int head, t0, rows;
  };
  Item operator()(int64_t i) const {
    const int64_t pair = i / blocks;
    const int b = static_cast<int>(pair / NH), h = static_cast<int>(pair % NH);
    const int t0 = static_cast<int>(i % blocks) * kAttentionRows;
    return {int64_t{b} * T * C3, int64_t{b} * T * C, pair * T, h * hs, t0, std::min(kAttentionRows, T - t0)};
  }
};

}  // namespace

template <typename T>
void FusedAttentionForward(T* out, T* lse, const T* qkv, int B, int T_, int C, int NH, int window, float softcap,
                           const T* sinks) {
  window = InEffect(window, T_);
  const AttentionItems items(B, T_, C, NH);
  const int hs = items.hs;
  const int64_t C3 = items.C3;
  const T scale = static_cast<T>(1.0 / std::sqrt(static_cast<double>(hs)));
  const T cap = static_cast<T>(softcap);
#pragma omp parallel for schedule(dynamic) if (WorthThreads(int64_t{B} * T_ * T_ * C))
  for (int64_t i = 0; i < items.count(); ++i) {
    const auto it = items(i);
    // The keys the item's queries see: from its first query's first key to its last query.
    const int k0 = FirstKey(it.t0, window), keys = it.t0 + it.rows - k0;
    const T* q = qkv + it.qkv + it.t0 * C3 + it.head;
    const T* k = qkv + it.qkv + k0 * C3 + C + it.head;
    const T* v = qkv + it.qkv + k0 * C3 + 2 * C + it.head;
    T* s = ThreadBuffer<T>(kAttentionScores, static_cast<size_t>(it.rows) * keys);
    const T* sink = sinks != nullptr ? sinks + it.head / hs : nullptr;
    Gemm<T>(s, keys, q, C3, 1, k, 1, C3, it.rows, keys, hs, /*set=*/true);  // q . k
    Vectorized([&]() ZINF_INLINE_LAMBDA {
      for (int r = 0; r < it.rows; ++r) {  // query t = t0 + r sees keys FirstKey(t) .. t
        const int t = it.t0 + r;
        lse[it.bh + t] = AttentionRowOps::Softmax<T>(s + int64_t{r} * keys, FirstKey(t, window) - k0, t + 1 - k0, keys,
                                                     scale, cap, sink);
      }
    });
    Gemm<T>(out + it.btc + int64_t{it.t0} * C + it.head, C, s, keys, 1, v, C3, 1, it.rows, hs, keys, /*set=*/true);
  }
}

template <typename T>
void FusedAttentionBackward(T* dqkv, T* scratch, const T* dout, const T* qkv, const T* out, const T* lse, int B, int T_,
                            int C, int NH, int window, float softcap, const T* sinks, T* dsinks) {
  window = InEffect(window, T_);
  const AttentionItems items(B, T_, C, NH);
  const int hs = items.hs;
  const int64_t C3 = items.C3;
  const T scale = static_cast<T>(1.0 / std::sqrt(static_cast<double>(hs)));
  const T cap = static_cast<T>(softcap);
  const bool threads = WorthThreads(int64_t{B} * T_ * T_ * C);
  // D = rowsum(dout * out): the softmax backward's per-query term, in scratch.
  T* const D = scratch;
#pragma omp parallel for schedule(static) if (threads)
  for (int64_t i = 0; i < items.count(); ++i) {
    const auto it = items(i);
    for (int r = 0; r < it.rows; ++r) {
      const int64_t at = it.btc + int64_t{it.t0 + r} * C + it.head;
      T d = T(0);
      for (int c = 0; c < hs; ++c) d += dout[at + c] * out[at + c];
      D[it.bh + it.t0 + r] = d;
    }
  }
  // The sinks' gradient: -sum over a head's rows of p_sink * D, p_sink =
  // exp(sink - lse); a thread per head, its rows in order.
  if (sinks != nullptr && dsinks != nullptr) {
#pragma omp parallel for schedule(static) if (threads)
    for (int h = 0; h < NH; ++h) {
      T sum = T(0);
      for (int b = 0; b < B; ++b) {
        const int64_t bh = (int64_t{b} * NH + h) * T_;
        for (int t = 0; t < T_; ++t) sum += std::exp(sinks[h] - lse[bh + t]) * D[bh + t];
      }
      dsinks[h] -= sum;
    }
  }
  // dS = P * (dP - D) * scale with P = exp(q.k * scale - lse) (through
  // the cap, if any: AttentionRowOps::ScoreGrad), zero past
  // the causal edge (key after query) and outside the window. dq, per block
  // of queries: dq += dS . k over the keys each query sees.
#pragma omp parallel for schedule(dynamic) if (threads)
  for (int64_t i = 0; i < items.count(); ++i) {
    const auto it = items(i);
    const int k0 = FirstKey(it.t0, window), keys = it.t0 + it.rows - k0;
    const T* q = qkv + it.qkv + it.t0 * C3 + it.head;
    const T* k = qkv + it.qkv + k0 * C3 + C + it.head;
    const T* v = qkv + it.qkv + k0 * C3 + 2 * C + it.head;
    const T* d = dout + it.btc + int64_t{it.t0} * C + it.head;
    T* s = ThreadBuffer<T>(kAttentionScores, static_cast<size_t>(it.rows) * keys);
    T* dp = ThreadBuffer<T>(kAttentionGrads, static_cast<size_t>(it.rows) * keys);
    Gemm<T>(s, keys, q, C3, 1, k, 1, C3, it.rows, keys, hs, /*set=*/true);  // q . k
    Gemm<T>(dp, keys, d, C, 1, v, 1, C3, it.rows, keys, hs, /*set=*/true);  // dout . v
    Vectorized([&]() ZINF_INLINE_LAMBDA {
      for (int r = 0; r < it.rows; ++r) {  // query t = t0 + r: keys FirstKey(t) .. t
        const int t = it.t0 + r;
        const int64_t row = int64_t{r} * keys, at = it.bh + t;
        AttentionRowOps::ScoreGrad<false, T>(s + row, dp + row, FirstKey(t, window) - k0, t + 1 - k0, keys, scale, cap,
                                             lse + at, D + at, 0);
      }
    });
    Gemm<T>(dqkv + it.qkv + it.t0 * C3 + it.head, C3, s, keys, 1, k, C3, 1, it.rows, hs, keys);
  }
  // dk and dv, per block of keys: summed over the queries that see each.
#pragma omp parallel for schedule(dynamic) if (threads)
  for (int64_t i = 0; i < items.count(); ++i) {
    const auto it = items(i);
    // The queries from the block's first key to the last that sees its last key.
    const int queries = EndQuery(it.t0 + it.rows - 1, window, T_) - it.t0;
    const T* k = qkv + it.qkv + it.t0 * C3 + C + it.head;
    const T* v = qkv + it.qkv + it.t0 * C3 + 2 * C + it.head;
    const T* q = qkv + it.qkv + it.t0 * C3 + it.head;
    const T* d = dout + it.btc + int64_t{it.t0} * C + it.head;
    T* s = ThreadBuffer<T>(kAttentionScores, static_cast<size_t>(it.rows) * queries);
    T* dp = ThreadBuffer<T>(kAttentionGrads, static_cast<size_t>(it.rows) * queries);
    Gemm<T>(s, queries, k, C3, 1, q, 1, C3, it.rows, queries, hs, /*set=*/true);  // k . q
    Gemm<T>(dp, queries, v, C3, 1, d, 1, C, it.rows, queries, hs, /*set=*/true);  // v . dout
    Vectorized([&]() ZINF_INLINE_LAMBDA {
      for (int r = 0; r < it.rows; ++r) {  // key t0 + r: queries t0 + r .. EndQuery - 1, entries r ..
        const int64_t row = int64_t{r} * queries, at = it.bh + it.t0;
        const int end = EndQuery(it.t0 + r, window, T_) - it.t0;
        AttentionRowOps::ScoreGrad<true, T>(s + row, dp + row, r, end, queries, scale, cap, lse + at, D + at, 1);
      }
    });
    T* dk = dqkv + it.qkv + it.t0 * C3 + C + it.head;
    Gemm<T>(dk + C, C3, dp, queries, 1, d, C, 1, it.rows, hs, queries);  // dv += P^T . dout
    Gemm<T>(dk, C3, s, queries, 1, q, C3, 1, it.rows, hs, queries);      // dk += dS^T . q
  }
}

// ---------------------------------------------------------------- gelu

template <typename T>
void GeluForward(T* out, const T* inp, int64_t n) {
  VectorizedChunks(n, [&](int64_t i0, int64_t i1) ZINF_INLINE_LAMBDA {
#pragma omp simd
    for (int64_t i = i0; i < i1; ++i) out[i] = Gelu<T>(inp[i]);
  });
}

template <typename T>
void GeluBackward(T* dinp, const T* inp, const T* dout, int64_t n) {
  VectorizedChunks(n, [&](int64_t i0, int64_t i1) ZINF_INLINE_LAMBDA {
#pragma omp simd
    for (int64_t i = i0; i < i1; ++i) dinp[i] += GeluGrad<T>(inp[i]) * dout[i];
  });
}

// ---------------------------------------------------------------- residual

template <typename T>
void ResidualForward(T* out, const T* a, const T* b, int64_t n) {
#pragma omp parallel for schedule(static) if (WorthThreads(n))
  for (int64_t i = 0; i < n; ++i) out[i] = a[i] + b[i];
}

template <typename T>
void Accumulate(T* y, const T* x, int64_t n) {
#pragma omp parallel for schedule(static) if (WorthThreads(n))
  for (int64_t i = 0; i < n; ++i) y[i] += x[i];
}

template <typename T>
void Scale(T* x, T s, int64_t n) {
#pragma omp parallel for schedule(static) if (WorthThreads(n))
  for (int64_t i = 0; i < n; ++i) x[i] *= s;
}

// ---------------------------------------------------------------- softcap

template <typename T>
void SoftcapForward(T* x, T cap, int64_t n) {
  const T inv = T(1) / cap;
  VectorizedChunks(n, [&](int64_t i0, int64_t i1) ZINF_INLINE_LAMBDA {
#pragma omp simd
    for (int64_t i = i0; i < i1; ++i) x[i] = cap * Tanh<T>(x[i] * inv);
  });
}

template <typename T>
void SoftcapBackward(T* dx, const T* y, T cap, int64_t n) {
  const T inv = T(1) / cap;
  VectorizedChunks(n, [&](int64_t i0, int64_t i1) ZINF_INLINE_LAMBDA {
#pragma omp simd
    for (int64_t i = i0; i < i1; ++i) {
      const T u = y[i] * inv;
      dx[i] *= T(1) - u * u;
    }
  });
}

// ---------------------------------------------------------------- loss

namespace {
// One position's loss and (`d` not null) d += dloss * (softmax - onehot),
// from the logits `l` less their max: the exps in double (T = double, the
// gradient checks) or in float through ExpFloat into the thread's buffer,
// Vectorized, summed in double in fixed lanes (float: about 2 ulp an exp
// against the double exp of the same argument).
template <typename T>
ZINF_ALWAYS_INLINE T CrossEntropyRow(const T* l, T* d, int V, int target, T dloss) {
  T maxv = l[0];
#pragma omp simd reduction(max : maxv)
  for (int v = 0; v < V; ++v) maxv = l[v] > maxv ? l[v] : maxv;
  T* e = ThreadBuffer<T>(kLossExps, static_cast<size_t>(V));
  if constexpr (std::is_same_v<T, float>) {
#pragma omp simd
    for (int v = 0; v < V; ++v) e[v] = ExpFloat(l[v] - maxv);
  } else {
    for (int v = 0; v < V; ++v) e[v] = std::exp(l[v] - maxv);
  }
  const double sum = SumLanes<double>(e, V);
  if (d != nullptr) {
    const double inv = 1.0 / sum, dl = static_cast<double>(dloss);
#pragma omp simd
    for (int v = 0; v < V; ++v)
      d[v] += static_cast<T>((static_cast<double>(e[v]) * inv - (v == target ? 1.0 : 0.0)) * dl);
  }
  return static_cast<T>(std::log(sum) - static_cast<double>(l[target] - maxv));
}
}  // namespace

template <typename T>
void CrossEntropyForwardBackward(T* losses, T* dlogits, const T* logits, const int32_t* targets, int64_t N, int V,
                                 int Vp, T dloss) {
#pragma omp parallel for schedule(static) if (WorthThreads(N * V))
  for (int64_t n = 0; n < N; ++n) {
    T* d = dlogits != nullptr ? dlogits + n * Vp : nullptr;
    Vectorized([&]() ZINF_INLINE_LAMBDA { losses[n] = CrossEntropyRow<T>(logits + n * Vp, d, V, targets[n], dloss); });
  }
}

// ---------------------------------------------------------------- instantiations

#define ZINF_INSTANTIATE_CPU_KERNELS(T)                                                                            \
  template void CastIn<T>(T*, const void*, ElementType, int64_t);                                                  \
  template void EncoderForward<T>(T*, const int32_t*, const T*, const T*, int, int, int);                          \
  template void EncoderBackward<T>(T*, T*, const T*, const int32_t*, int, int, int, int32_t);                      \
  template void LayerNormForward<T>(T*, T*, T*, const T*, const T*, const T*, int64_t, int);                       \
  template void LayerNormBackward<T>(T*, T*, T*, const T*, const T*, const T*, const T*, const T*, int64_t, int);  \
  template void MatmulForward<T>(T*, const T*, const T*, const T*, int64_t, int, int);                             \
  template void MatmulBackward<T>(T*, T*, T*, const T*, const T*, const T*, int64_t, int, int, GradMode);          \
  template void AttentionForward<T>(T*, T*, const T*, int, int, int, int, int, float, const T*);                   \
  template void AttentionBackward<T>(T*, T*, const T*, const T*, const T*, int, int, int, int, int, float, T*);    \
  template void FusedAttentionForward<T>(T*, T*, const T*, int, int, int, int, int, float, const T*);              \
  template void FusedAttentionBackward<T>(T*, T*, const T*, const T*, const T*, const T*, int, int, int, int, int, \
                                          float, const T*, T*);                                                    \
  template void SoftcapForward<T>(T*, T, int64_t);                                                                 \
  template void SoftcapBackward<T>(T*, const T*, T, int64_t);                                                      \
  template void GeluForward<T>(T*, const T*, int64_t);                                                             \
  template void GeluBackward<T>(T*, const T*, const T*, int64_t);                                                  \
  template void ResidualForward<T>(T*, const T*, const T*, int64_t);                                               \
  template void Accumulate<T>(T*, const T*, int64_t);                                                              \
  template void Scale<T>(T*, T, int64_t);                                                                          \
  template void CrossEntropyForwardBackward<T>(T*, T*, const T*, const int32_t*, int64_t, int, int, T);

ZINF_INSTANTIATE_CPU_KERNELS(float)
ZINF_INSTANTIATE_CPU_KERNELS(double)

#undef ZINF_INSTANTIATE_CPU_KERNELS

}  // namespace cpu
}  // namespace zinf::kernels
