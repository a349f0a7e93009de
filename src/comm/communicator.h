// Communicator: the collectives ZeRO needs, over a fixed group of ranks.
//
// Three implementations, one interface:
//   * LocalCommunicator - one rank; every collective is a copy (or nothing).
//   * MpiCommunicator   - OpenMPI on host buffers (mpi_communicator.h); ranks
//                         are started with mpirun.
//   * NcclCommunicator  - NCCL on device buffers (nccl_communicator.h),
//                         bootstrapped by broadcasting its unique id over MPI.
// Nothing home-made moves bytes between processes.
//
// Buffers and streams. buffers_on_device() says which memory a communicator
// works on: device pointers (NCCL) or host memory (Local, MPI; the host
// stand-in Device's memory is host memory, so the host pipeline runs on MPI).
// Every collective takes the Stream that produced its input:
//   * device communicators enqueue the collective on it and return at once;
//     the result is ready when the stream has reached that point;
//   * host communicators first drain it (Synchronize), then run the
//     collective on the calling thread and return when it has finished.
// `stream` may be null for host communicators (nothing to drain).
//
// Semantics (MPI's and NCCL's): `count` is in elements of `dtype` (any
// ElementType).
//   AllGather:     recv[r*count .. (r+1)*count) = rank r's send[0..count).
//                  In place when send == recv + rank()*count.
//   ReduceScatter: recv[0..count) = op over ranks of send[rank()*count ..).
//                  send holds world_size()*count elements; recv must not
//                  overlap send.
//   AllReduce:     recv[i] = op over ranks of send[i]; send == recv allowed.
//   Broadcast:     buf on every rank = buf on `root`.
//   Barrier:       returns when every rank has called it.
// Every rank must call the same collectives in the same order with the same
// counts (SPMD); a mismatch is a programmer error MPI and NCCL may hang on.
// bf16 and fp16 are reduced by converting to fp32 and back per element.
//
// Errors: a failed MPI or NCCL call becomes kInternal/kUnavailable naming the
// collective; bad arguments are kInvalidArgument. No error is sticky here.
//
// Thread-safety: one thread at a time per communicator (collectives are
// ordered per rank). Distinct communicators may be used from distinct threads
// only when the MPI library was initialised with MPI_THREAD_MULTIPLE.
#pragma once

#include <cstdint>
#include <memory>
#include <string_view>

#include "device/device.h"
#include "zinf/element_type.h"
#include "zinf/status.h"

namespace zinf::comm {

enum class ReduceOp { kSum, kMax };

class Communicator {
 public:
  virtual ~Communicator() = default;
  // "local", "mpi", "nccl".
  virtual std::string_view name() const = 0;
  virtual int rank() const = 0;
  virtual int world_size() const = 0;
  // True when buffers are device pointers (NCCL), false for host memory.
  virtual bool buffers_on_device() const = 0;

  virtual Status AllGather(const void* send, void* recv, int64_t count, ElementType dtype, Stream* stream) = 0;
  virtual Status ReduceScatter(const void* send, void* recv, int64_t count, ElementType dtype, ReduceOp op,
                               Stream* stream) = 0;
  virtual Status AllReduce(const void* send, void* recv, int64_t count, ElementType dtype, ReduceOp op,
                           Stream* stream) = 0;
  virtual Status Broadcast(void* buf, int64_t count, ElementType dtype, int root, Stream* stream) = 0;
  virtual Status Barrier() = 0;
};

// One rank. Collectives on host memory (buffers_on_device() false) with
// memmove; with `device` set they copy through `stream` as device-to-device
// copies instead, so the single-rank path on a GPU needs no NCCL.
class LocalCommunicator final : public Communicator {
 public:
  // `device_buffers`: the buffers are device pointers (copies go through the
  // caller's stream, which must then be non-null).
  explicit LocalCommunicator(bool device_buffers = false) : device_buffers_(device_buffers) {}
  std::string_view name() const override { return "local"; }
  int rank() const override { return 0; }
  int world_size() const override { return 1; }
  bool buffers_on_device() const override { return device_buffers_; }
  Status AllGather(const void* send, void* recv, int64_t count, ElementType dtype, Stream* stream) override;
  Status ReduceScatter(const void* send, void* recv, int64_t count, ElementType dtype, ReduceOp op,
                       Stream* stream) override;
  Status AllReduce(const void* send, void* recv, int64_t count, ElementType dtype, ReduceOp op,
                   Stream* stream) override;
  Status Broadcast(void* buf, int64_t count, ElementType dtype, int root, Stream* stream) override;
  Status Barrier() override { return Status::Ok(); }

 private:
  Status Copy(void* dst, const void* src, int64_t bytes, Stream* stream);
  bool device_buffers_;
};

// Checks a count and, for device communicators, the stream (shared by the
// implementations).
Status CheckCollectiveArgs(std::string_view op, int64_t count, bool needs_stream, const Stream* stream);

}  // namespace zinf::comm
