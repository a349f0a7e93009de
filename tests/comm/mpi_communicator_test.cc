// Runs under mpirun (tests/comm/CMakeLists.txt: np 2 and 3): every rank runs
// every test; the collective results are checked against what each rank can
// compute on its own.
#include <gtest/gtest.h>

#include <vector>

#include "comm/mpi_communicator.h"
#include "core/half.h"
#include "device/device.h"

namespace zinf::comm {
namespace {

std::unique_ptr<MpiCommunicator> World() {
  auto c = MpiCommunicator::CreateWorld();
  EXPECT_TRUE(c.ok()) << c.status().ToString();
  return c.ok() ? std::move(c).value() : nullptr;
}

TEST(MpiCommunicatorTest, AllGatherOutOfPlaceAndInPlace) {
  auto c = World();
  ASSERT_NE(c, nullptr);
  const int n = c->world_size(), r = c->rank();
  constexpr int kCount = 5;
  std::vector<float> send(kCount), recv(static_cast<size_t>(kCount * n), -1.0f);
  for (int i = 0; i < kCount; ++i) send[static_cast<size_t>(i)] = static_cast<float>(r * 100 + i);
  ASSERT_TRUE(c->AllGather(send.data(), recv.data(), kCount, ElementType::kF32, nullptr).ok());
  for (int q = 0; q < n; ++q) {
    for (int i = 0; i < kCount; ++i) EXPECT_EQ(recv[static_cast<size_t>(q * kCount + i)], q * 100 + i);
  }
  std::vector<float> inplace(static_cast<size_t>(kCount * n), -1.0f);
  std::copy(send.begin(), send.end(), inplace.begin() + r * kCount);
  ASSERT_TRUE(c->AllGather(inplace.data() + r * kCount, inplace.data(), kCount, ElementType::kF32, nullptr).ok());
  EXPECT_EQ(inplace, recv);
}

TEST(MpiCommunicatorTest, ReduceScatterSumsEachRanksSlice) {
  auto c = World();
  ASSERT_NE(c, nullptr);
  const int n = c->world_size(), r = c->rank();
  constexpr int kCount = 3;
  std::vector<float> send(static_cast<size_t>(kCount * n));
  for (size_t i = 0; i < send.size(); ++i) send[i] = static_cast<float>(i) + static_cast<float>(r);
  std::vector<float> recv(kCount);
  ASSERT_TRUE(c->ReduceScatter(send.data(), recv.data(), kCount, ElementType::kF32, ReduceOp::kSum, nullptr).ok());
  for (int i = 0; i < kCount; ++i) {
    const float base = static_cast<float>(r * kCount + i);
    EXPECT_EQ(recv[static_cast<size_t>(i)], base * static_cast<float>(n) + static_cast<float>(n * (n - 1) / 2));
  }
}

TEST(MpiCommunicatorTest, SixteenBitSumsAddInFp32) {
  auto c = World();
  ASSERT_NE(c, nullptr);
  const int n = c->world_size();
  std::vector<uint16_t> bf(4), f16(4);
  for (int i = 0; i < 4; ++i) {
    bf[static_cast<size_t>(i)] = FloatToBf16(0.5f * static_cast<float>(i + 1));
    f16[static_cast<size_t>(i)] = FloatToHalf(0.25f * static_cast<float>(i + 1));
  }
  ASSERT_TRUE(c->AllReduce(bf.data(), bf.data(), 4, ElementType::kBf16, ReduceOp::kSum, nullptr).ok());
  ASSERT_TRUE(c->AllReduce(f16.data(), f16.data(), 4, ElementType::kF16, ReduceOp::kSum, nullptr).ok());
  for (int i = 0; i < 4; ++i) {
    EXPECT_EQ(Bf16ToFloat(bf[static_cast<size_t>(i)]), 0.5f * static_cast<float>((i + 1) * n));
    EXPECT_EQ(HalfToFloat(f16[static_cast<size_t>(i)]), 0.25f * static_cast<float>((i + 1) * n));
  }
}

TEST(MpiCommunicatorTest, AllReduceMaxBroadcastBarrier) {
  auto c = World();
  ASSERT_NE(c, nullptr);
  const int n = c->world_size(), r = c->rank();
  double x[2] = {static_cast<double>(r), 1.0};
  ASSERT_TRUE(c->AllReduce(x, x, 2, ElementType::kF64, ReduceOp::kMax, nullptr).ok());
  EXPECT_EQ(x[0], n - 1);
  int64_t v[3] = {r == n - 1 ? 7 : 0, r == n - 1 ? 8 : 0, r == n - 1 ? 9 : 0};
  ASSERT_TRUE(c->Broadcast(v, 3, ElementType::kI64, n - 1, nullptr).ok());
  EXPECT_EQ(v[0], 7);
  EXPECT_EQ(v[2], 9);
  EXPECT_EQ(c->Broadcast(v, 3, ElementType::kI64, n, nullptr).code(), StatusCode::kInvalidArgument);
  EXPECT_TRUE(c->Barrier().ok());
}

TEST(MpiCommunicatorTest, HostDeviceStreamIsDrainedFirst) {
  auto c = World();
  ASSERT_NE(c, nullptr);
  auto device = CreateHostDevice(0);
  auto stream = device->CreateStream();
  ASSERT_TRUE(stream.ok());
  const int n = c->world_size();
  auto buf = device->Allocate(static_cast<size_t>(n) * 4);
  ASSERT_TRUE(buf.ok());
  const float mine = static_cast<float>(c->rank() + 1);
  auto* slot = static_cast<float*>(*buf) + c->rank();
  ASSERT_TRUE((*stream)->CopyAsync(slot, &mine, 4, CopyDirection::kHostToDevice).ok());
  ASSERT_TRUE(c->AllGather(slot, *buf, 1, ElementType::kF32, stream->get()).ok());
  for (int q = 0; q < n; ++q) EXPECT_EQ(static_cast<float*>(*buf)[q], static_cast<float>(q + 1));
  device->Free(*buf);
}

}  // namespace
}  // namespace zinf::comm
