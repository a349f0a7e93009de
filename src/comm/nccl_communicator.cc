#include "comm/nccl_communicator.h"

#include <string>

#ifdef ZINF_COMM_HAVE_NCCL
#include <cuda_runtime_api.h>
#include <nccl.h>

#include "comm/mpi_impl.h"
#endif

namespace zinf::comm {

#ifdef ZINF_COMM_HAVE_NCCL
namespace {

Status NcclError(ncclResult_t rc, std::string_view what) {
  return Status::Internal("nccl " + std::string(what) + ": " + ncclGetErrorString(rc));
}

Status CudaError(cudaError_t rc, std::string_view what) {
  return Status::Internal("cuda " + std::string(what) + ": " + cudaGetErrorString(rc));
}

ncclDataType_t NcclType(ElementType dtype) {
  switch (dtype) {
    case ElementType::kF32: return ncclFloat32;
    case ElementType::kF64: return ncclFloat64;
    case ElementType::kF16: return ncclFloat16;
    case ElementType::kBf16: return ncclBfloat16;
    case ElementType::kU8: return ncclUint8;
    case ElementType::kI64: return ncclInt64;
  }
  return ncclUint8;
}

ncclRedOp_t NcclOp(ReduceOp op) { return op == ReduceOp::kSum ? ncclSum : ncclMax; }

StatusOr<cudaStream_t> CudaStream(std::string_view op, int64_t count, Stream* stream) {
  ZINF_RETURN_IF_ERROR(CheckCollectiveArgs(op, count, true, stream));
  void* h = stream->native_handle();
  if (h == nullptr) {
    return Status::InvalidArgument(std::string(op) + ": nccl needs a CUDA stream, got a host stream");
  }
  return static_cast<cudaStream_t>(h);
}

}  // namespace

struct NcclCommunicator::Impl {
  ncclComm_t comm = nullptr;
  cudaStream_t barrier_stream = nullptr;
  void* barrier_buf = nullptr;
};

bool NcclCompiledIn() { return true; }

StatusOr<std::unique_ptr<NcclCommunicator>> NcclCommunicator::Create(MpiCommunicator& bootstrap, int cuda_ordinal) {
  int gpus = 0;
  if (cudaGetDeviceCount(&gpus) != cudaSuccess || gpus == 0) {
    return Status::Unavailable("nccl communicator: no CUDA device");
  }
  cudaError_t ce = cudaSetDevice(cuda_ordinal);
  if (ce != cudaSuccess) return CudaError(ce, "set device " + std::to_string(cuda_ordinal));
  ncclUniqueId id{};
  if (bootstrap.rank() == 0) {
    ncclResult_t r = ncclGetUniqueId(&id);
    if (r != ncclSuccess) return NcclError(r, "get unique id");
  }
  const int rc = MPI_Bcast(&id, sizeof(id), MPI_BYTE, 0, bootstrap.impl()->comm);
  if (rc != MPI_SUCCESS) return Status::Internal("nccl bootstrap: MPI_Bcast of the unique id failed");
  std::unique_ptr<NcclCommunicator> c(new NcclCommunicator());
  c->impl_ = std::make_unique<Impl>();
  c->rank_ = bootstrap.rank();
  c->size_ = bootstrap.world_size();
  ncclResult_t r = ncclCommInitRank(&c->impl_->comm, c->size_, id, c->rank_);
  if (r != ncclSuccess) return NcclError(r, "comm init rank " + std::to_string(c->rank_));
  ce = cudaStreamCreateWithFlags(&c->impl_->barrier_stream, cudaStreamNonBlocking);
  if (ce != cudaSuccess) return CudaError(ce, "stream create");
  ce = cudaMalloc(&c->impl_->barrier_buf, 256);
  if (ce != cudaSuccess) return CudaError(ce, "malloc");
  return c;
}

NcclCommunicator::~NcclCommunicator() {
  if (!impl_) return;
  if (impl_->comm != nullptr) ncclCommDestroy(impl_->comm);
  if (impl_->barrier_buf != nullptr) cudaFree(impl_->barrier_buf);
  if (impl_->barrier_stream != nullptr) cudaStreamDestroy(impl_->barrier_stream);
}

Status NcclCommunicator::AllGather(const void* send, void* recv, int64_t count, ElementType dtype, Stream* stream) {
  ZINF_ASSIGN_OR_RETURN(cudaStream_t s, CudaStream("all-gather", count, stream));
  ncclResult_t r = ncclAllGather(send, recv, static_cast<size_t>(count), NcclType(dtype), impl_->comm, s);
  return r == ncclSuccess ? Status::Ok() : NcclError(r, "all-gather");
}

Status NcclCommunicator::ReduceScatter(const void* send, void* recv, int64_t count, ElementType dtype, ReduceOp op,
                                       Stream* stream) {
  ZINF_ASSIGN_OR_RETURN(cudaStream_t s, CudaStream("reduce-scatter", count, stream));
  ncclResult_t r =
      ncclReduceScatter(send, recv, static_cast<size_t>(count), NcclType(dtype), NcclOp(op), impl_->comm, s);
  return r == ncclSuccess ? Status::Ok() : NcclError(r, "reduce-scatter");
}

Status NcclCommunicator::AllReduce(const void* send, void* recv, int64_t count, ElementType dtype, ReduceOp op,
                                   Stream* stream) {
  ZINF_ASSIGN_OR_RETURN(cudaStream_t s, CudaStream("all-reduce", count, stream));
  ncclResult_t r = ncclAllReduce(send, recv, static_cast<size_t>(count), NcclType(dtype), NcclOp(op), impl_->comm, s);
  return r == ncclSuccess ? Status::Ok() : NcclError(r, "all-reduce");
}

Status NcclCommunicator::Broadcast(void* buf, int64_t count, ElementType dtype, int root, Stream* stream) {
  ZINF_ASSIGN_OR_RETURN(cudaStream_t s, CudaStream("broadcast", count, stream));
  if (root < 0 || root >= size_) {
    return Status::InvalidArgument("broadcast: root " + std::to_string(root) + " of " + std::to_string(size_));
  }
  ncclResult_t r = ncclBroadcast(buf, buf, static_cast<size_t>(count), NcclType(dtype), root, impl_->comm, s);
  return r == ncclSuccess ? Status::Ok() : NcclError(r, "broadcast");
}

Status NcclCommunicator::Barrier() {
  ncclResult_t r = ncclAllReduce(impl_->barrier_buf, impl_->barrier_buf, 1, ncclFloat32, ncclSum, impl_->comm,
                                 impl_->barrier_stream);
  if (r != ncclSuccess) return NcclError(r, "barrier");
  cudaError_t ce = cudaStreamSynchronize(impl_->barrier_stream);
  return ce == cudaSuccess ? Status::Ok() : CudaError(ce, "barrier synchronize");
}

#else  // !ZINF_COMM_HAVE_NCCL

struct NcclCommunicator::Impl {};
bool NcclCompiledIn() { return false; }
StatusOr<std::unique_ptr<NcclCommunicator>> NcclCommunicator::Create(MpiCommunicator&, int) {
  return Status::Unavailable("nccl: zinf was built without NCCL (or without MPI to bootstrap it)");
}
NcclCommunicator::~NcclCommunicator() = default;
Status NcclCommunicator::AllGather(const void*, void*, int64_t, ElementType, Stream*) {
  return Status::Unavailable("nccl");
}
Status NcclCommunicator::ReduceScatter(const void*, void*, int64_t, ElementType, ReduceOp, Stream*) {
  return Status::Unavailable("nccl");
}
Status NcclCommunicator::AllReduce(const void*, void*, int64_t, ElementType, ReduceOp, Stream*) {
  return Status::Unavailable("nccl");
}
Status NcclCommunicator::Broadcast(void*, int64_t, ElementType, int, Stream*) { return Status::Unavailable("nccl"); }
Status NcclCommunicator::Barrier() { return Status::Unavailable("nccl"); }

#endif

}  // namespace zinf::comm
