// `kvshift inspect`: the learned KV shift coefficients of a checkpoint, per layer
// and KV head, and (window 1) the paper's Table 4: how often a_cur > a_prev
// coincides with b_cur > b_prev, plus how far a_cur + a_prev and b_cur + b_prev
// drift from 1 (section 4.6).
#include <algorithm>
#include <cstdio>
#include <limits>
#include <cmath>
#include <map>
#include <nlohmann/json.hpp>
#include <string>
#include <vector>

#include "cli/commands/commands.h"
#include "cli/commands/common.h"
#include "core/error.h"
#include "core/safetensors.h"
#include "model/params.h"

namespace kvs::cli {

namespace {

// coefs[layer][head][column], columns oldest -> current.
using Coefs = std::vector<std::vector<std::vector<double>>>;

struct Stats {
  double min = std::numeric_limits<double>::infinity();
  double max = -std::numeric_limits<double>::infinity();
  double sum = 0;
  int64_t n = 0;
  void add(double v) {
    min = std::min(min, v);
    max = std::max(max, v);
    sum += v;
    ++n;
  }
  double mean() const { return n ? sum / static_cast<double>(n) : 0.0; }
  nlohmann::json json() const { return {{"min", min}, {"mean", mean()}, {"max", max}}; }
};

std::string column_label(int c, int window) { return c == window ? "t" : "t-" + std::to_string(window - c); }

// The coefficients of `kind` ("k_shift"/"v_shift" over the KV heads, "q_shift"
// over the query heads) for every layer, or empty if the checkpoint has none of
// them. Shapes are checked against the config. For the "sigmoid_gate"
// parametrisation the stored tensor holds the gate logit g (column 1); what the
// model uses, and what is reported, is [1 - s, s] with s = sigmoid(g), as the
// engines compute it.
Coefs read_shift(const LoadedCheckpoint& ck, const std::map<std::string, const StTensor*>& by_name,
                 const std::string& kind) {
  const int L = ck.model.num_hidden_layers;
  const int H = kind == "q_shift" ? ck.model.num_attention_heads : ck.model.num_key_value_heads;
  Coefs out;
  for (int l = 0; l < L; ++l) {
    const std::string name = "model.layers." + std::to_string(l) + ".self_attn." + kind;
    auto it = by_name.find(name);
    if (it == by_name.end()) {
      KVS_CHECK(l == 0, "{}/model.safetensors: missing tensor '{}' (layer 0 has one)", ck.dir, name);
      return {};
    }
    const StTensor& t = *it->second;
    KVS_CHECK(t.shape.size() == 2 && t.shape[0] == H && t.shape[1] >= 2,
              "{}/model.safetensors: tensor '{}' has shape {}, expected [{}={}, window+1]", ck.dir, name,
              nlohmann::json(t.shape).dump(), kind == "q_shift" ? "num_attention_heads" : "num_key_value_heads", H);
    const std::vector<float> v = tensor_to_f32(t);
    const int64_t cols = t.shape[1];
    std::vector<std::vector<double>> heads(H);
    const bool gated = ck.model.kv_shift.sigmoid_gate();
    for (int h = 0; h < H; ++h) {
      if (gated) {
        const float sg = 1.0f / (1.0f + std::exp(-v[h * cols + 1]));
        heads[h] = {1.0f - sg, sg};
        continue;
      }
      for (int64_t c = 0; c < cols; ++c) heads[h].push_back(v[h * cols + c]);
    }
    if (!out.empty())
      KVS_CHECK(out[0][0].size() == static_cast<size_t>(cols), "{}/model.safetensors: tensor '{}' has {} columns, layer 0 has {}",
                ck.dir, name, cols, out[0][0].size());
    out.push_back(std::move(heads));
  }
  return out;
}

nlohmann::json shift_json(const Coefs& c) {
  nlohmann::json layers = nlohmann::json::array();
  for (const auto& l : c) layers.push_back(l);
  return layers;
}

Stats column_sums(const Coefs& c) {
  Stats s;
  for (const auto& l : c)
    for (const auto& h : l) {
      double sum = 0;
      for (double x : h) sum += x;
      s.add(sum);
    }
  return s;
}

void print_shift(const char* title, const Coefs& c, int window) {
  std::printf("%s\n  %-14s", title, "layer/head");
  for (int col = 0; col <= window; ++col) std::printf(" %10s", column_label(col, window).c_str());
  std::printf(" %10s\n", "sum");
  for (size_t l = 0; l < c.size(); ++l)
    for (size_t h = 0; h < c[l].size(); ++h) {
      char lh[48];
      std::snprintf(lh, sizeof lh, "L%d H%d", static_cast<int>(l), static_cast<int>(h));
      std::printf("  %-14s", lh);
      double sum = 0;
      for (double x : c[l][h]) {
        std::printf(" %10.4f", x);
        sum += x;
      }
      std::printf(" %10.4f\n", sum);
    }
}

}  // namespace

void add_inspect(CLI::App& app) {
  auto* cmd = app.add_subcommand("inspect", "Learned KV shift coefficients of a checkpoint (and the paper's Table 4)");
  struct Args {
    std::string checkpoint;
    bool json = false;
  };
  auto a = std::make_shared<Args>();
  cmd->add_option("--checkpoint", a->checkpoint,
                  "A checkpoint (step_* dir), a checkpoints/ dir or a run dir (their latest checkpoint)")
      ->required();
  cmd->add_flag("--json", a->json, "Print one JSON object instead of text");
  cmd->callback([a]() {
    const std::string dir = resolve_checkpoint_dir(a->checkpoint);
    LoadedCheckpoint ck = read_checkpoint(dir);
    // Every tensor against the config, as forward and eval check them: a
    // missing, extra or misshaped tensor (another window's shifts) is an error.
    validate_layout_tensors(ck.data.model, ParamLayout::build(ck.model), {""}, dir + "/model.safetensors");
    std::map<std::string, const StTensor*> by_name;
    for (const auto& t : ck.data.model) by_name[t.name] = &t;
    const Coefs k = read_shift(ck, by_name, "k_shift");
    const Coefs v = read_shift(ck, by_name, "v_shift");
    const Coefs q = read_shift(ck, by_name, "q_shift");  // model.kv_shift.shift_q
    if (k.empty() && v.empty() && q.empty()) {
      const char* msg = "kv_shift disabled: no shift parameters";
      if (a->json)
        std::printf("%s\n", nlohmann::json({{"checkpoint", dir}, {"kv_shift", false}, {"message", msg}}).dump().c_str());
      else
        std::printf("%s: %s\n", dir.c_str(), msg);
      return;
    }
    const Coefs& first = !k.empty() ? k : !v.empty() ? v : q;
    const int window = static_cast<int>(first[0][0].size()) - 1;
    for (const auto& [name, c] : {std::pair{"v_shift", &v}, std::pair{"q_shift", &q}})
      KVS_CHECK(c->empty() || (*c)[0][0].size() == first[0][0].size(),
                "{}/model.safetensors: {} has {} columns, the other shifts {}", dir, name, (*c)[0][0].size(),
                first[0][0].size());
    std::vector<std::string> columns;
    for (int c = 0; c <= window; ++c) columns.push_back(column_label(c, window));
    const int L = ck.model.num_hidden_layers, H = ck.model.num_key_value_heads;

    // Table 4 (window 1, both K and V shifted): a = k_shift, b = v_shift;
    // column 0 = prev (alpha2/beta2), column 1 = cur (alpha1/beta1).
    const bool table4 = window == 1 && !k.empty() && !v.empty();
    int64_t n[2][2] = {{0, 0}, {0, 0}};  // [a_cur > a_prev ? 0 : 1][b_cur > b_prev ? 0 : 1]
    if (table4)
      for (int l = 0; l < L; ++l)
        for (int h = 0; h < H; ++h) {
          const int ia = k[l][h][1] > k[l][h][0] ? 0 : 1;
          const int ib = v[l][h][1] > v[l][h][0] ? 0 : 1;
          ++n[ia][ib];
        }

    if (a->json) {
      nlohmann::json j = {{"checkpoint", dir},
                          {"kv_shift", true},
                          {"window", window},
                          {"num_hidden_layers", L},
                          {"num_key_value_heads", H},
                          {"columns", columns},
                          {"k_shift", k.empty() ? nlohmann::json(nullptr) : shift_json(k)},
                          {"v_shift", v.empty() ? nlohmann::json(nullptr) : shift_json(v)},
                          {"q_shift", q.empty() ? nlohmann::json(nullptr) : shift_json(q)}};
      nlohmann::json sums = nlohmann::json::object();
      if (!k.empty()) sums["k_shift"] = column_sums(k).json();
      if (!v.empty()) sums["v_shift"] = column_sums(v).json();
      if (!q.empty()) sums["q_shift"] = column_sums(q).json();
      j["sums"] = sums;
      if (table4)
        j["table4"] = {{"a_cur_gt_a_prev", {{"b_cur_gt_b_prev", n[0][0]}, {"b_cur_le_b_prev", n[0][1]}}},
                       {"a_cur_le_a_prev", {{"b_cur_gt_b_prev", n[1][0]}, {"b_cur_le_b_prev", n[1][1]}}},
                       {"total", n[0][0] + n[0][1] + n[1][0] + n[1][1]}};
      else
        j["table4"] = nullptr;
      std::printf("%s\n", j.dump().c_str());
      return;
    }

    std::printf("%s: kv_shift window %d, %d layers x %d KV heads (columns oldest -> current)\n", dir.c_str(), window, L,
                H);
    if (!k.empty()) print_shift("k_shift (a):", k, window);
    else std::printf("k_shift: not shifted\n");
    if (!v.empty()) print_shift("v_shift (b):", v, window);
    else std::printf("v_shift: not shifted\n");
    if (!q.empty()) print_shift("q_shift (query heads):", q, window);
    const char* sum_label = window == 1 ? "cur + prev" : "sum of all columns";
    if (!k.empty()) {
      const Stats s = column_sums(k);
      std::printf("a %s: min %.4f mean %.4f max %.4f\n", sum_label, s.min, s.mean(), s.max);
    }
    if (!v.empty()) {
      const Stats s = column_sums(v);
      std::printf("b %s: min %.4f mean %.4f max %.4f\n", sum_label, s.min, s.mean(), s.max);
    }
    if (table4) {
      std::printf("Table 4 (counts over %lld (layer, KV head) pairs; a = k_shift, b = v_shift):\n",
                  static_cast<long long>(n[0][0] + n[0][1] + n[1][0] + n[1][1]));
      std::printf("  %-17s %16s %17s\n", "", "b_cur > b_prev", "b_cur <= b_prev");
      std::printf("  %-17s %16lld %17lld\n", "a_cur > a_prev", static_cast<long long>(n[0][0]),
                  static_cast<long long>(n[0][1]));
      std::printf("  %-17s %16lld %17lld\n", "a_cur <= a_prev", static_cast<long long>(n[1][0]),
                  static_cast<long long>(n[1][1]));
    }
  });
}

}  // namespace kvs::cli
