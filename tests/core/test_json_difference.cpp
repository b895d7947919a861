// json_difference names the first differing key of two documents (the errors
// for a checkpoint whose model differs from the config's).
#include <gtest/gtest.h>

#include "core/json_difference.h"

using nlohmann::json;

TEST(JsonDifference, NamesTheFirstDifferingKeyAndBothValues) {
  const json a = {{"hidden_size", 64}, {"kv_shift", {{"enabled", true}, {"window", 1}}}, {"vocab_size", 32}};
  EXPECT_EQ(kvs::json_difference(a, a), "");
  json b = a;
  b["kv_shift"]["enabled"] = false;
  b["vocab_size"] = 33;  // later in key order: the first difference is named
  EXPECT_EQ(kvs::json_difference(a, b), "kv_shift.enabled: true vs false");
  json c = a;
  c.erase("vocab_size");
  EXPECT_EQ(kvs::json_difference(a, c), "vocab_size: 32 vs (absent)");
  EXPECT_EQ(kvs::json_difference(c, a), "vocab_size: (absent) vs 32");
  json d = a;
  d["rope_scaling"] = nullptr;  // null is a value, not an absent key
  EXPECT_EQ(kvs::json_difference(a, d), "rope_scaling: (absent) vs null");
  EXPECT_EQ(kvs::json_difference(json{{"x", {1, 2}}}, json{{"x", {1, 3}}}), "x: [1,2] vs [1,3]");
  EXPECT_EQ(kvs::json_difference(json(1), json("1")), "(top level): 1 vs \"1\"");
}
