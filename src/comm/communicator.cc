#include "comm/communicator.h"

#include <cstring>
#include <string>

namespace zinf::comm {

Status CheckCollectiveArgs(std::string_view op, int64_t count, bool needs_stream, const Stream* stream) {
  if (count < 0) {
    return Status::InvalidArgument(std::string(op) + ": count must be >= 0, got " + std::to_string(count));
  }
  if (needs_stream && stream == nullptr) {
    return Status::InvalidArgument(std::string(op) + ": device buffers need a stream");
  }
  return Status::Ok();
}

Status LocalCommunicator::Copy(void* dst, const void* src, int64_t bytes, Stream* stream) {
  if (dst == src || bytes == 0) return Status::Ok();
  if (device_buffers_) {
    return stream->CopyAsync(dst, src, static_cast<size_t>(bytes), CopyDirection::kDeviceToDevice);
  }
  if (stream != nullptr) ZINF_RETURN_IF_ERROR(stream->Synchronize());
  std::memmove(dst, src, static_cast<size_t>(bytes));
  return Status::Ok();
}

Status LocalCommunicator::AllGather(const void* send, void* recv, int64_t count, ElementType dtype, Stream* stream) {
  ZINF_RETURN_IF_ERROR(CheckCollectiveArgs("all-gather", count, device_buffers_, stream));
  return Copy(recv, send, count * ElementSizeBytes(dtype), stream);
}

Status LocalCommunicator::ReduceScatter(const void* send, void* recv, int64_t count, ElementType dtype, ReduceOp,
                                        Stream* stream) {
  ZINF_RETURN_IF_ERROR(CheckCollectiveArgs("reduce-scatter", count, device_buffers_, stream));
  return Copy(recv, send, count * ElementSizeBytes(dtype), stream);
}

Status LocalCommunicator::AllReduce(const void* send, void* recv, int64_t count, ElementType dtype, ReduceOp,
                                    Stream* stream) {
  ZINF_RETURN_IF_ERROR(CheckCollectiveArgs("all-reduce", count, device_buffers_, stream));
  return Copy(recv, send, count * ElementSizeBytes(dtype), stream);
}

Status LocalCommunicator::Broadcast(void*, int64_t count, ElementType, int root, Stream* stream) {
  ZINF_RETURN_IF_ERROR(CheckCollectiveArgs("broadcast", count, device_buffers_, stream));
  if (root != 0) return Status::InvalidArgument("broadcast: root " + std::to_string(root) + " of 1 rank");
  return Status::Ok();
}

}  // namespace zinf::comm
