// HostDevice: host memory standing in for a GPU.
//
// Each Stream owns one worker thread that runs its queue in order, so copies
// are truly asynchronous and a missing Synchronize shows up as a race in tests
// (and under TSan) just as it would on a GPU. Device pointers are checked on
// every copy against the live allocations: a copy that would be an illegal
// address on a GPU is an error here too, at enqueue time.
#include <sys/sysinfo.h>

#include <algorithm>
#include <atomic>
#include <chrono>
#include <condition_variable>
#include <cstdlib>
#include <cstring>
#include <deque>
#include <map>
#include <mutex>
#include <thread>

#include "core/check.h"
#include "core/units.h"
#include "device/device.h"
#include "device/host_device.h"

namespace zinf {

// The state a stream's worker and its events share. Host copies cannot fail
// once their ranges are checked, so unlike a CUDA stream there is no sticky
// error to carry.
struct StreamState {
  std::mutex mu;
  std::condition_variable cv;  // signals: work queued, work done, space freed
  std::deque<std::function<void()>> queue;
  uint64_t enqueued = 0;   // ops ever enqueued
  uint64_t completed = 0;  // ops finished
  bool stop = false;
  const Stream* owner = nullptr;  // the HostStream, while it lives (HostDevice::RecordOn)
};

namespace {

constexpr size_t kAlignment = 256;      // what cudaMalloc guarantees (Device::Allocate rounds to it)
constexpr size_t kMaxQueuedOps = 4096;  // per stream; Enqueue blocks past it

class HostEvent final : public Event {
 public:
  HostEvent(std::shared_ptr<StreamState> state, uint64_t seq) : state_(std::move(state)), seq_(seq) {}

  StatusOr<bool> Query() override {
    std::lock_guard lock(state_->mu);
    return state_->completed >= seq_;
  }
  Status Synchronize() override {
    std::unique_lock lock(state_->mu);
    state_->cv.wait(lock, [&] { return state_->completed >= seq_; });
    return Status::Ok();
  }
  const StreamState* stream() const { return state_.get(); }

 private:
  std::shared_ptr<StreamState> state_;
  uint64_t seq_;
};

class HostStream final : public Stream {
 public:
  HostStream(HostDevice* device, std::shared_ptr<StreamState> state)
      : device_(device), state_(std::move(state)), worker_([this] { Run(); }) {
    std::lock_guard lock(state_->mu);
    state_->owner = this;
  }

  ~HostStream() override {
    {
      std::lock_guard lock(state_->mu);
      state_->stop = true;
      state_->owner = nullptr;
    }
    state_->cv.notify_all();
    worker_.join();
  }

  Status CopyAsync(void* dst, const void* src, size_t bytes, CopyDirection dir) override {
    if (bytes == 0) return Status::Ok();
    if (dst == nullptr || src == nullptr) return Status::InvalidArgument("host device copy: null pointer");
    const void* dev_dst = dir == CopyDirection::kDeviceToHost ? nullptr : dst;
    const void* dev_src = dir == CopyDirection::kHostToDevice ? nullptr : src;
    if (dev_dst) ZINF_RETURN_IF_ERROR(device_->CheckRange(dev_dst, bytes, "copy destination"));
    if (dev_src) ZINF_RETURN_IF_ERROR(device_->CheckRange(dev_src, bytes, "copy source"));
    return Enqueue([dst, src, bytes] { std::memmove(dst, src, bytes); });
  }

  Status MemsetAsync(void* dst, int value, size_t bytes) override {
    if (bytes == 0) return Status::Ok();
    ZINF_RETURN_IF_ERROR(device_->CheckRange(dst, bytes, "memset destination"));
    return Enqueue([dst, value, bytes] { std::memset(dst, value, bytes); });
  }

  Status LaunchHostFunc(std::function<void()> fn) override { return Enqueue(std::move(fn)); }

  StatusOr<std::unique_ptr<Event>> Record() override {
    std::lock_guard lock(state_->mu);
    return std::unique_ptr<Event>(new HostEvent(state_, state_->enqueued));
  }

  Status Wait(Event& event) override {
    auto* host_event = dynamic_cast<HostEvent*>(&event);
    if (host_event == nullptr) return Status::InvalidArgument("host stream: event from another device");
    if (host_event->stream() == state_.get()) return Status::Ok();  // in order already
    // The worker blocks on the other stream's event, as a GPU stream would.
    return Enqueue([host_event_copy = HostEvent(*host_event)]() mutable {
      host_event_copy.Synchronize().IgnoreError();  // host events cannot fail
    });
  }

  Status Synchronize() override {
    std::unique_lock lock(state_->mu);
    uint64_t target = state_->enqueued;
    state_->cv.wait(lock, [&] { return state_->completed >= target; });
    return Status::Ok();
  }

  void* native_handle() override { return nullptr; }

 private:
  Status Enqueue(std::function<void()> op) {
    std::unique_lock lock(state_->mu);
    state_->cv.wait(lock, [&] { return state_->queue.size() < kMaxQueuedOps; });
    state_->queue.push_back(std::move(op));
    ++state_->enqueued;
    lock.unlock();
    state_->cv.notify_all();
    return Status::Ok();
  }

  void Run() {
    std::unique_lock lock(state_->mu);
    for (;;) {
      state_->cv.wait(lock, [&] { return state_->stop || !state_->queue.empty(); });
      if (state_->queue.empty()) return;  // stop requested and drained
      std::function<void()> op = std::move(state_->queue.front());
      state_->queue.pop_front();
      lock.unlock();
      op();
      lock.lock();
      ++state_->completed;
      state_->cv.notify_all();
    }
  }

  HostDevice* device_;
  std::shared_ptr<StreamState> state_;
  std::thread worker_;  // last: starts after the members it uses
};

// Stamps from the steady clock: by the stream's worker when it reaches the
// mark, or at once with no stream. A stamp is written once, before its
// mark's op counts as completed (under the stream's mutex), and read after
// Synchronize, which takes that mutex: Collect reads it safely. A deque
// keeps the slots in place as marks are added.
class HostTimer final : public StreamTimer {
 public:
  explicit HostTimer(Stream* stream) : stream_(stream) {}
  ~HostTimer() override {
    if (stream_ != nullptr) stream_->Synchronize().IgnoreError();  // its work writes into stamps_
  }

  Status Mark() override {
    int64_t* slot = &stamps_.emplace_back(0);
    if (stream_ == nullptr) {
      *slot = NowNanos();
      return Status::Ok();
    }
    return stream_->LaunchHostFunc([slot] { *slot = NowNanos(); });
  }

  StatusOr<std::vector<double>> Collect() override {
    if (stream_ != nullptr) ZINF_RETURN_IF_ERROR(stream_->Synchronize());
    std::vector<double> seconds;
    seconds.reserve(stamps_.size());
    for (int64_t t : stamps_) seconds.push_back(static_cast<double>(t - stamps_.front()) / 1e9);
    stamps_.clear();
    return seconds;
  }

 private:
  static int64_t NowNanos() {
    return std::chrono::duration_cast<std::chrono::nanoseconds>(std::chrono::steady_clock::now().time_since_epoch())
        .count();
  }

  Stream* stream_;
  std::deque<int64_t> stamps_;
};

size_t PhysicalMemoryBytes() {
  struct sysinfo info {};
  if (sysinfo(&info) != 0) return size_t{1} << 40;
  return static_cast<size_t>(info.totalram) * info.mem_unit;
}

}  // namespace

HostDevice::HostDevice(size_t budget_bytes)
    : budget_bytes_(budget_bytes == 0 ? PhysicalMemoryBytes() : budget_bytes), has_budget_(budget_bytes != 0) {}

HostDevice::~HostDevice() {
  std::lock_guard lock(mu_);
  for (auto& [addr, bytes] : allocations_) std::free(reinterpret_cast<void*>(addr));
}

std::string HostDevice::name() const {
  return has_budget_ ? "host (budget " + FormatBytes(static_cast<int64_t>(budget_bytes_)) + ")" : "host (no budget)";
}

StatusOr<void*> HostDevice::AllocateBytes(size_t bytes) {
  {
    std::lock_guard lock(mu_);
    if (held_ + bytes > budget_bytes_) {
      return Status::OutOfMemory("host device: cannot allocate " + FormatBytes(static_cast<int64_t>(bytes)) + ": " +
                                 FormatBytes(static_cast<int64_t>(held_)) + " of " +
                                 FormatBytes(static_cast<int64_t>(budget_bytes_)) + " in use");
    }
    held_ += bytes;
  }
  void* p = std::aligned_alloc(kAlignment, bytes);
  std::lock_guard lock(mu_);
  if (p == nullptr) {
    held_ -= bytes;
    return Status::OutOfMemory("host device: aligned_alloc of " + FormatBytes(static_cast<int64_t>(bytes)) + " failed");
  }
  allocations_.emplace(reinterpret_cast<uintptr_t>(p), bytes);
  return p;
}

void HostDevice::FreeBytes(void* ptr) {
  std::lock_guard lock(mu_);
  auto it = allocations_.find(reinterpret_cast<uintptr_t>(ptr));
  ZINF_CHECK_MSG(it != allocations_.end(), "HostDevice::FreeBytes of a pointer it did not allocate");
  held_ -= it->second;
  allocations_.erase(it);
  std::free(ptr);
}

bool HostDevice::keeps_freed() const {
#if defined(__SANITIZE_ADDRESS__)
  return false;
#else
  return true;
#endif
}

Status HostDevice::CheckRange(const void* ptr, size_t bytes, const char* what) const {
  auto addr = reinterpret_cast<uintptr_t>(ptr);
  if (IsLiveRange(addr, bytes)) return Status::Ok();
  return Status::InvalidArgument(std::string("host device: ") + what + " [" + std::to_string(addr) + ", +" +
                                 std::to_string(bytes) + ") is not inside a live device allocation");
}

StatusOr<std::unique_ptr<Stream>> HostDevice::CreateStream() {
  auto state = std::make_shared<StreamState>();
  {
    std::lock_guard lock(mu_);
    std::erase_if(streams_, [](const std::weak_ptr<StreamState>& w) { return w.expired(); });
    streams_.push_back(state);
  }
  return std::unique_ptr<Stream>(new HostStream(this, std::move(state)));
}

std::shared_ptr<StreamState> HostDevice::Live(const void* stream) const {
  std::vector<std::shared_ptr<StreamState>> live;
  {
    std::lock_guard lock(mu_);
    for (const std::weak_ptr<StreamState>& w : streams_) {
      if (auto s = w.lock()) live.push_back(std::move(s));
    }
  }
  for (std::shared_ptr<StreamState>& state : live) {
    std::lock_guard lock(state->mu);
    if (state->owner != nullptr && state->owner == stream) return std::move(state);
  }
  return nullptr;
}

StatusOr<std::unique_ptr<Event>> HostDevice::RecordOn(void* stream) {
  if (std::shared_ptr<StreamState> state = Live(stream)) {
    std::lock_guard lock(state->mu);
    return std::unique_ptr<Event>(new HostEvent(state, state->enqueued));
  }
  return Status::InvalidArgument("host device: RecordOn of something that is not one of its live streams");
}

Status HostDevice::WaitOn(void* stream, Event& event) {
  // The caller keeps the stream alive across the call, as for RecordOn.
  if (Live(stream) != nullptr) return static_cast<Stream*>(stream)->Wait(event);
  return Status::InvalidArgument("host device: WaitOn of something that is not one of its live streams");
}

StatusOr<std::unique_ptr<StreamTimer>> HostDevice::CreateTimer(void* stream) {
  if (stream != nullptr && Live(stream) == nullptr) {
    return Status::InvalidArgument("host device: CreateTimer on something that is not one of its live streams");
  }
  return std::unique_ptr<StreamTimer>(new HostTimer(static_cast<Stream*>(stream)));
}

Status HostDevice::Synchronize() {
  std::vector<std::shared_ptr<StreamState>> live;
  {
    std::lock_guard lock(mu_);
    for (auto& w : streams_) {
      if (auto s = w.lock()) live.push_back(std::move(s));
    }
  }
  for (auto& s : live) {
    std::unique_lock lock(s->mu);
    uint64_t target = s->enqueued;
    s->cv.wait(lock, [&] { return s->completed >= target || s->stop; });
  }
  return Status::Ok();
}

std::unique_ptr<Device> CreateHostDevice(size_t budget_bytes) { return std::make_unique<HostDevice>(budget_bytes); }

}  // namespace zinf
