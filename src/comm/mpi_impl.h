// The MPI handle behind MpiCommunicator, for comm/ sources that need it
// (NCCL bootstraps its unique id over it). Private to comm/.
#pragma once

#include <mpi.h>

#include "comm/mpi_communicator.h"

namespace zinf::comm {

struct MpiCommunicator::Impl {
  MPI_Comm comm = MPI_COMM_NULL;
};

}  // namespace zinf::comm
