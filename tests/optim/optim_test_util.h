// Shared helpers for the optim tests: ISA parameters and skipping.
#pragma once

#include <string>
#include <vector>

#include <gtest/gtest.h>

#include "optim/isa.h"

namespace zinf::optim::testing {

inline const std::vector<Isa>& AllIsas() {
  static const std::vector<Isa> kAll = {Isa::kScalar, Isa::kAvx2, Isa::kAvx512};
  return kAll;
}

}  // namespace zinf::optim::testing

// Skips the current test when the CPU cannot run `isa`'s kernels.
#define ZINF_SKIP_UNLESS_SUPPORTED(isa)                                                           \
  do {                                                                                            \
    if (!::zinf::optim::CpuSupports(isa)) {                                                       \
      GTEST_SKIP() << "this CPU lacks " << ::zinf::optim::IsaName(isa) << "; kernels not tested"; \
    }                                                                                             \
  } while (0)
