#include "aio/pinned_pool.h"

#include <hwloc.h>
#include <sys/mman.h>
#include <unistd.h>

#include <atomic>
#include <cerrno>
#include <cstring>

#include "core/check.h"
#include "core/log.h"
#include "core/units.h"
#include "device/device.h"

namespace zinf::aio {

// PinnedPool::LiveMappedBytes: pools created and not yet destroyed.
std::atomic<int64_t> g_live_mapped_bytes{0};

PinnedBuffer::PinnedBuffer(PinnedBuffer&& other) noexcept
    : pool_(other.pool_), data_(other.data_), size_(other.size_), index_(other.index_) {
  other.pool_ = nullptr;
  other.data_ = nullptr;
  other.index_ = -1;
}

PinnedBuffer& PinnedBuffer::operator=(PinnedBuffer&& other) noexcept {
  if (this != &other) {
    Reset();
    pool_ = other.pool_;
    data_ = other.data_;
    size_ = other.size_;
    index_ = other.index_;
    other.pool_ = nullptr;
    other.data_ = nullptr;
    other.index_ = -1;
  }
  return *this;
}

void PinnedBuffer::Reset() {
  if (pool_ != nullptr) {
    pool_->Release(index_);
    pool_ = nullptr;
    data_ = nullptr;
    index_ = -1;
  }
}

namespace {

constexpr int64_t kHugePageBytes = 2 * kMiB;

// Binds [addr, addr+bytes) to a NUMA node (the calling thread's when
// `requested` < 0); returns the node, or -1 when there is nothing to choose.
int BindToNumaNode(void* addr, size_t bytes, int requested) {
  hwloc_topology_t topo;
  if (hwloc_topology_init(&topo) != 0) return -1;
  int node = -1;
  if (hwloc_topology_load(topo) == 0) {
    const int nodes = hwloc_get_nbobjs_by_type(topo, HWLOC_OBJ_NUMANODE);
    node = requested;
    if (node < 0) {
      hwloc_bitmap_t cpus = hwloc_bitmap_alloc();
      hwloc_bitmap_t nodeset = hwloc_bitmap_alloc();
      if (hwloc_get_last_cpu_location(topo, cpus, HWLOC_CPUBIND_THREAD) == 0) {
        hwloc_cpuset_to_nodeset(topo, cpus, nodeset);
        node = hwloc_bitmap_first(nodeset);
      }
      hwloc_bitmap_free(nodeset);
      hwloc_bitmap_free(cpus);
    }
    if (nodes > 1 && node >= 0) {
      hwloc_obj_t obj = hwloc_get_numanode_obj_by_os_index(topo, static_cast<unsigned>(node));
      if (obj == nullptr ||
          hwloc_set_area_membind(topo, addr, bytes, obj->nodeset, HWLOC_MEMBIND_BIND, HWLOC_MEMBIND_BYNODESET) != 0) {
        Log("aio").warn("pinned pool: cannot bind memory to NUMA node {}; left to the kernel's policy", node);
      }
    }
  }
  hwloc_topology_destroy(topo);
  return node;
}

}  // namespace

int64_t PinnedPool::MappedBytes(const PinnedPoolOptions& options) {
  const int64_t page = ::sysconf(_SC_PAGESIZE);
  const int64_t map_align = options.huge_pages ? kHugePageBytes : page;
  return AlignUp(AlignUp(options.buffer_bytes, options.alignment_bytes) * options.buffer_count, map_align);
}

StatusOr<std::unique_ptr<PinnedPool>> PinnedPool::Create(const PinnedPoolOptions& options) {
  const int64_t page = ::sysconf(_SC_PAGESIZE);
  if (options.buffer_count < 1 || options.buffer_bytes < 1) {
    return Status::InvalidArgument(options.name + ": buffer_count and buffer_bytes must be positive (got " +
                                   std::to_string(options.buffer_count) + " x " + std::to_string(options.buffer_bytes) +
                                   ")");
  }
  if (!IsPowerOfTwo(options.alignment_bytes) || options.alignment_bytes < 512 || options.alignment_bytes > page) {
    return Status::InvalidArgument(options.name +
                                   ": alignment_bytes must be a power of two from 512 to the page size (" +
                                   std::to_string(page) + "), got " + std::to_string(options.alignment_bytes));
  }
  std::unique_ptr<PinnedPool> pool(new PinnedPool());
  pool->name_ = options.name;
  pool->count_ = options.buffer_count;
  pool->alignment_ = options.alignment_bytes;
  pool->buffer_bytes_ = AlignUp(options.buffer_bytes, options.alignment_bytes);
  pool->stride_ = pool->buffer_bytes_;
  // Every buffer free from the start: a pool given up below (mmap or a
  // required pin failing) is destroyed with none leased.
  pool->free_.reserve(static_cast<size_t>(pool->count_));
  for (int64_t i = pool->count_ - 1; i >= 0; --i) pool->free_.push_back(static_cast<int>(i));
  const int64_t map_align = options.huge_pages ? kHugePageBytes : page;
  pool->mapped_bytes_ = MappedBytes(options);
  // Over-map by the alignment and trim both ends, leaving an aligned region.
  const int64_t raw_bytes = pool->mapped_bytes_ + map_align - page;
  void* raw =
      ::mmap(nullptr, static_cast<size_t>(raw_bytes), PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
  if (raw == MAP_FAILED) return ErrnoStatus(errno, options.name + ": mmap of " + FormatBytes(raw_bytes));
  char* raw_begin = static_cast<char*>(raw);
  char* begin = reinterpret_cast<char*>(AlignUp(reinterpret_cast<int64_t>(raw_begin), map_align));
  if (begin > raw_begin) ::munmap(raw_begin, static_cast<size_t>(begin - raw_begin));
  char* end = begin + pool->mapped_bytes_;
  if (raw_begin + raw_bytes > end) ::munmap(end, static_cast<size_t>(raw_begin + raw_bytes - end));
  void* p = begin;
  pool->base_ = begin;
  g_live_mapped_bytes.fetch_add(pool->mapped_bytes_, std::memory_order_relaxed);
  if (options.huge_pages) ::madvise(p, static_cast<size_t>(pool->mapped_bytes_), MADV_HUGEPAGE);  // a hint
  pool->numa_node_ = BindToNumaNode(p, static_cast<size_t>(pool->mapped_bytes_), options.numa_node);
  if (options.pin) {
    Status st = PinHostMemory(p, static_cast<size_t>(pool->mapped_bytes_));
    if (st.ok()) {
      pool->pinned_ = true;
    } else if (options.require_pinned) {
      return Status(StatusCode::kUnavailable,
                    options.name + ": cannot pin " + FormatBytes(pool->mapped_bytes_) + ": " + st.ToString(),
                    st.sys_errno());
    } else {
      Log("aio").warn("{}: cannot pin {} ({}); using pageable memory (raise RLIMIT_MEMLOCK to pin)", options.name,
                      FormatBytes(pool->mapped_bytes_), st.ToString());
    }
  }
  // Fault every page in now, on the bound node, so the hot path never does.
  std::memset(p, 0, static_cast<size_t>(pool->mapped_bytes_));
  return pool;
}

int64_t PinnedPool::LiveMappedBytes() { return g_live_mapped_bytes.load(std::memory_order_relaxed); }

PinnedPool::~PinnedPool() {
  {
    std::lock_guard lock(mu_);
    ZINF_CHECK_MSG(static_cast<int64_t>(free_.size()) == count_, "PinnedPool destroyed with buffers still leased");
  }
  if (base_ == nullptr) return;  // given up before its mapping
  if (pinned_) UnpinHostMemory(base_, static_cast<size_t>(mapped_bytes_)).IgnoreError();
  ::munmap(base_, static_cast<size_t>(mapped_bytes_));
  g_live_mapped_bytes.fetch_sub(mapped_bytes_, std::memory_order_relaxed);
}

PinnedBuffer PinnedPool::Lease() {
  const int index = free_.back();
  free_.pop_back();
  return PinnedBuffer(this, base_ + stride_ * index, buffer_bytes_, index);
}

StatusOr<PinnedBuffer> PinnedPool::TryAcquire() {
  std::lock_guard lock(mu_);
  if (free_.empty()) {
    return Status::ResourceExhausted(name_ + " exhausted: all " + std::to_string(count_) + " buffers of " +
                                     FormatBytes(buffer_bytes_) + " are leased");
  }
  return Lease();
}

StatusOr<PinnedBuffer> PinnedPool::TryAcquire(int64_t bytes) {
  if (bytes > buffer_bytes_ || bytes < 0) {
    return Status::InvalidArgument(name_ + ": a request for " + std::to_string(bytes) +
                                   " bytes cannot be served by buffers of " + std::to_string(buffer_bytes_) + " bytes");
  }
  return TryAcquire();
}

PinnedBuffer PinnedPool::Acquire() {
  std::unique_lock lock(mu_);
  freed_cv_.wait(lock, [&] { return !free_.empty(); });
  return Lease();
}

int64_t PinnedPool::free_count() const {
  std::lock_guard lock(mu_);
  return static_cast<int64_t>(free_.size());
}

void PinnedPool::Release(int index) {
  {
    std::lock_guard lock(mu_);
    free_.push_back(index);
  }
  freed_cv_.notify_one();
}

}  // namespace zinf::aio
