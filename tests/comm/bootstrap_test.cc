// The default communicators (comm/bootstrap.h) of a process without mpirun.
#include "comm/bootstrap.h"

#include <gtest/gtest.h>

namespace zinf::comm {
namespace {

TEST(BootstrapTest, WithoutMpiTheHostCommunicatorIsOneLocalRank) {
  std::unique_ptr<Communicator> owned;
  StatusOr<Communicator*> host = HostCommunicator(nullptr, owned);
  ASSERT_TRUE(host.ok()) << host.status().ToString();
  EXPECT_EQ(*host, owned.get());
  EXPECT_EQ((*host)->world_size(), 1);
  EXPECT_EQ((*host)->rank(), 0);
  EXPECT_FALSE((*host)->buffers_on_device());
}

TEST(BootstrapTest, AGivenCommunicatorIsUsedAndNotOwned) {
  LocalCommunicator given;
  std::unique_ptr<Communicator> owned;
  StatusOr<Communicator*> host = HostCommunicator(&given, owned);
  ASSERT_TRUE(host.ok());
  EXPECT_EQ(*host, &given);
  EXPECT_EQ(owned, nullptr);
}

TEST(BootstrapTest, ADeviceBufferCommunicatorCannotBeTheHostOne) {
  LocalCommunicator device_buffers(/*device_buffers=*/true);
  std::unique_ptr<Communicator> owned;
  StatusOr<Communicator*> host = HostCommunicator(&device_buffers, owned);
  ASSERT_FALSE(host.ok());
  EXPECT_EQ(host.status().code(), StatusCode::kInvalidArgument);
  EXPECT_NE(host.status().message().find("host buffers"), std::string::npos);
}

TEST(BootstrapTest, TheHostDeviceSharesTheHostCommunicator) {
  LocalCommunicator host;
  std::unique_ptr<Communicator> owned;
  StatusOr<Communicator*> device = DeviceCommunicator(nullptr, host, DeviceKind::kHost, owned);
  ASSERT_TRUE(device.ok());
  EXPECT_EQ(*device, &host);
  EXPECT_EQ(owned, nullptr);
}

TEST(BootstrapTest, OneGpuRankGetsALocalDeviceBufferCommunicator) {
  LocalCommunicator host;
  std::unique_ptr<Communicator> owned;
  StatusOr<Communicator*> device = DeviceCommunicator(nullptr, host, DeviceKind::kCuda, owned);
  ASSERT_TRUE(device.ok()) << device.status().ToString();
  EXPECT_EQ(*device, owned.get());
  EXPECT_TRUE((*device)->buffers_on_device());
  EXPECT_EQ((*device)->world_size(), 1);
}

TEST(BootstrapTest, AGpuRefusesAHostBufferCommunicator) {
  LocalCommunicator host;
  std::unique_ptr<Communicator> owned;
  StatusOr<Communicator*> device = DeviceCommunicator(&host, host, DeviceKind::kCuda, owned);
  ASSERT_FALSE(device.ok());
  EXPECT_EQ(device.status().code(), StatusCode::kInvalidArgument);
  EXPECT_NE(device.status().message().find("NCCL"), std::string::npos);
}

}  // namespace
}  // namespace zinf::comm
