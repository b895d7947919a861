#include "core/json_difference.h"

#include <set>

namespace kvs {

namespace {

std::string shown(const nlohmann::json* v) { return v ? v->dump() : "(absent)"; }

std::string difference(const nlohmann::json* a, const nlohmann::json* b, const std::string& path) {
  if (a && b && *a == *b) return "";
  if (a && b && a->is_object() && b->is_object()) {
    std::set<std::string> keys;
    for (const auto& [k, v] : a->items()) keys.insert(k);
    for (const auto& [k, v] : b->items()) keys.insert(k);
    for (const std::string& k : keys) {
      const auto ia = a->find(k), ib = b->find(k);
      const std::string d = difference(ia == a->end() ? nullptr : &*ia, ib == b->end() ? nullptr : &*ib,
                                       path.empty() ? k : path + "." + k);
      if (!d.empty()) return d;
    }
    return "";
  }
  return (path.empty() ? "(top level)" : path) + ": " + shown(a) + " vs " + shown(b);
}

}  // namespace

std::string json_difference(const nlohmann::json& a, const nlohmann::json& b) { return difference(&a, &b, ""); }

}  // namespace kvs
