// Commands that run on every rank under `mpirun -np N` (zinf train, zinf
// eval): MPI is initialised when the launcher's environment says there are
// several ranks, a rank that fails alone takes the whole job down (rather
// than leave the others waiting in a collective forever), and ranks sharing
// a machine share its cores.
#pragma once

#include <unistd.h>

#include <algorithm>
#include <cstdio>
#include <cstdlib>
#include <functional>

#include "comm/mpi_communicator.h"
#include "kernels/cpu_kernels.h"
#include "zinf/status.h"

namespace zinf::cli {

// Ranks the launcher started (OpenMPI, PMI-based launchers); 1 otherwise.
inline int LauncherWorldSize() {
  for (const char* var : {"OMPI_COMM_WORLD_SIZE", "PMI_SIZE", "PMIX_SIZE"}) {
    if (const char* v = std::getenv(var)) return std::max(1, std::atoi(v));
  }
  return 1;
}

// MPI for the duration of a command, when there are several ranks.
class MpiScope {
 public:
  MpiScope() = default;
  MpiScope(const MpiScope&) = delete;
  MpiScope& operator=(const MpiScope&) = delete;
  Status Start() {
    if (LauncherWorldSize() <= 1 || comm::MpiInitialized()) return Status::Ok();
    ZINF_RETURN_IF_ERROR(comm::MpiInit(nullptr, nullptr));
    started_ = true;
    // Each kernel team gets its part of the machine's cores (unless
    // OMP_NUM_THREADS says otherwise).
    if (const char* local = std::getenv("OMPI_COMM_WORLD_LOCAL_SIZE"); local && !std::getenv("OMP_NUM_THREADS")) {
      const long cores = sysconf(_SC_NPROCESSORS_ONLN);
      kernels::cpu::SetThreads(static_cast<int>(std::max(1L, cores / std::max(1, std::atoi(local)))));
    }
    return Status::Ok();
  }
  ~MpiScope() {
    if (started_) comm::MpiFinalize().IgnoreError();
  }

 private:
  bool started_ = false;
};

// Runs `rank_body` (which starts the scope when it needs MPI) and returns
// its exit code; with several ranks a failing rank aborts the job.
inline int RunOnEveryRank(const std::function<int(MpiScope&)>& rank_body) {
  MpiScope mpi;
  const int code = rank_body(mpi);
  if (code != 0 && comm::MpiWorldSize() > 1) {
    std::fflush(stdout);
    std::fflush(stderr);
    comm::MpiAbort(code);
  }
  return code;
}

}  // namespace zinf::cli
