// CpuAdam: Adam / AdamW over fp32 master weights and fp32 moments, on the CPU,
// at the memory-bandwidth limit.
//
// In ZeRO-Infinity the optimizer step visits every parameter once per step and
// does little arithmetic per byte, so it is bound by memory bandwidth. Update()
// therefore makes one pass: it reads params, m, v and the gradient, writes
// params, m, v in place, and, in the same pass, writes the new parameters as
// bf16 or fp16 into the caller's buffer (the one that goes to the GPU or to
// NVMe). That is 16 B read + 12 B written per parameter with fp32 gradients
// (+2 B written for the 16-bit copy; 2 B less read for 16-bit gradients).
//
// The swap layer calls Update() once per sub-group, a contiguous span of n
// elements, with the step's lr and one gradient multiplier: 1 / loss_scale
// times the clip coefficient (see grad_clip.h), worked out beforehand from the
// global norm, which array_ops.h's SumSquares computes per sub-group.
//
// Semantics are DeepSpeed's DeepSpeedCPUAdam (operation order in
// kernels_impl.h): AdamW (decoupled decay) when config.type is kAdamW or
// config.adam_w_mode is set, else Adam with L2 decay added to the gradient;
// bias correction per config.bias_correction.
//
// Numerics: the scalar, AVX2 and AVX-512 paths give bit-identical results (the
// same IEEE operations in the same order, fma included); against an fp64
// reference the error stays within a few fp32 ulps per step
// (tests/optim/cpu_adam_test.cc states the tolerances).
//
// Thread-safety: a CpuAdam is immutable after Create; Update may be called from
// any thread, but calls that share a ThreadPool must not overlap (the pool
// runs one ParallelFor at a time). The arrays of one call must not overlap
// one another.
#pragma once

#include <cstdint>
#include <vector>

#include "optim/isa.h"
#include "optim/thread_pool.h"
#include "zinf/config.h"
#include "zinf/element_type.h"
#include "zinf/status.h"

namespace zinf::optim {

// The unit of work handed to a thread (elements). Large enough that a thread
// streams whole pages from each array, small enough to balance two to dozens
// of threads over a sub-group.
inline constexpr int64_t kChunkElems = int64_t{1} << 16;

// One contiguous sub-group. No alignment is required (64-byte alignment is
// faster); all arrays hold n elements.
struct AdamSpan {
  float* params = nullptr;                          // fp32 master weights, updated in place
  float* exp_avg = nullptr;                         // Adam m, updated in place
  float* exp_avg_sq = nullptr;                      // Adam v, updated in place
  const void* grads = nullptr;                      // n elements of grad_dtype
  ElementType grad_dtype = ElementType::kF32;       // kF32, kBf16 or kF16
  void* params16 = nullptr;                         // optional: receives the new params as params16_dtype
  ElementType params16_dtype = ElementType::kBf16;  // kBf16 or kF16
  int64_t n = 0;
  bool decay = true;  // false: no weight decay on these elements (the rest of the step as usual)
};

// Elements [begin, end) of an array.
struct ElemRange {
  int64_t begin = 0;
  int64_t end = 0;
  bool operator==(const ElemRange&) const = default;
};

// Elements [at, at + n) of `span` (every array advanced by `at`).
AdamSpan SubSpan(const AdamSpan& span, int64_t at, int64_t n);

struct AdamStepArgs {
  int64_t step = 1;         // Adam's t, 1-based, for bias correction
  double lr = 0.0;          // this step's learning rate (from the schedule)
  double grad_scale = 1.0;  // gradients are multiplied by this first (unscale * clip)
};

class CpuAdam {
 public:
  // Errors: beta1 or beta2 outside [0, 1), eps, lr or weight_decay negative or
  // not finite; `isa` not supported by this CPU (kUnavailable); null pool.
  // `pool` is not owned and must outlive the CpuAdam.
  static StatusOr<CpuAdam> Create(const OptimizerConfig& config, ThreadPool* pool, Isa isa);

  // One Adam step over `span`. Errors (nothing is written): a null array
  // with n > 0, n < 0, step < 1, lr or grad_scale negative or not finite,
  // grad_dtype other than kF32, kBf16 or kF16, params16_dtype other than
  // kBf16 or kF16 (with params16 set).
  Status Update(const AdamSpan& span, const AdamStepArgs& step) const;

  // Update() over `span`, which holds elements [base, base + span.n) of a
  // larger array, with weight decay off inside `no_decay` (ranges of that
  // array, sorted and disjoint; span.decay is ignored). Adam is
  // elementwise, so each element gets exactly what a whole-span Update with
  // or without decay would give it. Errors: Update's, nothing written for
  // the piece that failed.
  Status UpdateMasked(const AdamSpan& span, const AdamStepArgs& step, int64_t base,
                      const std::vector<ElemRange>& no_decay) const;

  // The memory-bandwidth bound of Update(), for benchmarks: the same loads and
  // stores (params, m, v, grads read; params, m, v and params16 written in
  // place), the same pool and chunking, and next to no arithmetic
  // (x += scale * g; params16 = high half of params). With scale 0 the data
  // is left as it was. Same errors as Update.
  Status BandwidthPass(const AdamSpan& span, float scale) const;

  Isa isa() const { return isa_; }
  bool decoupled_weight_decay() const { return decoupled_; }
  const OptimizerConfig& config() const { return config_; }

 private:
  CpuAdam(const OptimizerConfig& config, ThreadPool* pool, Isa isa, bool decoupled)
      : config_(config), pool_(pool), isa_(isa), decoupled_(decoupled) {}

  OptimizerConfig config_;
  ThreadPool* pool_;
  Isa isa_;
  bool decoupled_;
};

// Checks a span's pointers, length and dtypes (what Update would reject).
Status ValidateSpan(const AdamSpan& span);

}  // namespace zinf::optim
