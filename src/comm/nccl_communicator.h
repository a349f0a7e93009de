// NcclCommunicator: collectives over NCCL on device buffers.
//
// Bootstrap: rank 0 of the MPI communicator makes an ncclUniqueId and
// broadcasts it over MPI; every rank then calls ncclCommInitRank with the
// MPI rank and size. So ranks are the processes mpirun started, one GPU
// each (`cuda_ordinal`, by default the local rank modulo the GPUs visible).
//
// Every collective is enqueued on the caller's stream (a CUDA stream from a
// CudaDevice; a host stream is refused) and returns at once.
//
// Compiled when NCCL and MPI are found (ZINF_HAVE_NCCL); Create otherwise
// reports kUnavailable.
//
// Thread-safety: one thread at a time.
#pragma once

#include <memory>

#include "comm/communicator.h"
#include "comm/mpi_communicator.h"

namespace zinf::comm {

// Whether NCCL was compiled in.
bool NcclCompiledIn();

class NcclCommunicator final : public Communicator {
 public:
  // `bootstrap` (not owned) supplies rank, size and the id broadcast; it is
  // only used during Create. `cuda_ordinal` is made current (cudaSetDevice)
  // before NCCL initialises. Errors: kUnavailable without NCCL or GPU,
  // kInternal naming the NCCL call that failed.
  static StatusOr<std::unique_ptr<NcclCommunicator>> Create(MpiCommunicator& bootstrap, int cuda_ordinal);
  ~NcclCommunicator() override;
  NcclCommunicator(const NcclCommunicator&) = delete;
  NcclCommunicator& operator=(const NcclCommunicator&) = delete;

  std::string_view name() const override { return "nccl"; }
  int rank() const override { return rank_; }
  int world_size() const override { return size_; }
  bool buffers_on_device() const override { return true; }
  Status AllGather(const void* send, void* recv, int64_t count, ElementType dtype, Stream* stream) override;
  Status ReduceScatter(const void* send, void* recv, int64_t count, ElementType dtype, ReduceOp op,
                       Stream* stream) override;
  Status AllReduce(const void* send, void* recv, int64_t count, ElementType dtype, ReduceOp op,
                   Stream* stream) override;
  Status Broadcast(void* buf, int64_t count, ElementType dtype, int root, Stream* stream) override;
  // A one-element all-reduce on an internal stream, synchronised.
  Status Barrier() override;

 private:
  struct Impl;
  NcclCommunicator() = default;
  std::unique_ptr<Impl> impl_;
  int rank_ = 0;
  int size_ = 1;
};

}  // namespace zinf::comm
