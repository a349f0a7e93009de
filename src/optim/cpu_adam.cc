#include "optim/cpu_adam.h"

#include <algorithm>
#include <cmath>
#include <string>

#include "optim/kernels.h"

namespace zinf::optim {
namespace internal {

const KernelTable& KernelsFor(Isa isa) {
#if defined(ZINF_OPTIM_X86_KERNELS)
  switch (isa) {
    case Isa::kAvx512: return Avx512Kernels();
    case Isa::kAvx2: return Avx2Kernels();
    case Isa::kScalar: break;
  }
#else
  (void)isa;  // CpuSupports() reports only kScalar off x86-64
#endif
  return ScalarKernels();
}

}  // namespace internal

namespace {

bool FiniteNonNegative(double x) { return std::isfinite(x) && x >= 0.0; }

int OutIndex(const AdamSpan& span) { return span.params16 == nullptr ? 0 : internal::TypeIndex(span.params16_dtype); }

}  // namespace

Status ValidateSpan(const AdamSpan& span) {
  if (span.n < 0) return Status::InvalidArgument("adam: n must be >= 0, got " + std::to_string(span.n));
  if (internal::TypeIndex(span.grad_dtype) < 0) {
    return Status::InvalidArgument("adam: grad_dtype must be f32, bf16 or f16, got " +
                                   std::string(ElementTypeName(span.grad_dtype)));
  }
  if (span.params16 != nullptr && internal::TypeIndex(span.params16_dtype) <= 0) {
    return Status::InvalidArgument("adam: params16_dtype must be bf16 or f16, got " +
                                   std::string(ElementTypeName(span.params16_dtype)));
  }
  if (span.n > 0 &&
      (span.params == nullptr || span.exp_avg == nullptr || span.exp_avg_sq == nullptr || span.grads == nullptr)) {
    return Status::InvalidArgument("adam: params, exp_avg, exp_avg_sq and grads must be non-null when n > 0");
  }
  return Status::Ok();
}

StatusOr<CpuAdam> CpuAdam::Create(const OptimizerConfig& config, ThreadPool* pool, Isa isa) {
  if (pool == nullptr) return Status::InvalidArgument("adam: null thread pool");
  if (!(config.beta1 >= 0.0 && config.beta1 < 1.0)) {
    return Status::InvalidArgument("adam: beta1 must be in [0, 1), got " + std::to_string(config.beta1));
  }
  if (!(config.beta2 >= 0.0 && config.beta2 < 1.0)) {
    return Status::InvalidArgument("adam: beta2 must be in [0, 1), got " + std::to_string(config.beta2));
  }
  if (!FiniteNonNegative(config.eps)) {
    return Status::InvalidArgument("adam: eps must be finite and >= 0, got " + std::to_string(config.eps));
  }
  if (!FiniteNonNegative(config.lr)) {
    return Status::InvalidArgument("adam: lr must be finite and >= 0, got " + std::to_string(config.lr));
  }
  if (!FiniteNonNegative(config.weight_decay)) {
    return Status::InvalidArgument("adam: weight_decay must be finite and >= 0, got " +
                                   std::to_string(config.weight_decay));
  }
  if (!CpuSupports(isa)) {
    return Status::Unavailable("adam: this CPU does not support the " + std::string(IsaName(isa)) + " kernels");
  }
  // DeepSpeed: the AdamW type always decouples; Adam decouples unless adam_w_mode is false.
  const bool decoupled = config.type == OptimizerType::kAdamW || config.adam_w_mode;
  return CpuAdam(config, pool, isa, decoupled);
}

Status CpuAdam::Update(const AdamSpan& span, const AdamStepArgs& step) const {
  ZINF_RETURN_IF_ERROR(ValidateSpan(span));
  if (step.step < 1) return Status::InvalidArgument("adam: step must be >= 1, got " + std::to_string(step.step));
  if (!FiniteNonNegative(step.lr)) {
    return Status::InvalidArgument("adam: lr must be finite and >= 0, got " + std::to_string(step.lr));
  }
  if (!FiniteNonNegative(step.grad_scale)) {
    return Status::InvalidArgument("adam: grad_scale must be finite and >= 0, got " + std::to_string(step.grad_scale));
  }
  if (span.n == 0) return Status::Ok();

  // Per-step scalars in double, rounded once to float (DeepSpeed rounds its
  // float pow(); the difference is below an ulp of the step size).
  const double t = static_cast<double>(step.step);
  const double bc1 = config_.bias_correction ? 1.0 - std::pow(config_.beta1, t) : 1.0;
  const double bc2 = config_.bias_correction ? 1.0 - std::pow(config_.beta2, t) : 1.0;
  internal::AdamArgs args;
  args.beta1 = static_cast<float>(config_.beta1);
  args.one_minus_beta1 = static_cast<float>(1.0 - config_.beta1);
  args.beta2 = static_cast<float>(config_.beta2);
  args.one_minus_beta2 = static_cast<float>(1.0 - config_.beta2);
  args.eps = static_cast<float>(config_.eps);
  args.bias_correction2_rsqrt = static_cast<float>(1.0 / std::sqrt(bc2));
  args.step_size = static_cast<float>(-step.lr / bc1);
  args.weight_decay = static_cast<float>(config_.weight_decay);
  args.decay = static_cast<float>(-step.lr * config_.weight_decay);
  args.grad_scale = static_cast<float>(step.grad_scale);

  internal::DecayMode mode = internal::DecayMode::kNone;
  if (config_.weight_decay > 0.0 && span.decay) {
    mode = decoupled_ ? internal::DecayMode::kDecoupled : internal::DecayMode::kL2;
  }
  const internal::AdamFn fn =
      internal::KernelsFor(isa_).adam[static_cast<int>(mode)][internal::TypeIndex(span.grad_dtype)][OutIndex(span)];
  const int64_t gsize = ElementSizeBytes(span.grad_dtype);
  const auto* grads = static_cast<const char*>(span.grads);
  auto* out = static_cast<char*>(span.params16);
  pool_->ParallelFor(span.n, kChunkElems, [&](int64_t, int64_t begin, int64_t end) {
    fn(args, span.params + begin, span.exp_avg + begin, span.exp_avg_sq + begin, grads + begin * gsize,
       out == nullptr ? nullptr : out + begin * 2, end - begin);
  });
  return Status::Ok();
}

AdamSpan SubSpan(const AdamSpan& span, int64_t at, int64_t n) {
  AdamSpan s = span;
  s.params += at;
  s.exp_avg += at;
  s.exp_avg_sq += at;
  s.grads = static_cast<const char*>(span.grads) + at * ElementSizeBytes(span.grad_dtype);
  if (span.params16 != nullptr) s.params16 = static_cast<char*>(span.params16) + at * 2;
  s.n = n;
  return s;
}

Status CpuAdam::UpdateMasked(const AdamSpan& span, const AdamStepArgs& step, int64_t base,
                             const std::vector<ElemRange>& no_decay) const {
  ZINF_RETURN_IF_ERROR(ValidateSpan(span));
  const int64_t end = base + span.n;
  // The first range that ends past base.
  auto it =
      std::upper_bound(no_decay.begin(), no_decay.end(), base, [](int64_t x, const ElemRange& r) { return x < r.end; });
  int64_t pos = base;
  // One piece [pos, to) of the span, with or without decay.
  auto piece = [&](int64_t to, bool decay) -> Status {
    if (to <= pos) return Status::Ok();
    AdamSpan p = SubSpan(span, pos - base, to - pos);
    p.decay = decay;
    pos = to;
    return Update(p, step);
  };
  for (; it != no_decay.end() && it->begin < end; ++it) {
    ZINF_RETURN_IF_ERROR(piece(std::max(pos, it->begin), true));
    ZINF_RETURN_IF_ERROR(piece(std::min(end, it->end), false));
  }
  return piece(end, true);
}

Status CpuAdam::BandwidthPass(const AdamSpan& span, float scale) const {
  ZINF_RETURN_IF_ERROR(ValidateSpan(span));
  if (span.n == 0) return Status::Ok();
  const internal::BoundFn fn = internal::KernelsFor(isa_).bound[internal::TypeIndex(span.grad_dtype)][OutIndex(span)];
  const int64_t gsize = ElementSizeBytes(span.grad_dtype);
  const auto* grads = static_cast<const char*>(span.grads);
  auto* out = static_cast<char*>(span.params16);
  pool_->ParallelFor(span.n, kChunkElems, [&](int64_t, int64_t begin, int64_t end) {
    fn(scale, span.params + begin, span.exp_avg + begin, span.exp_avg_sq + begin, grads + begin * gsize,
       out == nullptr ? nullptr : out + begin * 2, end - begin);
  });
  return Status::Ok();
}

}  // namespace zinf::optim
