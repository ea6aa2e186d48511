#include <gtest/gtest.h>

#include <thread>

#include "loco/comm/key_value.h"
#include "loco/core/error.h"

namespace loco::comm {
namespace {

using namespace std::chrono_literals;

TEST(MemoryKeyValueStoreTest, GetWaitsForTheKeyOrTimesOut) {
  MemoryKeyValueStore store;
  const auto start = std::chrono::steady_clock::now();
  EXPECT_FALSE(store.get("absent", 100ms).has_value());
  EXPECT_GE(std::chrono::steady_clock::now() - start, 100ms);

  std::thread setter([&] {
    std::this_thread::sleep_for(50ms);
    store.set("late", std::string("v\0x", 3));
  });
  auto value = store.get("late", 5s);
  setter.join();
  ASSERT_TRUE(value.has_value());
  EXPECT_EQ(*value, std::string("v\0x", 3));
}

TEST(MemoryKeyValueStoreTest, AddCheckRemove) {
  MemoryKeyValueStore store;
  EXPECT_EQ(store.add("n", 2), 2);
  EXPECT_EQ(store.add("n", -5), -3);
  store.set("a", "1");
  EXPECT_TRUE(store.check({"a", "n"}));
  EXPECT_FALSE(store.check({"a", "b"}));
  EXPECT_EQ(store.add("a", 1), 2);  // a value set as text counts as an integer when it is one
  store.set("x", "text");
  EXPECT_THROW(store.add("x", 1), Error);
  EXPECT_TRUE(store.remove("a"));
  EXPECT_FALSE(store.remove("a"));
  store.set("epoch/1/a", "");
  store.set("epoch/1/b", "");
  store.set("epoch/2/a", "");
  EXPECT_EQ(store.remove_prefix("epoch/1/"), 2);
  EXPECT_TRUE(store.check({"epoch/2/a"}));
}

TEST(MemoryKeyValueStoreTest, LimitsProtectTheServer) {
  MemoryKeyValueStore store(/*max_value_bytes=*/8, /*max_keys=*/2);
  EXPECT_THROW(store.set("big", std::string(9, 'x')), Error);
  store.set("a", "1");
  store.set("b", "2");
  store.set("a", "3");  // replacing a key needs no room
  EXPECT_THROW(store.set("c", "4"), Error);
}

}  // namespace
}  // namespace loco::comm
