// Internal: the per-ISA kernel tables behind CpuAdam, SumSquares, the casts
// and the bandwidth probe. Not for use outside src/optim.
//
// Each ISA's kernels are one instantiation of the templates in
// kernels_impl.h, compiled in its own file with that ISA's flags
// (kernels_scalar.cc, kernels_avx2.cc, kernels_avx512.cc). A kernel works on
// one contiguous range and is called by many threads on disjoint ranges.
#pragma once

#include <cstdint>

#include "optim/isa.h"
#include "zinf/element_type.h"

namespace zinf::optim::internal {

// How weight decay enters the update (DeepSpeed's cpu_adam):
//   kNone:       no decay (weight_decay == 0)
//   kL2:         Adam:  g += weight_decay * p before the moments
//   kDecoupled:  AdamW: p += (-lr * weight_decay) * p before the update
enum class DecayMode : int { kNone = 0, kL2 = 1, kDecoupled = 2 };

// Per-step scalars, worked out once per call in double and rounded to float.
struct AdamArgs {
  float beta1;
  float one_minus_beta1;
  float beta2;
  float one_minus_beta2;
  float eps;
  float bias_correction2_rsqrt;  // 1 / sqrt(1 - beta2^t), or 1 without bias correction
  float step_size;               // -lr / (1 - beta1^t), or -lr without bias correction
  float weight_decay;            // kL2: weight_decay
  float decay;                   // kDecoupled: -lr * weight_decay
  float grad_scale;              // gradients are multiplied by this first
};

// Updates n elements in place; `grads` holds n elements of the table's grad
// dtype, `out16` (when the table's out dtype is not none) receives n 16-bit
// copies of the new params.
using AdamFn = void (*)(const AdamArgs& args, float* params, float* exp_avg, float* exp_avg_sq, const void* grads,
                        void* out16, int64_t n);
// The bandwidth probe: the same loads and stores as AdamFn, next to no
// arithmetic: params, exp_avg, exp_avg_sq += scale * grad; out16 = high half
// of params' bits.
using BoundFn = void (*)(float scale, float* params, float* exp_avg, float* exp_avg_sq, const void* grads, void* out16,
                         int64_t n);
// Sum of x^2 over n elements, accumulated in double.
using SumSquaresFn = double (*)(const void* x, int64_t n);
// fp32 -> 16 bit (round to nearest even) and 16 bit -> fp32.
using CastFromF32Fn = void (*)(const float* src, void* dst, int64_t n);
using CastToF32Fn = void (*)(const void* src, float* dst, int64_t n);

// The tables' index of an element type the kernels take: f32 0, bf16 1,
// f16 2; -1 for any other. As an output index, 0 stands for "none" (the
// kernels never write an fp32 copy).
constexpr int TypeIndex(ElementType type) {
  switch (type) {
    case ElementType::kF32: return 0;
    case ElementType::kBf16: return 1;
    case ElementType::kF16: return 2;
    case ElementType::kF64:
    case ElementType::kU8:
    case ElementType::kI64: break;
  }
  return -1;
}

// Indices: decay mode, grad type (TypeIndex), output (0: none, 1: bf16,
// 2: fp16, i.e. TypeIndex with f32 standing for "none").
struct KernelTable {
  AdamFn adam[3][3][3];
  BoundFn bound[3][3];
  SumSquaresFn sum_squares[3];
  CastFromF32Fn from_f32[3];  // [1] bf16, [2] fp16; [0] unused
  CastToF32Fn to_f32[3];      // [1] bf16, [2] fp16; [0] unused
};

const KernelTable& ScalarKernels();
const KernelTable& Avx2Kernels();
const KernelTable& Avx512Kernels();

// The table for `isa`; the caller has checked CpuSupports(isa).
const KernelTable& KernelsFor(Isa isa);

}  // namespace zinf::optim::internal
