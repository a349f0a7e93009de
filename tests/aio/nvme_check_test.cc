// nvme-check on real directories.
#include "aio/nvme_check.h"

#include <unistd.h>

#include <filesystem>

#include <gtest/gtest.h>

#include "aio/aio_test_util.h"
#include "core/units.h"

namespace zinf::aio {
namespace {

TEST(NvmeCheck, ALocalDirectoryPasses) {
  testing::TempDir dir;
  NvmeCheckOptions o;
  o.test_bytes = 8 * kMiB;
  o.required_bytes = 1 * kMiB;
  const NvmeCheckReport r = CheckNvmePath(dir.path(), o);
  if (!r.direct_io && r.filesystem == "tmpfs") GTEST_SKIP() << "TMPDIR is on tmpfs without O_DIRECT";
  EXPECT_TRUE(r.ok()) << (r.problems.empty() ? "" : r.problems[0]);
  EXPECT_TRUE(r.exists);
  EXPECT_TRUE(r.writable);
  EXPECT_TRUE(r.direct_io);
  EXPECT_GE(r.alignment_bytes, 512);
  EXPECT_GT(r.free_bytes, 0);
  EXPECT_GT(r.write_gbps, 0);
  EXPECT_GT(r.read_gbps, 0);
  EXPECT_FALSE(std::filesystem::exists(dir.File(".zinf-nvme-check." + std::to_string(::getpid()))));
}

TEST(NvmeCheck, AMissingPathFails) {
  const NvmeCheckReport r = CheckNvmePath("/nonexistent/zinf/path", NvmeCheckOptions{});
  EXPECT_FALSE(r.ok());
  EXPECT_FALSE(r.exists);
  ASSERT_FALSE(r.problems.empty());
  EXPECT_NE(r.problems[0].find("does not exist"), std::string::npos);
}

TEST(NvmeCheck, TooLittleFreeSpaceFails) {
  testing::TempDir dir;
  NvmeCheckOptions o;
  o.test_bytes = 0;
  o.required_bytes = int64_t{1} << 60;
  const NvmeCheckReport r = CheckNvmePath(dir.path(), o);
  EXPECT_FALSE(r.ok());
  bool found = false;
  for (const auto& p : r.problems) found |= p.find("needs") != std::string::npos;
  EXPECT_TRUE(found);
}

}  // namespace
}  // namespace zinf::aio
