// The first place two JSON documents differ, for errors that say which key of
// two configs disagrees instead of printing both.
#pragma once
#include <nlohmann/json.hpp>
#include <string>

namespace kvs {

// "" when equal; otherwise the dotted path of the first differing key (in key
// order; arrays and other values compared whole) and both values, e.g.
// "kv_shift.enabled: true vs false", or "rope_scaling: null vs (absent)".
std::string json_difference(const nlohmann::json& a, const nlohmann::json& b);

}  // namespace kvs
