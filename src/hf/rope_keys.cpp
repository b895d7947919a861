#include "hf/rope_keys.h"

#include <optional>
#include <set>

#include "core/error.h"

namespace kvs::hf {

using nlohmann::json;

namespace {

json llama3_keys(const RopeScalingConfig& s) {
  return {{"rope_type", "llama3"},
          {"factor", s.factor},
          {"low_freq_factor", s.low_freq_factor},
          {"high_freq_factor", s.high_freq_factor},
          {"original_max_position_embeddings", s.original_max_position_embeddings}};
}

// What one RoPE object (rope_scaling or rope_parameters) says.
struct RopeObject {
  std::optional<double> theta;
  RopeScalingConfig scaling;
};

double number(const json& d, const std::string& key, const std::string& path, const std::string& origin) {
  const auto it = d.find(key);
  if (it == d.end() || it->is_null()) fail("{}: {}.{}: missing (rope_type \"llama3\" needs it)", origin, path, key);
  if (!it->is_number()) fail("{}: {}.{}: expected a number, got {}", origin, path, key, it->dump());
  return it->get<double>();
}

RopeObject read_object(const json& d, const std::string& path, const std::string& origin) {
  if (!d.is_object()) fail("{}: {}: expected an object or null, got {}", origin, path, d.dump());
  // transformers 4.x also spells rope_type "type"; 5.x defaults it to "default".
  std::string type = "default";
  for (const char* k : {"type", "rope_type"})
    if (d.contains(k)) {
      if (!d[k].is_string()) fail("{}: {}.{}: expected a string, got {}", origin, path, k, d[k].dump());
      type = d[k].get<std::string>();
    }
  if (d.contains("type") && d.contains("rope_type") && d["type"] != d["rope_type"])
    fail("{}: {}: type {} and rope_type {} disagree", origin, path, d["type"].dump(), d["rope_type"].dump());
  if (type != "default" && type != "llama3")
    fail("{}: {}.rope_type \"{}\" cannot be expressed (kvshift implements RoPE types \"default\" and \"llama3\")",
         origin, path, type);
  std::set<std::string> known = {"type", "rope_type", "rope_theta", "partial_rotary_factor"};
  if (type == "llama3")
    known.insert({"factor", "low_freq_factor", "high_freq_factor", "original_max_position_embeddings"});
  for (const auto& [k, v] : d.items())
    if (!known.count(k))
      fail("{}: {}.{} {} cannot be expressed (rope_type \"{}\" in kvshift reads no such key)", origin, path, k,
           v.dump(), type);
  if (d.contains("partial_rotary_factor") && !(d["partial_rotary_factor"].is_number() &&
                                                d["partial_rotary_factor"].get<double>() == 1.0))
    fail("{}: {}.partial_rotary_factor {} cannot be expressed (kvshift rotates the whole head)", origin, path,
         d["partial_rotary_factor"].dump());
  RopeObject r;
  if (d.contains("rope_theta") && !d["rope_theta"].is_null()) r.theta = number(d, "rope_theta", path, origin);
  if (type == "llama3") {
    RopeScalingConfig& s = r.scaling;
    s.rope_type = RopeType::Llama3;
    s.factor = number(d, "factor", path, origin);
    s.low_freq_factor = number(d, "low_freq_factor", path, origin);
    s.high_freq_factor = number(d, "high_freq_factor", path, origin);
    const double ctx = number(d, "original_max_position_embeddings", path, origin);
    if (ctx != static_cast<double>(static_cast<int>(ctx)))
      fail("{}: {}.original_max_position_embeddings: expected an integer, got {}", origin, path, ctx);
    s.original_max_position_embeddings = static_cast<int>(ctx);
  }
  return r;
}

}  // namespace

void write_rope_keys(const ModelConfig& m, json& j) {
  const bool llama3 = m.rope_scaling.rope_type == RopeType::Llama3;
  j["rope_theta"] = m.rope_theta;
  j["rope_scaling"] = llama3 ? llama3_keys(m.rope_scaling) : json(nullptr);
  json p = llama3 ? llama3_keys(m.rope_scaling) : json{{"rope_type", "default"}};
  p["rope_theta"] = m.rope_theta;
  j["rope_parameters"] = p;
}

void read_rope_keys(const json& j, const std::string& origin, ModelConfig& m) {
  std::optional<RopeObject> scaling, params;
  if (j.contains("rope_scaling") && !j["rope_scaling"].is_null())
    scaling = read_object(j["rope_scaling"], "rope_scaling", origin);
  if (j.contains("rope_parameters") && !j["rope_parameters"].is_null())
    params = read_object(j["rope_parameters"], "rope_parameters", origin);
  // 4.x reads rope_scaling only; 5.x prefers it to rope_parameters: a model
  // that both describe must be the same model.
  if (scaling && params && !(scaling->scaling == params->scaling))
    fail("{}: rope_scaling {} and rope_parameters {} describe different RoPE", origin, j["rope_scaling"].dump(),
         j["rope_parameters"].dump());
  std::optional<double> theta;
  std::string theta_key;
  auto take_theta = [&](std::optional<double> t, const std::string& key) {
    if (!t) return;
    if (theta && *theta != *t)
      fail("{}: {} {} and {} {} disagree", origin, theta_key, *theta, key, *t);
    theta = t, theta_key = key;
  };
  if (j.contains("rope_theta") && !j["rope_theta"].is_null()) {
    if (!j["rope_theta"].is_number()) fail("{}: rope_theta: expected a number, got {}", origin, j["rope_theta"].dump());
    take_theta(j["rope_theta"].get<double>(), "rope_theta");
  }
  if (scaling) take_theta(scaling->theta, "rope_scaling.rope_theta");
  if (params) take_theta(params->theta, "rope_parameters.rope_theta");
  if (j.contains("partial_rotary_factor") && !j["partial_rotary_factor"].is_null() &&
      !(j["partial_rotary_factor"].is_number() && j["partial_rotary_factor"].get<double>() == 1.0))
    fail("{}: partial_rotary_factor {} cannot be expressed (kvshift rotates the whole head)", origin,
         j["partial_rotary_factor"].dump());
  m.rope_theta = theta.value_or(10000.0);
  m.rope_scaling = scaling ? scaling->scaling : params ? params->scaling : RopeScalingConfig{};
}

}  // namespace kvs::hf
