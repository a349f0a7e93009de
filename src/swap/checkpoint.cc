#include "swap/checkpoint.h"

#include <charconv>
#include <cinttypes>
#include <cstdio>
#include <cstring>
#include <limits>
#include <set>
#include <sstream>

#include <nlohmann/json.hpp>

#include "core/crc32c.h"
#include "core/fs.h"
#include "core/log.h"
#include "core/units.h"

namespace zinf::swap {
namespace {

constexpr char kManifestName[] = "manifest";
constexpr char kManifestMagic[] = "zinf-checkpoint";
constexpr char kLatestMagic[] = "zinf-latest";

std::string Hex32(uint32_t v) {
  char b[12];
  std::snprintf(b, sizeof(b), "%08" PRIx32, v);
  return b;
}

// Sums a byte stream per chunk of `chunk_bytes`, whatever the sizes of the
// pieces it is fed in, and over the whole stream.
class ChunkSummer {
 public:
  explicit ChunkSummer(int64_t chunk_bytes) : chunk_(chunk_bytes) {}

  // `on_chunk(index, begin, length, crc)` runs for every chunk completed;
  // its first error stops the feed and is returned.
  template <typename F>
  Status Feed(const char* data, int64_t n, F&& on_chunk) {
    whole_ = Crc32cExtend(whole_, data, static_cast<size_t>(n));
    while (n > 0) {
      const int64_t take = std::min(n, chunk_ - filled_);
      current_ = Crc32cExtend(current_, data, static_cast<size_t>(take));
      filled_ += take;
      data += take;
      n -= take;
      if (filled_ == chunk_) ZINF_RETURN_IF_ERROR(Emit(on_chunk));
    }
    return Status::Ok();
  }
  // Completes a last, shorter chunk.
  template <typename F>
  Status Finish(F&& on_chunk) {
    return filled_ > 0 ? Emit(on_chunk) : Status::Ok();
  }
  uint32_t whole() const { return whole_; }

 private:
  template <typename F>
  Status Emit(F&& on_chunk) {
    Status s = on_chunk(index_, index_ * chunk_, filled_, current_);
    ++index_;
    filled_ = 0;
    current_ = 0;
    return s;
  }

  int64_t chunk_;
  int64_t index_ = 0;
  int64_t filled_ = 0;
  uint32_t current_ = 0;
  uint32_t whole_ = 0;
};

// Writes `contents` (zero-padded to the alignment) to a new file `path`
// through the engine, then syncs and closes it.
Status WriteSmallFile(aio::IoEngine& engine, aio::PinnedPool& pool, const std::string& path,
                      std::string_view contents) {
  aio::OpenOptions create;
  create.create = true;
  create.truncate = true;
  ZINF_ASSIGN_OR_RETURN(aio::FileId fid, engine.OpenFile(path, create));
  const int64_t align = std::max<int64_t>(pool.alignment_bytes(), engine.file_info(fid).alignment_bytes);
  const int64_t piece_max = AlignDown(pool.buffer_bytes(), align);
  Status s;
  if (piece_max <= 0) {
    s = Status::InvalidArgument("pinned pool buffers (" + std::to_string(pool.buffer_bytes()) +
                                " bytes) are smaller than the file alignment " + std::to_string(align));
  }
  aio::PinnedBuffer buffer;
  if (s.ok()) buffer = pool.Acquire();
  const int64_t total = static_cast<int64_t>(contents.size());
  for (int64_t pos = 0; s.ok() && pos < total; pos += piece_max) {
    const int64_t n = std::min(piece_max, total - pos);
    const int64_t padded = AlignUp(n, align);
    std::memcpy(buffer.data(), contents.data() + pos, static_cast<size_t>(n));
    std::memset(buffer.data() + n, 0, static_cast<size_t>(padded - n));
    s = engine.Write(fid, pos, buffer.data(), padded);
  }
  buffer.Reset();
  if (s.ok()) s = engine.Sync(fid);
  Status c = engine.CloseFile(fid);
  if (s.ok()) s = c;
  return s;
}

// Reads all of `path` (whose size must be a multiple of the alignment).
StatusOr<std::string> ReadSmallFile(aio::IoEngine& engine, aio::PinnedPool& pool, const std::string& path) {
  aio::OpenOptions ro;
  ro.read_only = true;
  ZINF_ASSIGN_OR_RETURN(aio::FileId fid, engine.OpenFile(path, ro));
  const int64_t align = std::max<int64_t>(pool.alignment_bytes(), engine.file_info(fid).alignment_bytes);
  auto size = engine.FileSize(fid);
  Status s = size.status();
  std::string out;
  if (s.ok() && *size % align != 0) {
    s = Status::Corruption(path + " offset " + std::to_string(AlignDown(*size, align)) + ": file is " +
                           std::to_string(*size) + " bytes, not a multiple of " + std::to_string(align) +
                           " (truncated or not written by zinf)");
  }
  const int64_t piece_max = AlignDown(pool.buffer_bytes(), align);
  if (s.ok() && piece_max <= 0) s = Status::InvalidArgument("pinned pool buffers are smaller than the alignment");
  if (s.ok()) {
    aio::PinnedBuffer buffer = pool.Acquire();
    out.reserve(static_cast<size_t>(*size));
    for (int64_t pos = 0; s.ok() && pos < *size; pos += piece_max) {
      const int64_t n = std::min(piece_max, *size - pos);
      s = engine.Read(fid, pos, buffer.data(), n);
      if (s.ok()) out.append(buffer.data(), static_cast<size_t>(n));
    }
  }
  Status c = engine.CloseFile(fid);
  if (s.ok()) s = c;
  if (!s.ok()) return s;
  return out;
}

bool IsPlainFileName(const std::string& name) {
  return !name.empty() && name != "." && name != ".." && name.find('/') == std::string::npos;
}

}  // namespace

int64_t BlobRef::size_bytes() const {
  if (store != nullptr) return store->tensor(tensor).size_bytes;
  return static_cast<int64_t>(ram.size());
}

// ---------------------------------------------------------------------------
// Save

namespace {

struct Saved {
  std::string file;
  int64_t size = 0;
  uint32_t crc = 0;
  std::vector<uint32_t> chunk_crc;
};

// Writes one blob to `path`, double-buffered when the pool has a second
// buffer free: the next piece is filled while the last one is written.
Status SaveBlob(aio::IoEngine& engine, aio::PinnedPool& pool, const BlobRef& blob, const std::string& path,
                int64_t chunk_bytes, Saved* saved, const std::function<void(int64_t bytes)>& written) {
  const int64_t size = blob.size_bytes();
  int64_t granule = pool.alignment_bytes();
  if (blob.store != nullptr) {
    granule = blob.store->stripe_bytes();
    if (pool.alignment_bytes() % blob.store->alignment_bytes() != 0) {
      return Status::InvalidArgument("checkpoint blob '" + blob.name + "': pinned pool alignment " +
                                     std::to_string(pool.alignment_bytes()) + " is below the swap store's " +
                                     std::to_string(blob.store->alignment_bytes()));
    }
    if (!blob.store->IsWritten(blob.tensor)) {
      return Status::FailedPrecondition("checkpoint blob '" + blob.name + "': swap tensor '" +
                                        blob.store->tensor(blob.tensor).name + "' was never fully swapped out");
    }
  }
  const int64_t piece_max = AlignDown(pool.buffer_bytes(), granule);
  if (piece_max <= 0) {
    return Status::InvalidArgument("checkpoint blob '" + blob.name + "': pinned pool buffers (" +
                                   std::to_string(pool.buffer_bytes()) + " bytes) are smaller than " +
                                   std::to_string(granule) + " bytes (alignment or swap stripe)");
  }

  aio::OpenOptions create;
  create.create = true;
  create.truncate = true;
  ZINF_ASSIGN_OR_RETURN(aio::FileId fid, engine.OpenFile(path, create));
  const int64_t align = std::max<int64_t>(pool.alignment_bytes(), engine.file_info(fid).alignment_bytes);

  aio::PinnedBuffer buffers[2];
  aio::IoTicket tickets[2];
  buffers[0] = pool.Acquire();
  if (auto second = pool.TryAcquire(); second.ok()) buffers[1] = std::move(second).value();
  const int nbuf = buffers[1] ? 2 : 1;

  ChunkSummer summer(chunk_bytes);
  auto record = [&](int64_t, int64_t, int64_t, uint32_t crc) {
    saved->chunk_crc.push_back(crc);
    return Status::Ok();
  };
  Status s;
  int which = 0;
  for (int64_t pos = 0; s.ok() && pos < size; pos += piece_max, which = (which + 1) % nbuf) {
    if (tickets[which].valid()) {
      s = engine.Wait(tickets[which]);
      tickets[which] = {};
      if (!s.ok()) break;
    }
    char* buf = buffers[which].data();
    const int64_t n = std::min(piece_max, size - pos);
    if (blob.store == nullptr) {
      std::memcpy(buf, blob.ram.data() + pos, static_cast<size_t>(n));
    } else {
      auto h = blob.store->SwapInRange(blob.tensor, pos, n, buf);
      s = h.ok() ? blob.store->Wait(*h) : h.status();
      if (!s.ok()) break;
    }
    const int64_t padded = AlignUp(n, align);
    std::memset(buf + n, 0, static_cast<size_t>(padded - n));
    s = summer.Feed(buf, n, record);
    if (!s.ok()) break;
    auto t = engine.Submit(aio::IoOp::kWrite, aio::IoSegment{fid, pos, padded, buf});
    if (!t.ok()) {
      s = t.status();
      break;
    }
    tickets[which] = *t;
    if (written) written(n);
  }
  for (aio::IoTicket& t : tickets) {
    if (!t.valid()) continue;
    Status w = engine.Wait(t);
    if (s.ok()) s = w;
  }
  if (s.ok()) s = summer.Finish(record);
  if (s.ok()) s = engine.Sync(fid);
  Status c = engine.CloseFile(fid);
  if (s.ok()) s = c;
  if (!s.ok()) return s.WithContext("saving checkpoint blob '" + blob.name + "' to " + path);
  saved->size = size;
  saved->crc = summer.whole();
  return Status::Ok();
}

Status WriteLatest(aio::IoEngine& engine, aio::PinnedPool& pool, const std::string& root, const std::string& name,
                   const SaveOptions& options) {
  const std::string line =
      std::string(kLatestMagic) + " 1 " + name + " " + Hex32(Crc32c(name.data(), name.size())) + "\n";
  const std::string final_path = JoinPath(root, kLatestFileName);
  const std::string tmp = final_path + ".tmp-" + RandomHex(8);
  Status s = WriteSmallFile(engine, pool, tmp, line);
  if (s.ok()) s = RenamePath(tmp, final_path);
  if (!s.ok()) {
    RemoveFile(tmp).IgnoreError();
    return s.WithContext("updating " + final_path);
  }
  ZINF_RETURN_IF_ERROR(SyncDirectory(root));
  if (options.after_step) options.after_step(final_path);
  return Status::Ok();
}

}  // namespace

Status SaveCheckpoint(aio::IoEngine& engine, aio::PinnedPool& pool, const std::string& dir,
                      const std::map<std::string, std::string>& metadata, const std::vector<BlobRef>& blobs,
                      const SaveOptions& options) {
  if (dir.empty()) return Status::InvalidArgument("checkpoint: empty directory name");
  const std::string root = ParentPath(dir);
  const std::string base = BaseName(dir);
  const std::string target = JoinPath(root, base);
  if (base == kLatestFileName || base.find(".tmp-") != std::string::npos) {
    return Status::InvalidArgument("checkpoint: '" + base + "' is reserved as a checkpoint name");
  }
  std::set<std::string> names;
  for (const BlobRef& b : blobs) {
    if (b.name.empty()) return Status::InvalidArgument("checkpoint " + target + ": a blob has an empty name");
    if (!names.insert(b.name).second) {
      return Status::InvalidArgument("checkpoint " + target + ": blob name '" + b.name + "' is given twice");
    }
    if (b.store != nullptr && (b.tensor < 0 || b.tensor >= b.store->tensor_count())) {
      return Status::InvalidArgument("checkpoint " + target + ": blob '" + b.name + "' names no swap tensor");
    }
  }
  const int64_t chunk_bytes =
      options.chunk_bytes > 0 ? options.chunk_bytes : std::max(pool.alignment_bytes(), pool.buffer_bytes());
  if (PathExists(target)) {
    if (!options.replace_orphan) {
      return Status::FailedPrecondition("checkpoint " + target + " already exists; checkpoints are never overwritten");
    }
    StatusOr<std::string> latest = ResolveLatest(engine, pool, root);
    if (latest.ok() && *latest == target) {
      return Status::FailedPrecondition("checkpoint " + target +
                                        " exists and is the latest checkpoint; it is not overwritten");
    }
    if (!latest.ok() && latest.status().code() != StatusCode::kNotFound) return latest.status();
    Log("swap").warn(
        "replacing checkpoint {}: `latest` does not name it (left by a run that stopped before "
        "finishing its save)",
        target);
    ZINF_RETURN_IF_ERROR(RemoveTree(target));
  }
  ZINF_RETURN_IF_ERROR(MakeDirectories(root));

  // A save that crashed left its temporary directory behind; it was never
  // renamed into place, so nothing refers to it.
  ZINF_ASSIGN_OR_RETURN(std::vector<std::string> entries, ListDirectory(root));
  for (const std::string& e : entries) {
    if (e.rfind(base + ".tmp-", 0) == 0) {
      Log("swap").warn("removing {} left by a checkpoint save that did not finish", JoinPath(root, e));
      ZINF_RETURN_IF_ERROR(RemoveTree(JoinPath(root, e)));
    }
  }

  const std::string tmp = target + ".tmp-" + RandomHex(8);
  ZINF_RETURN_IF_ERROR(MakeDirectory(tmp));
  auto fail = [&](Status s) {
    RemoveTree(tmp).IgnoreError();
    return s;
  };

  nlohmann::json manifest;
  manifest["format_version"] = kCheckpointFormatVersion;
  manifest["chunk_bytes"] = chunk_bytes;
  manifest["metadata"] = nlohmann::json::object();
  for (const auto& [k, v] : metadata) manifest["metadata"][k] = v;
  // Progress in blob bytes; the total is reported once the checkpoint is in
  // place, so a reader of the bar never sees 100% for a save not yet done.
  int64_t total_bytes = 0, done_bytes = 0;
  for (const BlobRef& b : blobs) total_bytes += b.size_bytes();
  std::function<void(int64_t)> written;
  if (options.progress) {
    options.progress(0, total_bytes);
    written = [&](int64_t n) {
      done_bytes += n;
      options.progress(std::min(done_bytes, total_bytes - 1), total_bytes);
    };
  }
  manifest["blobs"] = nlohmann::json::array();
  for (size_t i = 0; i < blobs.size(); ++i) {
    char file[32];
    std::snprintf(file, sizeof(file), "blob-%05zu.bin", i);
    const std::string path = JoinPath(tmp, file);
    Saved saved;
    Status s = SaveBlob(engine, pool, blobs[i], path, chunk_bytes, &saved, written);
    if (!s.ok()) return fail(s);
    if (options.after_step) options.after_step(path);
    nlohmann::json b;
    b["name"] = blobs[i].name;
    b["file"] = file;
    b["size_bytes"] = saved.size;
    b["crc32c"] = saved.crc;
    b["chunk_crc32c"] = saved.chunk_crc;
    manifest["blobs"].push_back(std::move(b));
  }

  std::string body;
  try {
    body = manifest.dump(1);
  } catch (const nlohmann::json::exception& e) {
    return fail(Status::InvalidArgument("checkpoint " + target + ": metadata or a blob name is not valid UTF-8 (" +
                                        e.what() + ")"));
  }
  body.push_back('\n');
  const std::string text = std::string(kManifestMagic) + " " + std::to_string(kCheckpointFormatVersion) + " " +
                           std::to_string(body.size()) + " " + Hex32(Crc32c(body.data(), body.size())) + "\n" + body;
  const std::string manifest_path = JoinPath(tmp, kManifestName);
  Status s = WriteSmallFile(engine, pool, manifest_path, text);
  if (!s.ok()) return fail(s.WithContext("writing checkpoint manifest " + manifest_path));
  if (options.after_step) options.after_step(manifest_path);
  s = SyncDirectory(tmp);
  if (s.ok()) s = RenamePath(tmp, target);
  if (!s.ok()) return fail(s);
  ZINF_RETURN_IF_ERROR(SyncDirectory(root));
  if (options.after_step) options.after_step(target);
  if (options.update_latest) ZINF_RETURN_IF_ERROR(WriteLatest(engine, pool, root, base, options));
  if (options.progress) options.progress(total_bytes, total_bytes);
  Log("swap").info("saved checkpoint {} ({} blobs)", target, blobs.size());
  return Status::Ok();
}

StatusOr<std::string> ResolveLatest(aio::IoEngine& engine, aio::PinnedPool& pool, const std::string& root) {
  const std::string path = JoinPath(root, kLatestFileName);
  if (!PathExists(path)) return Status::NotFound("no checkpoint pointer " + path);
  ZINF_ASSIGN_OR_RETURN(std::string text, ReadSmallFile(engine, pool, path));
  const size_t nl = text.find('\n');
  std::istringstream in(text.substr(0, nl == std::string::npos ? 0 : nl));
  std::string magic, version, name, crc;
  in >> magic >> version >> name >> crc;
  if (nl == std::string::npos || magic != kLatestMagic || version != "1" || !IsPlainFileName(name) ||
      crc != Hex32(Crc32c(name.data(), name.size()))) {
    return Status::Corruption(path + " offset 0: damaged checkpoint pointer");
  }
  return JoinPath(root, name);
}

// ---------------------------------------------------------------------------
// Load

StatusOr<CheckpointReader> CheckpointReader::Open(aio::IoEngine& engine, aio::PinnedPool& pool,
                                                  const std::string& dir) {
  CheckpointReader r(engine, pool);
  r.dir_ = dir;
  if (!PathExists(dir)) return Status::NotFound("checkpoint directory " + dir + " does not exist");
  const std::string manifest_path = JoinPath(dir, kManifestName);
  if (!PathExists(manifest_path)) {
    return Status::NotFound("checkpoint " + dir + " has no manifest: not a checkpoint, or a save that did not finish");
  }
  ZINF_ASSIGN_OR_RETURN(std::string text, ReadSmallFile(engine, pool, manifest_path));
  const size_t nl = text.find('\n');
  if (nl == std::string::npos || nl > 200) {
    return Status::Corruption(manifest_path + " offset 0: no manifest header line (empty or damaged file)");
  }
  std::istringstream in(text.substr(0, nl));
  std::string magic, crc_hex;
  int version = 0;
  int64_t body_bytes = -1;
  in >> magic >> version >> body_bytes >> crc_hex;
  if (magic != kManifestMagic) {
    return Status::Corruption(manifest_path + " offset 0: not a zinf checkpoint manifest");
  }
  if (version != kCheckpointFormatVersion) {
    return Status::FailedPrecondition(manifest_path + ": checkpoint format version " + std::to_string(version) +
                                      "; this build reads version " + std::to_string(kCheckpointFormatVersion));
  }
  const int64_t body_offset = static_cast<int64_t>(nl) + 1;
  if (body_bytes < 0 || body_bytes > static_cast<int64_t>(text.size()) - body_offset) {  // no overflow
    return Status::Corruption(manifest_path + " offset " + std::to_string(body_offset) + ": manifest body of " +
                              std::to_string(body_bytes) + " bytes announced, file holds " +
                              std::to_string(static_cast<int64_t>(text.size()) - body_offset) + " (truncated)");
  }
  const std::string_view body(text.data() + body_offset, static_cast<size_t>(body_bytes));
  const uint32_t actual = Crc32c(body.data(), body.size());
  if (Hex32(actual) != crc_hex) {
    return Status::Corruption(manifest_path + " offset " + std::to_string(body_offset) + " length " +
                              std::to_string(body_bytes) + ": manifest crc32c mismatch (header " + crc_hex +
                              ", computed " + Hex32(actual) + ")");
  }
  try {
    const nlohmann::json m = nlohmann::json::parse(body);
    if (m.at("format_version").get<int>() != kCheckpointFormatVersion) {
      return Status::FailedPrecondition(manifest_path + ": body says format version " +
                                        std::to_string(m.at("format_version").get<int>()));
    }
    r.chunk_bytes_ = m.at("chunk_bytes").get<int64_t>();
    if (r.chunk_bytes_ <= 0) return Status::Corruption(manifest_path + ": chunk_bytes must be positive");
    for (const auto& [k, v] : m.at("metadata").items()) r.metadata_[k] = v.get<std::string>();
    std::set<std::string> names;
    for (const auto& b : m.at("blobs")) {
      BlobInfo info;
      info.name = b.at("name").get<std::string>();
      const std::string file = b.at("file").get<std::string>();
      if (!IsPlainFileName(file)) return Status::Corruption(manifest_path + ": bad blob file name '" + file + "'");
      info.file = JoinPath(dir, file);
      info.size_bytes = b.at("size_bytes").get<int64_t>();
      info.crc32c = b.at("crc32c").get<uint32_t>();
      info.chunk_crc32c = b.at("chunk_crc32c").get<std::vector<uint32_t>>();
      if (info.size_bytes > std::numeric_limits<int64_t>::max() - r.chunk_bytes_) {
        return Status::Corruption(manifest_path + ": blob '" + info.name + "' size out of range");
      }
      const int64_t chunks = (info.size_bytes + r.chunk_bytes_ - 1) / r.chunk_bytes_;
      if (info.size_bytes < 0 || static_cast<int64_t>(info.chunk_crc32c.size()) != chunks ||
          !names.insert(info.name).second) {
        return Status::Corruption(manifest_path + ": inconsistent entry for blob '" + info.name + "'");
      }
      r.blobs_.push_back(std::move(info));
    }
  } catch (const nlohmann::json::exception& e) {
    return Status::Corruption(manifest_path + ": manifest body is not a valid checkpoint manifest (" + e.what() + ")");
  }

  // Every file there, each exactly as long as its padded blob.
  for (const BlobInfo& info : r.blobs_) {
    if (!PathExists(info.file)) {
      return Status::Corruption("checkpoint " + dir + ": blob file " + info.file + " (blob '" + info.name +
                                "') is missing");
    }
    aio::OpenOptions ro;
    ro.read_only = true;
    ZINF_ASSIGN_OR_RETURN(aio::FileId fid, engine.OpenFile(info.file, ro));
    const int64_t align = std::max<int64_t>(pool.alignment_bytes(), engine.file_info(fid).alignment_bytes);
    auto size = engine.FileSize(fid);
    ZINF_RETURN_IF_ERROR(engine.CloseFile(fid));
    if (!size.ok()) return size.status();
    const int64_t want = AlignUp(info.size_bytes, align);
    if (*size != want) {
      return Status::Corruption(info.file + " offset " + std::to_string(std::min(*size, want)) + ": file is " +
                                std::to_string(*size) + " bytes, the manifest says " + std::to_string(want) +
                                " (blob '" + info.name + "', " + (*size < want ? "truncated)" : "has extra bytes)"));
    }
  }
  return r;
}

StatusOr<const BlobInfo*> CheckpointReader::Find(const std::string& name) const {
  for (const BlobInfo& b : blobs_) {
    if (b.name == name) return &b;
  }
  return Status::NotFound("checkpoint " + dir_ + " has no blob '" + name + "'");
}

Status CheckpointReader::Stream(const BlobInfo& info, int64_t granule_bytes,
                                const std::function<Status(int64_t, const char*, int64_t)>& sink) const {
  aio::OpenOptions ro;
  ro.read_only = true;
  ZINF_ASSIGN_OR_RETURN(aio::FileId fid, engine_->OpenFile(info.file, ro));
  const int64_t align = std::max<int64_t>(pool_->alignment_bytes(), engine_->file_info(fid).alignment_bytes);
  const int64_t granule = std::max(granule_bytes, align);
  const int64_t piece_max = AlignDown(pool_->buffer_bytes(), granule);
  Status s;
  if (piece_max <= 0) {
    s = Status::InvalidArgument("checkpoint " + dir_ + ": pinned pool buffers (" +
                                std::to_string(pool_->buffer_bytes()) + " bytes) are smaller than " +
                                std::to_string(granule) + " bytes (alignment or swap stripe)");
  }
  ChunkSummer summer(chunk_bytes_);
  auto check = [&](int64_t index, int64_t begin, int64_t length, uint32_t crc) {
    const uint32_t want = info.chunk_crc32c[static_cast<size_t>(index)];
    if (crc == want) return Status::Ok();
    return Status::Corruption(info.file + " offset " + std::to_string(begin) + " length " + std::to_string(length) +
                              ": crc32c mismatch in blob '" + info.name + "' (manifest " + Hex32(want) + ", read " +
                              Hex32(crc) + ")");
  };
  if (s.ok()) {
    aio::PinnedBuffer buffer = pool_->Acquire();
    for (int64_t pos = 0; s.ok() && pos < info.size_bytes; pos += piece_max) {
      const int64_t n = std::min(piece_max, info.size_bytes - pos);
      s = engine_->Read(fid, pos, buffer.data(), AlignUp(n, align));
      if (s.ok()) s = summer.Feed(buffer.data(), n, check);
      if (s.ok() && sink) s = sink(pos, buffer.data(), n);
      if (s.ok() && progress_ != nullptr) (*progress_)(progress_done_ += n, progress_total_);
    }
  }
  if (s.ok()) s = summer.Finish(check);
  if (s.ok() && summer.whole() != info.crc32c) {
    s = Status::Corruption(info.file + " offset 0 length " + std::to_string(info.size_bytes) + ": crc32c of blob '" +
                           info.name + "' is " + Hex32(summer.whole()) + ", manifest says " + Hex32(info.crc32c));
  }
  Status c = engine_->CloseFile(fid);
  if (s.ok()) s = c;
  return s.WithContext("loading checkpoint " + dir_);
}

Status CheckpointReader::VerifyAll() const {
  for (const BlobInfo& b : blobs_) ZINF_RETURN_IF_ERROR(Stream(b, 0, nullptr));
  return Status::Ok();
}

Status CheckpointReader::ReadBlob(const BlobRef& target) const {
  ZINF_ASSIGN_OR_RETURN(const BlobInfo* info, Find(target.name));
  if (target.size_bytes() != info->size_bytes) {
    return Status::InvalidArgument("checkpoint " + dir_ + ": blob '" + target.name + "' holds " +
                                   std::to_string(info->size_bytes) + " bytes; its destination holds " +
                                   std::to_string(target.size_bytes()));
  }
  if (target.store == nullptr) {
    std::byte* dst = target.ram.data();
    return Stream(*info, 0, [dst](int64_t offset, const char* data, int64_t n) {
      std::memcpy(dst + offset, data, static_cast<size_t>(n));
      return Status::Ok();
    });
  }
  SwapStore* store = target.store;
  const TensorId id = target.tensor;
  return Stream(*info, store->stripe_bytes(), [store, id](int64_t offset, const char* data, int64_t n) {
    ZINF_ASSIGN_OR_RETURN(SwapHandle h, store->SwapOutRange(id, offset, n, data));
    return store->Wait(h);
  });
}

Status CheckpointReader::ReadBlobPieces(
    const std::string& name, const std::function<Status(int64_t offset, const char* data, int64_t n)>& sink) const {
  ZINF_ASSIGN_OR_RETURN(const BlobInfo* info, Find(name));
  return Stream(*info, 0, sink);
}

Status CheckpointReader::Restore(const std::vector<BlobRef>& targets, const ProgressFn& progress) const {
  for (const BlobRef& t : targets) {
    ZINF_ASSIGN_OR_RETURN(const BlobInfo* info, Find(t.name));
    if (t.size_bytes() != info->size_bytes) {
      return Status::InvalidArgument("checkpoint " + dir_ + ": blob '" + t.name + "' holds " +
                                     std::to_string(info->size_bytes) + " bytes; its destination holds " +
                                     std::to_string(t.size_bytes()));
    }
  }
  progress_done_ = progress_total_ = 0;
  if (progress) {
    for (const BlobInfo& b : blobs_) progress_total_ += b.size_bytes;
    for (const BlobRef& t : targets) progress_total_ += t.size_bytes();
    progress(0, progress_total_);
    progress_ = &progress;
  }
  Status s = VerifyAll();
  for (size_t i = 0; s.ok() && i < targets.size(); ++i) s = ReadBlob(targets[i]);
  progress_ = nullptr;
  return s;
}

StatusOr<std::map<std::string, std::string>> LoadCheckpoint(aio::IoEngine& engine, aio::PinnedPool& pool,
                                                            const std::string& dir,
                                                            const std::vector<BlobRef>& targets) {
  ZINF_ASSIGN_OR_RETURN(CheckpointReader reader, CheckpointReader::Open(engine, pool, dir));
  ZINF_RETURN_IF_ERROR(reader.Restore(targets));
  return reader.metadata();
}

StatusOr<int64_t> ManifestInteger(const std::string& dir, const std::map<std::string, std::string>& metadata,
                                  const std::string& key, int64_t min_value) {
  auto it = metadata.find(key);
  if (it == metadata.end()) return Status::Corruption("checkpoint " + dir + ": manifest lacks '" + key + "'");
  const std::string& v = it->second;
  int64_t x = 0;
  const auto [end, err] = std::from_chars(v.data(), v.data() + v.size(), x);
  if (v.empty() || err != std::errc() || end != v.data() + v.size()) {
    return Status::Corruption("checkpoint " + dir + ": '" + key + "' is not an integer: '" + v + "'");
  }
  if (x < min_value) {
    return Status::Corruption("checkpoint " + dir + ": '" + key + "' is " + v + ", expected at least " +
                              std::to_string(min_value));
  }
  return x;
}

}  // namespace zinf::swap
