// CPU Adam over arrays held in RAM, set up one way for every benchmark that
// times it: `zinf bench adam` (the step against its bandwidth bound) and the
// in-RAM Adam part of `zinf bench step`'s bound.
//
// AdamArrays holds fp32 params, m and v, a gradient and an optional 16-bit
// output, each in a 2 MiB-aligned buffer with transparent huge pages
// requested (fewer TLB misses while streaming gigabytes), first touched by
// the pool's threads chunk by chunk as the step will run them, and filled
// with deterministic values of the sizes training sees (params in
// [-0.5, 0.5), m ~1e-3, v ~1e-6 and positive, gradients ~1e-2).
//
// AdamAlone is one such set with its own pool and CpuAdam (the CPU's best
// ISA): what an optimizer step costs when the state is already in RAM.
//
// Thread-safety: thread-compatible; one thread drives each object.
#pragma once

#include <cstdint>
#include <memory>

#include "optim/cpu_adam.h"
#include "optim/thread_pool.h"
#include "zinf/config.h"
#include "zinf/status.h"

namespace zinf::perf {

struct AdamArraysOptions {
  int64_t n = 0;  // parameters, >= 1
  ElementType grad_dtype = ElementType::kF32;
  bool with_out = false;  // a 16-bit copy of the new params (the engine's fused output)
  ElementType out_dtype = ElementType::kBf16;
};

class AdamArrays {
 public:
  // Allocates and fills the arrays on `pool`'s threads. OutOfMemory names the size.
  static StatusOr<AdamArrays> Create(const AdamArraysOptions& options, optim::ThreadPool& pool);
  // Bytes Create allocates for `options` (before rounding to huge pages).
  static int64_t Bytes(const AdamArraysOptions& options);

  // The arrays as CpuAdam::Update takes them (params16 null without an output).
  optim::AdamSpan span() const;
  float* params() const { return static_cast<float*>(params_.get()); }
  float* exp_avg() const { return static_cast<float*>(exp_avg_.get()); }
  float* exp_avg_sq() const { return static_cast<float*>(exp_avg_sq_.get()); }
  char* grads() const { return static_cast<char*>(grads_.get()); }
  uint16_t* out() const { return static_cast<uint16_t*>(out_.get()); }
  const AdamArraysOptions& options() const { return options_; }

 private:
  struct Free {
    void operator()(void* p) const;
  };
  using Buffer = std::unique_ptr<void, Free>;
  static StatusOr<Buffer> Allocate(int64_t bytes);
  void Fill(optim::ThreadPool& pool);

  AdamArraysOptions options_;
  Buffer params_, exp_avg_, exp_avg_sq_, grads_, out_;
};

// CpuAdam over n parameters in RAM, as the engine runs it: fp32 state and
// gradient, a 16-bit output, `threads` unbound pool threads (0: one per
// core), the CPU's default ISA.
class AdamAlone {
 public:
  static StatusOr<std::unique_ptr<AdamAlone>> Create(const OptimizerConfig& config, int threads, int64_t n,
                                                     ElementType out_dtype);
  // Runs the next step (lr 1e-4) and returns its wall time in seconds.
  StatusOr<double> TimeUpdate();
  int threads() const { return pool_->num_threads(); }

 private:
  AdamAlone() = default;
  std::unique_ptr<optim::ThreadPool> pool_;
  std::unique_ptr<optim::CpuAdam> adam_;
  std::unique_ptr<AdamArrays> arrays_;
  int64_t step_ = 0;
};

}  // namespace zinf::perf
