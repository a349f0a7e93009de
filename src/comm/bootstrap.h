// Which communicators a rank uses when the caller names none: the one
// choice the engine and the trainer share.
//
//   host:   MPI_COMM_WORLD when MPI is initialised with more than one rank
//           (mpirun), else a single local rank;
//   device: the host communicator on the host device (its "device buffers"
//           are host memory); on a GPU, a local device-buffer communicator
//           for one rank, else NCCL bootstrapped over the MPI host
//           communicator on GPU rank % (GPUs visible).
//
// Thread-safety: plain functions; call them from the thread that drives the
// communicators.
#pragma once

#include <memory>

#include "comm/communicator.h"
#include "device/device.h"
#include "zinf/status.h"

namespace zinf::comm {

// `given` when not null; else the default host communicator, created into
// `owned`. kInvalidArgument when `given` works on device buffers.
StatusOr<Communicator*> HostCommunicator(Communicator* given, std::unique_ptr<Communicator>& owned);

// `given` when not null; else the default device communicator for `host`
// and a device of `kind`, created into `owned`. kInvalidArgument when it
// disagrees with `host` on rank or size, or a CUDA device would get a
// host-buffer communicator; kUnavailable when NCCL has no MPI to
// bootstrap over.
StatusOr<Communicator*> DeviceCommunicator(Communicator* given, Communicator& host, DeviceKind kind,
                                           std::unique_ptr<Communicator>& owned);

}  // namespace zinf::comm
