#include "zinf/status.h"

#include <cerrno>
#include <memory>

#include <gtest/gtest.h>

namespace zinf {
namespace {

TEST(StatusTest, DefaultIsOkAndCheap) {
  Status s;
  EXPECT_TRUE(s.ok());
  EXPECT_EQ(s.code(), StatusCode::kOk);
  EXPECT_EQ(s.ToString(), "OK");
  EXPECT_EQ(s.message(), "");
  EXPECT_EQ(sizeof(Status), sizeof(std::shared_ptr<int>));
}

TEST(StatusTest, ErrorCarriesCodeAndMessage) {
  Status s = Status::Corruption("checkpoint x: bad crc");
  EXPECT_FALSE(s.ok());
  EXPECT_EQ(s.code(), StatusCode::kCorruption);
  EXPECT_EQ(s.ToString(), "Corruption: checkpoint x: bad crc");
}

TEST(StatusTest, WithContextPrefixesAndKeepsErrno) {
  Status s = ErrnoStatus(EIO, "read", "/nvme/a.swp", 4096, 512).WithContext("swap-in m");
  EXPECT_EQ(s.code(), StatusCode::kIoError);
  EXPECT_EQ(s.sys_errno(), EIO);
  EXPECT_EQ(s.message().rfind("swap-in m: read /nvme/a.swp offset 4096 length 512: ", 0), 0u) << s.message();
  EXPECT_TRUE(Status().WithContext("x").ok());
}

TEST(StatusTest, ErrnoMapping) {
  struct Case {
    int err;
    StatusCode code;
  } cases[] = {
      {ENOENT, StatusCode::kNotFound},        {EACCES, StatusCode::kPermissionDenied},
      {EROFS, StatusCode::kPermissionDenied}, {ENOSPC, StatusCode::kNoSpace},
      {EDQUOT, StatusCode::kNoSpace},         {ENOMEM, StatusCode::kOutOfMemory},
      {EINVAL, StatusCode::kInvalidArgument}, {EIO, StatusCode::kIoError},
      {EOPNOTSUPP, StatusCode::kUnavailable}, {EAGAIN, StatusCode::kResourceExhausted},
      {ECANCELED, StatusCode::kAborted},      {0, StatusCode::kInternal},
  };
  for (const Case& c : cases) {
    Status s = ErrnoStatus(c.err, "op");
    EXPECT_EQ(s.code(), c.code) << "errno " << c.err << ": " << s.ToString();
    EXPECT_EQ(s.sys_errno(), c.err);
  }
  // No file, offset or length: none of them is mentioned.
  EXPECT_EQ(ErrnoStatus(ENOSPC, "fallocate").message(), "fallocate: No space left on device");
}

StatusOr<int> Half(int x) {
  if (x % 2) return Status::InvalidArgument("odd: " + std::to_string(x));
  return x / 2;
}

Status Quarter(int x, int* out) {
  ZINF_ASSIGN_OR_RETURN(int h, Half(x));
  ZINF_ASSIGN_OR_RETURN(*out, Half(h));
  return Status::Ok();
}

TEST(StatusOrTest, ValueAndError) {
  StatusOr<int> a = Half(8);
  ASSERT_TRUE(a.ok());
  EXPECT_EQ(*a, 4);
  EXPECT_TRUE(a.status().ok());
  StatusOr<int> b = Half(3);
  ASSERT_FALSE(b.ok());
  EXPECT_EQ(b.status().message(), "odd: 3");
}

TEST(StatusOrTest, OkStatusWithoutValueIsAnError) {
  StatusOr<int> s = Status::Ok();
  EXPECT_FALSE(s.ok());
  EXPECT_EQ(s.status().code(), StatusCode::kInternal);
}

TEST(StatusOrTest, MacrosPropagate) {
  int out = 0;
  EXPECT_TRUE(Quarter(12, &out).ok());
  EXPECT_EQ(out, 3);
  Status s = Quarter(6, &out);  // 6 -> 3 -> odd
  EXPECT_EQ(s.code(), StatusCode::kInvalidArgument);
  EXPECT_EQ(s.message(), "odd: 3");
}

TEST(StatusOrTest, MoveOnlyValue) {
  StatusOr<std::unique_ptr<int>> p = std::make_unique<int>(7);
  ASSERT_TRUE(p.ok());
  std::unique_ptr<int> v = std::move(p).value();
  EXPECT_EQ(*v, 7);
}

}  // namespace
}  // namespace zinf
