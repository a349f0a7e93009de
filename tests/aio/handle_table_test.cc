// HandleTable: the capacity bound, stale handles after reuse, the generation
// wrap, release and double release.
#include "aio/handle_table.h"

#include <set>
#include <string>
#include <vector>

#include <gtest/gtest.h>

namespace zinf::aio {
namespace {

struct Payload {
  std::vector<int> items;  // keeps its capacity between uses
  int tag = 0;
};

TEST(HandleTable, HoldsAtMostCapacityAndHandlesFindTheirSlots) {
  HandleTable<Payload> table(3);
  EXPECT_EQ(table.capacity(), 3);
  EXPECT_EQ(table.in_use_count(), 0);
  std::vector<uint64_t> handles;
  std::set<uint32_t> indices;
  for (int i = 0; i < 3; ++i) {
    auto index = table.Acquire();
    ASSERT_TRUE(index.has_value());
    indices.insert(*index);
    table[*index].tag = 10 + i;
    handles.push_back(table.HandleOf(*index));
    EXPECT_NE(handles.back(), 0u);
  }
  EXPECT_EQ(indices.size(), 3u);
  EXPECT_EQ(table.in_use_count(), 3);
  EXPECT_FALSE(table.Acquire().has_value()) << "a fourth slot out of a table of three";
  for (int i = 0; i < 3; ++i) {
    auto found = table.Find(handles[static_cast<size_t>(i)]);
    ASSERT_TRUE(found.has_value());
    EXPECT_EQ(table[*found].tag, 10 + i);
  }
  // Freeing one makes room for exactly one.
  table.Release(*table.Find(handles[1]));
  EXPECT_EQ(table.in_use_count(), 2);
  EXPECT_TRUE(table.Acquire().has_value());
  EXPECT_FALSE(table.Acquire().has_value());
}

TEST(HandleTable, AStaleHandleIsRefusedAfterItsSlotIsReused) {
  HandleTable<Payload> table(1);
  const uint32_t index = *table.Acquire();
  const uint64_t first = table.HandleOf(index);
  table[index].items.assign(100, 7);
  table.Release(index);
  EXPECT_FALSE(table.Find(first).has_value()) << "a released handle still finds its slot";

  const uint32_t again = *table.Acquire();
  ASSERT_EQ(again, index) << "one slot: it must be reused";
  const uint64_t second = table.HandleOf(again);
  EXPECT_NE(second, first);
  EXPECT_FALSE(table.Find(first).has_value()) << "the old handle names the new occupant";
  ASSERT_TRUE(table.Find(second).has_value());
  EXPECT_EQ(*table.Find(second), index);
  // The payload stays in place between uses (the owner resets it).
  EXPECT_GE(table[again].items.capacity(), 100u);
}

TEST(HandleTable, ForeignHandlesAreOutOfRangeAndNeverFound) {
  HandleTable<int> table(4);
  const uint32_t index = *table.Acquire();
  const uint64_t live = table.HandleOf(index);
  EXPECT_TRUE(table.InRange(live));
  EXPECT_FALSE(table.InRange(0));
  EXPECT_FALSE(table.Find(0).has_value());
  const uint64_t past_end = (live & ~uint64_t{0xffffffff}) | 5;  // index 4 of a table of 4
  EXPECT_FALSE(table.InRange(past_end));
  EXPECT_FALSE(table.Find(past_end).has_value());
  // In range but never issued: a slot not in use.
  const uint64_t idle = (live & ~uint64_t{0xffffffff}) | (index == 0 ? 2 : 1);
  EXPECT_TRUE(table.InRange(idle));
  EXPECT_FALSE(table.Find(idle).has_value());
  // The right index with another generation.
  EXPECT_FALSE(table.Find(live + (uint64_t{1} << 32)).has_value());
}

TEST(HandleTable, TheGenerationWrapsPastZero) {
  HandleTable<int> table(1, /*first_generation=*/0xfffffffeu);
  std::vector<uint64_t> seen;
  for (int round = 0; round < 4; ++round) {
    const uint32_t index = *table.Acquire();
    const uint64_t h = table.HandleOf(index);
    for (uint64_t old : seen) {
      EXPECT_NE(h, old) << "round " << round;
      EXPECT_FALSE(table.Find(old).has_value()) << "round " << round;
    }
    EXPECT_NE(h >> 32, 0u) << "generation 0 issued in round " << round;
    ASSERT_TRUE(table.Find(h).has_value());
    seen.push_back(h);
    table.Release(index);
  }
  // 0xfffffffe, 0xffffffff, then 1 and 2: 0 is skipped.
  EXPECT_EQ(seen[0] >> 32, 0xfffffffeu);
  EXPECT_EQ(seen[1] >> 32, 0xffffffffu);
  EXPECT_EQ(seen[2] >> 32, 1u);
  EXPECT_EQ(seen[3] >> 32, 2u);
}

TEST(HandleTable, ReleaseFreesTheSlotAndADoubleReleaseIsCaught) {
  HandleTable<int> table(2);
  const uint32_t a = *table.Acquire();
  const uint32_t b = *table.Acquire();
  EXPECT_TRUE(table.in_use(a));
  table.Release(a);
  EXPECT_FALSE(table.in_use(a));
  EXPECT_TRUE(table.in_use(b));
  EXPECT_EQ(table.in_use_count(), 1);
  GTEST_FLAG_SET(death_test_style, "threadsafe");
  EXPECT_DEATH(table.Release(a), "release of a slot not in use");
  EXPECT_DEATH(table.HandleOf(a), "handle of a slot not in use");
  EXPECT_DEATH(table.Release(7), "release of a slot not in use");
}

}  // namespace
}  // namespace zinf::aio
