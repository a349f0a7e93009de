// RequestTable on its own: the bound, parts finished from other threads
// (as the io_uring workers do), the first error of a request and the sticky
// error of the table.
#include "aio/request_table.h"

#include <string>
#include <thread>
#include <vector>

#include <gtest/gtest.h>

namespace zinf::aio {
namespace {

TEST(RequestTable, RefusesPastCapacityNamingMaxRequests) {
  RequestTable table(2);
  uint32_t slot = 0;
  std::vector<IoTicket> tickets;
  for (int i = 0; i < 2; ++i) {
    auto t = table.Allocate(IoOp::kRead, {}, 1, 0, &slot);
    ASSERT_TRUE(t.ok()) << t.status().ToString();
    tickets.push_back(*t);
  }
  EXPECT_EQ(table.outstanding(), 2);
  auto refused = table.Allocate(IoOp::kWrite, {}, 1, 0, &slot);
  ASSERT_EQ(refused.status().code(), StatusCode::kResourceExhausted);
  EXPECT_NE(refused.status().message().find("max_requests"), std::string::npos) << refused.status().ToString();
  table.FinishPart(0, Status::Ok());
  table.FinishPart(1, Status::Ok());
  for (IoTicket t : tickets) EXPECT_TRUE(table.Wait(t).ok());
  EXPECT_EQ(table.outstanding(), 0);
  EXPECT_TRUE(table.Allocate(IoOp::kRead, {}, 1, 0, &slot).ok());
}

TEST(RequestTable, WaitReturnsWhenTheLastPartFinishesOnAnotherThread) {
  RequestTable table(4);
  char buffer[16] = {};
  const IoSegment seg{3, 4096, 16, buffer};
  uint32_t slot = 0;
  auto t = table.Allocate(IoOp::kWrite, std::span<const IoSegment>(&seg, 1), 3, 3, &slot);
  ASSERT_TRUE(t.ok());
  EXPECT_EQ(table.slot(slot).segments.size(), 1u);
  EXPECT_EQ(table.slot(slot).segments[0].offset, 4096);
  EXPECT_FALSE(table.IsDone(*t));
  std::vector<std::thread> workers;
  for (int part = 0; part < 3; ++part) {
    workers.emplace_back([&table, slot] { table.FinishPart(slot, Status::Ok()); });
  }
  EXPECT_TRUE(table.Wait(*t).ok());
  for (auto& w : workers) w.join();
  EXPECT_EQ(table.outstanding(), 0);
}

TEST(RequestTable, TheFirstErrorIsTheRequestsAndBecomesSticky) {
  RequestTable table(4);
  uint32_t slot = 0;
  auto t = table.Allocate(IoOp::kRead, {}, 2, 2, &slot);
  ASSERT_TRUE(t.ok());
  table.FinishPart(slot, Status::IoError("read f offset 0 length 4096: EIO"));
  EXPECT_TRUE(table.slot(slot).failed.load()) << "workers must see the failure to stop issuing pieces";
  table.FinishPart(slot, Status::IoError("second"));
  Status st = table.Wait(*t);
  EXPECT_EQ(st.code(), StatusCode::kIoError);
  EXPECT_NE(st.message().find("offset 0"), std::string::npos) << st.ToString();
  EXPECT_NE(table.sticky_error().message().find("offset 0"), std::string::npos);
  auto refused = table.Allocate(IoOp::kRead, {}, 1, 0, &slot);
  ASSERT_EQ(refused.status().code(), StatusCode::kAborted);
  EXPECT_NE(refused.status().message().find("offset 0"), std::string::npos) << refused.status().ToString();
}

TEST(RequestTable, WaitAllSpendsEveryTicketAndReturnsTheFirstError) {
  RequestTable table(4);
  uint32_t a = 0, b = 0, c = 0;
  ASSERT_TRUE(table.Allocate(IoOp::kRead, {}, 1, 1, &a).ok());
  ASSERT_TRUE(table.Allocate(IoOp::kRead, {}, 1, 1, &b).ok());
  auto empty = table.Allocate(IoOp::kRead, {}, 0, 0, &c);  // no parts: done at once
  ASSERT_TRUE(empty.ok());
  EXPECT_TRUE(table.IsDone(*empty));
  std::thread worker([&] {
    table.FinishPart(a, Status::Ok());
    table.FinishPart(b, Status::IoError("b failed"));
  });
  Status st = table.WaitAll();
  worker.join();
  EXPECT_EQ(st.code(), StatusCode::kIoError);
  EXPECT_EQ(table.outstanding(), 0);
}

}  // namespace
}  // namespace zinf::aio
