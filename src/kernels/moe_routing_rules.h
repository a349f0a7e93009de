// The routing's choice rules, written once for the CPU kernels (in double)
// and the CUDA ones (in float): which groups are candidates, which experts
// a token takes, and what the chosen scores' sum is divided by. Included
// only by cpu_moe_kernels.cc and cuda_moe_kernels.cu; contracts of the
// kernels that use them in cpu_kernels.h and cuda_kernels.h.
#pragma once

#include <cmath>
#include <cstdint>

#include "kernels/cpu_kernels.h"

#if defined(__CUDACC__)
#define ZINF_HOST_DEVICE __host__ __device__
#else
#define ZINF_HOST_DEVICE
#endif

namespace zinf::kernels::routing {

// The chosen scores' sum as it normalizes: + 1e-20 with a sigmoid router
// (transformers' guard against k scores of 0). The weights are divided by
// it, or by norm_min where it is below that (ERNIE 4.5's floor: a constant
// there, so the backward has no term through the sum).
template <typename F>
ZINF_HOST_DEVICE F NormSum(F total, const MoeRouting& r) {
  return total + (r.scoring == MoeScoring::kSigmoid ? F(1e-20) : F(0));
}
// torch.clamp's rule: below the floor, not at it.
template <typename F>
ZINF_HOST_DEVICE bool Floored(F sum, const MoeRouting& r) {
  return sum < static_cast<F>(r.norm_min);
}
template <typename F>
ZINF_HOST_DEVICE F NormDivisor(F total, const MoeRouting& r) {
  const F sum = NormSum(total, r);
  return Floored(sum, r) ? static_cast<F>(r.norm_min) : sum;
}

// The candidate groups as a bit mask (bit g: group g): the topk_groups
// groups whose group_best (1 or 2) largest choice scores c(e) sum highest,
// ties to the lower group; every group with one.
template <typename F, typename Score>
ZINF_HOST_DEVICE uint64_t ChooseGroups(const Score& c, const MoeRouting& r) {
  if (r.groups <= 1) return ~uint64_t{0};
  const int size = r.E / r.groups;
  F score[kMaxRouterGroups];
  for (int g = 0; g < r.groups; ++g) {
    F first = -F(INFINITY), second = -F(INFINITY);
    for (int e = g * size; e < (g + 1) * size; ++e) {
      const F v = c(e);
      if (v > first) {
        second = first;
        first = v;
      } else if (v > second) {
        second = v;
      }
    }
    score[g] = r.group_best > 1 ? first + second : first;
  }
  uint64_t chosen = 0;
  for (int j = 0; j < r.topk_groups; ++j) {
    int best = -1;
    for (int g = 0; g < r.groups; ++g) {
      if (!(chosen >> g & 1) && (best < 0 || score[g] > score[best])) best = g;
    }
    chosen |= uint64_t{1} << best;
  }
  return chosen;
}

// experts [k] = the k largest choice scores c(e) among the candidate
// groups' experts, descending, ties to the lower index: k passes over E
// (k is small).
template <typename Score>
ZINF_HOST_DEVICE void ChooseExperts(int32_t* experts, const Score& c, uint64_t groups, const MoeRouting& r) {
  const int size = r.E / (r.groups > 1 ? r.groups : 1);
  for (int j = 0; j < r.k; ++j) {
    int best = -1;
    for (int e = 0; e < r.E; ++e) {
      bool taken = r.groups > 1 && !(groups >> (e / size) & 1);
      for (int i = 0; i < j && !taken; ++i) taken = experts[i] == e;
      if (!taken && (best < 0 || c(e) > c(best))) best = e;
    }
    experts[j] = best;
  }
}

}  // namespace zinf::kernels::routing

#undef ZINF_HOST_DEVICE
