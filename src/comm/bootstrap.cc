// The default communicators (bootstrap.h).
#include "comm/bootstrap.h"

#include <algorithm>

#include "comm/mpi_communicator.h"
#include "comm/nccl_communicator.h"

namespace zinf::comm {

StatusOr<Communicator*> HostCommunicator(Communicator* given, std::unique_ptr<Communicator>& owned) {
  Communicator* c = given;
  if (c == nullptr) {
    if (MpiInitialized() && MpiWorldSize() > 1) {
      ZINF_ASSIGN_OR_RETURN(auto mpi, MpiCommunicator::CreateWorld());
      owned = std::move(mpi);
    } else {
      owned = std::make_unique<LocalCommunicator>();
    }
    c = owned.get();
  }
  if (c->buffers_on_device()) return Status::InvalidArgument("the host communicator must work on host buffers");
  return c;
}

StatusOr<Communicator*> DeviceCommunicator(Communicator* given, Communicator& host, DeviceKind kind,
                                           std::unique_ptr<Communicator>& owned) {
  Communicator* c = given;
  if (c == nullptr) {
    if (kind == DeviceKind::kHost) {
      c = &host;
    } else if (host.world_size() == 1) {
      owned = std::make_unique<LocalCommunicator>(/*device_buffers=*/true);
      c = owned.get();
    } else {
      auto* mpi = dynamic_cast<MpiCommunicator*>(&host);
      if (mpi == nullptr) return Status::Unavailable("NCCL needs an MPI host communicator to bootstrap");
      const int ordinal = mpi->rank() % std::max(1, CudaDeviceCount());
      ZINF_ASSIGN_OR_RETURN(auto nccl, NcclCommunicator::Create(*mpi, ordinal));
      owned = std::move(nccl);
      c = owned.get();
    }
  }
  if (c->world_size() != host.world_size() || c->rank() != host.rank()) {
    return Status::InvalidArgument("the host and device communicators disagree on rank or size");
  }
  if (kind == DeviceKind::kCuda && !c->buffers_on_device()) {
    return Status::InvalidArgument("a CUDA device needs a device-buffer communicator (NCCL)");
  }
  return c;
}

}  // namespace zinf::comm
