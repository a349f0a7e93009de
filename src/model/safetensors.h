// Safetensors files: weight export that Python (`safetensors`, PyTorch,
// Hugging Face) loads as it is, and a strict reader for tests and tools.
//
// Format: an 8-byte little-endian unsigned header length N; N bytes of JSON
// (UTF-8), {"__metadata__": {string: string}, NAME: {"dtype": "F32",
// "shape": [d0, d1, ...], "data_offsets": [begin, end]}, ...}, padded with
// spaces so the data starts 8-byte aligned; then the data buffer, the
// tensors' little-endian, row-major bytes at [begin, end) relative to the
// buffer's start.
//
// The writer follows the Python library's own layout, so for the same
// tensors it writes the same bytes: compact JSON, "__metadata__" first
// (left out when there is none; its keys sorted), tensors ordered by dtype
// (wider first: F32 before BF16 before F16) then by name, stored back to
// back from offset 0.
//
// Thread-safety: free functions without shared state.
#pragma once

#include <cstddef>
#include <cstdint>
#include <map>
#include <memory>
#include <optional>
#include <span>
#include <string>
#include <string_view>
#include <vector>

#include "zinf/element_type.h"
#include "zinf/status.h"

namespace zinf::model {

// One tensor to write. `data` must stay valid during WriteSafetensors.
struct SafetensorsTensor {
  std::string name;
  std::string dtype;  // "F32", "F16", "BF16" (also F64, I64, I32, I16, I8, U8, BOOL, ...)
  std::vector<int64_t> shape;
  std::span<const std::byte> data;  // exactly numel(shape) * DtypeBytes(dtype) bytes
};

// Bytes per element of a safetensors dtype name, or 0 when it is not one.
int SafetensorsDtypeBytes(std::string_view dtype);
// The element type of "F32", "BF16" or "F16", the float dtypes zinf reads
// weights from and exports to; nullopt for another name.
std::optional<ElementType> SafetensorsFloatType(std::string_view dtype);

// A tensor's name, dtype and shape, without its data.
struct SafetensorsSpec {
  std::string name;
  std::string dtype;
  std::vector<int64_t> shape;
};

// A file written tensor by tensor, in any order, so that only one tensor
// need be in memory (a model larger than RAM exports): Create lays the
// tensors out as WriteSafetensors does (the same bytes in the end) and
// writes the header into a new temporary file beside `path`; Write puts one
// tensor's bytes at its place; Commit checks that every tensor was written,
// then fsyncs, renames over `path` and fsyncs the directory. Until Commit
// succeeds `path` is untouched; a writer dropped before removes its
// temporary file. Errors: Create's are WriteSafetensors' (but the data
// sizes, which Write checks: kInvalidArgument naming the tensor, as for a
// name not declared or written twice); Commit's kFailedPrecondition names
// a tensor never written.
class SafetensorsWriter {
 public:
  static StatusOr<SafetensorsWriter> Create(const std::string& path, const std::vector<SafetensorsSpec>& tensors,
                                            const std::map<std::string, std::string>& metadata);
  SafetensorsWriter(SafetensorsWriter&&) noexcept;
  SafetensorsWriter& operator=(SafetensorsWriter&&) = delete;
  ~SafetensorsWriter();

  Status Write(std::string_view name, std::span<const std::byte> data);
  Status Commit();

 private:
  struct File;
  explicit SafetensorsWriter(std::unique_ptr<File> file);
  std::unique_ptr<File> file_;
};

// Writes `tensors` and `metadata` to `path`: a new temporary file beside it,
// fsynced, renamed over `path`, directory fsynced; on error `path` is
// untouched. kInvalidArgument (nothing written) for an unknown dtype, a
// negative dimension, a data size other than numel * dtype size, an empty,
// repeated or reserved ("__metadata__") name, or a name that is not UTF-8.
Status WriteSafetensors(const std::string& path, const std::vector<SafetensorsTensor>& tensors,
                        const std::map<std::string, std::string>& metadata);

struct SafetensorsFile {
  struct Tensor {
    std::string name;
    std::string dtype;
    std::vector<int64_t> shape;
    std::vector<std::byte> data;
  };
  std::vector<Tensor> tensors;  // in the order of their data in the file
  std::map<std::string, std::string> metadata;

  // The tensor called `name`, or nullptr.
  const Tensor* Find(std::string_view name) const;
};

// The header of a safetensors file: names, dtypes, shapes and where each
// tensor's bytes lie, checked as ReadSafetensors checks it, without reading
// the data (HF checkpoints are read from a memory map, tensor by tensor).
struct SafetensorsHeader {
  struct Entry {
    std::string name;
    std::string dtype;
    std::vector<int64_t> shape;
    uint64_t begin = 0;  // byte offsets in the file (not the data buffer)
    uint64_t end = 0;
  };
  std::vector<Entry> tensors;  // in the order of their data in the file
  std::map<std::string, std::string> metadata;
  uint64_t file_bytes = 0;

  const Entry* Find(std::string_view name) const;
};
StatusOr<SafetensorsHeader> ReadSafetensorsHeader(const std::string& path);
// One tensor's bytes (entry of ReadSafetensorsHeader(path)) into `out`,
// which must hold exactly them. The file's errors, kCorruption when it has
// been truncated since.
Status ReadSafetensorsTensor(const std::string& path, const SafetensorsHeader::Entry& entry, std::span<std::byte> out);
// out.size() of its bytes from byte `offset` of its data on
// (kInvalidArgument past its end): a range of a tensor, for a reader that
// holds one range at a time.
Status ReadSafetensorsTensor(const std::string& path, const SafetensorsHeader::Entry& entry, uint64_t offset,
                             std::span<std::byte> out);

// Reads and checks a whole safetensors file. kNotFound when it is missing;
// kCorruption naming the file when it is truncated, the header is not the
// JSON described above (or is not padded with spaces), a dtype is unknown, a
// tensor's byte range disagrees with its shape and dtype, ranges overlap,
// leave a gap, or run past the end of the file, or bytes follow the last
// tensor (the same rules the Python library enforces).
StatusOr<SafetensorsFile> ReadSafetensors(const std::string& path);

}  // namespace zinf::model
