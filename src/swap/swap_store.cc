#include "swap/swap_store.h"

#include <sys/stat.h>

#include <algorithm>
#include <cinttypes>
#include <cstring>
#include <map>
#include <optional>

#include "aio/nvme_check.h"
#include "aio/pinned_pool.h"
#include "core/check.h"
#include "core/crc32c.h"
#include "core/fs.h"
#include "core/log.h"
#include "core/units.h"

namespace zinf::swap {
namespace {

void PutU32(char* p, uint32_t v) {
  for (int i = 0; i < 4; ++i) p[i] = static_cast<char>((v >> (8 * i)) & 0xff);
}
void PutU64(char* p, uint64_t v) {
  for (int i = 0; i < 8; ++i) p[i] = static_cast<char>((v >> (8 * i)) & 0xff);
}
uint32_t GetU32(const char* p) {
  uint32_t v = 0;
  for (int i = 0; i < 4; ++i) v |= static_cast<uint32_t>(static_cast<unsigned char>(p[i])) << (8 * i);
  return v;
}
uint64_t GetU64(const char* p) {
  uint64_t v = 0;
  for (int i = 0; i < 8; ++i) v |= static_cast<uint64_t>(static_cast<unsigned char>(p[i])) << (8 * i);
  return v;
}

// FNV-1a, 64 bit: the layout hash needs stability across builds, not strength.
class Fnv64 {
 public:
  void Add(const void* data, size_t n) {
    const auto* p = static_cast<const unsigned char*>(data);
    for (size_t i = 0; i < n; ++i) h_ = (h_ ^ p[i]) * 0x100000001b3ull;
  }
  void AddU64(uint64_t v) {
    char b[8];
    PutU64(b, v);
    Add(b, 8);
  }
  void AddString(std::string_view s) {
    AddU64(s.size());
    Add(s.data(), s.size());
  }
  uint64_t value() const { return h_; }

 private:
  uint64_t h_ = 0xcbf29ce484222325ull;
};

std::string Hex(uint64_t v) {
  char b[24];
  std::snprintf(b, sizeof(b), "0x%" PRIx64, v);
  return b;
}

constexpr int kRunIdBytes = 32;
constexpr int64_t kMaxExtentsPerTensor = int64_t{1} << 24;

}  // namespace

// ---------------------------------------------------------------------------
// Header

void SwapFileHeader::Encode(char* out) const {
  std::memset(out, 0, kEncodedBytes);
  std::memcpy(out, kMagic, 8);
  PutU32(out + 8, format_version);
  PutU32(out + 12, header_bytes);
  PutU32(out + 16, file_index);
  PutU32(out + 20, file_count);
  PutU64(out + 24, data_bytes);
  PutU64(out + 32, logical_bytes);
  PutU64(out + 40, stripe_bytes);
  PutU64(out + 48, tensor_count);
  PutU32(out + 56, element_size_bytes);
  PutU64(out + 64, layout_hash);
  std::memcpy(out + 72, run_id.data(), std::min<size_t>(run_id.size(), kRunIdBytes));
  PutU32(out + 104, Crc32c(out, 104));
}

StatusOr<SwapFileHeader> SwapFileHeader::Decode(const char* in, int64_t bytes, std::string_view file) {
  const std::string where = std::string(file) + " offset 0";
  if (bytes < kEncodedBytes) return Status::Corruption(where + ": too short for a swap file header");
  if (std::memcmp(in, kMagic, 8) != 0) return Status::Corruption(where + ": not a zinf swap file (bad magic)");
  const uint32_t stored = GetU32(in + 104);
  const uint32_t actual = Crc32c(in, 104);
  if (stored != actual) {
    return Status::Corruption(where + ": swap file header crc32c mismatch (stored " + Hex(stored) + ", computed " +
                              Hex(actual) + ")");
  }
  SwapFileHeader h;
  h.format_version = GetU32(in + 8);
  h.header_bytes = GetU32(in + 12);
  h.file_index = GetU32(in + 16);
  h.file_count = GetU32(in + 20);
  h.data_bytes = GetU64(in + 24);
  h.logical_bytes = GetU64(in + 32);
  h.stripe_bytes = GetU64(in + 40);
  h.tensor_count = GetU64(in + 48);
  h.element_size_bytes = GetU32(in + 56);
  h.layout_hash = GetU64(in + 64);
  const char* id = in + 72;
  h.run_id.assign(id, strnlen(id, kRunIdBytes));
  return h;
}

// ---------------------------------------------------------------------------
// Create

StatusOr<std::unique_ptr<SwapStore>> SwapStore::Create(aio::IoEngine* engine, std::vector<TensorSpec> tensors,
                                                       const SwapStoreOptions& options) {
  ZINF_CHECK(engine != nullptr);
  if (options.paths.empty()) return Status::InvalidArgument("swap store: no nvme paths given");
  if (!IsPowerOfTwo(options.alignment_bytes) || options.alignment_bytes < 512) {
    return Status::InvalidArgument("swap store: alignment_bytes must be a power of two >= 512, got " +
                                   std::to_string(options.alignment_bytes));
  }
  if (options.stripe_bytes <= 0 || options.stripe_bytes % options.alignment_bytes != 0) {
    return Status::InvalidArgument("swap store: stripe_bytes must be a positive multiple of alignment_bytes (" +
                                   std::to_string(options.alignment_bytes) + "), got " +
                                   std::to_string(options.stripe_bytes));
  }
  if (options.max_outstanding < 1) return Status::InvalidArgument("swap store: max_outstanding must be >= 1");
  if (options.run_id.size() > kRunIdBytes) {
    return Status::InvalidArgument("swap store: run_id is longer than 32 bytes: " + options.run_id);
  }
  if (options.file_prefix.empty() || options.file_prefix.find('/') != std::string::npos) {
    return Status::InvalidArgument("swap store: file_prefix must be a non-empty file name, got '" +
                                   options.file_prefix + "'");
  }

  std::unique_ptr<SwapStore> store(new SwapStore(options.max_outstanding));
  store->engine_ = engine;
  store->options_ = options;
  store->run_id_ = options.run_id.empty() ? RandomHex(kRunIdBytes) : options.run_id;
  store->alignment_ = options.alignment_bytes;
  store->stripe_ = options.stripe_bytes;
  store->header_bytes_ = options.alignment_bytes;
  ZINF_RETURN_IF_ERROR(store->Layout(std::move(tensors)));
  ZINF_RETURN_IF_ERROR(store->OpenFiles());
  return store;
}

Status SwapStore::Layout(std::vector<TensorSpec> tensors) {
  if (tensors.empty()) return Status::InvalidArgument("swap store: no tensors");
  const int64_t n_files = static_cast<int64_t>(options_.paths.size());
  Fnv64 hash;
  hash.AddU64(SwapFileHeader::kFormatVersion);
  hash.AddU64(static_cast<uint64_t>(alignment_));
  hash.AddU64(static_cast<uint64_t>(stripe_));
  hash.AddU64(static_cast<uint64_t>(n_files));
  int64_t logical = 0;
  common_element_size_ = static_cast<uint32_t>(tensors.front().element_size_bytes);
  tensors_.reserve(tensors.size());
  for (TensorSpec& spec : tensors) {
    if (spec.name.empty()) return Status::InvalidArgument("swap store: a tensor has an empty name");
    if (spec.size_bytes <= 0) {
      return Status::InvalidArgument("swap store: tensor '" + spec.name + "' has size " +
                                     std::to_string(spec.size_bytes) + " bytes; expected > 0");
    }
    const int32_t es = spec.element_size_bytes;
    if (es != 1 && es != 2 && es != 4 && es != 8) {
      return Status::InvalidArgument("swap store: tensor '" + spec.name + "' has element size " + std::to_string(es) +
                                     "; expected 1, 2, 4 or 8");
    }
    if (static_cast<uint32_t>(es) != common_element_size_) common_element_size_ = 0;
    const TensorId id = static_cast<TensorId>(tensors_.size());
    if (!by_name_.emplace(spec.name, id).second) {
      return Status::InvalidArgument("swap store: tensor name '" + spec.name + "' is given twice");
    }
    Tensor t;
    t.logical_offset = logical;
    const int64_t padded = PaddedBytes(spec.size_bytes);
    if (padded / stripe_ > kMaxExtentsPerTensor) {
      return Status::InvalidArgument("swap store: tensor '" + spec.name + "' (" + FormatBytes(spec.size_bytes) +
                                     ") spans more than " + std::to_string(kMaxExtentsPerTensor) +
                                     " stripes; raise stripe_bytes");
    }
    for (int64_t pos = 0; pos < padded; pos += stripe_) {
      const int64_t unit = (logical + pos) / stripe_;
      Extent e;
      e.file = static_cast<int32_t>(unit % n_files);
      e.file_offset = header_bytes_ + (unit / n_files) * stripe_;
      e.length = std::min(stripe_, padded - pos);
      t.extents.push_back(e);
    }
    t.crc.assign(t.extents.size(), 0);
    t.written.assign(t.extents.size(), 0);
    t.busy.assign(t.extents.size(), 0);
    hash.AddString(spec.name);
    hash.AddU64(static_cast<uint64_t>(spec.size_bytes));
    hash.AddU64(static_cast<uint64_t>(es));
    hash.AddU64(static_cast<uint64_t>(logical));
    logical += AlignUp(spec.size_bytes, stripe_);
    t.spec = std::move(spec);
    tensors_.push_back(std::move(t));
  }
  logical_bytes_ = logical;
  const int64_t units = logical / stripe_;
  data_bytes_per_file_ = (units + n_files - 1) / n_files * stripe_;
  layout_hash_ = hash.value();
  return Status::Ok();
}

Status SwapStore::OpenFiles() {
  const int n = static_cast<int>(options_.paths.size());
  for (int i = 0; i < n; ++i) {
    ZINF_RETURN_IF_ERROR(MakeDirectories(options_.paths[static_cast<size_t>(i)]));
    file_paths_.push_back(
        JoinPath(options_.paths[static_cast<size_t>(i)], options_.file_prefix + "." + std::to_string(i) + ".swp"));
  }

  // One aligned, pinned block for reading and writing headers.
  aio::PinnedPoolOptions pool_options;
  pool_options.buffer_count = 1;
  pool_options.buffer_bytes = header_bytes_;
  pool_options.alignment_bytes = alignment_;
  pool_options.name = "swap header";
  ZINF_ASSIGN_OR_RETURN(std::unique_ptr<aio::PinnedPool> pool, aio::PinnedPool::Create(pool_options));
  aio::PinnedBuffer block = pool->Acquire();

  // Classify what is already there: reuse a file of this exact layout and
  // run, treat anything else as stale.
  std::vector<bool> reuse(static_cast<size_t>(n), false);
  for (int i = 0; i < n; ++i) {
    const std::string& path = file_paths_[static_cast<size_t>(i)];
    if (!PathExists(path)) continue;
    std::string stale;
    aio::OpenOptions ro;
    ro.read_only = true;
    auto fid = engine_->OpenFile(path, ro);
    if (!fid.ok()) return fid.status().WithContext("opening existing swap file");
    auto size = engine_->FileSize(*fid);
    if (!size.ok()) {
      engine_->CloseFile(*fid).IgnoreError();
      return size.status();
    }
    if (*size < header_bytes_) {
      stale = "it is " + std::to_string(*size) + " bytes, too short for a header";
    } else {
      Status read = engine_->Read(*fid, 0, block.data(), header_bytes_);
      if (!read.ok()) {
        engine_->CloseFile(*fid).IgnoreError();
        return read.WithContext("reading swap file header");
      }
      auto header = SwapFileHeader::Decode(block.data(), header_bytes_, path);
      if (!header.ok()) {
        stale = header.status().message();
      } else if (header->format_version != SwapFileHeader::kFormatVersion) {
        stale = "format version " + std::to_string(header->format_version) + ", this build writes " +
                std::to_string(SwapFileHeader::kFormatVersion);
      } else if (header->layout_hash != layout_hash_ || header->file_count != static_cast<uint32_t>(n) ||
                 header->file_index != static_cast<uint32_t>(i) ||
                 header->data_bytes != static_cast<uint64_t>(data_bytes_per_file_) ||
                 header->header_bytes != static_cast<uint32_t>(header_bytes_)) {
        stale = "another layout (layout hash " + Hex(header->layout_hash) + ", " +
                std::to_string(header->tensor_count) + " tensors, " + FormatBytes(int64_t(header->data_bytes)) +
                " of data, file " + std::to_string(header->file_index) + " of " + std::to_string(header->file_count) +
                "; this store: layout hash " + Hex(layout_hash_) + ", " + std::to_string(tensors_.size()) +
                " tensors, " + FormatBytes(data_bytes_per_file_) + ", file " + std::to_string(i) + " of " +
                std::to_string(n) + ")";
      } else if (header->run_id != run_id_) {
        stale = "left by another run (run id '" + header->run_id + "', this run '" + run_id_ + "')";
      }
    }
    ZINF_RETURN_IF_ERROR(engine_->CloseFile(*fid));
    if (stale.empty()) {
      reuse[static_cast<size_t>(i)] = true;
      continue;
    }
    if (options_.stale_policy == StalePolicy::kRefuse) {
      return Status::FailedPrecondition("swap file " + path + " was left by an earlier run and does not match: " +
                                        stale + "; delete it, or let zinf replace stale swap files");
    }
    Log("swap").warn("replacing stale swap file {}: {}", path, stale);
    ZINF_RETURN_IF_ERROR(RemoveFile(path));
  }
  block.Reset();
  pool.reset();

  ZINF_RETURN_IF_ERROR(CheckSpace());
  for (int i = 0; i < n; ++i) {
    if (!reuse[static_cast<size_t>(i)]) ZINF_RETURN_IF_ERROR(OpenOneFile(i));
    aio::OpenOptions rw;
    ZINF_ASSIGN_OR_RETURN(aio::FileId fid, engine_->OpenFile(file_paths_[static_cast<size_t>(i)], rw));
    files_.push_back(fid);
    const int64_t need = engine_->file_info(fid).alignment_bytes;
    if (alignment_ % need != 0) {
      return Status::InvalidArgument("swap file " + file_paths_[static_cast<size_t>(i)] + " needs " +
                                     std::to_string(need) + "-byte alignment for O_DIRECT; alignment_bytes is " +
                                     std::to_string(alignment_));
    }
    if (reuse[static_cast<size_t>(i)]) {
      Status s = engine_->Allocate(fid, file_bytes());
      if (!s.ok()) return s.WithContext("preallocating swap file " + file_paths_[static_cast<size_t>(i)]);
    }
  }
  return Status::Ok();
}

Status SwapStore::CheckSpace() const {
  // Paths on one filesystem share its free space: add up what each needs.
  struct Fs {
    int64_t need = 0;
    int64_t free = 0;
    std::vector<std::string> paths;
  };
  std::map<dev_t, Fs> by_fs;
  std::vector<std::pair<std::string, dev_t>> order;
  for (size_t i = 0; i < file_paths_.size(); ++i) {
    const std::string& dir = options_.paths[i];
    struct stat st {};
    if (::stat(dir.c_str(), &st) != 0) return ErrnoStatus(errno, "stat", dir);
    Fs& fs = by_fs[st.st_dev];
    ZINF_ASSIGN_OR_RETURN(fs.free, FreeBytes(dir));
    fs.need += std::max<int64_t>(0, file_bytes() - AllocatedBytes(file_paths_[i]));
    fs.paths.push_back(dir);
  }
  bool short_of_space = false;
  for (const auto& [dev, fs] : by_fs) short_of_space |= fs.need > fs.free;
  if (!short_of_space) return Status::Ok();
  // A filesystem that is no drive (ramfs reports 0 B free however much RAM
  // there is) is short for another reason than space: say what nvme-check
  // finds there (O_DIRECT refused, ...), which is what to fix.
  std::string unfit;
  for (const auto& [dev, fs] : by_fs) {
    if (fs.need <= fs.free) continue;
    aio::NvmeCheckOptions check;
    check.test_bytes = 0;  // no speed test: only what the path is
    const aio::NvmeCheckReport report = aio::CheckNvmePath(fs.paths[0], check);
    // Only a path where no file opens with O_DIRECT (the engine started,
    // no alignment was found): on a disk that is merely full, the probe's own
    // write fails for want of space, and the space message below is right.
    if (report.ok() || report.engine.empty() || report.alignment_bytes != 0) continue;
    std::string problems;
    for (const std::string& p : report.problems) problems += (problems.empty() ? "" : "; ") + p;
    unfit += (unfit.empty() ? "" : "; ") + fs.paths[0] + ": " + problems + " (zinf nvme-check " + fs.paths[0] +
             " says so), and it reports " + FormatBytes(fs.free) + " free where the swap files need " +
             FormatBytes(fs.need);
  }
  if (!unfit.empty()) return Status::FailedPrecondition("cannot hold swap files: " + unfit);
  std::string msg = "not enough space for the swap files (" + FormatBytes(file_bytes()) + " per path):";
  for (const auto& [dev, fs] : by_fs) {
    std::string paths;
    for (const std::string& p : fs.paths) paths += (paths.empty() ? "" : ", ") + p;
    msg += " [" + paths + "] needs " + FormatBytes(fs.need) + ", has " + FormatBytes(fs.free) + " free" +
           (fs.need > fs.free ? " (short)" : "") + ";";
  }
  msg.pop_back();
  return Status::NoSpace(msg);
}

Status SwapStore::OpenOneFile(int index) {
  // Write new, allocate, fsync, rename: a crash leaves no half-made file
  // under the final name.
  const std::string& path = file_paths_[static_cast<size_t>(index)];
  const std::string tmp = path + ".tmp-" + RandomHex(8);
  aio::OpenOptions create;
  create.create = true;
  create.truncate = true;
  ZINF_ASSIGN_OR_RETURN(aio::FileId fid, engine_->OpenFile(tmp, create));
  auto fail = [&](Status s) {
    engine_->CloseFile(fid).IgnoreError();
    RemoveFile(tmp).IgnoreError();
    return s;
  };
  if (engine_->file_info(fid).alignment_bytes > alignment_ ||
      alignment_ % engine_->file_info(fid).alignment_bytes != 0) {
    return fail(Status::InvalidArgument(
        "swap file " + path + " needs " + std::to_string(engine_->file_info(fid).alignment_bytes) +
        "-byte alignment for O_DIRECT; alignment_bytes is " + std::to_string(alignment_)));
  }
  Status s = engine_->Allocate(fid, file_bytes());
  if (!s.ok()) {
    auto free = FreeBytes(options_.paths[static_cast<size_t>(index)]);
    return fail(s.WithContext("preallocating swap file " + path + " (needs " + FormatBytes(file_bytes()) +
                              ", path has " + (free.ok() ? FormatBytes(*free) : std::string("?")) + " free)"));
  }
  SwapFileHeader h;
  h.header_bytes = static_cast<uint32_t>(header_bytes_);
  h.file_index = static_cast<uint32_t>(index);
  h.file_count = static_cast<uint32_t>(file_paths_.size());
  h.data_bytes = static_cast<uint64_t>(data_bytes_per_file_);
  h.logical_bytes = static_cast<uint64_t>(logical_bytes_);
  h.stripe_bytes = static_cast<uint64_t>(stripe_);
  h.tensor_count = tensors_.size();
  h.element_size_bytes = common_element_size_;
  h.layout_hash = layout_hash_;
  h.run_id = run_id_;
  aio::PinnedPoolOptions pool_options;
  pool_options.buffer_count = 1;
  pool_options.buffer_bytes = header_bytes_;
  pool_options.alignment_bytes = alignment_;
  pool_options.name = "swap header";
  auto pool = aio::PinnedPool::Create(pool_options);
  if (!pool.ok()) return fail(pool.status());
  {
    aio::PinnedBuffer block = (*pool)->Acquire();
    std::memset(block.data(), 0, static_cast<size_t>(header_bytes_));
    h.Encode(block.data());
    s = engine_->Write(fid, 0, block.data(), header_bytes_);
  }
  if (s.ok()) s = engine_->Sync(fid);
  if (!s.ok()) return fail(s.WithContext("writing swap file header"));
  ZINF_RETURN_IF_ERROR(engine_->CloseFile(fid));
  Status r = RenamePath(tmp, path);
  if (!r.ok()) {
    RemoveFile(tmp).IgnoreError();
    return r;
  }
  return SyncDirectory(options_.paths[static_cast<size_t>(index)]);
}

SwapStore::~SwapStore() {
  WaitAll().IgnoreError();
  for (aio::FileId f : files_) engine_->CloseFile(f).IgnoreError();
}

// ---------------------------------------------------------------------------
// Transfers

int64_t SwapStore::PaddedBytes(int64_t bytes) const { return AlignUp(bytes, alignment_); }

StatusOr<TensorId> SwapStore::Find(std::string_view name) const {
  auto it = by_name_.find(std::string(name));
  if (it == by_name_.end()) return Status::NotFound("swap store has no tensor '" + std::string(name) + "'");
  return it->second;
}

std::string SwapStore::DescribeRange(const Tensor& t, int64_t first_extent, int64_t count) const {
  const int64_t begin = first_extent * stripe_;
  const int64_t end = std::min(t.spec.size_bytes, (first_extent + count) * stripe_);
  return "tensor '" + t.spec.name + "' bytes [" + std::to_string(begin) + ", " + std::to_string(end) + ")";
}

StatusOr<SwapHandle> SwapStore::SwapOut(TensorId id, const void* buffer) {
  if (id < 0 || id >= tensor_count()) return Status::InvalidArgument("swap-out: no tensor id " + std::to_string(id));
  return Start(aio::IoOp::kWrite, id, 0, tensors_[static_cast<size_t>(id)].spec.size_bytes,
               static_cast<char*>(const_cast<void*>(buffer)));
}

StatusOr<SwapHandle> SwapStore::SwapOut(TensorId id, const void* buffer, const uint32_t* extent_crcs) {
  if (id < 0 || id >= tensor_count()) return Status::InvalidArgument("swap-out: no tensor id " + std::to_string(id));
  if (extent_crcs == nullptr) return Status::InvalidArgument("swap-out: null checksums");
  return Start(aio::IoOp::kWrite, id, 0, tensors_[static_cast<size_t>(id)].spec.size_bytes,
               static_cast<char*>(const_cast<void*>(buffer)), extent_crcs);
}

StatusOr<SwapHandle> SwapStore::SwapIn(TensorId id, void* buffer) {
  if (id < 0 || id >= tensor_count()) return Status::InvalidArgument("swap-in: no tensor id " + std::to_string(id));
  return Start(aio::IoOp::kRead, id, 0, tensors_[static_cast<size_t>(id)].spec.size_bytes, static_cast<char*>(buffer));
}

StatusOr<SwapHandle> SwapStore::SwapOutRange(TensorId id, int64_t offset_bytes, int64_t length_bytes,
                                             const void* buffer) {
  return Start(aio::IoOp::kWrite, id, offset_bytes, length_bytes, static_cast<char*>(const_cast<void*>(buffer)));
}

StatusOr<SwapHandle> SwapStore::SwapInRange(TensorId id, int64_t offset_bytes, int64_t length_bytes, void* buffer) {
  return Start(aio::IoOp::kRead, id, offset_bytes, length_bytes, static_cast<char*>(buffer));
}

StatusOr<SwapHandle> SwapStore::Start(aio::IoOp op, TensorId id, int64_t offset_bytes, int64_t length_bytes,
                                      char* buffer, const uint32_t* crcs) {
  const char* verb = op == aio::IoOp::kWrite ? "swap-out" : "swap-in";
  if (id < 0 || id >= tensor_count()) {
    return Status::InvalidArgument(std::string(verb) + ": no tensor id " + std::to_string(id));
  }
  Tensor& t = tensors_[static_cast<size_t>(id)];
  const int64_t size = t.spec.size_bytes;
  const int64_t end = offset_bytes + length_bytes;
  if (offset_bytes < 0 || length_bytes <= 0 || end > size || offset_bytes % stripe_ != 0 ||
      (end != size && length_bytes % stripe_ != 0)) {
    return Status::InvalidArgument(std::string(verb) + " of tensor '" + t.spec.name + "' (" + std::to_string(size) +
                                   " bytes): bad range offset " + std::to_string(offset_bytes) + " length " +
                                   std::to_string(length_bytes) +
                                   " (offset and length must be multiples of the stripe, " + std::to_string(stripe_) +
                                   " bytes, unless the range ends the tensor)");
  }
  if (buffer == nullptr || reinterpret_cast<uintptr_t>(buffer) % static_cast<uintptr_t>(alignment_) != 0) {
    return Status::InvalidArgument(std::string(verb) + " of tensor '" + t.spec.name + "': buffer is not " +
                                   std::to_string(alignment_) + "-byte aligned");
  }
  const int64_t first = offset_bytes / stripe_;
  const int64_t count = end == size ? static_cast<int64_t>(t.extents.size()) - first : length_bytes / stripe_;

  uint32_t index = 0;
  {
    std::lock_guard<std::mutex> lock(mu_);
    for (int64_t k = first; k < first + count; ++k) {
      const int32_t busy = t.busy[static_cast<size_t>(k)];
      if (busy < 0 || (op == aio::IoOp::kWrite && busy > 0)) {
        return Status::FailedPrecondition(std::string(verb) + " of " + DescribeRange(t, first, count) +
                                          ": overlaps a swap-out (or, for a swap-out, any transfer) still "
                                          "outstanding on the same range");
      }
      if (op == aio::IoOp::kRead && !t.written[static_cast<size_t>(k)]) {
        return Status::FailedPrecondition("swap-in of " + DescribeRange(t, first, count) +
                                          ": not written by this store (never swapped out, or its last "
                                          "swap-out failed)");
      }
    }
    const std::optional<uint32_t> taken = slots_.Acquire();
    if (!taken) {
      return Status::ResourceExhausted(std::string(verb) + " of tensor '" + t.spec.name +
                                       "': " + std::to_string(slots_.capacity()) +
                                       " transfers already outstanding (max_outstanding)");
    }
    index = *taken;
    for (int64_t k = first; k < first + count; ++k) {
      t.busy[static_cast<size_t>(k)] = op == aio::IoOp::kWrite ? -1 : t.busy[static_cast<size_t>(k)] + 1;
    }
    Slot& slot = slots_[index];
    slot.op = op;
    slot.tensor = id;
    slot.first_extent = first;
    slot.extent_count = count;
    slot.buffer = buffer;
  }

  // The slot is ours alone until it is released: fill it without the lock.
  // Its vectors keep the capacity of the largest transfer it has carried, so
  // the steady state does not allocate.
  Slot& slot = slots_[index];
  slot.segments.clear();
  slot.crc.clear();
  for (int64_t k = 0; k < count; ++k) {
    const Extent& e = t.extents[static_cast<size_t>(first + k)];
    char* piece = buffer + k * stripe_;
    slot.segments.push_back(aio::IoSegment{files_[static_cast<size_t>(e.file)], e.file_offset, e.length, piece});
    if (op == aio::IoOp::kWrite && options_.checksums) {
      slot.crc.push_back(crcs != nullptr ? crcs[k] : Crc32c(piece, size_t(e.length)));
    }
  }
  auto ticket = engine_->Submit(op, slot.segments);
  std::lock_guard<std::mutex> lock(mu_);
  if (!ticket.ok()) {
    for (int64_t k = first; k < first + count; ++k) {
      int32_t& busy = t.busy[static_cast<size_t>(k)];
      busy = op == aio::IoOp::kWrite ? 0 : busy - 1;
    }
    ReleaseSlot(index);
    return ticket.status().WithContext(std::string(verb) + " of " + DescribeRange(t, first, count));
  }
  slot.ticket = *ticket;
  if (op == aio::IoOp::kWrite) {
    // From here until Wait succeeds the range on disk is in flux.
    for (int64_t k = first; k < first + count; ++k) t.written[static_cast<size_t>(k)] = 0;
  }
  return SwapHandle{slots_.HandleOf(index)};
}

void SwapStore::ReleaseSlot(uint32_t index) {
  slots_[index].ticket = {};
  slots_.Release(index);
}

uint32_t SwapStore::SlotOf(SwapHandle handle, const char* caller) const {
  const std::optional<uint32_t> index = slots_.Find(handle.id);
  ZINF_CHECK_MSG(index.has_value() && slots_[*index].ticket.valid(),
                 (std::string("SwapStore::") + caller + " on an unknown or spent handle").c_str());
  return *index;
}

Status SwapStore::Wait(SwapHandle handle) {
  uint32_t index = 0;
  aio::IoTicket ticket;
  {
    std::lock_guard<std::mutex> lock(mu_);
    index = SlotOf(handle, "Wait");
    ticket = slots_[index].ticket;
    slots_[index].ticket = {};  // a second Wait on this handle is caught in SlotOf
  }
  Slot& slot = slots_[index];
  Tensor& t = tensors_[static_cast<size_t>(slot.tensor)];
  const char* verb = slot.op == aio::IoOp::kWrite ? "swap-out" : "swap-in";
  Status status = engine_->Wait(ticket);
  if (!status.ok()) {
    status = status.WithContext(std::string(verb) + " of " + DescribeRange(t, slot.first_extent, slot.extent_count));
  } else if (slot.op == aio::IoOp::kRead && options_.checksums) {
    // The range is pinned against writers (busy > 0), so its crcs are stable.
    for (int64_t k = 0; k < slot.extent_count; ++k) {
      const size_t e_index = static_cast<size_t>(slot.first_extent + k);
      const Extent& e = t.extents[e_index];
      const uint32_t actual = Crc32c(slot.buffer + k * stripe_, static_cast<size_t>(e.length));
      const uint32_t expected = t.crc[e_index];
      if (actual != expected) {
        status = Status::Corruption("swap-in of tensor '" + t.spec.name + "': crc32c mismatch in " +
                                    file_paths_[static_cast<size_t>(e.file)] + " offset " +
                                    std::to_string(e.file_offset) + " length " + std::to_string(e.length) +
                                    " (tensor bytes from " + std::to_string(int64_t(e_index) * stripe_) + "; written " +
                                    Hex(expected) + ", read " + Hex(actual) + ")");
        break;
      }
    }
  }
  std::lock_guard<std::mutex> lock(mu_);
  for (int64_t k = 0; k < slot.extent_count; ++k) {
    const size_t e = static_cast<size_t>(slot.first_extent + k);
    if (slot.op == aio::IoOp::kWrite) {
      t.busy[e] = 0;
      if (status.ok()) {
        t.written[e] = 1;
        if (options_.checksums) t.crc[e] = slot.crc[static_cast<size_t>(k)];
      }
    } else {
      --t.busy[e];
    }
  }
  ReleaseSlot(index);
  return status;
}

bool SwapStore::IsDone(SwapHandle handle) const {
  aio::IoTicket ticket;
  {
    std::lock_guard<std::mutex> lock(mu_);
    ticket = slots_[SlotOf(handle, "IsDone")].ticket;
  }
  return engine_->IsDone(ticket);
}

Status SwapStore::WaitAll() {
  std::vector<SwapHandle> pending;
  {
    std::lock_guard<std::mutex> lock(mu_);
    for (uint32_t i = 0; i < static_cast<uint32_t>(slots_.capacity()); ++i) {
      if (slots_.in_use(i) && slots_[i].ticket.valid()) pending.push_back(SwapHandle{slots_.HandleOf(i)});
    }
  }
  Status first;
  for (SwapHandle h : pending) {
    Status s = Wait(h);
    if (first.ok() && !s.ok()) first = s;
  }
  return first;
}

bool SwapStore::IsWritten(TensorId id) const {
  ZINF_CHECK(id >= 0 && id < tensor_count());
  std::lock_guard<std::mutex> lock(mu_);
  const Tensor& t = tensors_[static_cast<size_t>(id)];
  return std::all_of(t.written.begin(), t.written.end(), [](uint8_t w) { return w != 0; });
}

std::string NvmePathContext(std::string_view section, const std::vector<std::string>& paths) {
  std::string list;
  for (const std::string& p : paths) list += (list.empty() ? "" : ", ") + p;
  return "swap files on zero_optimization." + std::string(section) + ".nvme_path [" + list + "]";
}

StatusOr<FileLock> LockSwapDirectory(const std::string& dir, int rank) {
  ZINF_RETURN_IF_ERROR(MakeDirectories(dir));
  StatusOr<FileLock> lock = FileLock::Acquire(JoinPath(dir, "zinf-r" + std::to_string(rank) + ".lock"));
  if (!lock.ok()) return lock.status().WithContext("swap directory " + dir + " is in use; give each run its own");
  return lock;
}

}  // namespace zinf::swap
