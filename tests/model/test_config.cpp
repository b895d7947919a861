// The experiment config: strict parsing, overrides, validation, round trips and
// the shipped config files.
#include <gtest/gtest.h>

#include <filesystem>
#include <fstream>
#include <functional>
#include <map>
#include <string>
#include <vector>

#include "build_paths.h"
#include "core/error.h"
#include "model/config.h"
#include "test_util.h"

namespace fs = std::filesystem;
using nlohmann::json;
using kvs::AttentionImpl;
using kvs::DatasetType;
using kvs::Device;
using kvs::DocumentBoundaries;
using kvs::LrSchedule;
using kvs::PositionEncoding;
using kvs::Recompute;
using kvs::ShiftParametrization;

namespace {

const std::string kRoot = kvs::test::source_dir();
const std::string kOrigin = "configs/x.json";

// Runs f, expects a kvs::Error whose message contains every needle.
void expect_error(const std::function<void()>& f, const std::vector<std::string>& needles) {
  try {
    f();
  } catch (const kvs::Error& e) {
    std::string msg = e.what();
    for (const auto& n : needles) EXPECT_NE(msg.find(n), std::string::npos) << "message: " << msg << "\nmissing: " << n;
    EXPECT_EQ(msg.find('\n'), std::string::npos) << "message is not one line: " << msg;
    return;
  } catch (const std::exception& e) {
    ADD_FAILURE() << "threw a non-kvs exception: " << e.what();
    return;
  }
  ADD_FAILURE() << "no error thrown; expected one containing " << (needles.empty() ? "" : needles[0]);
}

// A small valid config as JSON (induction data), the base the tests mutate.
json base_json() {
  return json::parse(R"({
    "name": "t", "device": "cpu",
    "model": {"hidden_size": 64, "intermediate_size": 256, "num_hidden_layers": 2, "num_attention_heads": 4,
              "num_key_value_heads": 2, "vocab_size": 128, "max_position_embeddings": 128,
              "kv_shift": {"enabled": true}},
    "train": {"seq_len": 64, "steps": 10, "lr": 1e-3, "warmup_steps": 2},
    "data": {"type": "induction", "induction": {"token_lo": 11, "token_hi": 128, "pool_size": 32, "pad_token": 0}},
    "parallel": {"tp": 1}
  })");
}

kvs::Config base_config() { return kvs::config_from_json(base_json(), kOrigin); }

// Every run config shipped under configs/ (configs/experiments/ holds sweep
// specs, a different format checked by tests/test_sweep.py).
std::vector<fs::path> all_config_files() {
  std::vector<fs::path> out;
  for (const auto& e : fs::recursive_directory_iterator(kRoot + "/configs"))
    if (e.is_regular_file() && e.path().extension() == ".json" &&
        e.path().parent_path().filename() != "experiments")
      out.push_back(e.path());
  std::sort(out.begin(), out.end());
  return out;
}

std::string write_temp(const std::string& name, const std::string& text) {
  fs::path dir = fs::temp_directory_path() / "kvs_test_config";
  fs::create_directories(dir);
  fs::path p = dir / name;
  std::ofstream(p) << text;
  return p.string();
}

}  // namespace

// ---------------------------------------------------------------------------
// Shipped config files.
// ---------------------------------------------------------------------------

TEST(Config, EveryShippedFileLoadsAndValidates) {
  auto files = all_config_files();
  EXPECT_GE(files.size(), 14u);
  for (const auto& f : files) {
    SCOPED_TRACE(f.string());
    kvs::Config c;
    EXPECT_NO_THROW(c = kvs::load_config(f.string())) << f;
    EXPECT_EQ(c.source_path, f.string());
    // Every shipped file spells out every key (but the data section it does not
    // use): it equals its own full dump.
    std::ifstream in(f);
    json j = json::parse(in);
    json full = kvs::to_json(c);
    for (const char* section : {"induction", "ngram", "hopk", "shards"})
      if (kvs::to_string(c.data.type) != section) full["data"].erase(section);
    EXPECT_EQ(j, full) << "not every key is written out in " << f;
  }
  for (const char* name : {"paper/1.5B-vanilla", "paper/1.5B-kvshift", "paper/2.9B-vanilla", "paper/2.9B-kvshift",
                           "paper/6.7B-vanilla", "paper/6.7B-kvshift", "paper/13B-vanilla", "paper/13B-kvshift",
                           "paper/19B-vanilla", "paper/19B-kvshift", "toy/induction-1l-kvshift",
                           "toy/induction-1l-vanilla", "toy/lm-small-kvshift", "toy/lm-small-vanilla",
                           "toy/ngram-1l-kvshift", "toy/ngram-1l-vanilla", "toy/hopk-2l-kvshift",
                           "toy/hopk-2l-vanilla", "toy/lm-text-kvshift", "toy/lm-text-vanilla"})
    EXPECT_TRUE(fs::exists(kRoot + "/configs/" + name + ".json")) << name;
}

TEST(Config, ShippedPairsDifferOnlyInTheShift) {
  for (const char* stem : {"toy/induction-1l", "toy/lm-small", "toy/lm-text", "toy/ngram-1l", "toy/hopk-2l", "paper/1.5B", "paper/2.9B", "paper/6.7B", "paper/13B",
                           "paper/19B"}) {
    SCOPED_TRACE(stem);
    auto k = kvs::load_config(kRoot + "/configs/" + stem + "-kvshift.json");
    auto v = kvs::load_config(kRoot + "/configs/" + stem + "-vanilla.json");
    EXPECT_TRUE(k.model.kv_shift.enabled);
    EXPECT_FALSE(v.model.kv_shift.enabled);
    // The run names carry the variant; everything else is identical.
    EXPECT_NE(k.name.find("kvshift"), std::string::npos);
    EXPECT_NE(v.name.find("vanilla"), std::string::npos);
    v.model.kv_shift.enabled = true;
    v.name = k.name;
    v.source_path = k.source_path;
    EXPECT_TRUE(k == v);
  }
}

TEST(Config, ToyConfigsMatchTheBrief) {
  auto c = kvs::load_config(kRoot + "/configs/toy/induction-1l-kvshift.json");
  EXPECT_EQ(c.device, Device::Cpu);
  EXPECT_EQ(c.model.num_hidden_layers, 1);
  EXPECT_EQ(c.model.hidden_size, 64);
  EXPECT_EQ(c.model.intermediate_size, 256);
  EXPECT_EQ(c.model.num_attention_heads, 4);
  EXPECT_EQ(c.model.num_key_value_heads, 4);
  EXPECT_EQ(c.model.vocab_size, 128);
  EXPECT_EQ(c.model.max_position_embeddings, 128);
  EXPECT_EQ(c.data.type, DatasetType::Induction);
  EXPECT_EQ(c.data.induction.token_lo, 11);
  EXPECT_EQ(c.data.induction.token_hi, 128);
  EXPECT_EQ(c.data.induction.pool_size, 32);
  EXPECT_EQ(c.data.induction.pad_token, 0);
  EXPECT_EQ(c.train.seq_len, 64);
  EXPECT_EQ(c.train.micro_batch_size, 32);
  EXPECT_EQ(c.train.steps, 800);
  EXPECT_DOUBLE_EQ(c.train.lr, 2e-3);

  auto l = kvs::load_config(kRoot + "/configs/toy/lm-small-kvshift.json");
  EXPECT_EQ(l.model.vocab_size, 256);
  EXPECT_EQ(l.model.hidden_size, 256);
  EXPECT_EQ(l.model.num_hidden_layers, 4);
  EXPECT_EQ(l.model.num_attention_heads, 4);
  EXPECT_EQ(l.model.num_key_value_heads, 2);
  EXPECT_EQ(l.model.intermediate_size, 688);
  EXPECT_EQ(l.train.seq_len, 256);
  EXPECT_EQ(l.train.schedule, LrSchedule::Cosine);
  EXPECT_DOUBLE_EQ(l.train.min_lr, 1e-4);
  EXPECT_EQ(l.data.type, DatasetType::Shards);
  EXPECT_EQ(l.data.shards.train, std::vector<std::string>{"../../data/bytes/train_*.bin"});
  EXPECT_EQ(l.data.shards.val, std::vector<std::string>{"../../data/bytes/val_*.bin"});
}

TEST(Config, PaperConfigsMatchTable6) {
  struct Row {
    const char* name;
    int hidden, layers, heads, kv, ffn, ctx, vocab;
    double lr;
    int warmup, gpus, batch_per_gpu;
    double tokens;
  };
  const Row rows[] = {
      {"1.5B", 2048, 28, 16, 16, 5504, 2048, 36000, 2e-4, 1000, 64, 8, 10e9},
      {"2.9B", 2560, 32, 20, 4, 8704, 4096, 48000, 8e-4, 600, 512, 8, 500e9},
      {"6.7B", 4096, 32, 32, 32, 11008, 2048, 36000, 2e-4, 1000, 64, 8, 10e9},
      {"13B", 5120, 40, 40, 40, 13824, 2048, 36000, 2e-4, 1000, 128, 8, 10e9},
      {"19B", 6144, 48, 48, 4, 16384, 12288, 48000, 2e-4, 3000, 240, 1, 200e9},
  };
  const int expected_steps[] = {9537, 29803, 9537, 4769, 67817};
  for (size_t i = 0; i < std::size(rows); ++i) {
    const Row& r = rows[i];
    for (const char* variant : {"vanilla", "kvshift"}) {
      SCOPED_TRACE(std::string(r.name) + "-" + variant);
      auto c = kvs::load_config(kRoot + "/configs/paper/" + r.name + "-" + variant + ".json");
      const auto& m = c.model;
      EXPECT_EQ(m.hidden_size, r.hidden);
      EXPECT_EQ(m.num_hidden_layers, r.layers);
      EXPECT_EQ(m.num_attention_heads, r.heads);
      EXPECT_EQ(m.num_key_value_heads, r.kv);
      EXPECT_EQ(m.intermediate_size, r.ffn);
      EXPECT_EQ(m.max_position_embeddings, r.ctx);
      EXPECT_EQ(m.vocab_size, r.vocab);
      EXPECT_EQ(m.head_dim(), 128);
      EXPECT_DOUBLE_EQ(m.rope_theta, 100000.0);
      EXPECT_DOUBLE_EQ(m.rms_norm_eps, 1e-5);
      EXPECT_FALSE(m.tie_word_embeddings);
      EXPECT_EQ(m.kv_shift.enabled, std::string(variant) == "kvshift");
      EXPECT_EQ(m.kv_shift.window, 1);
      const auto& t = c.train;
      EXPECT_EQ(t.seq_len, r.ctx);
      EXPECT_EQ(t.micro_batch_size, r.batch_per_gpu);
      EXPECT_EQ(t.grad_accum_steps, r.gpus);
      EXPECT_DOUBLE_EQ(t.lr, r.lr);
      EXPECT_EQ(t.warmup_steps, r.warmup);
      EXPECT_EQ(t.schedule, LrSchedule::Constant);
      EXPECT_DOUBLE_EQ(t.beta1, 0.9);
      EXPECT_DOUBLE_EQ(t.beta2, 0.95);
      EXPECT_DOUBLE_EQ(t.weight_decay, 0.1);
      const double tokens_per_step = double(c.global_batch_sequences()) * t.seq_len;
      EXPECT_EQ(t.steps, static_cast<int>(std::ceil(r.tokens / tokens_per_step)));
      EXPECT_EQ(t.steps, expected_steps[i]);
      EXPECT_EQ(c.device, Device::Cuda);
      EXPECT_EQ(c.data.type, DatasetType::Shards);
      EXPECT_EQ(c.data.shards.train, std::vector<std::string>{"../../data/corpus/train_*.bin"});
    }
  }
  // The paper's global batches: 1M / 16M / 1M / 2M / ~3M (1M = 2^20 tokens).
  auto tokens = [&](const char* n) {
    auto c = kvs::load_config(kRoot + "/configs/paper/" + std::string(n) + "-kvshift.json");
    return static_cast<long long>(c.global_batch_sequences()) * c.train.seq_len;
  };
  EXPECT_EQ(tokens("1.5B"), 1LL << 20);
  EXPECT_EQ(tokens("2.9B"), 16LL << 20);
  EXPECT_EQ(tokens("6.7B"), 1LL << 20);
  EXPECT_EQ(tokens("13B"), 2LL << 20);
  EXPECT_EQ(tokens("19B"), 240LL * 12288);
}

// ---------------------------------------------------------------------------
// Parsing.
// ---------------------------------------------------------------------------

TEST(Config, DefaultsFillMissingKeys) {
  json j = base_json();
  j["model"].erase("num_key_value_heads");
  j.erase("train");
  j.erase("parallel");
  j.erase("name");
  j.erase("device");
  auto c = kvs::config_from_json(j, kOrigin);
  kvs::TrainConfig dt;
  EXPECT_TRUE(c.train == dt);
  EXPECT_EQ(c.model.num_key_value_heads, c.model.num_attention_heads);
  EXPECT_DOUBLE_EQ(c.model.rms_norm_eps, 1e-5);
  EXPECT_DOUBLE_EQ(c.model.rope_theta, 100000.0);
  EXPECT_EQ(c.model.position_encoding, PositionEncoding::Rope);
  EXPECT_EQ(c.parallel.tp, 1);
  EXPECT_EQ(c.device, Device::Cpu);
  EXPECT_EQ(c.name, "");
  // A missing kv_shift object takes the struct defaults (enabled) in a run config.
  j = base_json();
  j["model"].erase("kv_shift");
  EXPECT_TRUE(kvs::config_from_json(j, kOrigin).model.kv_shift.enabled);
  // Missing shift_q / parametrization: false / "free".
  j = base_json();
  j["model"]["kv_shift"].erase("shift_q");
  j["model"]["kv_shift"].erase("parametrization");
  auto ks = kvs::config_from_json(j, kOrigin).model.kv_shift;
  EXPECT_FALSE(ks.shift_q);
  EXPECT_EQ(ks.parametrization, ShiftParametrization::Free);
}

TEST(Config, RequiredModelKeys) {
  for (const char* k : {"hidden_size", "intermediate_size", "num_hidden_layers", "num_attention_heads", "vocab_size",
                        "max_position_embeddings"}) {
    json j = base_json();
    j["model"].erase(k);
    expect_error([&] { kvs::config_from_json(j, kOrigin); }, {kOrigin, std::string("model.") + k, "missing"});
  }
  json j = base_json();
  j.erase("model");
  expect_error([&] { kvs::config_from_json(j, kOrigin); }, {kOrigin, "'model'", "missing"});
}

TEST(Config, UnknownKeysNameTheFullPath) {
  struct Case {
    std::function<void(json&)> edit;
    std::string needle;
  };
  std::vector<Case> cases = {
      {[](json& j) { j["trian"] = json::object(); }, "unknown key 'trian'"},
      {[](json& j) { j["train"]["lerning_rate"] = 1; }, "unknown key 'train.lerning_rate'"},
      {[](json& j) { j["model"]["hidden_sizes"] = 1; }, "unknown key 'model.hidden_sizes'"},
      {[](json& j) { j["model"]["kv_shift"]["windows"] = 1; }, "unknown key 'model.kv_shift.windows'"},
      {[](json& j) { j["data"]["induction"]["pad"] = 1; }, "unknown key 'data.induction.pad'"},
      {[](json& j) { j["data"]["shards"]["tran"] = json::array(); }, "unknown key 'data.shards.tran'"},
      {[](json& j) { j["data"]["ngram"]["pairs"] = 5; }, "unknown key 'data.ngram.pairs'"},
      {[](json& j) { j["data"]["hopk"]["hops"] = 2; }, "unknown key 'data.hopk.hops'"},
      {[](json& j) { j["data"]["typ"] = "x"; }, "unknown key 'data.typ'"},
      {[](json& j) { j["parallel"]["dp"] = 2; }, "unknown key 'parallel.dp'"},
  };
  for (auto& cs : cases) {
    json j = base_json();
    cs.edit(j);
    expect_error([&] { kvs::config_from_json(j, kOrigin); }, {kOrigin + ": " + cs.needle});
  }
}

TEST(Config, UnknownKeySuggestions) {
  json j = base_json();
  j["train"]["warmup_step"] = 3;
  expect_error([&] { kvs::config_from_json(j, kOrigin); },
               {"unknown key 'train.warmup_step'", "did you mean 'train.warmup_steps'"});
  j = base_json();
  j["model"]["hiden_size"] = 3;
  expect_error([&] { kvs::config_from_json(j, kOrigin); }, {"did you mean 'model.hidden_size'"});
  // A key of another section is pointed to.
  j = base_json();
  j["train"]["vocab_size"] = 3;
  expect_error([&] { kvs::config_from_json(j, kOrigin); },
               {"unknown key 'train.vocab_size'", "did you mean 'model.vocab_size'"});
  // Nothing close: no suggestion.
  j = base_json();
  j["train"]["zzzzzzzzzz"] = 3;
  try {
    kvs::config_from_json(j, kOrigin);
    ADD_FAILURE();
  } catch (const kvs::Error& e) {
    EXPECT_EQ(std::string(e.what()).find("did you mean"), std::string::npos) << e.what();
  }
}

TEST(Config, WrongTypesNameKeyAndValue) {
  struct Case {
    std::function<void(json&)> edit;
    std::vector<std::string> needles;
  };
  std::vector<Case> cases = {
      {[](json& j) { j["train"]["lr"] = "abc"; }, {"train.lr: expected a number, got string \"abc\""}},
      {[](json& j) { j["train"]["steps"] = "10"; }, {"train.steps: expected an integer, got string \"10\""}},
      {[](json& j) { j["train"]["steps"] = 3.5; }, {"train.steps: expected an integer, got number 3.5"}},
      {[](json& j) { j["model"]["hidden_size"] = 64.25; }, {"model.hidden_size: expected an integer"}},
      {[](json& j) { j["model"]["tie_word_embeddings"] = 1; }, {"model.tie_word_embeddings: expected a boolean", "got number 1"}},
      {[](json& j) { j["model"]["kv_shift"]["enabled"] = "true"; }, {"model.kv_shift.enabled: expected a boolean"}},
      {[](json& j) { j["model"]["kv_shift"] = true; }, {"model.kv_shift: expected an object, got boolean true"}},
      {[](json& j) { j["train"] = json::array(); }, {"train: expected an object, got array"}},
      {[](json& j) { j["name"] = 5; }, {"name: expected a string, got number 5"}},
      {[](json& j) { j["model"]["position_encoding"] = false; }, {"model.position_encoding: expected a string"}},
      {[](json& j) { j["model"]["kv_shift"]["shift_q"] = 1; }, {"model.kv_shift.shift_q: expected a boolean"}},
      {[](json& j) { j["model"]["kv_shift"]["parametrization"] = 0; },
       {"model.kv_shift.parametrization: expected a string"}},
      {[](json& j) { j["device"] = nullptr; }, {"device: expected a string, got null"}},
      {[](json& j) { j["data"]["shards"]["train"] = "a.bin"; }, {"data.shards.train: expected an array of strings"}},
      {[](json& j) { j["data"]["shards"]["train"] = json::array({"a.bin", 3}); }, {"data.shards.train[1]: expected a string"}},
      {[](json& j) { j["train"]["seed"] = -1; }, {"train.seed: expected a non-negative integer"}},
      {[](json& j) { j["train"]["seed"] = -2.0; }, {"train.seed: expected a non-negative integer, got number -2.0"}},
      {[](json& j) { j["train"]["seed"] = 1e16; },
       {"train.seed: 1e+16 is past 2^53", "write it in plain digits (10000000000000000)"}},
      {[](json& j) { j["model"]["vocab_size"] = 1e12; }, {"model.vocab_size", "32-bit"}},
      {[](json& j) { j["parallel"]["tp"] = 4294967296LL; }, {"parallel.tp", "32-bit"}},
  };
  for (auto& cs : cases) {
    json j = base_json();
    cs.edit(j);
    auto needles = cs.needles;
    needles.push_back(kOrigin);
    expect_error([&] { kvs::config_from_json(j, kOrigin); }, needles);
  }
  expect_error([&] { kvs::config_from_json(json::array(), kOrigin); }, {kOrigin, "top level"});
}

TEST(Config, IntegralFloatsAreIntegers) {
  json j = base_json();
  j["train"]["steps"] = 2e3;
  j["train"]["seed"] = 7.0;
  auto c = kvs::config_from_json(j, kOrigin);
  EXPECT_EQ(c.train.steps, 2000);
  EXPECT_EQ(c.train.seed, 7u);
  j["train"]["seed"] = 18446744073709551615ULL;  // full uint64 range as an integer
  EXPECT_EQ(kvs::config_from_json(j, kOrigin).train.seed, 18446744073709551615ULL);
  // Integers are fine where a number is expected.
  j["train"]["lr"] = 1;
  EXPECT_DOUBLE_EQ(kvs::config_from_json(j, kOrigin).train.lr, 1.0);
}

// Each enum's name table is the one list of its names: parsing, printing and
// JSON all use it.
template <class E>
void expect_names_round_trip(const std::vector<std::string>& names) {
  const auto table = enum_names(E{});
  ASSERT_EQ(table.size(), names.size());
  for (size_t i = 0; i < names.size(); ++i) {
    const E e = table[i].value;
    EXPECT_EQ(static_cast<size_t>(e), i) << names[i];  // every enumerator, in declaration order
    EXPECT_EQ(kvs::to_string(e), names[i]);
    EXPECT_EQ(kvs::enum_from_string<E>(names[i]), e);
    EXPECT_EQ(fmt::format("{}", e), names[i]);
    EXPECT_EQ(json(e), json(names[i]));
  }
  EXPECT_EQ(kvs::enum_from_string<E>("nonsense"), std::nullopt);
}

TEST(Config, EnumNamesRoundTrip) {
  expect_names_round_trip<Device>({"cpu", "cuda"});
  expect_names_round_trip<PositionEncoding>({"rope", "none"});
  expect_names_round_trip<ShiftParametrization>({"free", "sigmoid_gate", "clamp01"});
  expect_names_round_trip<DocumentBoundaries>({"none", "shift", "shift_and_attention"});
  expect_names_round_trip<DatasetType>({"induction", "ngram", "hopk", "shards"});
  expect_names_round_trip<LrSchedule>({"constant", "cosine", "linear", "wsd"});
  expect_names_round_trip<kvs::LrDecayShape>({"linear", "cosine", "1-sqrt"});
  expect_names_round_trip<Recompute>({"none", "attention", "full"});
  expect_names_round_trip<AttentionImpl>({"flash", "cudnn", "flash-mma"});
  EXPECT_EQ(kvs::enum_choices<Recompute>(), "\"none\", \"attention\" or \"full\"");
  EXPECT_EQ(kvs::enum_choices<Device>('\''), "'cpu' or 'cuda'");
}

// An enum-valued key is checked where it is read: the message names the key,
// every allowed value and the value given.
TEST(Config, EnumValuesAreCheckedWhenRead) {
  struct Case {
    std::function<void(json&)> edit;
    std::vector<std::string> needles;
  };
  std::vector<Case> cases = {
      {[](json& j) { j["device"] = "tpu"; }, {"device: must be \"cpu\" or \"cuda\", got \"tpu\""}},
      {[](json& j) { j["model"]["position_encoding"] = "alibi"; },
       {"model.position_encoding: must be \"rope\" or \"none\", got \"alibi\""}},
      {[](json& j) { j["model"]["position_encoding"] = "NONE"; }, {"model.position_encoding"}},
      {[](json& j) { j["model"]["kv_shift"]["parametrization"] = "sigmoid"; },
       {"model.kv_shift.parametrization: must be \"free\", \"sigmoid_gate\" or \"clamp01\", got \"sigmoid\""}},
      {[](json& j) { j["train"]["schedule"] = "exponential"; },
       {"train.schedule: must be \"constant\", \"cosine\", \"linear\" or \"wsd\", got \"exponential\""}},
      {[](json& j) { j["train"]["decay_shape"] = "sqrt"; }, {"train.decay_shape", "\"1-sqrt\"", "\"sqrt\""}},
      {[](json& j) { j["data"]["type"] = "text"; }, {"data.type", "text"}},
      {[](json& j) { j["train"]["recompute"] = "layers"; }, {"train.recompute", "\"layers\""}},
      {[](json& j) { j["train"]["attention_backend"] = "xformers"; }, {"train.attention_backend", "\"xformers\""}},
      {[](json& j) { j["model"]["document_boundaries"] = "docs"; }, {"model.document_boundaries", "\"docs\""}},
  };
  for (size_t i = 0; i < cases.size(); ++i) {
    SCOPED_TRACE(i);
    json j = base_json();
    cases[i].edit(j);
    auto needles = cases[i].needles;
    needles.push_back(kOrigin);
    expect_error([&] { kvs::config_from_json(j, kOrigin); }, needles);
  }
}

// ---------------------------------------------------------------------------
// Validation: every rule names its key and the file.
// ---------------------------------------------------------------------------

TEST(Config, BaseConfigIsValid) { EXPECT_NO_THROW(kvs::validate(base_config(), kOrigin)); }

// Counts past any real run are one-line errors naming the key, not an overflow:
// pp x virtual_stages wrapped to 0 (SIGFPE), layers_per_stage summed past
// INT_MAX (a wrong split accepted), 2 x cp negative (a layout accepted), and
// absurd sizes allocated before anything said no (found by a config fuzzer).
TEST(Config, HugeCountsAreBoundedNotOverflowed) {
  auto bad = [](const std::function<void(json&)>& edit, std::vector<std::string> needles) {
    json j = base_json();
    edit(j);
    needles.push_back(kOrigin);
    expect_error([&] { kvs::validate(kvs::config_from_json(j, kOrigin), kOrigin); }, needles);
  };
  bad([](json& j) { j["parallel"] = {{"pp", 4}, {"virtual_stages", 1073741824}}; },
      {"parallel.virtual_stages: must be in [1, 4096], got 1073741824"});
  bad([](json& j) { j["parallel"] = {{"pp", 2147483647}}; }, {"parallel.pp: must be in [1, 4096]"});
  bad([](json& j) { j["parallel"] = {{"pp", 2}, {"virtual_stages", 2}}; },
      {"parallel.pp x parallel.virtual_stages (2 x 2) is more stages than model.num_hidden_layers (2)"});
  bad([](json& j) {
        j["model"]["num_hidden_layers"] = 4;
        j["parallel"] = {{"pp", 3}, {"layers_per_stage", {2147483647, 2147483647, 6}}};
      },
      {"parallel.layers_per_stage: the stages hold 4294967300 layers, model.num_hidden_layers is 4"});
  bad([](json& j) { j["parallel"] = {{"cp", 2147483647}}; }, {"parallel.cp: must be in [1, 65536]"});
  bad([](json& j) { j["parallel"] = {{"tp", 2147483647}}; }, {"parallel.tp: must be in [1, 65536]"});
  bad([](json& j) { j["model"]["num_hidden_layers"] = 200000000; }, {"model.num_hidden_layers: must be in [1, 4096]"});
  bad([](json& j) { j["train"]["threads"] = 100000; }, {"train.threads: must be in [0, 4096]"});
  bad([](json& j) { j["train"]["grad_accum_steps"] = 2147483647; }, {"train.grad_accum_steps: must be in [1, 1048576]"});
  bad([](json& j) { j["train"]["eval_sequences"] = 2147483647; }, {"train.eval_sequences: must be in [1, 16777216]"});
  // Values that round to 0 in float32 or turn RoPE inside out: NaN at the first step before.
  bad([](json& j) { j["train"]["eps"] = 1e-320; }, {"train.eps: must be >= 1e-30"});
  bad([](json& j) { j["model"]["rms_norm_eps"] = 5e-324; }, {"model.rms_norm_eps: must be >= 1e-30"});
  bad([](json& j) { j["model"]["rope_theta"] = 1e-300; }, {"model.rope_theta: must be >= 1"});
}

TEST(Config, ValidationRulesNameTheKey) {
  using C = kvs::Config;
  struct Case {
    std::function<void(C&)> edit;
    std::vector<std::string> needles;
  };
  std::vector<Case> cases = {
      {[](C& c) { c.model.hidden_size = 0; }, {"model.hidden_size"}},
      {[](C& c) { c.model.intermediate_size = -1; }, {"model.intermediate_size"}},
      {[](C& c) { c.model.num_hidden_layers = 0; }, {"model.num_hidden_layers"}},
      {[](C& c) { c.model.num_attention_heads = 0; }, {"model.num_attention_heads"}},
      {[](C& c) { c.model.num_key_value_heads = 0; }, {"model.num_key_value_heads"}},
      {[](C& c) { c.model.vocab_size = 0; }, {"model.vocab_size"}},
      {[](C& c) { c.model.max_position_embeddings = 0; }, {"model.max_position_embeddings"}},
      {[](C& c) { c.model.hidden_size = 60; c.model.num_attention_heads = 8; },
       {"model.hidden_size", "model.num_attention_heads", "not divisible"}},
      {[](C& c) { c.model.num_key_value_heads = 3; }, {"model.num_key_value_heads", "not divisible"}},
      {[](C& c) { c.model.hidden_size = 36; c.model.num_attention_heads = 4; c.model.num_key_value_heads = 4; },
       {"model.hidden_size", "head_dim", "even"}},
      {[](C& c) { c.model.rms_norm_eps = 0; }, {"model.rms_norm_eps"}},
      {[](C& c) { c.model.rope_theta = -1; }, {"model.rope_theta"}},
      {[](C& c) { c.model.initializer_range = 0; }, {"model.initializer_range"}},
      {[](C& c) { c.model.kv_shift.window = 4; },
       {"model.kv_shift.window: training supports windows 1 to 3", "got 4"}},
      {[](C& c) { c.model.kv_shift.window = 9; }, {"model.kv_shift.window", "[1, 8]"}},
      {[](C& c) { c.model.kv_shift.window = 0; }, {"model.kv_shift.window"}},
      {[](C& c) { c.model.kv_shift.parametrization = ShiftParametrization::SigmoidGate; c.model.kv_shift.window = 2; },
       {"model.kv_shift.parametrization", "sigmoid_gate", "window 1", "got window 2"}},
      {[](C& c) { c.train.seq_len = 129; }, {"train.seq_len", "model.max_position_embeddings"}},
      {[](C& c) { c.train.seq_len = 0; }, {"train.seq_len"}},
      {[](C& c) { c.train.micro_batch_size = 0; }, {"train.micro_batch_size"}},
      {[](C& c) { c.train.grad_accum_steps = 0; }, {"train.grad_accum_steps"}},
      {[](C& c) { c.train.steps = 0; }, {"train.steps"}},
      {[](C& c) { c.train.lr = 0; }, {"train.lr"}},
      {[](C& c) { c.train.min_lr = -1e-5; }, {"train.min_lr"}},
      {[](C& c) { c.train.min_lr = 2 * c.train.lr; }, {"train.min_lr"}},
      {[](C& c) { c.train.warmup_steps = -1; }, {"train.warmup_steps"}},
      {[](C& c) { c.train.beta1 = 1.0; }, {"train.beta1"}},
      {[](C& c) { c.train.beta1 = -0.1; }, {"train.beta1"}},
      {[](C& c) { c.train.beta2 = 1.0; }, {"train.beta2"}},
      {[](C& c) { c.train.eps = 0; }, {"train.eps"}},
      {[](C& c) { c.train.weight_decay = -0.1; }, {"train.weight_decay"}},
      {[](C& c) { c.train.grad_clip = -1; }, {"train.grad_clip"}},
      {[](C& c) { c.train.eval_every = -1; }, {"train.eval_every"}},
      {[](C& c) { c.train.checkpoint_every = -1; }, {"train.checkpoint_every"}},
      {[](C& c) { c.train.log_every = 0; }, {"train.log_every"}},
      {[](C& c) { c.train.eval_sequences = 0; }, {"train.eval_sequences"}},
      {[](C& c) { c.train.threads = -1; }, {"train.threads"}},
      {[](C& c) { c.data.induction.token_lo = -1; }, {"data.induction.token_lo"}},
      {[](C& c) { c.data.induction.token_hi = 11; }, {"data.induction.token_hi"}},
      {[](C& c) { c.data.induction.token_hi = 129; }, {"data.induction.token_hi", "model.vocab_size"}},
      {[](C& c) { c.data.induction.pool_size = 1; }, {"data.induction.pool_size"}},
      {[](C& c) { c.data.induction.pool_size = 118; }, {"data.induction.pool_size"}},
      {[](C& c) { c.data.induction.max_repeats = -1; }, {"data.induction.max_repeats"}},
      {[](C& c) { c.data.induction.pad_token = 11; }, {"data.induction.pad_token"}},
      {[](C& c) { c.data.induction.pad_token = 127; }, {"data.induction.pad_token"}},
      {[](C& c) { c.data.induction.pad_token = 128; c.data.induction.token_hi = 100; }, {"data.induction.pad_token"}},
      {[](C& c) { c.data.induction.pad_token = -1; }, {"data.induction.pad_token"}},
      {[](C& c) { c.data.type = DatasetType::Ngram; c.data.ngram.token_lo = -1; }, {"data.ngram.token_lo"}},
      {[](C& c) { c.data.type = DatasetType::Ngram; c.data.ngram.token_hi = 11; }, {"data.ngram.token_hi"}},
      {[](C& c) { c.data.type = DatasetType::Ngram; c.data.ngram.token_hi = 129; },
       {"data.ngram.token_hi", "model.vocab_size"}},
      {[](C& c) { c.data.type = DatasetType::Ngram; c.data.ngram.token_hi = 128; c.data.ngram.num_pairs = 0; },
       {"data.ngram.num_pairs"}},
      {[](C& c) { c.data.type = DatasetType::Ngram; c.data.ngram.token_hi = 21; c.data.ngram.num_pairs = 101; },
       {"data.ngram.num_pairs", "100"}},
      {[](C& c) { c.data.type = DatasetType::Hopk; c.data.hopk.token_lo = -1; }, {"data.hopk.token_lo"}},
      {[](C& c) { c.data.type = DatasetType::Hopk; c.data.hopk.token_hi = 12; }, {"data.hopk.token_hi"}},
      {[](C& c) { c.data.type = DatasetType::Hopk; c.data.hopk.token_hi = 129; },
       {"data.hopk.token_hi", "model.vocab_size"}},
      {[](C& c) { c.data.type = DatasetType::Hopk; c.data.hopk.k = 0; }, {"data.hopk.k"}},
      {[](C& c) { c.data.type = DatasetType::Hopk; c.data.hopk.k = c.train.seq_len - 1; },
       {"data.hopk.k", "train.seq_len"}},
      {[](C& c) { c.data.type = DatasetType::Shards; }, {"data.shards.train"}},
      {[](C& c) { c.data.type = DatasetType::Shards; c.data.shards.train = {""}; }, {"data.shards.train[0]"}},
      {[](C& c) { c.data.type = DatasetType::Shards; c.data.shards.train = {"a"}; c.data.shards.val_fraction = 1.0; },
       {"data.shards.val_fraction"}},
      {[](C& c) { c.data.type = DatasetType::Shards; c.data.shards.train = {"a"}; c.data.shards.val_fraction = -0.1; },
       {"data.shards.val_fraction"}},
      {[](C& c) { c.device = Device::Cuda; c.model.num_attention_heads = c.model.num_key_value_heads = 8; },
       {"device", "head_dim", "got 8"}},
      {[](C& c) { c.train.attention_backend = AttentionImpl::Cudnn; },
       {"train.attention_backend", "needs device \"cuda\""}},
      {[](C& c) { c.train.attention_backend = AttentionImpl::FlashMma; },
       {"train.attention_backend", "\"flash-mma\" needs device \"cuda\""}},
      {[](C& c) { c.device = Device::Cuda; c.parallel.cp = 2; c.train.attention_backend = AttentionImpl::Cudnn; },
       {"parallel.cp", "\"flash\" or \"flash-mma\""}},
      {[](C& c) { c.parallel.tp = 0; }, {"parallel.tp"}},
      {[](C& c) { c.train.schedule = LrSchedule::Wsd; }, {"train.decay_steps", "\"wsd\"", "got 0"}},
      {[](C& c) { c.train.schedule = LrSchedule::Wsd; c.train.decay_steps = c.train.steps - c.train.warmup_steps + 1; },
       {"train.decay_steps", "train.steps - train.warmup_steps"}},
      {[](C& c) { c.train.schedule = LrSchedule::Cosine; c.train.decay_steps = 10; },
       {"train.decay_steps", "only the \"wsd\" schedule", "\"cosine\""}},
      {[](C& c) { c.train.decay_shape = kvs::LrDecayShape::OneMinusSqrt; },
       {"train.decay_shape", "\"constant\""}},
      {[](C& c) { c.train.decay_steps = -1; }, {"train.decay_steps"}},
      {[](C& c) { c.model.document_boundaries = DocumentBoundaries::Shift; },
       {"model.document_boundaries", "model.bos_token_id"}},
      {[](C& c) { c.model.bos_token_id = 128; }, {"model.bos_token_id", "128"}},
      {[](C& c) {
         c.model.document_boundaries = DocumentBoundaries::ShiftAndAttention;
         c.model.bos_token_id = 1;
         c.device = Device::Cuda;
         c.train.attention_backend = kvs::AttentionImpl::Cudnn;
       },
       {"model.document_boundaries", "\"cudnn\" has no document masks"}},
      {[](C& c) { c.parallel.tp = 4; }, {"parallel.tp (4) must divide model.num_key_value_heads (2)"}},
      {[](C& c) { c.parallel.tp = 2; c.model.intermediate_size = 255; }, {"parallel.tp (2)", "intermediate_size (255)"}},
  };
  for (size_t i = 0; i < cases.size(); ++i) {
    SCOPED_TRACE(i);
    C c = base_config();
    cases[i].edit(c);
    auto needles = cases[i].needles;
    needles.push_back(kOrigin);
    expect_error([&] { kvs::validate(c, kOrigin); }, needles);
  }
}

TEST(Config, ValidationEdgesThatPass) {
  auto ok = [](const std::function<void(kvs::Config&)>& edit) {
    kvs::Config c = base_config();
    edit(c);
    EXPECT_NO_THROW(kvs::validate(c, kOrigin));
  };
  ok([](auto& c) { c.train.seq_len = c.model.max_position_embeddings; });
  ok([](auto& c) { c.train.min_lr = c.train.lr; });
  ok([](auto& c) { c.train.grad_clip = 0; c.train.weight_decay = 0; c.train.warmup_steps = 0; });
  ok([](auto& c) { c.train.schedule = LrSchedule::Cosine; });
  ok([](auto& c) { c.train.schedule = LrSchedule::Linear; });
  ok([](auto& c) {  // the whole run after warmup decays
    c.train.schedule = LrSchedule::Wsd;
    c.train.decay_steps = c.train.steps - c.train.warmup_steps;
    c.train.decay_shape = kvs::LrDecayShape::OneMinusSqrt;
  });
  ok([](auto& c) { c.train.beta1 = 0; });
  ok([](auto& c) { c.device = Device::Cuda; });
  ok([](auto& c) { c.device = Device::Cuda; c.parallel.cp = 2; c.train.attention_backend = AttentionImpl::FlashMma; });
  ok([](auto& c) {  // document masks in ring attention
    c.device = Device::Cuda;
    c.parallel.cp = 2;
    c.model.document_boundaries = DocumentBoundaries::ShiftAndAttention;
    c.model.bos_token_id = 1;
  });
  ok([](auto& c) { c.data.induction.pool_size = 117; });                               // = token_hi - token_lo
  ok([](auto& c) { c.data.induction.pad_token = 10; });                                // just below token_lo
  ok([](auto& c) { c.data.induction.token_hi = 100; c.data.induction.pad_token = 127; });  // above the range
  ok([](auto& c) { c.model.num_key_value_heads = 1; });                                // MQA
  ok([](auto& c) { c.model.kv_shift.window = 2; });                                    // the paper's section 4.7
  ok([](auto& c) { c.model.kv_shift.window = 3; });
  ok([](auto& c) { c.model.position_encoding = PositionEncoding::None; });
  ok([](auto& c) {
    c.data.type = DatasetType::Shards;
    c.data.shards.train = {"x_*.bin"};
    c.data.induction.token_hi = 99999;
  });
  ok([](auto& c) { c.data.type = DatasetType::Induction; c.data.shards.val_fraction = 7; });  // unused: not checked
  ok([](auto& c) {  // num_pairs = range^2
    c.data.type = DatasetType::Ngram;
    c.data.ngram.token_hi = 21;
    c.data.ngram.num_pairs = 100;
  });
  ok([](auto& c) { c.data.type = DatasetType::Hopk; c.data.hopk.token_hi = 13; c.data.hopk.k = c.train.seq_len - 2; });
  ok([](auto& c) { c.data.type = DatasetType::Induction; c.data.hopk.k = 0; c.data.ngram.num_pairs = 0; });  // unused
}

// ---------------------------------------------------------------------------
// Overrides.
// ---------------------------------------------------------------------------

TEST(Config, OverridesSetNumbersBooleansStringsAndNestedKeys) {
  json j = base_json();
  j.erase("parallel");
  kvs::apply_override(j, "train.lr=3e-4", kOrigin);
  kvs::apply_override(j, "train.steps=2e3", kOrigin);
  kvs::apply_override(j, "model.kv_shift.enabled=false", kOrigin);
  kvs::apply_override(j, "model.tie_word_embeddings=true", kOrigin);
  kvs::apply_override(j, "device=cuda", kOrigin);                        // not JSON -> a string
  kvs::apply_override(j, "name=\"123\"", kOrigin);                       // a JSON string
  kvs::apply_override(j, "train.schedule=cosine", kOrigin);
  kvs::apply_override(j, "model.position_encoding=none", kOrigin);
  kvs::apply_override(j, "data.shards.train=[\"a_*.bin\",\"b.bin\"]", kOrigin);  // section missing in the file
  kvs::apply_override(j, "data.type=shards", kOrigin);
  kvs::apply_override(j, "parallel.tp=1", kOrigin);                      // whole section missing in the file
  kvs::apply_override(j, "train.seed=a=b", kOrigin);                     // split at the first '='
  EXPECT_EQ(j["train"]["seed"], "a=b");
  kvs::apply_override(j, "train.seed=99", kOrigin);
  auto c = kvs::config_from_json(j, kOrigin);
  EXPECT_DOUBLE_EQ(c.train.lr, 3e-4);
  EXPECT_EQ(c.train.steps, 2000);
  EXPECT_FALSE(c.model.kv_shift.enabled);
  EXPECT_TRUE(c.model.tie_word_embeddings);
  EXPECT_EQ(c.device, Device::Cuda);
  EXPECT_EQ(c.name, "123");
  EXPECT_EQ(c.train.schedule, LrSchedule::Cosine);
  EXPECT_EQ(c.model.position_encoding, PositionEncoding::None);
  EXPECT_EQ(c.data.type, DatasetType::Shards);
  EXPECT_EQ(c.data.shards.train, (std::vector<std::string>{"a_*.bin", "b.bin"}));
  EXPECT_EQ(c.train.seed, 99u);
  EXPECT_NO_THROW(kvs::validate(c, kOrigin));
}

TEST(Config, BadOverridesError) {
  json j = base_json();
  expect_error([&] { kvs::apply_override(j, "train.lr", kOrigin); }, {"train.lr", "'='"});
  expect_error([&] { kvs::apply_override(j, "=3", kOrigin); }, {"'=3'", "empty key path"});
  expect_error([&] { kvs::apply_override(j, "train..lr=3", kOrigin); }, {"train..lr=3", "empty"});
  expect_error([&] { kvs::apply_override(j, "foo.bar=1", kOrigin); }, {"foo.bar=1", "unknown key 'foo'"});
  expect_error([&] { kvs::apply_override(j, "train.lerning_rate=1", kOrigin); },
               {"train.lerning_rate=1", "unknown key 'train.lerning_rate'"});
  expect_error([&] { kvs::apply_override(j, "train.warmup_step=1", kOrigin); }, {"did you mean 'train.warmup_steps'"});
  expect_error([&] { kvs::apply_override(j, "train.lr.x=1", kOrigin); }, {"train.lr.x=1", "not an object"});
  expect_error([&] { kvs::apply_override(j, "model.foo.bar=1", kOrigin); }, {"unknown key 'model.foo'"});
  // A well-formed override with a value of the wrong type fails at parsing, naming the key.
  kvs::apply_override(j, "train.lr=fast", kOrigin);
  expect_error([&] { kvs::config_from_json(j, kOrigin); }, {"train.lr: expected a number, got string \"fast\""});
}

// Numbers as a shell user writes them but JSON does not are numbers; words,
// hex floats, inf and nan stay strings (and fail where a number belongs).
TEST(Config, OverrideValuesInShellNumberForms) {
  json j = base_json();
  for (const auto& [text, want] : {std::pair{".001", json(0.001)}, {"1.", json(1.0)}, {"+3", json(3)},
                                   {"+2e-4", json(2e-4)}, {"-.5", json(-0.5)}, {"0x10", json("0x10")},
                                   {"inf", json("inf")}, {"nan", json("nan")}, {"1e", json("1e")}}) {
    SCOPED_TRACE(text);
    kvs::apply_override(j, std::string("train.lr=") + text, kOrigin);
    EXPECT_EQ(j["train"]["lr"], want);
    EXPECT_EQ(j["train"]["lr"].is_number_integer(), want.is_number_integer());
  }
  kvs::apply_override(j, "train.steps=+7", kOrigin);
  j["train"]["lr"] = 0.01;
  EXPECT_EQ(kvs::config_from_json(j, kOrigin).train.steps, 7);
}

TEST(Config, LoadConfigAppliesOverridesAndValidates) {
  auto p = write_temp("ok.json", base_json().dump(2));
  auto c = kvs::load_config(p, {"train.lr=5e-4", "model.kv_shift.enabled=false"});
  EXPECT_DOUBLE_EQ(c.train.lr, 5e-4);
  EXPECT_FALSE(c.model.kv_shift.enabled);
  EXPECT_EQ(c.source_path, p);
  expect_error([&] { kvs::load_config(p, {"parallel.tp=3"}); }, {p, "parallel.tp (3) must divide"});
  EXPECT_EQ(kvs::load_config(p, {"parallel.tp=2"}).parallel.tp, 2);
  expect_error([&] { kvs::load_config(p, {"bogus"}); }, {p, "bogus"});
}

TEST(Config, LoadConfigFileErrors) {
  expect_error([] { kvs::load_config("/nonexistent/dir/x.json"); }, {"/nonexistent/dir/x.json: cannot read:"});
  expect_error([] { kvs::load_config(fs::temp_directory_path().string()); }, {"cannot read"});
  auto bad = write_temp("bad.json", "{\n  \"name\": \"x\",\n  \"device\": cpu\n}\n");
  expect_error([&] { kvs::load_config(bad); }, {bad + ": invalid JSON at line 3, column"});
  auto empty = write_temp("empty.json", "");
  expect_error([&] { kvs::load_config(empty); }, {empty + ": invalid JSON"});
  auto dup = write_temp("dup.json", R"({"train": {"lr": 1e-3, "lr": 2e-3}})");
  expect_error([&] { kvs::load_config(dup); }, {dup + ": duplicate key 'train.lr'"});
  json j = base_json();
  j["train"]["lerning_rate"] = 1;
  auto unk = write_temp("unknown.json", j.dump());
  expect_error([&] { kvs::load_config(unk); }, {unk + ": unknown key 'train.lerning_rate'"});
}

// ---------------------------------------------------------------------------
// Round trips.
// ---------------------------------------------------------------------------

TEST(Config, ToJsonRoundTrips) {
  kvs::Config c = base_config();
  c.name = "round trip";
  c.train.seed = 0xFFFFFFFFFFFFFFFFULL;
  c.train.lr = 0.1 + 0.2;  // not short in decimal
  c.train.min_lr = 1e-7;
  c.train.schedule = LrSchedule::Cosine;
  c.train.recompute = Recompute::Full;
  c.train.attention_backend = AttentionImpl::Cudnn;
  c.train.overlap_optimizer = false;
  c.train.shard_master = false;
  c.train.time_gemm_algorithms = true;
  c.device = Device::Cuda;
  c.model.kv_shift.shift_v = false;
  c.model.kv_shift.shift_q = true;
  c.model.kv_shift.parametrization = ShiftParametrization::Clamp01;
  c.model.kv_shift.window = 3;
  c.model.position_encoding = PositionEncoding::None;
  c.model.tie_word_embeddings = true;
  c.data.shards.train = {"a_*.bin", "b.bin"};
  c.data.shards.val = {"v.bin"};
  c.data.shards.val_fraction = 0.25;
  c.data.ngram = {3, 77, 123, 0xFFFFFFFFFFFFFFF1ULL};
  c.data.hopk = {5, 9, 6};
  json j = kvs::to_json(c);
  EXPECT_TRUE(kvs::config_from_json(j, "mem") == c);
  EXPECT_TRUE(kvs::config_from_json(json::parse(j.dump()), "mem") == c);  // through text, doubles exact
  // Every key is written.
  for (const char* k : {"name", "device", "model", "train", "data", "parallel"}) EXPECT_TRUE(j.contains(k)) << k;
  EXPECT_EQ(j["train"].size(), 24u);
  EXPECT_EQ(j["train"]["overlap_optimizer"], false);
  EXPECT_EQ(j["train"]["shard_master"], false);
  EXPECT_EQ(j["train"]["time_gemm_algorithms"], true);
  // Left out while they hold their defaults (true), so that older readers keep working.
  EXPECT_FALSE(kvs::to_json(base_config())["train"].contains("overlap_optimizer"));
  EXPECT_FALSE(kvs::to_json(base_config())["train"].contains("shard_master"));
  EXPECT_FALSE(kvs::to_json(base_config())["train"].contains("time_gemm_algorithms"));  // false
  EXPECT_EQ(j["model"].size(), 13u);
  EXPECT_EQ(j["model"]["position_encoding"], "none");
  EXPECT_EQ(j["model"]["kv_shift"].size(), 6u);
  EXPECT_EQ(j["model"]["kv_shift"]["shift_q"], true);
  EXPECT_EQ(j["model"]["kv_shift"]["parametrization"], "clamp01");
  EXPECT_EQ(j["data"]["induction"].size(), 5u);
  EXPECT_EQ(j["data"]["ngram"].size(), 4u);
  EXPECT_EQ(j["data"]["hopk"].size(), 3u);
  EXPECT_EQ(j["data"]["shards"].size(), 3u);
  // Shipped files round-trip too.
  for (const auto& f : all_config_files()) {
    auto fc = kvs::load_config(f.string());
    auto back = kvs::config_from_json(kvs::to_json(fc), f.string());
    back.source_path = fc.source_path;
    EXPECT_TRUE(back == fc) << f;
  }
}

TEST(Config, HfJsonRoundTrips) {
  for (bool enabled : {true, false}) {
    kvs::ModelConfig m = base_config().model;
    m.kv_shift.enabled = enabled;
    m.kv_shift.shift_k = false;
    m.kv_shift.window = enabled ? 2 : 1;
    m.kv_shift.shift_q = enabled;
    m.kv_shift.parametrization = enabled ? ShiftParametrization::Clamp01 : ShiftParametrization::SigmoidGate;
    m.position_encoding = enabled ? PositionEncoding::Rope : PositionEncoding::None;
    json j = kvs::model_to_hf_json(m);
    EXPECT_EQ(j["position_encoding"], enabled ? "rope" : "none");
    EXPECT_EQ(j["architectures"], json::array({enabled ? "KvShiftLlamaForCausalLM" : "LlamaForCausalLM"}));
    EXPECT_EQ(j["model_type"], "llama");
    EXPECT_EQ(j["head_dim"], 16);
    EXPECT_EQ(j["hidden_act"], "silu");
    EXPECT_EQ(j["attention_bias"], false);
    EXPECT_EQ(j["mlp_bias"], false);
    EXPECT_EQ(j["torch_dtype"], "float32");
    EXPECT_EQ(j["num_key_value_heads"], 2);
    EXPECT_EQ(j["kv_shift"]["enabled"], enabled);
    EXPECT_EQ(j["kv_shift"]["shift_q"], enabled);
    EXPECT_EQ(j["kv_shift"]["parametrization"], enabled ? "clamp01" : "sigmoid_gate");
    EXPECT_TRUE(kvs::model_from_hf_json(j, "config.json") == m);
    EXPECT_TRUE(kvs::model_from_hf_json(json::parse(j.dump()), "config.json") == m);
  }
}

TEST(Config, RopeScalingIsWrittenOnlyWhenSet) {
  kvs::Config c = base_config();
  EXPECT_FALSE(kvs::to_json(c)["model"].contains("rope_scaling"));
  EXPECT_FALSE(kvs::model_to_hf_json(c.model).contains("rope_scaling"));
  json j = kvs::to_json(c);
  j["model"]["rope_scaling"] = {{"rope_type", "llama3"}, {"factor", 32.0}, {"original_max_position_embeddings", 64}};
  c = kvs::config_from_json(j, kOrigin);
  kvs::validate(c, kOrigin);
  const kvs::RopeScalingConfig& r = c.model.rope_scaling;
  EXPECT_EQ(r.rope_type, kvs::RopeType::Llama3);
  EXPECT_DOUBLE_EQ(r.factor, 32.0);
  EXPECT_DOUBLE_EQ(r.low_freq_factor, 1.0);  // Llama 3's values by default
  EXPECT_DOUBLE_EQ(r.high_freq_factor, 4.0);
  EXPECT_EQ(r.original_max_position_embeddings, 64);
  const json hf = kvs::model_to_hf_json(c.model);
  EXPECT_EQ(hf["rope_scaling"]["rope_type"], "llama3");
  EXPECT_TRUE(kvs::model_from_hf_json(hf, "config.json") == c.model);
  EXPECT_TRUE(kvs::config_from_json(kvs::to_json(c), kOrigin) == c);

  using C = kvs::Config;
  const std::pair<std::function<void(C&)>, std::vector<std::string>> bad[] = {
      {[](C& x) { x.model.rope_scaling.factor = 0.5; }, {"model.rope_scaling.factor", ">= 1"}},
      {[](C& x) { x.model.rope_scaling.original_max_position_embeddings = 0; },
       {"model.rope_scaling.original_max_position_embeddings"}},
      {[](C& x) { x.model.rope_scaling.high_freq_factor = 1.0; },
       {"model.rope_scaling.high_freq_factor", "model.rope_scaling.low_freq_factor"}},
      {[](C& x) { x.model.position_encoding = PositionEncoding::None; },
       {"model.rope_scaling.rope_type", "model.position_encoding", "none"}},
  };
  for (const auto& [edit, needles] : bad) {
    C x = c;
    edit(x);
    const std::string msg = kvs::testing_util::error_of([&] { kvs::validate(x, kOrigin); });
    for (const auto& n : needles) EXPECT_NE(msg.find(n), std::string::npos) << "missing '" << n << "' in: " << msg;
  }
  j["model"]["rope_scaling"]["rope_type"] = "yarn";
  EXPECT_KVS_ERROR(kvs::config_from_json(j, kOrigin), "model.rope_scaling.rope_type", "\"default\" or \"llama3\"",
                   "yarn");
}

TEST(Config, HfJsonReading) {
  // A plain Llama config.json: no kv_shift object -> the shift is disabled.
  json j = json::parse(R"({"architectures": ["LlamaForCausalLM"], "model_type": "llama", "hidden_size": 64,
      "intermediate_size": 256, "num_hidden_layers": 2, "num_attention_heads": 4, "vocab_size": 128,
      "max_position_embeddings": 128, "hidden_act": "silu", "torch_dtype": "bfloat16"})");
  auto m = kvs::model_from_hf_json(j, "ckpt/config.json");
  EXPECT_FALSE(m.kv_shift.enabled);
  EXPECT_EQ(m.num_key_value_heads, 4);
  EXPECT_EQ(m.position_encoding, PositionEncoding::Rope);  // checkpoints written before the key existed
  json nope = j;
  nope["position_encoding"] = "none";
  EXPECT_EQ(kvs::model_from_hf_json(nope, "ckpt/config.json").position_encoding, PositionEncoding::None);
  // A kv_shift object from before shift_q / parametrization existed: the defaults.
  json old = j;
  old["kv_shift"] = {{"enabled", true}, {"window", 1}, {"shift_k", true}, {"shift_v", true}};
  const auto om = kvs::model_from_hf_json(old, "ckpt/config.json");
  EXPECT_FALSE(om.kv_shift.shift_q);
  EXPECT_EQ(om.kv_shift.parametrization, ShiftParametrization::Free);
  // Other unknown keys are rejected; HF values we do not implement too.
  auto bad = [&](const std::function<void(json&)>& edit, std::vector<std::string> needles) {
    json b = j;
    edit(b);
    needles.push_back("ckpt/config.json");
    expect_error([&] { kvs::model_from_hf_json(b, "ckpt/config.json"); }, needles);
  };
  bad([](json& b) { b["rope_parameters"] = nullptr; }, {"unknown key 'rope_parameters'"});
  bad([](json& b) { b["hidden_act"] = "gelu"; }, {"hidden_act"});
  bad([](json& b) { b["attention_bias"] = true; }, {"attention_bias"});
  bad([](json& b) { b["mlp_bias"] = true; }, {"mlp_bias"});
  bad([](json& b) { b["head_dim"] = 32; }, {"head_dim"});
  bad([](json& b) { b["model_type"] = "gpt2"; }, {"model_type"});
  bad([](json& b) { b.erase("vocab_size"); }, {"missing required key 'vocab_size'"});
  bad([](json& b) { b["num_attention_heads"] = 3; }, {"hidden_size", "not divisible"});
  bad([](json& b) { b["kv_shift"] = {{"window", 0}}; }, {"kv_shift.window"});
  bad([](json& b) { b["kv_shift"] = {{"enabld", true}}; }, {"unknown key 'kv_shift.enabld'"});
  bad([](json& b) { b["position_encoding"] = "alibi"; }, {"position_encoding: must be", "alibi"});
  bad([](json& b) { b["kv_shift"] = {{"parametrization", "tanh"}}; }, {"kv_shift.parametrization: must be", "tanh"});
  bad([](json& b) { b["kv_shift"] = {{"parametrization", "sigmoid_gate"}, {"window", 2}}; },
      {"kv_shift.parametrization", "window 1"});
  bad([](json& b) { b["kv_shift"] = {{"shift_q", "yes"}}; }, {"kv_shift.shift_q: expected a boolean"});
  bad([](json& b) { b["position_encoding"] = 0; }, {"position_encoding: expected a string"});
}
