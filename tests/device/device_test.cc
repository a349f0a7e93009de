// Device contract tests, run against the host device and (label gpu) CUDA.
#include "device/device.h"

#include <atomic>
#include <chrono>
#include <cstdint>
#include <cstring>
#include <functional>
#include <numeric>
#include <thread>
#include <vector>

#include <gtest/gtest.h>

#include "core/units.h"
#include "stream_gate.h"

namespace zinf {
namespace {

constexpr bool kCuda = ZINF_TEST_DEVICE_CUDA;

class DeviceTest : public ::testing::Test {
 protected:
  void SetUp() override {
    if (kCuda && CudaDeviceCount() == 0) {
      GTEST_SKIP() << "no CUDA GPU visible (compiled in: " << (CudaCompiledIn() ? "yes" : "no") << ")";
    }
    device_ = Make(0);
    ASSERT_NE(device_, nullptr);
  }

  // A device of the kind under test; budget 0 means none.
  static std::unique_ptr<Device> Make(size_t budget) {
    DeviceOptions opt;
    opt.choice = kCuda ? DeviceOptions::Choice::kCuda : DeviceOptions::Choice::kHost;
    opt.host_budget_bytes = budget;
    opt.cuda_budget_bytes = budget;
    auto d = CreateDevice(opt);
    EXPECT_TRUE(d.ok()) << d.status().ToString();
    return d.ok() ? std::move(d).value() : nullptr;
  }

  std::unique_ptr<Stream> NewStream() {
    auto s = device_->CreateStream();
    EXPECT_TRUE(s.ok()) << s.status().ToString();
    return s.ok() ? std::move(s).value() : nullptr;
  }

  void* Alloc(size_t bytes) {
    auto p = device_->Allocate(bytes);
    EXPECT_TRUE(p.ok()) << p.status().ToString();
    return p.ok() ? *p : nullptr;
  }

  void CrossStreamWait(const std::function<Status(Stream& consumer, Event& produced)>& wait);

  std::unique_ptr<Device> device_;
};

std::vector<uint8_t> Pattern(size_t n, uint8_t seed) {
  std::vector<uint8_t> v(n);
  for (size_t i = 0; i < n; ++i) v[i] = static_cast<uint8_t>(i * 131 + seed);
  return v;
}

TEST_F(DeviceTest, KindMatches) {
  EXPECT_EQ(device_->kind(), kCuda ? DeviceKind::kCuda : DeviceKind::kHost);
  EXPECT_FALSE(device_->name().empty());
}

TEST_F(DeviceTest, AllocateIsAlignedAndCounted) {
  size_t before = device_->bytes_in_use();
  void* a = Alloc(1000);
  void* b = Alloc(3);
  EXPECT_EQ(reinterpret_cast<uintptr_t>(a) % 256, 0u);
  EXPECT_EQ(reinterpret_cast<uintptr_t>(b) % 256, 0u);
  EXPECT_GE(device_->bytes_in_use(), before + 1003);
  device_->Free(a);
  device_->Free(b);
  device_->Free(nullptr);
  EXPECT_EQ(device_->bytes_in_use(), before);
}

TEST_F(DeviceTest, BudgetIsEnforcedLikeCudaMalloc) {
  auto dev = Make(4 * kMiB);
  ASSERT_NE(dev, nullptr);
  EXPECT_EQ(dev->capacity_bytes(), static_cast<size_t>(4 * kMiB));
  auto a = dev->Allocate(3 * kMiB);
  ASSERT_TRUE(a.ok()) << a.status().ToString();
  auto b = dev->Allocate(2 * kMiB);
  ASSERT_FALSE(b.ok());
  EXPECT_EQ(b.status().code(), StatusCode::kOutOfMemory);
  EXPECT_NE(b.status().message().find("cannot allocate 2.00 MiB"), std::string::npos) << b.status().message();
  dev->Free(*a);
  auto c = dev->Allocate(4 * kMiB);
  ASSERT_TRUE(c.ok()) << c.status().ToString();
  dev->Free(*c);
}

// A freed allocation is kept (host, outside ASan) and handed out again for
// the same rounded size (no fresh pages); another size takes its room.
TEST_F(DeviceTest, FreedMemoryIsKeptForTheNextRequestOfItsSize) {
  auto dev = Make(4 * kMiB);
  ASSERT_NE(dev, nullptr);
  if (!dev->keeps_freed()) GTEST_SKIP() << "this device returns freed memory at once (an ASan build)";
  auto a = dev->Allocate(kMiB + 100);
  ASSERT_TRUE(a.ok()) << a.status().ToString();
  dev->Free(*a);
  EXPECT_EQ(dev->bytes_in_use(), 0u);
  EXPECT_EQ(dev->bytes_cached(), static_cast<size_t>(kMiB + 256));
  auto b = dev->Allocate(kMiB + 200);  // rounds to the same 256 bytes
  ASSERT_TRUE(b.ok());
  EXPECT_EQ(*b, *a);
  EXPECT_EQ(dev->bytes_cached(), 0u);
  EXPECT_EQ(dev->bytes_in_use(), static_cast<size_t>(kMiB + 256));
  dev->Free(*b);
  auto c = dev->Allocate(3 * kMiB);  // the kept MiB gives way
  ASSERT_TRUE(c.ok()) << c.status().ToString();
  EXPECT_EQ(dev->bytes_cached(), 0u);
  auto d = dev->Allocate(kMiB);
  ASSERT_TRUE(d.ok()) << d.status().ToString();
  dev->Free(*c);
  dev->Free(*d);
  dev->ReleaseCached();
  EXPECT_EQ(dev->bytes_cached(), 0u);
  EXPECT_EQ(dev->bytes_in_use(), 0u);
}

// FreeAfter gives memory back without waiting for the work queued on it:
// it is handed out again only once that work has run, sooner when another
// allocation fits, and waited for when nothing else does.
TEST_F(DeviceTest, FreeAfterHandsMemoryOutAgainOnlyOnceItsStreamPassedIt) {
  auto dev = Make(2 * kMiB);
  ASSERT_NE(dev, nullptr);
  if (!dev->keeps_freed()) GTEST_SKIP() << "this device returns freed memory at once (an ASan build)";
  auto stream = dev->CreateStream();
  ASSERT_TRUE(stream.ok()) << stream.status().ToString();
  test_support::StreamGate gate;
  auto a = dev->Allocate(kMiB);
  ASSERT_TRUE(a.ok()) << a.status().ToString();
  // Work on `a`, held at the gate.
  ASSERT_TRUE(gate.HoldOn(**stream).ok());
  ASSERT_TRUE((*stream)->MemsetAsync(*a, 7, kMiB).ok());
  ASSERT_TRUE(dev->FreeAfter(*a, **stream).ok());
  EXPECT_EQ(dev->bytes_in_use(), 0u);
  EXPECT_EQ(dev->bytes_cached(), static_cast<size_t>(kMiB));
  // Room for another: a fresh one, not `a`.
  auto b = dev->Allocate(kMiB);
  ASSERT_TRUE(b.ok()) << b.status().ToString();
  EXPECT_NE(*b, *a);
  // Freed plainly, `b` is free to reuse at once.
  dev->Free(*b);
  auto c = dev->Allocate(kMiB);
  ASSERT_TRUE(c.ok()) << c.status().ToString();
  EXPECT_EQ(*c, *b);
  // The budget is full: the next one waits for `a`'s work, then is `a`.
  gate.OpenAfter(std::chrono::milliseconds(50));
  auto d = dev->Allocate(kMiB);
  ASSERT_TRUE(d.ok()) << d.status().ToString();
  EXPECT_EQ(*d, *a);
  EXPECT_TRUE(gate.opened()) << "handed out while its stream was still held";
  std::vector<uint8_t> back(kMiB, 0);
  auto check = dev->CreateStream();
  ASSERT_TRUE(check.ok());
  ASSERT_TRUE((*check)->CopyAsync(back.data(), *d, kMiB, CopyDirection::kDeviceToHost).ok());
  ASSERT_TRUE((*check)->Synchronize().ok());
  EXPECT_EQ(back, std::vector<uint8_t>(kMiB, 7)) << "the memset queued before FreeAfter ran first";
  dev->Free(*c);
  dev->Free(*d);
  stream->reset();
  check->reset();
  dev->ReleaseCached();
  EXPECT_EQ(dev->bytes_cached(), 0u);
}

TEST_F(DeviceTest, RoundTripThroughDevice) {
  const size_t n = 3 * kMiB + 17;
  std::vector<uint8_t> src = Pattern(n, 7), dst(n, 0);
  void* d = Alloc(n);
  auto s = NewStream();
  ASSERT_TRUE(s->CopyAsync(d, src.data(), n, CopyDirection::kHostToDevice).ok());
  ASSERT_TRUE(s->CopyAsync(dst.data(), d, n, CopyDirection::kDeviceToHost).ok());
  ASSERT_TRUE(s->Synchronize().ok());
  EXPECT_EQ(src, dst);
  device_->Free(d);
}

TEST_F(DeviceTest, DeviceToDeviceAndMemset) {
  const size_t n = 64 * 1024;
  std::vector<uint8_t> src = Pattern(n, 3), dst(n, 0);
  auto* a = static_cast<uint8_t*>(Alloc(n));
  auto* b = static_cast<uint8_t*>(Alloc(n));
  auto s = NewStream();
  ASSERT_TRUE(s->CopyAsync(a, src.data(), n, CopyDirection::kHostToDevice).ok());
  ASSERT_TRUE(s->CopyAsync(b, a, n, CopyDirection::kDeviceToDevice).ok());
  ASSERT_TRUE(s->MemsetAsync(b + 100, 0xAB, 50).ok());
  ASSERT_TRUE(s->CopyAsync(dst.data(), b, n, CopyDirection::kDeviceToHost).ok());
  ASSERT_TRUE(s->Synchronize().ok());
  std::memset(src.data() + 100, 0xAB, 50);
  EXPECT_EQ(src, dst);
  device_->Free(a);
  device_->Free(b);
}

TEST_F(DeviceTest, StreamRunsInEnqueueOrder) {
  // Many small copies into the same place: the last one must win, and host
  // functions run between them in order.
  const size_t n = 4096;
  void* d = Alloc(n);
  auto s = NewStream();
  std::vector<std::vector<uint8_t>> srcs;
  for (int i = 0; i < 64; ++i) srcs.push_back(Pattern(n, static_cast<uint8_t>(i)));
  std::vector<int> order;
  for (int i = 0; i < 64; ++i) {
    ASSERT_TRUE(s->CopyAsync(d, srcs[i].data(), n, CopyDirection::kHostToDevice).ok());
    ASSERT_TRUE(s->LaunchHostFunc([&order, i] { order.push_back(i); }).ok());
  }
  std::vector<uint8_t> out(n);
  ASSERT_TRUE(s->CopyAsync(out.data(), d, n, CopyDirection::kDeviceToHost).ok());
  ASSERT_TRUE(s->Synchronize().ok());
  EXPECT_EQ(out, srcs.back());
  std::vector<int> want(64);
  std::iota(want.begin(), want.end(), 0);
  EXPECT_EQ(order, want);
  device_->Free(d);
}

// A consumer stream made to wait for a producer's event (by `wait`) runs
// its later work only once the producer, held at a gate, has run.
void DeviceTest::CrossStreamWait(const std::function<Status(Stream& consumer, Event& produced)>& wait) {
  const size_t n = 1 * kMiB;
  // Pinned host buffers: on a GPU a copy to or from pageable memory returns
  // only once the stream's earlier work has run (CUDA's rule), and that work
  // is held at the gate below, by this thread.
  std::vector<uint8_t> src = Pattern(n, 11), out(n, 0);
  ASSERT_TRUE(PinHostMemory(src.data(), n).ok());
  ASSERT_TRUE(PinHostMemory(out.data(), n).ok());
  // Unpinned on every way out, before the vectors are freed.
  struct Unpin {
    std::vector<uint8_t>& a;
    std::vector<uint8_t>& b;
    ~Unpin() {
      UnpinHostMemory(a.data(), a.size()).IgnoreError();
      UnpinHostMemory(b.data(), b.size()).IgnoreError();
    }
  } unpin{src, out};
  void* d = Alloc(n);
  auto producer = NewStream();
  auto consumer = NewStream();
  // The producer is held at a gate, so the consumer can only see the data if
  // it really waits for the producer's event. (Declared after the streams:
  // opened on every way out before they drain.)
  test_support::StreamGate gate;
  ASSERT_TRUE(gate.HoldOn(*producer).ok());
  ASSERT_TRUE(producer->CopyAsync(d, src.data(), n, CopyDirection::kHostToDevice).ok());
  auto produced = producer->Record();
  ASSERT_TRUE(produced.ok());
  ASSERT_TRUE(wait(*consumer, **produced).ok());
  ASSERT_TRUE(consumer->CopyAsync(out.data(), d, n, CopyDirection::kDeviceToHost).ok());
  auto consumed = consumer->Record();
  ASSERT_TRUE(consumed.ok());
  std::this_thread::sleep_for(std::chrono::milliseconds(20));
  auto done = (*consumed)->Query();
  ASSERT_TRUE(done.ok());
  EXPECT_FALSE(*done) << "consumer finished while the producer was still held";
  gate.Open();
  ASSERT_TRUE((*consumed)->Synchronize().ok());
  auto done_now = (*produced)->Query();
  ASSERT_TRUE(done_now.ok());
  EXPECT_TRUE(*done_now);
  EXPECT_EQ(out, src);
  ASSERT_TRUE(device_->Synchronize().ok());
  device_->Free(d);
}

TEST_F(DeviceTest, EventsAndCrossStreamWait) {
  CrossStreamWait([](Stream& consumer, Event& produced) { return consumer.Wait(produced); });
}

// The same through the device, on a stream as a model hands it to the
// engine (a cudaStream_t; on the host device, the Stream itself).
TEST_F(DeviceTest, WaitOnHoldsAModelsStreamBehindAnEvent) {
  CrossStreamWait([&](Stream& consumer, Event& produced) {
    return device_->WaitOn(kCuda ? consumer.native_handle() : &consumer, produced);
  });
  auto stream = NewStream();
  auto event = stream->Record();
  ASSERT_TRUE(event.ok());
  EXPECT_EQ(device_->WaitOn(nullptr, **event).code(), StatusCode::kInvalidArgument);
  if (!kCuda) {  // on CUDA any other non-null value is undefined, as in CUDA
    int not_a_stream = 0;
    EXPECT_EQ(device_->WaitOn(&not_a_stream, **event).code(), StatusCode::kInvalidArgument);
  }
}

// A timer's marks are taken as the stream gets to them: Mark does not wait
// (the stream is held at a gate while it marks), and the stretch a 30 ms
// host function holds the stream shows between its two marks.
TEST_F(DeviceTest, TimerStampsTheStreamsWorkAsItRuns) {
  auto stream = NewStream();
  void* handle = kCuda ? stream->native_handle() : stream.get();
  auto timer = device_->CreateTimer(handle);
  ASSERT_TRUE(timer.ok()) << timer.status().ToString();
  for (int round = 0; round < 2; ++round) {  // the second reuses the first's events
    test_support::StreamGate gate;
    ASSERT_TRUE(gate.HoldOn(*stream).ok());
    ASSERT_TRUE((*timer)->Mark().ok());
    ASSERT_TRUE(stream->LaunchHostFunc([] { std::this_thread::sleep_for(std::chrono::milliseconds(30)); }).ok());
    ASSERT_TRUE((*timer)->Mark().ok());
    ASSERT_TRUE((*timer)->Mark().ok());
    gate.Open();
    auto seconds = (*timer)->Collect();
    ASSERT_TRUE(seconds.ok()) << seconds.status().ToString();
    ASSERT_EQ(seconds->size(), 3u);
    EXPECT_EQ((*seconds)[0], 0.0);
    EXPECT_GE((*seconds)[1], 0.029);
    EXPECT_GE((*seconds)[2], (*seconds)[1]);
  }
  auto none = (*timer)->Collect();
  ASSERT_TRUE(none.ok());
  EXPECT_TRUE(none->empty());
  timer->reset();  // before its stream, as the contract asks
  if (kCuda) {
    EXPECT_EQ(device_->CreateTimer(nullptr).status().code(), StatusCode::kInvalidArgument);
  } else {  // the calling thread's clock
    int not_a_stream = 0;
    EXPECT_EQ(device_->CreateTimer(&not_a_stream).status().code(), StatusCode::kInvalidArgument);
    auto here = device_->CreateTimer(nullptr);
    ASSERT_TRUE(here.ok());
    ASSERT_TRUE((*here)->Mark().ok());
    std::this_thread::sleep_for(std::chrono::milliseconds(5));
    ASSERT_TRUE((*here)->Mark().ok());
    auto s = (*here)->Collect();
    ASSERT_TRUE(s.ok());
    ASSERT_EQ(s->size(), 2u);
    EXPECT_GE((*s)[1], 0.004);
  }
}

TEST_F(DeviceTest, PinnedHostMemoryRoundTrip) {
  const size_t n = 2 * kMiB;
  void* host = std::aligned_alloc(4096, n);
  ASSERT_NE(host, nullptr);
  Status pin = PinHostMemory(host, n);
  ASSERT_TRUE(pin.ok()) << pin.ToString();
  std::memset(host, 0x5A, n);
  void* d = Alloc(n);
  auto s = NewStream();
  ASSERT_TRUE(s->CopyAsync(d, host, n, CopyDirection::kHostToDevice).ok());
  ASSERT_TRUE(s->MemsetAsync(d, 0, 1).ok());
  ASSERT_TRUE(s->CopyAsync(host, d, n, CopyDirection::kDeviceToHost).ok());
  ASSERT_TRUE(s->Synchronize().ok());
  EXPECT_EQ(static_cast<uint8_t*>(host)[0], 0);
  EXPECT_EQ(static_cast<uint8_t*>(host)[n - 1], 0x5A);
  EXPECT_TRUE(UnpinHostMemory(host, n).ok());
  device_->Free(d);
  std::free(host);
}

#if !ZINF_TEST_DEVICE_CUDA
// What only the host stand-in can check: a copy touching memory that is not a
// live device allocation is refused at once, as it would fault on a GPU.
TEST_F(DeviceTest, HostRefusesCopiesOutsideDeviceAllocations) {
  std::vector<uint8_t> host(256);
  auto* d = static_cast<uint8_t*>(Alloc(256));
  auto s = NewStream();
  Status bad_dst = s->CopyAsync(host.data(), host.data(), 16, CopyDirection::kHostToDevice);
  EXPECT_EQ(bad_dst.code(), StatusCode::kInvalidArgument);
  EXPECT_NE(bad_dst.message().find("not inside a live device allocation"), std::string::npos);
  Status overrun = s->CopyAsync(host.data(), d + 200, 100, CopyDirection::kDeviceToHost);
  EXPECT_EQ(overrun.code(), StatusCode::kInvalidArgument);
  EXPECT_EQ(s->MemsetAsync(host.data(), 0, 8).code(), StatusCode::kInvalidArgument);
  device_->Free(d);
  // Freed memory is no longer a device allocation.
  EXPECT_EQ(s->CopyAsync(d, host.data(), 16, CopyDirection::kHostToDevice).code(), StatusCode::kInvalidArgument);
}

TEST(DeviceChoiceTest, AutoPicksHostWithoutGpu) {
  if (CudaDeviceCount() > 0) GTEST_SKIP() << "a GPU is visible: auto picks CUDA";
  auto d = CreateDevice(DeviceOptions{});
  ASSERT_TRUE(d.ok());
  EXPECT_EQ((*d)->kind(), DeviceKind::kHost);
  DeviceOptions cuda;
  cuda.choice = DeviceOptions::Choice::kCuda;
  auto c = CreateDevice(cuda);
  ASSERT_FALSE(c.ok());
  EXPECT_EQ(c.status().code(), StatusCode::kUnavailable);
}
#endif

}  // namespace
}  // namespace zinf
