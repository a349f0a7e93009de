#include "adam_arrays.h"

#include <sys/mman.h>

#include <algorithm>
#include <chrono>
#include <cstdlib>

#include "core/half.h"
#include "core/units.h"
#include "optim/isa.h"

namespace zinf::perf {
namespace {

constexpr int64_t kHugePageBytes = 2 * kMiB;

// A cheap deterministic value in [-1, 1) for element i of stream s.
float Hash(int64_t i, uint32_t s) {
  uint64_t x = static_cast<uint64_t>(i) * 0x9E3779B97F4A7C15ull + s * 0xD1B54A32D192ED03ull;
  x ^= x >> 29;
  x *= 0xBF58476D1CE4E5B9ull;
  x ^= x >> 32;
  return static_cast<float>(static_cast<int64_t>(x >> 40) - (int64_t{1} << 23)) * 0x1p-23f;
}

}  // namespace

void AdamArrays::Free::operator()(void* p) const { std::free(p); }

// Pages are not touched here but by the pool, in Fill.
StatusOr<AdamArrays::Buffer> AdamArrays::Allocate(int64_t bytes) {
  const int64_t size = AlignUp(std::max<int64_t>(bytes, 1), kHugePageBytes);
  void* p = std::aligned_alloc(kHugePageBytes, static_cast<size_t>(size));
  if (p == nullptr) return Status::OutOfMemory("cannot allocate " + FormatBytes(size) + " for Adam's arrays");
  madvise(p, static_cast<size_t>(size), MADV_HUGEPAGE);  // a hint; failure is harmless
  return Buffer(p);
}

int64_t AdamArrays::Bytes(const AdamArraysOptions& o) {
  return o.n * (12 + ElementSizeBytes(o.grad_dtype) + (o.with_out ? 2 : 0));
}

StatusOr<AdamArrays> AdamArrays::Create(const AdamArraysOptions& options, optim::ThreadPool& pool) {
  AdamArrays a;
  a.options_ = options;
  const int64_t n = options.n;
  ZINF_ASSIGN_OR_RETURN(a.params_, Allocate(n * 4));
  ZINF_ASSIGN_OR_RETURN(a.exp_avg_, Allocate(n * 4));
  ZINF_ASSIGN_OR_RETURN(a.exp_avg_sq_, Allocate(n * 4));
  ZINF_ASSIGN_OR_RETURN(a.grads_, Allocate(n * ElementSizeBytes(options.grad_dtype)));
  ZINF_ASSIGN_OR_RETURN(a.out_, Allocate(options.with_out ? n * 2 : 1));
  a.Fill(pool);
  return a;
}

// First touch by the pool's threads, chunk by chunk as the step will run.
void AdamArrays::Fill(optim::ThreadPool& pool) {
  float* pp = params();
  float* mp = exp_avg();
  float* vp = exp_avg_sq();
  char* gp = grads();
  uint16_t* op = out();
  const ElementType grad_dtype = options_.grad_dtype;
  const bool with_out = options_.with_out;
  pool.ParallelFor(options_.n, optim::kChunkElems, [&](int64_t, int64_t begin, int64_t end) {
    for (int64_t i = begin; i < end; ++i) {
      pp[i] = 0.5f * Hash(i, 1);
      mp[i] = 1e-3f * Hash(i, 2);
      vp[i] = 1e-6f * (1.5f + Hash(i, 3));
      const float gv = 1e-2f * Hash(i, 4);
      if (grad_dtype == ElementType::kF32) {
        reinterpret_cast<float*>(gp)[i] = gv;
      } else {
        reinterpret_cast<uint16_t*>(gp)[i] = grad_dtype == ElementType::kBf16 ? FloatToBf16(gv) : FloatToHalf(gv);
      }
      if (with_out) op[i] = 0;
    }
  });
}

optim::AdamSpan AdamArrays::span() const {
  return optim::AdamSpan{.params = params(),
                         .exp_avg = exp_avg(),
                         .exp_avg_sq = exp_avg_sq(),
                         .grads = grads(),
                         .grad_dtype = options_.grad_dtype,
                         .params16 = options_.with_out ? out() : nullptr,
                         .params16_dtype = options_.out_dtype,
                         .n = options_.n};
}

StatusOr<std::unique_ptr<AdamAlone>> AdamAlone::Create(const OptimizerConfig& config, int threads, int64_t n,
                                                       ElementType out_dtype) {
  auto a = std::unique_ptr<AdamAlone>(new AdamAlone());
  ZINF_ASSIGN_OR_RETURN(
      a->pool_, optim::ThreadPool::Create({.num_threads = threads, .bind_threads = false, .name = "bench-adam"}));
  ZINF_ASSIGN_OR_RETURN(optim::Isa isa, optim::DefaultIsa());
  ZINF_ASSIGN_OR_RETURN(optim::CpuAdam adam, optim::CpuAdam::Create(config, a->pool_.get(), isa));
  a->adam_ = std::make_unique<optim::CpuAdam>(std::move(adam));
  ZINF_ASSIGN_OR_RETURN(
      AdamArrays arrays,
      AdamArrays::Create({.n = n, .grad_dtype = ElementType::kF32, .with_out = true, .out_dtype = out_dtype},
                         *a->pool_));
  a->arrays_ = std::make_unique<AdamArrays>(std::move(arrays));
  return a;
}

StatusOr<double> AdamAlone::TimeUpdate() {
  optim::AdamStepArgs args;
  args.step = ++step_;
  args.lr = 1e-4;
  const auto t0 = std::chrono::steady_clock::now();
  ZINF_RETURN_IF_ERROR(adam_->Update(arrays_->span(), args));
  return std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
}

}  // namespace zinf::perf
