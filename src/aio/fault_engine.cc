#include "aio/fault_engine.h"

#include <fcntl.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>

#include "core/units.h"
#include "zinf/status.h"

namespace zinf::aio {

double FaultHash(uint64_t seed, std::initializer_list<uint64_t> values) {
  uint64_t h = seed ^ 0x9e3779b97f4a7c15ull;
  auto mix = [](uint64_t z) {
    z = (z ^ (z >> 30)) * 0xbf58476d1ce4e5b9ull;
    z = (z ^ (z >> 27)) * 0x94d049bb133111ebull;
    return z ^ (z >> 31);
  };
  for (uint64_t v : values) h = mix(h + 0x9e3779b97f4a7c15ull + v);
  h = mix(h);
  return static_cast<double>(h >> 11) * 0x1.0p-53;
}

bool FaultInjector::Applies(const FileInfo& file) const {
  return enabled_.load() && (options_.path_filter.empty() || file.path.find(options_.path_filter) != std::string::npos);
}

CompletionHook::Decision FaultInjector::OnCompletion(const Piece& piece, const FileInfo& file, int64_t res) {
  Decision d{res, 0};
  // Only a piece the kernel fully served is turned into a fault: real errors
  // and real short transfers pass through untouched.
  if (res != piece.remaining() || !Applies(file)) return d;
  const auto& o = options_;
  const double u = FaultHash(o.seed, {epoch_.load(), static_cast<uint64_t>(piece.op), 1,
                                      static_cast<uint64_t>(piece.file), static_cast<uint64_t>(piece.next_offset()),
                                      static_cast<uint64_t>(piece.remaining()), static_cast<uint64_t>(piece.retries)});
  double edge = o.eio_rate;
  if (u < edge) {
    eio_.fetch_add(1);
    d.res = -EIO;
    return d;
  }
  if (u < (edge += o.eagain_rate)) {
    eagain_.fetch_add(1);
    d.res = -EAGAIN;
    return d;
  }
  if (u < (edge += o.eintr_rate)) {
    eintr_.fetch_add(1);
    d.res = -EINTR;
    return d;
  }
  if (u < (edge += o.short_rate)) {
    // A block-aligned part, as O_DIRECT short transfers are; at least one block.
    const int64_t blocks = piece.remaining() / file.alignment_bytes;
    if (blocks >= 2) {
      const double v = FaultHash(o.seed, {epoch_.load(), 2, static_cast<uint64_t>(piece.next_offset())});
      d.res = (1 + static_cast<int64_t>(v * static_cast<double>(blocks - 1))) * file.alignment_bytes;
      short_.fetch_add(1);
    }
    return d;
  }
  if (u < (edge += o.delay_rate)) {
    const double v = FaultHash(o.seed, {epoch_.load(), 3, static_cast<uint64_t>(piece.next_offset())});
    d.delay_rounds = 1 + static_cast<int>(v * std::max(o.max_delay_rounds, 1));
    delayed_.fetch_add(1);
  }
  return d;
}

FaultCounts FaultInjector::counts() const {
  FaultCounts c;
  c.eio = eio_.load();
  c.short_io = short_.load();
  c.eagain = eagain_.load();
  c.eintr = eintr_.load();
  c.delayed = delayed_.load();
  c.torn_writes = torn_.load();
  c.crash_dropped = crash_dropped_.load();
  c.crash_kept = crash_kept_.load();
  c.crash_torn = crash_torn_.load();
  return c;
}

StatusOr<std::unique_ptr<FaultyEngine>> FaultyEngine::Create(const IoEngineOptions& inner, const FaultOptions& faults) {
  const double sum = faults.eio_rate + faults.short_rate + faults.eagain_rate + faults.eintr_rate + faults.delay_rate;
  if (sum > 1.0 || faults.torn_write_rate > 1.0 || faults.crash_keep_rate + faults.crash_tear_rate > 1.0) {
    return Status::InvalidArgument("fault rates must be probabilities whose sums stay at most 1");
  }
  std::unique_ptr<FaultyEngine> engine(new FaultyEngine());
  engine->injector_ = std::make_shared<FaultInjector>(faults);
  IoEngineOptions options = inner;
  options.completion_hook = engine->injector_;
  ZINF_ASSIGN_OR_RETURN(engine->inner_, CreateIoEngine(options));
  engine->name_ = "faulty(" + std::string(engine->inner_->name()) + ")";
  return engine;
}

StatusOr<FileId> FaultyEngine::OpenFile(const std::string& path, const OpenOptions& open) {
  ZINF_ASSIGN_OR_RETURN(FileId id, inner_->OpenFile(path, open));
  const int fd = ::open(path.c_str(), O_RDWR | O_CLOEXEC);
  if (fd < 0) {
    const int err = errno;
    inner_->CloseFile(id).IgnoreError();
    return ErrnoStatus(err, "open (fault engine shadow)", path);
  }
  Tracked t;
  t.aux = File(fd, FileInfo{path, false, 1});
  auto size = FileSizeFd(t.aux);
  if (!size.ok()) {
    inner_->CloseFile(id).IgnoreError();
    return size.status();
  }
  t.synced_size = *size;
  std::lock_guard lock(mu_);
  tracked_[id] = std::move(t);
  return id;
}

Status FaultyEngine::CloseFile(FileId file) {
  {
    std::lock_guard lock(mu_);
    tracked_.erase(file);
  }
  return inner_->CloseFile(file);
}

Status FaultyEngine::CaptureBeforeWrite(const IoSegment& seg) {
  auto it = tracked_.find(seg.file);
  if (it == tracked_.end()) return Status::Ok();  // inner Submit reports the bad id
  Tracked& t = it->second;
  Unsynced u{seg.offset, seg.length, std::string(static_cast<size_t>(seg.length), '\0')};
  int64_t got = 0;
  while (got < seg.length) {
    const ssize_t n = ::pread(t.aux.fd(), u.old_bytes.data() + got, seg.length - got, seg.offset + got);
    if (n < 0 && errno == EINTR) continue;
    if (n < 0) return ErrnoStatus(errno, "read (fault engine shadow)", t.aux.info().path, seg.offset + got);
    if (n == 0) break;  // past EOF: Crash() truncates instead
    got += n;
  }
  u.old_bytes.resize(static_cast<size_t>(got));
  t.writes.push_back(std::move(u));
  return Status::Ok();
}

StatusOr<IoTicket> FaultyEngine::Submit(IoOp op, std::span<const IoSegment> segments) {
  std::lock_guard lock(mu_);
  if (!sticky_.ok()) {
    return Status::Aborted(std::string(IoOpName(op)) +
                           " refused: an earlier I/O error is sticky: " + sticky_.ToString());
  }
  if (op == IoOp::kRead) return inner_->Submit(op, segments);
  const uint64_t seq = ++write_seq_;
  int64_t total = 0;
  for (const IoSegment& seg : segments) total += seg.length;
  const FaultOptions& o = injector_->options();
  bool torn = false;
  if (o.torn_write_rate > 0 && !segments.empty() && total > 0 &&
      injector_->Applies(inner_->file_info(segments[0].file))) {
    torn = FaultHash(o.seed, {injector_->epoch(), 4, seq}) < o.torn_write_rate;
  }
  std::vector<IoSegment> prefix;
  int64_t prefix_bytes = 0;
  if (torn) {
    const int64_t a = inner_->file_info(segments[0].file).alignment_bytes;
    prefix_bytes = AlignDown(
        static_cast<int64_t>(FaultHash(o.seed, {injector_->epoch(), 5, seq}) * static_cast<double>(total)), a);
    int64_t left = prefix_bytes;
    for (const IoSegment& seg : segments) {
      if (left <= 0) break;
      IoSegment s = seg;
      s.length = std::min(s.length, left);
      left -= s.length;
      prefix.push_back(s);
    }
  }
  for (const IoSegment& seg : segments) {
    if (seg.length > 0) ZINF_RETURN_IF_ERROR(CaptureBeforeWrite(seg));
  }
  std::span<const IoSegment> forwarded = torn ? std::span<const IoSegment>(prefix) : segments;
  auto ticket = inner_->Submit(op, forwarded);  // a refused request's capture is a harmless no-op restore
  if (!ticket.ok() || !torn) return ticket;
  injector_->torn_.fetch_add(1);
  const IoSegment& first = segments[0];
  torn_[ticket->id] =
      Status::IoError("write " + inner_->file_info(first.file).path + " offset " + std::to_string(first.offset) +
                      " length " + std::to_string(total) + ": torn write (injected fault): only the first " +
                      std::to_string(prefix_bytes) + " bytes reached the file");
  return ticket;
}

Status FaultyEngine::Wait(IoTicket ticket) {
  Status st = inner_->Wait(ticket);
  std::lock_guard lock(mu_);
  auto it = torn_.find(ticket.id);
  if (it != torn_.end()) {
    if (st.ok()) st = it->second;
    torn_.erase(it);
  }
  if (!st.ok() && sticky_.ok()) sticky_ = st;
  return st;
}

Status FaultyEngine::WaitAll() {
  Status st = inner_->WaitAll();
  std::lock_guard lock(mu_);
  if (st.ok() && !torn_.empty()) st = torn_.begin()->second;
  torn_.clear();
  if (!st.ok() && sticky_.ok()) sticky_ = st;
  return st;
}

Status FaultyEngine::sticky_error() const {
  Status inner = inner_->sticky_error();
  if (!inner.ok()) return inner;
  std::lock_guard lock(mu_);
  return sticky_;
}

Status FaultyEngine::Sync(FileId file) {
  ZINF_RETURN_IF_ERROR(inner_->Sync(file));
  std::lock_guard lock(mu_);
  auto it = tracked_.find(file);
  if (it != tracked_.end()) {
    it->second.writes.clear();
    ZINF_ASSIGN_OR_RETURN(it->second.synced_size, FileSizeFd(it->second.aux));
  }
  return Status::Ok();
}

Status FaultyEngine::Truncate(FileId file, int64_t size_bytes) {
  // Metadata changes are treated as durable at once (as if followed by fsync).
  ZINF_RETURN_IF_ERROR(inner_->Truncate(file, size_bytes));
  std::lock_guard lock(mu_);
  auto it = tracked_.find(file);
  if (it != tracked_.end()) it->second.synced_size = size_bytes;
  return Status::Ok();
}

Status FaultyEngine::Allocate(FileId file, int64_t size_bytes) {
  ZINF_RETURN_IF_ERROR(inner_->Allocate(file, size_bytes));
  std::lock_guard lock(mu_);
  auto it = tracked_.find(file);
  if (it != tracked_.end()) it->second.synced_size = std::max(it->second.synced_size, size_bytes);
  return Status::Ok();
}

Status FaultyEngine::Crash() {
  inner_->WaitAll().IgnoreError();  // in-flight writes land (or not) first
  std::lock_guard lock(mu_);
  torn_.clear();
  const FaultOptions& o = injector_->options();
  const uint64_t epoch = injector_->epoch();
  for (auto& [id, t] : tracked_) {
    const std::string& path = t.aux.info().path;
    const int64_t a = inner_->file_info(id).alignment_bytes;
    int64_t keep_size = t.synced_size;
    // Undo newest first, so each restore puts back what the write saw.
    for (size_t i = t.writes.size(); i-- > 0;) {
      const Unsynced& w = t.writes[i];
      const double u = FaultHash(o.seed, {epoch, 6, static_cast<uint64_t>(id), i, static_cast<uint64_t>(w.offset)});
      int64_t kept = 0;  // bytes of the new write that survive
      if (u < o.crash_keep_rate) {
        kept = w.length;
        injector_->crash_kept_.fetch_add(1);
      } else if (u < o.crash_keep_rate + o.crash_tear_rate) {
        const double v = FaultHash(o.seed, {epoch, 7, static_cast<uint64_t>(id), i});
        kept = AlignDown(static_cast<int64_t>(v * static_cast<double>(w.length)), a);
        injector_->crash_torn_.fetch_add(1);
      } else {
        injector_->crash_dropped_.fetch_add(1);
      }
      keep_size = std::max(keep_size, kept > 0 ? w.offset + kept : 0);
      const int64_t old_len = static_cast<int64_t>(w.old_bytes.size());
      for (int64_t at = kept; at < old_len;) {
        const ssize_t n = ::pwrite(t.aux.fd(), w.old_bytes.data() + at, old_len - at, w.offset + at);
        if (n < 0 && errno == EINTR) continue;
        if (n <= 0) return ErrnoStatus(n < 0 ? errno : EIO, "write (crash restore)", path, w.offset + at);
        at += n;
      }
    }
    ZINF_ASSIGN_OR_RETURN(int64_t size, FileSizeFd(t.aux));
    if (size > keep_size) ZINF_RETURN_IF_ERROR(TruncateFd(t.aux, keep_size));
    if (::fsync(t.aux.fd()) != 0) return ErrnoStatus(errno, "fsync (crash restore)", path);
    t.writes.clear();
    t.synced_size = std::min(size, keep_size);
  }
  return Status::Ok();
}

}  // namespace zinf::aio
