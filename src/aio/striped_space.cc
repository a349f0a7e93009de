#include "aio/striped_space.h"

#include <sys/statvfs.h>

#include <algorithm>
#include <cstring>
#include <filesystem>

#include "core/check.h"
#include "core/units.h"

namespace zinf::aio {

StatusOr<std::unique_ptr<StripedSpace>> StripedSpace::Open(const StripedSpaceOptions& options,
                                                           EngineFactory factory) {
  const int n = static_cast<int>(options.dirs.size());
  if (n < 1 || n > kMaxPaths) {
    return Status::InvalidArgument("nvme_paths: expected 1.." + std::to_string(kMaxPaths) + " paths, got " +
                                   std::to_string(n));
  }
  if (options.capacity_bytes <= 0) {
    return Status::InvalidArgument("swap capacity must be positive, got " + std::to_string(options.capacity_bytes));
  }
  if (!IsPowerOfTwo(options.stripe_bytes) || options.stripe_bytes < 512) {
    return Status::InvalidArgument("stripe_bytes: expected a power of two of at least 512, got " +
                                   std::to_string(options.stripe_bytes));
  }
  if (!factory) {
    factory = [](int, const IoEngineOptions& o) { return CreateIoEngine(o); };
  }
  std::unique_ptr<StripedSpace> space(new StripedSpace());
  space->stripe_ = options.stripe_bytes;
  const int64_t stripes = (options.capacity_bytes + space->stripe_ - 1) / space->stripe_;
  const int64_t stripes_per_path = (stripes + n - 1) / n;
  space->per_path_bytes_ = stripes_per_path * space->stripe_;
  space->capacity_ = stripes * space->stripe_;
  space->alignment_ = 512;
  for (int i = 0; i < n; ++i) {
    const std::string& dir = options.dirs[i];
    std::error_code ec;
    if (!std::filesystem::is_directory(dir, ec)) {
      return Status::NotFound("nvme path " + dir + ": not a directory");
    }
    Path p;
    p.path = (std::filesystem::path(dir) / options.file_name).string();
    ZINF_ASSIGN_OR_RETURN(p.engine, factory(i, options.engine));
    ZINF_ASSIGN_OR_RETURN(p.file, p.engine->OpenFile(p.path, OpenOptions{true, options.truncate, false}));
    space->alignment_ = std::max(space->alignment_, p.engine->file_info(p.file).alignment_bytes);
    ZINF_ASSIGN_OR_RETURN(int64_t size, p.engine->FileSize(p.file));
    if (size < space->per_path_bytes_) {
      if (options.preallocate) {
        Status st = p.engine->Allocate(p.file, space->per_path_bytes_);
        if (!st.ok()) {
          return st.WithContext("reserving " + FormatBytes(space->per_path_bytes_) + " of swap on " + dir);
        }
      } else {
        ZINF_RETURN_IF_ERROR(p.engine->Truncate(p.file, space->per_path_bytes_));
      }
    }
    space->paths_.push_back(std::move(p));
  }
  if (space->stripe_ % space->alignment_ != 0) {
    return Status::InvalidArgument("stripe_bytes " + std::to_string(space->stripe_) +
                                   " is not a multiple of the paths' O_DIRECT alignment " +
                                   std::to_string(space->alignment_));
  }
  const int capacity = options.engine.max_requests;
  space->compounds_.resize(static_cast<size_t>(capacity));
  space->free_.reserve(static_cast<size_t>(capacity));
  for (int i = capacity - 1; i >= 0; --i) space->free_.push_back(static_cast<uint32_t>(i));
  space->scratch_.resize(static_cast<size_t>(n));

  PinnedPoolOptions bounce;
  bounce.buffer_count = 1;
  bounce.buffer_bytes = AlignUp(std::max(options.bounce_bytes, space->alignment_), space->alignment_);
  bounce.alignment_bytes = 4096;  // one buffer at the (page-aligned) start of the mapping
  bounce.name = "swap bounce buffer";
  ZINF_ASSIGN_OR_RETURN(space->bounce_pool_, PinnedPool::Create(bounce));
  auto region = space->bounce_pool_->region();
  ZINF_RETURN_IF_ERROR(space->RegisterMemory(region.data(), region.size()));
  return space;
}

StripedSpace::~StripedSpace() {
  for (Path& p : paths_) {
    if (p.engine) p.engine->WaitAll().IgnoreError();
  }
}

Status StripedSpace::RegisterMemory(void* base, size_t bytes) {
  for (Path& p : paths_) ZINF_RETURN_IF_ERROR(p.engine->RegisterMemory(base, bytes));
  return Status::Ok();
}

Status StripedSpace::CheckRange(std::string_view op, int64_t offset, int64_t length) const {
  if (offset < 0 || length < 0 || offset > capacity_ - length) {
    return Status::InvalidArgument(std::string(op) + " swap offset " + std::to_string(offset) + " length " +
                                   std::to_string(length) + ": outside the swap space of " +
                                   std::to_string(capacity_) + " bytes");
  }
  return Status::Ok();
}

StatusOr<IoTicket> StripedSpace::Submit(IoOp op, int64_t offset, void* buffer, int64_t length) {
  ZINF_RETURN_IF_ERROR(CheckRange(IoOpName(op), offset, length));
  const auto addr = reinterpret_cast<uintptr_t>(buffer);
  if (offset % alignment_ != 0 || length % alignment_ != 0 || addr % static_cast<uintptr_t>(alignment_) != 0) {
    return Status::InvalidArgument(std::string(IoOpName(op)) + " swap offset " + std::to_string(offset) +
                                   " length " + std::to_string(length) +
                                   ": offset, length and buffer must be multiples of " +
                                   std::to_string(alignment_) + " bytes (use Read/Write for unaligned data)");
  }
  const int n = path_count();
  std::lock_guard lock(mu_);
  if (free_.empty()) {
    return Status::ResourceExhausted(std::string(IoOpName(op)) + " swap offset " + std::to_string(offset) +
                                     ": " + std::to_string(compounds_.size()) + " requests outstanding");
  }
  for (auto& s : scratch_) s.clear();
  char* data = static_cast<char*>(buffer);
  for (int64_t pos = offset; pos < offset + length;) {
    const int64_t stripe = pos / stripe_;
    const int64_t within = pos % stripe_;
    const int path = static_cast<int>(stripe % n);
    const int64_t file_off = (stripe / n) * stripe_ + within;
    const int64_t take = std::min(stripe_ - within, offset + length - pos);
    char* buf = data + (pos - offset);
    auto& segs = scratch_[path];
    if (!segs.empty() && segs.back().offset + segs.back().length == file_off &&
        static_cast<char*>(segs.back().buffer) + segs.back().length == buf) {
      segs.back().length += take;  // one path: file and buffer both contiguous
    } else {
      segs.push_back(IoSegment{paths_[path].file, file_off, take, buf});
    }
    pos += take;
  }
  const uint32_t index = free_.back();
  Compound& c = compounds_[index];
  c.tickets.fill(IoTicket{});
  for (int p = 0; p < n; ++p) {
    if (scratch_[p].empty()) continue;
    auto t = paths_[p].engine->Submit(op, scratch_[p]);
    if (!t.ok()) {
      for (int q = 0; q < p; ++q) {
        if (c.tickets[q].valid()) paths_[q].engine->Wait(c.tickets[q]).IgnoreError();
      }
      return t.status();
    }
    c.tickets[p] = *t;
  }
  free_.pop_back();
  c.in_use = true;
  return IoTicket{(uint64_t{c.generation} << 32) | (index + 1)};
}

uint32_t StripedSpace::SlotOf(IoTicket ticket) const {
  const uint64_t low = ticket.id & 0xffffffffu;
  ZINF_CHECK_MSG(low >= 1 && low <= compounds_.size(), "IoTicket does not belong to this swap space");
  const uint32_t index = static_cast<uint32_t>(low - 1);
  ZINF_CHECK_MSG(compounds_[index].in_use && compounds_[index].generation == static_cast<uint32_t>(ticket.id >> 32),
                 "IoTicket already waited on (or never issued)");
  return index;
}

Status StripedSpace::Wait(IoTicket ticket) {
  std::array<IoTicket, kMaxPaths> tickets;
  uint32_t index;
  {
    std::lock_guard lock(mu_);
    index = SlotOf(ticket);
    tickets = compounds_[index].tickets;
  }
  Status first;
  for (int p = 0; p < path_count(); ++p) {
    if (!tickets[p].valid()) continue;
    Status st = paths_[p].engine->Wait(tickets[p]);
    if (first.ok() && !st.ok()) first = st;
  }
  std::lock_guard lock(mu_);
  Compound& c = compounds_[index];
  c.in_use = false;
  if (++c.generation == 0) c.generation = 1;
  free_.push_back(index);
  return first;
}

bool StripedSpace::IsDone(IoTicket ticket) {
  std::lock_guard lock(mu_);
  const Compound& c = compounds_[SlotOf(ticket)];
  for (int p = 0; p < path_count(); ++p) {
    if (c.tickets[p].valid() && !paths_[p].engine->IsDone(c.tickets[p])) return false;
  }
  return true;
}

Status StripedSpace::WaitAll() {
  Status first;
  for (Path& p : paths_) {
    Status st = p.engine->WaitAll();
    if (first.ok() && !st.ok()) first = st;
  }
  std::lock_guard lock(mu_);
  for (uint32_t i = 0; i < compounds_.size(); ++i) {
    Compound& c = compounds_[i];
    if (!c.in_use) continue;
    c.in_use = false;
    if (++c.generation == 0) c.generation = 1;
    free_.push_back(i);
  }
  return first;
}

Status StripedSpace::Transfer(IoOp op, int64_t offset, char* data, int64_t length) {
  ZINF_ASSIGN_OR_RETURN(IoTicket t, Submit(op, offset, data, length));
  return Wait(t);
}

Status StripedSpace::Read(int64_t offset, void* dst, int64_t length) {
  ZINF_RETURN_IF_ERROR(CheckRange("read", offset, length));
  std::lock_guard lock(bounce_mu_);
  PinnedBuffer bounce = bounce_pool_->Acquire();
  char* out = static_cast<char*>(dst);
  const int64_t end = offset + length;
  for (int64_t pos = offset; pos < end;) {
    const int64_t win0 = AlignDown(pos, alignment_);
    const int64_t win1 = std::min(AlignUp(end, alignment_), win0 + AlignDown(bounce.size(), alignment_));
    ZINF_RETURN_IF_ERROR(Transfer(IoOp::kRead, win0, bounce.data(), win1 - win0));
    const int64_t take = std::min(end, win1) - pos;
    std::memcpy(out + (pos - offset), bounce.data() + (pos - win0), static_cast<size_t>(take));
    pos += take;
  }
  return Status::Ok();
}

Status StripedSpace::Write(int64_t offset, const void* src, int64_t length) {
  ZINF_RETURN_IF_ERROR(CheckRange("write", offset, length));
  std::lock_guard lock(bounce_mu_);
  PinnedBuffer bounce = bounce_pool_->Acquire();
  const char* in = static_cast<const char*>(src);
  const int64_t end = offset + length;
  for (int64_t pos = offset; pos < end;) {
    const int64_t win0 = AlignDown(pos, alignment_);
    const int64_t win1 = std::min(AlignUp(end, alignment_), win0 + AlignDown(bounce.size(), alignment_));
    const int64_t take = std::min(end, win1) - pos;
    const int64_t win = win1 - win0;
    // Read-modify-write of the blocks the caller covers only in part.
    if (pos > win0) {
      ZINF_RETURN_IF_ERROR(Transfer(IoOp::kRead, win0, bounce.data(), alignment_));
    }
    if (pos + take < win1 && (win1 - alignment_ > win0 || pos == win0)) {
      ZINF_RETURN_IF_ERROR(Transfer(IoOp::kRead, win1 - alignment_, bounce.data() + win - alignment_, alignment_));
    }
    std::memcpy(bounce.data() + (pos - win0), in + (pos - offset), static_cast<size_t>(take));
    ZINF_RETURN_IF_ERROR(Transfer(IoOp::kWrite, win0, bounce.data(), win));
    pos += take;
  }
  return Status::Ok();
}

Status StripedSpace::Sync() {
  for (Path& p : paths_) ZINF_RETURN_IF_ERROR(p.engine->Sync(p.file));
  return Status::Ok();
}

}  // namespace zinf::aio
