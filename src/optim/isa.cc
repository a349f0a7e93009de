#include "optim/isa.h"

#include <cstdlib>
#include <string>

namespace zinf::optim {

std::string_view IsaName(Isa isa) {
  switch (isa) {
    case Isa::kScalar: return "scalar";
    case Isa::kAvx2: return "avx2";
    case Isa::kAvx512: return "avx512";
  }
  return "?";
}

StatusOr<Isa> ParseIsa(std::string_view name) {
  if (name == "scalar") return Isa::kScalar;
  if (name == "avx2") return Isa::kAvx2;
  if (name == "avx512") return Isa::kAvx512;
  return Status::InvalidArgument("unknown ISA '" + std::string(name) + "' (expected scalar, avx2 or avx512)");
}

bool CpuSupports(Isa isa) {
#if !defined(ZINF_OPTIM_X86_KERNELS)
  return isa == Isa::kScalar;
#else
  // libgcc's cpu model also checks XCR0, so an OS that does not save the
  // AVX / AVX-512 register state reports the feature as absent.
  __builtin_cpu_init();
  const bool avx2 = __builtin_cpu_supports("avx2") && __builtin_cpu_supports("fma") && __builtin_cpu_supports("f16c");
  switch (isa) {
    case Isa::kScalar: return true;
    case Isa::kAvx2: return avx2;
    case Isa::kAvx512: return avx2 && __builtin_cpu_supports("avx512f");
  }
  return false;
#endif
}

Isa BestIsa() {
  if (CpuSupports(Isa::kAvx512)) return Isa::kAvx512;
  if (CpuSupports(Isa::kAvx2)) return Isa::kAvx2;
  return Isa::kScalar;
}

StatusOr<Isa> DefaultIsa() {
  const char* env = std::getenv("ZINF_ADAM_ISA");
  if (env == nullptr || *env == '\0') return BestIsa();
  auto isa = ParseIsa(env);
  if (!isa.ok()) return isa.status().WithContext("ZINF_ADAM_ISA");
  if (!CpuSupports(*isa)) {
    return Status::Unavailable("ZINF_ADAM_ISA=" + std::string(env) + ": this CPU does not support it");
  }
  return *isa;
}

}  // namespace zinf::optim
