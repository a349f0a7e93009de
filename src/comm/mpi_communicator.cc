#include "comm/mpi_communicator.h"

#include <climits>
#include <mutex>
#include <string>

#ifdef ZINF_COMM_HAVE_MPI
#include "comm/mpi_impl.h"
#include "core/half.h"
#endif

namespace zinf::comm {

#ifdef ZINF_COMM_HAVE_MPI
namespace {

Status MpiError(int rc, std::string_view what) {
  char text[MPI_MAX_ERROR_STRING];
  int len = 0;
  if (MPI_Error_string(rc, text, &len) != MPI_SUCCESS) len = 0;
  return Status::Internal("mpi " + std::string(what) + ": " + std::string(text, static_cast<size_t>(len)));
}

template <float (*kToF32)(uint16_t), uint16_t (*kFromF32)(float), bool kMax>
void Reduce16(void* in, void* inout, int* len, MPI_Datatype*) {
  const auto* a = static_cast<const uint16_t*>(in);
  auto* b = static_cast<uint16_t*>(inout);
  for (int i = 0; i < *len; ++i) {
    const float x = kToF32(a[i]);
    const float y = kToF32(b[i]);
    b[i] = kFromF32(kMax ? (x > y ? x : y) : x + y);
  }
}

// User ops for 16-bit floats, created once per process (MPI_Op_create needs
// MPI initialised; they are freed by MPI_Finalize).
struct HalfOps {
  MPI_Op bf16_sum, bf16_max, f16_sum, f16_max;
};

const HalfOps& GetHalfOps() {
  static HalfOps ops = [] {
    HalfOps o{};
    MPI_Op_create(&Reduce16<Bf16ToFloat, FloatToBf16, false>, 1, &o.bf16_sum);
    MPI_Op_create(&Reduce16<Bf16ToFloat, FloatToBf16, true>, 1, &o.bf16_max);
    MPI_Op_create(&Reduce16<HalfToFloat, FloatToHalf, false>, 1, &o.f16_sum);
    MPI_Op_create(&Reduce16<HalfToFloat, FloatToHalf, true>, 1, &o.f16_max);
    return o;
  }();
  return ops;
}

MPI_Datatype MpiType(ElementType dtype) {
  switch (dtype) {
    case ElementType::kF32: return MPI_FLOAT;
    case ElementType::kF64: return MPI_DOUBLE;
    case ElementType::kF16:
    case ElementType::kBf16: return MPI_UINT16_T;
    case ElementType::kU8: return MPI_UINT8_T;
    case ElementType::kI64: return MPI_INT64_T;
  }
  return MPI_BYTE;
}

StatusOr<MPI_Op> MpiOp(ElementType dtype, ReduceOp op) {
  const bool sum = op == ReduceOp::kSum;
  switch (dtype) {
    case ElementType::kBf16: return sum ? GetHalfOps().bf16_sum : GetHalfOps().bf16_max;
    case ElementType::kF16: return sum ? GetHalfOps().f16_sum : GetHalfOps().f16_max;
    case ElementType::kU8:
      if (sum) return Status::InvalidArgument("mpi: sum of u8 is not supported");
      return MPI_MAX;
    default: return sum ? MPI_SUM : MPI_MAX;
  }
}

Status Prepare(std::string_view op, int64_t count, Stream* stream) {
  ZINF_RETURN_IF_ERROR(CheckCollectiveArgs(op, count, false, stream));
  if (count > INT_MAX) {
    return Status::InvalidArgument(std::string(op) + ": count " + std::to_string(count) +
                                   " exceeds MPI's int limit; split the buffer");
  }
  if (stream != nullptr) ZINF_RETURN_IF_ERROR(stream->Synchronize().WithContext(op));
  return Status::Ok();
}

}  // namespace

bool MpiCompiledIn() { return true; }

bool MpiInitialized() {
  int init = 0, fin = 0;
  MPI_Initialized(&init);
  MPI_Finalized(&fin);
  return init && !fin;
}

Status MpiInit(int* argc, char*** argv) {
  if (MpiInitialized()) return Status::Ok();
  int provided = 0;
  const int rc = MPI_Init_thread(argc, argv, MPI_THREAD_FUNNELED, &provided);
  if (rc != MPI_SUCCESS) return MpiError(rc, "init");
  return Status::Ok();
}

Status MpiFinalize() {
  if (!MpiInitialized()) return Status::Ok();
  const int rc = MPI_Finalize();
  return rc == MPI_SUCCESS ? Status::Ok() : MpiError(rc, "finalize");
}

void MpiAbort(int code) {
  if (MpiInitialized()) MPI_Abort(MPI_COMM_WORLD, code);
}

int MpiWorldRank() {
  if (!MpiInitialized()) return 0;
  int r = 0;
  MPI_Comm_rank(MPI_COMM_WORLD, &r);
  return r;
}

int MpiWorldSize() {
  if (!MpiInitialized()) return 1;
  int s = 1;
  MPI_Comm_size(MPI_COMM_WORLD, &s);
  return s;
}

StatusOr<std::unique_ptr<MpiCommunicator>> MpiCommunicator::CreateWorld() {
  if (!MpiInitialized()) return Status::FailedPrecondition("mpi communicator: MPI is not initialised");
  std::unique_ptr<MpiCommunicator> c(new MpiCommunicator());
  c->impl_ = std::make_unique<Impl>();
  int rc = MPI_Comm_dup(MPI_COMM_WORLD, &c->impl_->comm);
  if (rc != MPI_SUCCESS) return MpiError(rc, "comm_dup");
  MPI_Comm_set_errhandler(c->impl_->comm, MPI_ERRORS_RETURN);
  MPI_Comm_rank(c->impl_->comm, &c->rank_);
  MPI_Comm_size(c->impl_->comm, &c->size_);
  GetHalfOps();
  return c;
}

MpiCommunicator::~MpiCommunicator() {
  if (impl_ && impl_->comm != MPI_COMM_NULL && MpiInitialized()) MPI_Comm_free(&impl_->comm);
}

Status MpiCommunicator::AllGather(const void* send, void* recv, int64_t count, ElementType dtype, Stream* stream) {
  ZINF_RETURN_IF_ERROR(Prepare("all-gather", count, stream));
  const int64_t bytes = count * ElementSizeBytes(dtype);
  const bool in_place = send == static_cast<const char*>(recv) + rank_ * bytes;
  const int rc = MPI_Allgather(in_place ? MPI_IN_PLACE : send, static_cast<int>(count), MpiType(dtype), recv,
                               static_cast<int>(count), MpiType(dtype), impl_->comm);
  return rc == MPI_SUCCESS ? Status::Ok() : MpiError(rc, "all-gather");
}

Status MpiCommunicator::ReduceScatter(const void* send, void* recv, int64_t count, ElementType dtype, ReduceOp op,
                                      Stream* stream) {
  ZINF_RETURN_IF_ERROR(Prepare("reduce-scatter", count, stream));
  ZINF_ASSIGN_OR_RETURN(MPI_Op mop, MpiOp(dtype, op));
  const int rc = MPI_Reduce_scatter_block(send, recv, static_cast<int>(count), MpiType(dtype), mop, impl_->comm);
  return rc == MPI_SUCCESS ? Status::Ok() : MpiError(rc, "reduce-scatter");
}

Status MpiCommunicator::AllReduce(const void* send, void* recv, int64_t count, ElementType dtype, ReduceOp op,
                                  Stream* stream) {
  ZINF_RETURN_IF_ERROR(Prepare("all-reduce", count, stream));
  ZINF_ASSIGN_OR_RETURN(MPI_Op mop, MpiOp(dtype, op));
  const int rc = MPI_Allreduce(send == recv ? MPI_IN_PLACE : send, recv, static_cast<int>(count), MpiType(dtype), mop,
                               impl_->comm);
  return rc == MPI_SUCCESS ? Status::Ok() : MpiError(rc, "all-reduce");
}

Status MpiCommunicator::Broadcast(void* buf, int64_t count, ElementType dtype, int root, Stream* stream) {
  ZINF_RETURN_IF_ERROR(Prepare("broadcast", count, stream));
  if (root < 0 || root >= size_) {
    return Status::InvalidArgument("broadcast: root " + std::to_string(root) + " of " + std::to_string(size_));
  }
  const int rc = MPI_Bcast(buf, static_cast<int>(count), MpiType(dtype), root, impl_->comm);
  return rc == MPI_SUCCESS ? Status::Ok() : MpiError(rc, "broadcast");
}

Status MpiCommunicator::Barrier() {
  const int rc = MPI_Barrier(impl_->comm);
  return rc == MPI_SUCCESS ? Status::Ok() : MpiError(rc, "barrier");
}

#else  // !ZINF_COMM_HAVE_MPI

struct MpiCommunicator::Impl {};

bool MpiCompiledIn() { return false; }
bool MpiInitialized() { return false; }
Status MpiInit(int*, char***) { return Status::Unavailable("mpi: zinf was built without MPI"); }
Status MpiFinalize() { return Status::Ok(); }
void MpiAbort(int) {}
int MpiWorldRank() { return 0; }
int MpiWorldSize() { return 1; }
StatusOr<std::unique_ptr<MpiCommunicator>> MpiCommunicator::CreateWorld() {
  return Status::Unavailable("mpi: zinf was built without MPI");
}
MpiCommunicator::~MpiCommunicator() = default;
Status MpiCommunicator::AllGather(const void*, void*, int64_t, ElementType, Stream*) {
  return Status::Unavailable("mpi");
}
Status MpiCommunicator::ReduceScatter(const void*, void*, int64_t, ElementType, ReduceOp, Stream*) {
  return Status::Unavailable("mpi");
}
Status MpiCommunicator::AllReduce(const void*, void*, int64_t, ElementType, ReduceOp, Stream*) {
  return Status::Unavailable("mpi");
}
Status MpiCommunicator::Broadcast(void*, int64_t, ElementType, int, Stream*) { return Status::Unavailable("mpi"); }
Status MpiCommunicator::Barrier() { return Status::Unavailable("mpi"); }

#endif

}  // namespace zinf::comm
