// NCCL on device buffers, bootstrapped over MPI (label gpu). Runs under
// mpirun, one rank per GPU; skips with a reason without NCCL or a GPU.
#include <gtest/gtest.h>

#include <vector>

#include "comm/mpi_communicator.h"
#include "comm/nccl_communicator.h"
#include "device/device.h"

namespace zinf::comm {
namespace {

struct Gpu {
  std::unique_ptr<Device> device;
  std::unique_ptr<Stream> stream;
  std::unique_ptr<MpiCommunicator> mpi;
  std::unique_ptr<NcclCommunicator> nccl;
};

// Skips the calling test when there is nothing to run on.
#define ZINF_REQUIRE_GPU(gpu)                                                              \
  if (!NcclCompiledIn()) GTEST_SKIP() << "built without NCCL";                             \
  if (CudaDeviceCount() == 0) GTEST_SKIP() << "no CUDA device visible";                    \
  Gpu gpu;                                                                                 \
  {                                                                                        \
    auto mpi = MpiCommunicator::CreateWorld();                                             \
    ASSERT_TRUE(mpi.ok()) << mpi.status().ToString();                                      \
    gpu.mpi = std::move(mpi).value();                                                      \
    if (gpu.mpi->world_size() > CudaDeviceCount()) GTEST_SKIP() << "more ranks than GPUs"; \
    DeviceOptions o;                                                                       \
    o.choice = DeviceOptions::Choice::kCuda;                                               \
    o.cuda_ordinal = gpu.mpi->rank();                                                      \
    auto d = CreateDevice(o);                                                              \
    ASSERT_TRUE(d.ok()) << d.status().ToString();                                          \
    gpu.device = std::move(d).value();                                                     \
    auto s = gpu.device->CreateStream();                                                   \
    ASSERT_TRUE(s.ok());                                                                   \
    gpu.stream = std::move(s).value();                                                     \
    auto n = NcclCommunicator::Create(*gpu.mpi, gpu.mpi->rank());                          \
    ASSERT_TRUE(n.ok()) << n.status().ToString();                                          \
    gpu.nccl = std::move(n).value();                                                       \
  }

std::vector<float> RoundTrip(Gpu& gpu, const std::vector<float>& in, int64_t out_count,
                             const std::function<Status(void*, void*)>& op) {
  auto src = gpu.device->Allocate(in.size() * 4);
  auto dst = gpu.device->Allocate(static_cast<size_t>(out_count) * 4);
  EXPECT_TRUE(src.ok() && dst.ok());
  EXPECT_TRUE(gpu.stream->CopyAsync(*src, in.data(), in.size() * 4, CopyDirection::kHostToDevice).ok());
  Status s = op(*src, *dst);
  EXPECT_TRUE(s.ok()) << s.ToString();
  std::vector<float> out(static_cast<size_t>(out_count));
  EXPECT_TRUE(gpu.stream->CopyAsync(out.data(), *dst, out.size() * 4, CopyDirection::kDeviceToHost).ok());
  EXPECT_TRUE(gpu.stream->Synchronize().ok());
  gpu.device->Free(*src);
  gpu.device->Free(*dst);
  return out;
}

TEST(NcclCommunicatorTest, CollectivesMatchTheirDefinitions) {
  ZINF_REQUIRE_GPU(gpu);
  const int n = gpu.nccl->world_size(), r = gpu.nccl->rank();
  constexpr int kCount = 1000;
  std::vector<float> mine(kCount);
  for (int i = 0; i < kCount; ++i) mine[static_cast<size_t>(i)] = static_cast<float>(r * kCount + i);
  auto gathered = RoundTrip(gpu, mine, kCount * n, [&](void* s, void* d) {
    return gpu.nccl->AllGather(s, d, kCount, ElementType::kF32, gpu.stream.get());
  });
  for (int i = 0; i < kCount * n; ++i) EXPECT_EQ(gathered[static_cast<size_t>(i)], static_cast<float>(i));

  std::vector<float> all(static_cast<size_t>(kCount * n), 1.0f);
  auto reduced = RoundTrip(gpu, all, kCount, [&](void* s, void* d) {
    return gpu.nccl->ReduceScatter(s, d, kCount, ElementType::kF32, ReduceOp::kSum, gpu.stream.get());
  });
  for (float v : reduced) EXPECT_EQ(v, static_cast<float>(n));

  auto summed = RoundTrip(gpu, mine, kCount, [&](void* s, void* d) {
    return gpu.nccl->AllReduce(s, d, kCount, ElementType::kF32, ReduceOp::kMax, gpu.stream.get());
  });
  EXPECT_EQ(summed[0], static_cast<float>((n - 1) * kCount));
  EXPECT_TRUE(gpu.nccl->Barrier().ok());
}

TEST(NcclCommunicatorTest, AHostStreamIsRefused) {
  ZINF_REQUIRE_GPU(gpu);
  auto host = CreateHostDevice(0);
  auto s = host->CreateStream();
  ASSERT_TRUE(s.ok());
  float x = 0;
  EXPECT_EQ(gpu.nccl->AllReduce(&x, &x, 1, ElementType::kF32, ReduceOp::kSum, s->get()).code(),
            StatusCode::kInvalidArgument);
  EXPECT_EQ(gpu.nccl->AllReduce(&x, &x, 1, ElementType::kF32, ReduceOp::kSum, nullptr).code(),
            StatusCode::kInvalidArgument);
}

}  // namespace
}  // namespace zinf::comm
