// Which instruction set the optimizer kernels use.
//
// The kernels are compiled three times (scalar, AVX2+FMA+F16C, AVX-512F) in
// separate files with per-file compiler flags, so the library runs on any
// x86-64 CPU; the choice is made at run time from the CPU's flags.
// DefaultIsa() honours ZINF_ADAM_ISA=scalar|avx2|avx512 so tests and
// benchmarks can force a path.
//
// Thread-safety: all functions are thread-safe.
#pragma once

#include <string_view>

#include "zinf/status.h"

namespace zinf::optim {

enum class Isa : int { kScalar = 0, kAvx2 = 1, kAvx512 = 2 };

// "scalar", "avx2", "avx512".
std::string_view IsaName(Isa isa);
StatusOr<Isa> ParseIsa(std::string_view name);

// Whether this CPU (and OS, for the register state) can run `isa`'s kernels:
// kAvx2 needs AVX2, FMA and F16C; kAvx512 needs those and AVX-512F.
bool CpuSupports(Isa isa);
// The widest ISA this CPU supports.
Isa BestIsa();
// ZINF_ADAM_ISA when set (an error if it names an unknown ISA or one this CPU
// lacks), else BestIsa().
StatusOr<Isa> DefaultIsa();

}  // namespace zinf::optim
