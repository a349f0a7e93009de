#include "model/safetensors.h"

#include <fcntl.h>
#include <sys/stat.h>
#include <unistd.h>

#include <algorithm>
#include <array>
#include <cerrno>
#include <memory>
#include <set>
#include <utility>

#include <nlohmann/json.hpp>

#include "core/fs.h"

namespace zinf::model {
namespace {

// The Python library refuses headers above 100 MB; so do we, so that a
// corrupt length cannot make us allocate the size of the file.
constexpr uint64_t kMaxHeaderBytes = 100'000'000;

struct DtypeInfo {
  std::string_view name;
  int bytes;
};
// In the order of the Python library's dtype enumeration, which decides the
// order of tensors in the files it writes (later entries first).
constexpr std::array<DtypeInfo, 15> kDtypes = {{
    {"BOOL", 1},
    {"U8", 1},
    {"I8", 1},
    {"F8_E5M2", 1},
    {"F8_E4M3", 1},
    {"I16", 2},
    {"U16", 2},
    {"F16", 2},
    {"BF16", 2},
    {"I32", 4},
    {"U32", 4},
    {"F32", 4},
    {"F64", 8},
    {"I64", 8},
    {"U64", 8},
}};

int DtypeRank(std::string_view dtype) {
  for (size_t i = 0; i < kDtypes.size(); ++i) {
    if (kDtypes[i].name == dtype) return static_cast<int>(i);
  }
  return -1;
}

// numel(shape) * element_bytes, or -1 on a negative dimension or overflow.
int64_t ByteSize(const std::vector<int64_t>& shape, int element_bytes) {
  int64_t n = element_bytes;
  for (int64_t d : shape) {
    if (d < 0 || __builtin_mul_overflow(n, d, &n)) return -1;
  }
  return n;
}

std::string ShapeString(const std::vector<int64_t>& shape) {
  std::string s = "[";
  for (size_t i = 0; i < shape.size(); ++i) s += (i ? ", " : "") + std::to_string(shape[i]);
  return s + "]";
}

// Owns a file descriptor.
class Fd {
 public:
  explicit Fd(int fd) : fd_(fd) {}
  ~Fd() {
    if (fd_ >= 0) ::close(fd_);
  }
  Fd(const Fd&) = delete;
  Fd& operator=(const Fd&) = delete;
  int get() const { return fd_; }
  // Closes now, reporting the error close(2) may carry for written data.
  int Close() {
    const int rc = ::close(fd_);
    fd_ = -1;
    return rc;
  }

 private:
  int fd_;
};

Status WriteAll(int fd, const std::string& path, const void* data, int64_t n, int64_t offset) {
  int64_t done = 0;
  while (done < n) {
    const ssize_t put =
        ::pwrite(fd, static_cast<const char*>(data) + done, static_cast<size_t>(n - done), offset + done);
    if (put < 0 && errno == EINTR) continue;
    if (put <= 0) return ErrnoStatus(put < 0 ? errno : EIO, "write", path, offset + done, n - done);
    done += put;
  }
  return Status::Ok();
}

Status ReadExact(int fd, const std::string& path, void* data, int64_t n, int64_t offset) {
  int64_t done = 0;
  while (done < n) {
    const ssize_t got = ::pread(fd, static_cast<char*>(data) + done, static_cast<size_t>(n - done), offset + done);
    if (got < 0 && errno == EINTR) continue;
    if (got < 0) return ErrnoStatus(errno, "read", path, offset + done, n - done);
    if (got == 0) {
      return Status::Corruption("safetensors " + path + ": truncated (end of file at offset " +
                                std::to_string(offset + done) + ", wanted " + std::to_string(n - done) +
                                " more bytes)");
    }
    done += got;
  }
  return Status::Ok();
}

}  // namespace

int SafetensorsDtypeBytes(std::string_view dtype) {
  const int rank = DtypeRank(dtype);
  return rank < 0 ? 0 : kDtypes[static_cast<size_t>(rank)].bytes;
}

std::optional<ElementType> SafetensorsFloatType(std::string_view dtype) {
  if (dtype == "F32") return ElementType::kF32;
  if (dtype == "BF16") return ElementType::kBf16;
  if (dtype == "F16") return ElementType::kF16;
  return std::nullopt;
}

const SafetensorsFile::Tensor* SafetensorsFile::Find(std::string_view name) const {
  for (const Tensor& t : tensors) {
    if (t.name == name) return &t;
  }
  return nullptr;
}

// The writer's state: the temporary file and where each tensor goes.
struct SafetensorsWriter::File {
  std::string path, tmp;
  int fd = -1;
  struct Slot {
    uint64_t offset = 0;  // in the file
    uint64_t bytes = 0;
    bool written = false;
  };
  std::map<std::string, Slot, std::less<>> slots;
  bool committed = false;

  ~File() {
    if (fd >= 0) ::close(fd);
    if (!committed && !tmp.empty()) ::unlink(tmp.c_str());
  }
};

SafetensorsWriter::SafetensorsWriter(std::unique_ptr<File> file) : file_(std::move(file)) {}
SafetensorsWriter::SafetensorsWriter(SafetensorsWriter&&) noexcept = default;
SafetensorsWriter::~SafetensorsWriter() = default;

StatusOr<SafetensorsWriter> SafetensorsWriter::Create(const std::string& path,
                                                      const std::vector<SafetensorsSpec>& tensors,
                                                      const std::map<std::string, std::string>& metadata) {
  const std::string where = "safetensors " + path + ": ";
  std::set<std::string_view> names;
  std::vector<uint64_t> bytes;
  for (const SafetensorsSpec& t : tensors) {
    if (t.name.empty() || t.name == "__metadata__") {
      return Status::InvalidArgument(where + "tensor name \"" + t.name + "\" is not allowed");
    }
    if (!names.insert(t.name).second) return Status::InvalidArgument(where + "tensor " + t.name + " given twice");
    const int element = SafetensorsDtypeBytes(t.dtype);
    if (element == 0) return Status::InvalidArgument(where + "tensor " + t.name + ": unknown dtype " + t.dtype);
    const int64_t want = ByteSize(t.shape, element);
    if (want < 0) {
      return Status::InvalidArgument(where + "tensor " + t.name + ": bad shape " + ShapeString(t.shape));
    }
    bytes.push_back(static_cast<uint64_t>(want));
  }
  // The Python library's order: wider dtypes first, then by name.
  std::vector<size_t> order(tensors.size());
  for (size_t i = 0; i < order.size(); ++i) order[i] = i;
  std::sort(order.begin(), order.end(), [&](size_t a, size_t b) {
    const int ra = DtypeRank(tensors[a].dtype), rb = DtypeRank(tensors[b].dtype);
    if (ra != rb) return ra > rb;
    return tensors[a].name < tensors[b].name;
  });

  nlohmann::ordered_json header = nlohmann::ordered_json::object();
  if (!metadata.empty()) {
    nlohmann::ordered_json meta = nlohmann::ordered_json::object();
    for (const auto& [k, v] : metadata) meta[k] = v;
    header["__metadata__"] = std::move(meta);
  }
  uint64_t offset = 0;
  for (size_t i : order) {
    nlohmann::ordered_json info = nlohmann::ordered_json::object();
    info["dtype"] = tensors[i].dtype;
    info["shape"] = tensors[i].shape;
    info["data_offsets"] = {offset, offset + bytes[i]};
    header[tensors[i].name] = std::move(info);
    offset += bytes[i];
  }
  std::string text;
  try {
    text = header.dump();  // compact; throws on a string that is not UTF-8
  } catch (const nlohmann::json::exception& e) {
    return Status::InvalidArgument(where + "cannot encode the header: " + e.what());
  }
  text.append((8 - text.size() % 8) % 8, ' ');
  std::array<std::byte, 8> length{};
  for (int i = 0; i < 8; ++i) length[static_cast<size_t>(i)] = static_cast<std::byte>((text.size() >> (8 * i)) & 0xFF);

  auto file = std::make_unique<File>();
  file->path = path;
  const uint64_t data_start = 8 + text.size();
  offset = data_start;
  for (size_t i : order) {
    file->slots[tensors[i].name] = {offset, bytes[i], false};
    offset += bytes[i];
  }
  const std::string tmp = path + ".tmp-" + RandomHex(8);
  file->fd = ::open(tmp.c_str(), O_WRONLY | O_CREAT | O_EXCL | O_CLOEXEC, 0644);
  if (file->fd < 0) return ErrnoStatus(errno, "open", tmp).WithContext("write safetensors " + path);
  file->tmp = tmp;
  ZINF_RETURN_IF_ERROR(WriteAll(file->fd, tmp, length.data(), 8, 0).WithContext("write safetensors " + path));
  ZINF_RETURN_IF_ERROR(WriteAll(file->fd, tmp, text.data(), static_cast<int64_t>(text.size()), 8)
                           .WithContext("write safetensors " + path));
  return SafetensorsWriter(std::move(file));
}

Status SafetensorsWriter::Write(std::string_view name, std::span<const std::byte> data) {
  File& f = *file_;
  const std::string where = "safetensors " + f.path + ": ";
  auto it = f.slots.find(name);
  if (it == f.slots.end()) return Status::InvalidArgument(where + "no tensor " + std::string(name) + " declared");
  File::Slot& slot = it->second;
  if (slot.written) return Status::InvalidArgument(where + "tensor " + std::string(name) + " written twice");
  if (data.size() != slot.bytes) {
    return Status::InvalidArgument(where + "tensor " + std::string(name) + " needs " + std::to_string(slot.bytes) +
                                   " bytes, given " + std::to_string(data.size()));
  }
  ZINF_RETURN_IF_ERROR(
      WriteAll(f.fd, f.tmp, data.data(), static_cast<int64_t>(data.size()), static_cast<int64_t>(slot.offset))
          .WithContext("write safetensors " + f.path));
  slot.written = true;
  return Status::Ok();
}

Status SafetensorsWriter::Commit() {
  File& f = *file_;
  for (const auto& [name, slot] : f.slots) {
    if (!slot.written) {
      return Status::FailedPrecondition("safetensors " + f.path + ": tensor " + name + " was never written");
    }
  }
  if (::fsync(f.fd) != 0) return ErrnoStatus(errno, "fsync", f.tmp).WithContext("write safetensors " + f.path);
  const int fd = std::exchange(f.fd, -1);
  if (::close(fd) != 0) return ErrnoStatus(errno, "close", f.tmp).WithContext("write safetensors " + f.path);
  ZINF_RETURN_IF_ERROR(RenamePath(f.tmp, f.path).WithContext("write safetensors " + f.path));
  f.committed = true;
  return SyncDirectory(ParentPath(f.path)).WithContext("write safetensors " + f.path);
}

Status WriteSafetensors(const std::string& path, const std::vector<SafetensorsTensor>& tensors,
                        const std::map<std::string, std::string>& metadata) {
  const std::string where = "safetensors " + path + ": ";
  std::vector<SafetensorsSpec> specs;
  for (const SafetensorsTensor& t : tensors) {
    // Sizes first: nothing is written for a tensor given the wrong bytes.
    const int element = SafetensorsDtypeBytes(t.dtype);
    const int64_t want = element == 0 ? 0 : ByteSize(t.shape, element);
    if (element != 0 && want >= 0 && want != static_cast<int64_t>(t.data.size())) {
      return Status::InvalidArgument(where + "tensor " + t.name + ": shape " + ShapeString(t.shape) + " of " + t.dtype +
                                     " needs " + std::to_string(want) + " bytes, given " +
                                     std::to_string(t.data.size()));
    }
    specs.push_back({t.name, t.dtype, t.shape});
  }
  ZINF_ASSIGN_OR_RETURN(SafetensorsWriter writer, SafetensorsWriter::Create(path, specs, metadata));
  for (const SafetensorsTensor& t : tensors) ZINF_RETURN_IF_ERROR(writer.Write(t.name, t.data));
  return writer.Commit();
}

namespace {

// The checked header of an open file, tensors sorted by their data.
StatusOr<SafetensorsHeader> ParseHeader(int fd, const std::string& path) {
  struct stat st {};
  if (::fstat(fd, &st) != 0) return ErrnoStatus(errno, "stat safetensors", path);
  const std::string where = "safetensors " + path + ": ";
  if (!S_ISREG(st.st_mode)) return Status::InvalidArgument(where + "not a regular file");
  const auto file_bytes = static_cast<uint64_t>(st.st_size);
  if (file_bytes < 8) {
    return Status::Corruption(where + "truncated: " + std::to_string(file_bytes) +
                              " bytes, fewer than the 8-byte header length");
  }
  std::array<unsigned char, 8> length{};
  ZINF_RETURN_IF_ERROR(ReadExact(fd, path, length.data(), 8, 0));
  uint64_t header_bytes = 0;
  for (int i = 7; i >= 0; --i) header_bytes = header_bytes << 8 | length[static_cast<size_t>(i)];
  if (header_bytes > kMaxHeaderBytes) {
    return Status::Corruption(where + "header length " + std::to_string(header_bytes) + " is implausible (limit " +
                              std::to_string(kMaxHeaderBytes) + ")");
  }
  if (header_bytes > file_bytes - 8) {
    return Status::Corruption(where + "truncated: header length " + std::to_string(header_bytes) + " but only " +
                              std::to_string(file_bytes - 8) + " bytes follow");
  }
  std::string text(header_bytes, '\0');
  ZINF_RETURN_IF_ERROR(ReadExact(fd, path, text.data(), static_cast<int64_t>(header_bytes), 8));
  const size_t last = text.find_last_not_of(' ');
  if (last == std::string::npos || text[0] != '{' || text[last] != '}') {
    return Status::Corruption(where + "the header is not a JSON object padded with spaces");
  }

  // Repeated top-level keys would silently collapse into one: refuse them.
  std::string duplicate;
  std::set<std::string> keys;
  nlohmann::json::parser_callback_t on_event = [&](int depth, nlohmann::json::parse_event_t event,
                                                   nlohmann::json& parsed) {
    if (depth == 1 && event == nlohmann::json::parse_event_t::key && parsed.is_string()) {
      const auto& key = parsed.get_ref<const std::string&>();
      if (!keys.insert(key).second && duplicate.empty()) duplicate = key;
    }
    return true;
  };
  nlohmann::json header;
  try {
    header = nlohmann::json::parse(text, on_event);
  } catch (const nlohmann::json::exception& e) {
    return Status::Corruption(where + "the header is not valid JSON: " + e.what());
  }
  if (!header.is_object()) return Status::Corruption(where + "the header is not a JSON object");
  if (!duplicate.empty()) return Status::Corruption(where + "the header names \"" + duplicate + "\" twice");

  const uint64_t data_start = 8 + header_bytes;
  const uint64_t data_bytes = file_bytes - data_start;
  SafetensorsHeader file;
  file.file_bytes = file_bytes;
  struct Range {
    uint64_t begin, end;
    size_t index;
  };
  std::vector<Range> ranges;
  for (const auto& [name, value] : header.items()) {
    if (name == "__metadata__") {
      if (!value.is_object()) return Status::Corruption(where + "__metadata__ is not an object");
      for (const auto& [k, v] : value.items()) {
        if (!v.is_string()) return Status::Corruption(where + "__metadata__." + k + " is not a string");
        file.metadata[k] = v.get<std::string>();
      }
      continue;
    }
    const std::string what = where + "tensor " + name + ": ";
    if (!value.is_object()) return Status::Corruption(what + "not an object");
    const auto dtype = value.find("dtype");
    const auto shape = value.find("shape");
    const auto offsets = value.find("data_offsets");
    if (dtype == value.end() || !dtype->is_string()) return Status::Corruption(what + "no string \"dtype\"");
    if (shape == value.end() || !shape->is_array()) return Status::Corruption(what + "no array \"shape\"");
    if (offsets == value.end() || !offsets->is_array() || offsets->size() != 2 || !(*offsets)[0].is_number_unsigned() ||
        !(*offsets)[1].is_number_unsigned()) {
      return Status::Corruption(what + "\"data_offsets\" is not [begin, end]");
    }
    SafetensorsHeader::Entry t;
    t.name = name;
    t.dtype = dtype->get<std::string>();
    const int element = SafetensorsDtypeBytes(t.dtype);
    if (element == 0) return Status::Corruption(what + "unknown dtype " + t.dtype);
    for (const auto& d : *shape) {
      if (!d.is_number_unsigned() || d.get<uint64_t>() > static_cast<uint64_t>(INT64_MAX)) {
        return Status::Corruption(what + "shape " + shape->dump() + " holds a bad dimension");
      }
      t.shape.push_back(d.get<int64_t>());
    }
    const auto begin = (*offsets)[0].get<uint64_t>();
    const auto end = (*offsets)[1].get<uint64_t>();
    const std::string range = "[" + std::to_string(begin) + ", " + std::to_string(end) + ")";
    if (end < begin) return Status::Corruption(what + "data_offsets " + range + " end before they begin");
    if (end > data_bytes) {
      return Status::Corruption(what + "data_offsets " + range + " run past the end of the data (" +
                                std::to_string(data_bytes) + " bytes): truncated or corrupt");
    }
    const int64_t want = ByteSize(t.shape, element);
    if (want < 0 || static_cast<uint64_t>(want) != end - begin) {
      return Status::Corruption(what + "data_offsets " + range + " hold " + std::to_string(end - begin) +
                                " bytes, but shape " + ShapeString(t.shape) + " of " + t.dtype + " needs " +
                                (want < 0 ? std::string("more than 2^63") : std::to_string(want)));
    }
    ranges.push_back({begin, end, file.tensors.size()});
    file.tensors.push_back(std::move(t));
  }

  // The ranges must tile the data buffer: no overlap, no gap, nothing after.
  std::sort(ranges.begin(), ranges.end(),
            [](const Range& a, const Range& b) { return a.begin != b.begin ? a.begin < b.begin : a.end < b.end; });
  uint64_t covered = 0;
  for (const Range& r : ranges) {
    const std::string& name = file.tensors[r.index].name;
    if (r.begin < covered) {
      return Status::Corruption(where + "tensor " + name + " overlaps the tensor before it (begins at " +
                                std::to_string(r.begin) + ", the previous one ends at " + std::to_string(covered) +
                                ")");
    }
    if (r.begin > covered) {
      return Status::Corruption(where + "a gap of " + std::to_string(r.begin - covered) + " bytes before tensor " +
                                name);
    }
    covered = r.end;
  }
  if (covered != data_bytes) {
    return Status::Corruption(where + std::to_string(data_bytes - covered) + " bytes follow the last tensor");
  }

  std::vector<SafetensorsHeader::Entry> ordered;
  ordered.reserve(ranges.size());
  for (const Range& r : ranges) {
    SafetensorsHeader::Entry& t = file.tensors[r.index];
    t.begin = data_start + r.begin;
    t.end = data_start + r.end;
    ordered.push_back(std::move(t));
  }
  file.tensors = std::move(ordered);
  return file;
}

}  // namespace

const SafetensorsHeader::Entry* SafetensorsHeader::Find(std::string_view name) const {
  for (const Entry& t : tensors) {
    if (t.name == name) return &t;
  }
  return nullptr;
}

StatusOr<SafetensorsHeader> ReadSafetensorsHeader(const std::string& path) {
  Fd fd(::open(path.c_str(), O_RDONLY | O_CLOEXEC));
  if (fd.get() < 0) return ErrnoStatus(errno, "open safetensors", path);
  return ParseHeader(fd.get(), path);
}

Status ReadSafetensorsTensor(const std::string& path, const SafetensorsHeader::Entry& entry, std::span<std::byte> out) {
  if (out.size() != entry.end - entry.begin) {
    return Status::InvalidArgument("safetensors " + path + ": tensor " + entry.name + " holds " +
                                   std::to_string(entry.end - entry.begin) + " bytes, the buffer " +
                                   std::to_string(out.size()));
  }
  return ReadSafetensorsTensor(path, entry, 0, out);
}

Status ReadSafetensorsTensor(const std::string& path, const SafetensorsHeader::Entry& entry, uint64_t offset,
                             std::span<std::byte> out) {
  const uint64_t bytes = entry.end - entry.begin;
  if (offset > bytes || out.size() > bytes - offset) {
    return Status::InvalidArgument("safetensors " + path + ": bytes [" + std::to_string(offset) + ", " +
                                   std::to_string(offset + out.size()) + ") of tensor " + entry.name +
                                   ", which holds " + std::to_string(bytes));
  }
  Fd fd(::open(path.c_str(), O_RDONLY | O_CLOEXEC));
  if (fd.get() < 0) return ErrnoStatus(errno, "open safetensors", path);
  return ReadExact(fd.get(), path, out.data(), static_cast<int64_t>(out.size()),
                   static_cast<int64_t>(entry.begin + offset));
}

StatusOr<SafetensorsFile> ReadSafetensors(const std::string& path) {
  Fd fd(::open(path.c_str(), O_RDONLY | O_CLOEXEC));
  if (fd.get() < 0) return ErrnoStatus(errno, "open safetensors", path);
  ZINF_ASSIGN_OR_RETURN(SafetensorsHeader header, ParseHeader(fd.get(), path));
  SafetensorsFile file;
  file.metadata = std::move(header.metadata);
  for (SafetensorsHeader::Entry& e : header.tensors) {
    SafetensorsFile::Tensor t;
    t.name = std::move(e.name);
    t.dtype = std::move(e.dtype);
    t.shape = std::move(e.shape);
    t.data.resize(e.end - e.begin);
    ZINF_RETURN_IF_ERROR(
        ReadExact(fd.get(), path, t.data.data(), static_cast<int64_t>(t.data.size()), static_cast<int64_t>(e.begin)));
    file.tensors.push_back(std::move(t));
  }
  return file;
}

}  // namespace zinf::model
