#include <gtest/gtest.h>

#include <numeric>
#include <vector>

#include "comm/communicator.h"
#include "comm/mpi_communicator.h"
#include "comm/nccl_communicator.h"
#include "device/device.h"

namespace zinf::comm {
namespace {

TEST(LocalCommunicatorTest, CollectivesOnOneRankAreCopies) {
  LocalCommunicator c;
  EXPECT_EQ(c.world_size(), 1);
  std::vector<float> a(7), b(7, -1.0f);
  std::iota(a.begin(), a.end(), 1.0f);
  ASSERT_TRUE(c.AllGather(a.data(), b.data(), 7, ElementType::kF32, nullptr).ok());
  EXPECT_EQ(a, b);
  std::fill(b.begin(), b.end(), 0.0f);
  ASSERT_TRUE(c.ReduceScatter(a.data(), b.data(), 7, ElementType::kF32, ReduceOp::kSum, nullptr).ok());
  EXPECT_EQ(a, b);
  ASSERT_TRUE(c.AllReduce(a.data(), a.data(), 7, ElementType::kF32, ReduceOp::kSum, nullptr).ok());
  EXPECT_TRUE(c.Broadcast(a.data(), 7, ElementType::kF32, 0, nullptr).ok());
  EXPECT_EQ(c.Broadcast(a.data(), 7, ElementType::kF32, 1, nullptr).code(), StatusCode::kInvalidArgument);
  EXPECT_EQ(c.AllGather(a.data(), b.data(), -1, ElementType::kF32, nullptr).code(), StatusCode::kInvalidArgument);
  EXPECT_TRUE(c.Barrier().ok());
}

TEST(LocalCommunicatorTest, DeviceBuffersGoThroughTheStream) {
  auto device = CreateHostDevice(1 << 20);
  auto stream = device->CreateStream();
  ASSERT_TRUE(stream.ok());
  auto src = device->Allocate(64);
  auto dst = device->Allocate(64);
  ASSERT_TRUE(src.ok() && dst.ok());
  std::vector<uint8_t> host(64);
  std::iota(host.begin(), host.end(), 0);
  ASSERT_TRUE((*stream)->CopyAsync(*src, host.data(), 64, CopyDirection::kHostToDevice).ok());
  LocalCommunicator c(/*device_buffers=*/true);
  EXPECT_EQ(c.AllGather(*src, *dst, 64, ElementType::kU8, nullptr).code(), StatusCode::kInvalidArgument);
  ASSERT_TRUE(c.AllGather(*src, *dst, 64, ElementType::kU8, stream->get()).ok());
  std::vector<uint8_t> back(64);
  ASSERT_TRUE((*stream)->CopyAsync(back.data(), *dst, 64, CopyDirection::kDeviceToHost).ok());
  ASSERT_TRUE((*stream)->Synchronize().ok());
  EXPECT_EQ(back, host);
  device->Free(*src);
  device->Free(*dst);
}

TEST(MpiCommunicatorTest, WithoutMpiInitIsAFailedPrecondition) {
  if (!MpiCompiledIn()) GTEST_SKIP() << "built without MPI";
  auto c = MpiCommunicator::CreateWorld();
  ASSERT_FALSE(c.ok());
  EXPECT_EQ(c.status().code(), StatusCode::kFailedPrecondition);
}

}  // namespace
}  // namespace zinf::comm
