// MpiCommunicator: collectives over OpenMPI on host buffers.
//
// The ranks are the processes mpirun started. Create() duplicates
// MPI_COMM_WORLD, so zinf's collectives never match a caller's messages on
// the world communicator. MPI must have been initialised (MpiInit, or the
// caller's own MPI_Init); zinf never initialises MPI behind a caller's back.
// bf16 and fp16 reductions use user-defined MPI ops that add in fp32.
//
// Host buffers only: a non-null stream is drained before the collective,
// which then runs on the calling thread (see communicator.h).
//
// Thread-safety: one thread at a time (MPI is initialised with
// MPI_THREAD_FUNNELED or better by MpiInit).
#pragma once

#include <memory>

#include "comm/communicator.h"

namespace zinf::comm {

// Whether this binary was built with MPI.
bool MpiCompiledIn();
// MPI_Init_thread(FUNNELED) unless MPI is already initialised. kUnavailable
// when built without MPI.
Status MpiInit(int* argc, char*** argv);
// MPI_Finalize when MPI is initialised and not yet finalised.
Status MpiFinalize();
// Ends every rank of the job with exit code `code` (MPI_Abort on
// MPI_COMM_WORLD): what a rank that failed alone must do, or the others wait
// forever in their next collective. Returns only when MPI is not initialised.
void MpiAbort(int code);
// True when MPI is initialised and not finalised.
bool MpiInitialized();
// World rank and size; (0, 1) when MPI is not initialised.
int MpiWorldRank();
int MpiWorldSize();

class MpiCommunicator final : public Communicator {
 public:
  // A duplicate of MPI_COMM_WORLD. kFailedPrecondition when MPI is not
  // initialised; kUnavailable when built without MPI.
  static StatusOr<std::unique_ptr<MpiCommunicator>> CreateWorld();
  ~MpiCommunicator() override;
  MpiCommunicator(const MpiCommunicator&) = delete;
  MpiCommunicator& operator=(const MpiCommunicator&) = delete;

  std::string_view name() const override { return "mpi"; }
  int rank() const override { return rank_; }
  int world_size() const override { return size_; }
  bool buffers_on_device() const override { return false; }
  Status AllGather(const void* send, void* recv, int64_t count, ElementType dtype, Stream* stream) override;
  Status ReduceScatter(const void* send, void* recv, int64_t count, ElementType dtype, ReduceOp op,
                       Stream* stream) override;
  Status AllReduce(const void* send, void* recv, int64_t count, ElementType dtype, ReduceOp op,
                   Stream* stream) override;
  Status Broadcast(void* buf, int64_t count, ElementType dtype, int root, Stream* stream) override;
  Status Barrier() override;

  // The MPI_Comm behind this communicator (comm/mpi_impl.h), for comm/
  // sources that bootstrap over it (NCCL).
  struct Impl;
  Impl* impl() const { return impl_.get(); }

 private:
  MpiCommunicator() = default;
  std::unique_ptr<Impl> impl_;
  int rank_ = 0;
  int size_ = 1;
};

}  // namespace zinf::comm
