// Hugging Face export/import pieces that need no Python: config mapping both
// ways, shard planning, sizes, the output directory's atomicity, and the
// sentencepiece piece reader. The end-to-end checks are tests/hf/run_hf.py.
#include <gtest/gtest.h>

#include <filesystem>

#include "hf/hf_config.h"
#include "hf/shard_plan.h"
#include "hf/sp_pieces.h"
#include "hf/staged_dir.h"
#include "test_util.h"

namespace {

using kvs::testing_util::TmpDir;
using nlohmann::json;

kvs::ModelConfig small_model(bool shift) {
  kvs::ModelConfig m;
  m.hidden_size = 32;
  m.intermediate_size = 48;
  m.num_hidden_layers = 2;
  m.num_attention_heads = 4;
  m.num_key_value_heads = 2;
  m.vocab_size = 40;
  m.max_position_embeddings = 64;
  m.kv_shift.enabled = shift;
  return m;
}

TEST(HfConfig, VanillaIsPlainLlama) {
  const json j = kvs::hf::export_config(small_model(false), "float32", {1, 2, -1, 0});
  EXPECT_EQ(j["model_type"], "llama");
  EXPECT_EQ(j["architectures"][0], "LlamaForCausalLM");
  EXPECT_FALSE(j.contains("auto_map"));
  EXPECT_FALSE(j.contains("kv_shift"));
  EXPECT_EQ(j["bos_token_id"], 1);
  EXPECT_EQ(j["eos_token_id"], 2);
}

TEST(HfConfig, ShiftedNeedsRemoteCode) {
  kvs::ModelConfig m = small_model(true);
  m.kv_shift.window = 2;
  m.kv_shift.shift_q = true;
  const json j = kvs::hf::export_config(m, "bfloat16", {});
  EXPECT_EQ(j["model_type"], "kvshift_llama");
  EXPECT_EQ(j["auto_map"]["AutoModelForCausalLM"], "modeling_kvshift_llama.KvShiftLlamaForCausalLM");
  EXPECT_EQ(j["kv_shift"]["window"], 2);
  EXPECT_TRUE(j["bos_token_id"].is_null());
  EXPECT_EQ(j["torch_dtype"], "bfloat16");
  // NoPE is not a plain Llama either, shift or not.
  kvs::ModelConfig nope = small_model(false);
  nope.position_encoding = kvs::PositionEncoding::None;
  EXPECT_TRUE(kvs::hf::needs_remote_code(nope));
}

TEST(HfConfig, ImportOfExportIsIdentity) {
  for (bool shift : {false, true}) {
    kvs::ModelConfig m = small_model(shift);
    m.tie_word_embeddings = shift;
    m.rope_theta = 500000.0;
    if (shift) m.kv_shift.parametrization = kvs::ShiftParametrization::SigmoidGate;
    EXPECT_EQ(kvs::hf::import_config(kvs::hf::export_config(m, "float32", {}), "c.json"), m);
  }
}

TEST(HfConfig, ImportDefaultsAndRefusals) {
  json j = {{"model_type", "mistral"}, {"hidden_size", 32},      {"intermediate_size", 48},
            {"num_hidden_layers", 1},  {"num_attention_heads", 4}, {"vocab_size", 40},
            {"sliding_window", nullptr}};
  const kvs::ModelConfig m = kvs::hf::import_config(j, "c.json");
  EXPECT_EQ(m.num_key_value_heads, 4);
  EXPECT_DOUBLE_EQ(m.rms_norm_eps, 1e-6);
  EXPECT_FALSE(m.kv_shift.enabled);
  auto with = [&](const char* k, json v) {
    json c = j;
    c[k] = v;
    return c;
  };
  EXPECT_KVS_ERROR(kvs::hf::import_config(with("rope_scaling", {{"type", "linear"}}), "c.json"), "c.json",
                   "rope_scaling");
  EXPECT_KVS_ERROR(kvs::hf::import_config(with("sliding_window", 16), "c.json"), "c.json", "sliding_window");
  // Without the key a Mistral attends within transformers' default window, 4096: refused at its
  // default 131072 positions, taken where the positions fit in the window.
  json no_key = j;
  no_key.erase("sliding_window");
  EXPECT_KVS_ERROR(kvs::hf::import_config(no_key, "c.json"), "c.json",
                   "sliding_window 4096 < max_position_embeddings 131072");
  no_key["max_position_embeddings"] = 4096;
  EXPECT_EQ(kvs::hf::import_config(no_key, "c.json").max_position_embeddings, 4096);
  // transformers' Llama ignores sliding_window.
  json llama = with("model_type", "llama");
  llama["sliding_window"] = 16;
  EXPECT_NO_THROW(kvs::hf::import_config(llama, "c.json"));
  EXPECT_KVS_ERROR(kvs::hf::import_config(with("attention_bias", true), "c.json"), "attention_bias");
  EXPECT_KVS_ERROR(kvs::hf::import_config(with("hidden_act", "gelu"), "c.json"), "gelu");
  EXPECT_KVS_ERROR(kvs::hf::import_config(with("model_type", "gpt2"), "c.json"), "gpt2");
  EXPECT_KVS_ERROR(kvs::hf::import_config(with("head_dim", 16), "c.json"), "head_dim");
}

// config.json as each transformers line saves a Llama (save_pretrained of 4.44.2 and 5.24.0; the
// RoPE keys as written, the rest shortened): theta 500000 and Llama 3 RoPE.
json saved_by(const char* line, bool llama3) {
  json j = {{"model_type", "llama"}, {"hidden_size", 64},       {"intermediate_size", 48},
            {"num_hidden_layers", 2}, {"num_attention_heads", 4}, {"num_key_value_heads", 2},
            {"vocab_size", 37},       {"max_position_embeddings", 64}};
  const json l3 = {{"factor", 8.0}, {"high_freq_factor", 4.0}, {"low_freq_factor", 1.0},
                   {"original_max_position_embeddings", 256}, {"rope_type", "llama3"}};
  if (std::string(line) == "4.44.2") {
    j["rope_theta"] = 500000.0;
    j["rope_scaling"] = llama3 ? l3 : json(nullptr);
  } else {  // 5.x: no rope_theta key
    j["rope_parameters"] = llama3 ? l3 : json{{"rope_type", "default"}};
    j["rope_parameters"]["rope_theta"] = 500000.0;
  }
  j["transformers_version"] = line;
  return j;
}

TEST(HfConfig, RopeOfBothTransformersLines) {
  for (const char* line : {"4.44.2", "5.24.0"}) {
    SCOPED_TRACE(line);
    const kvs::ModelConfig plain = kvs::hf::import_config(saved_by(line, false), "c.json");
    EXPECT_DOUBLE_EQ(plain.rope_theta, 500000.0);
    EXPECT_EQ(plain.rope_scaling.rope_type, kvs::RopeType::Default);
    const kvs::ModelConfig l3 = kvs::hf::import_config(saved_by(line, true), "c.json");
    EXPECT_DOUBLE_EQ(l3.rope_theta, 500000.0);
    EXPECT_EQ(l3.rope_scaling.rope_type, kvs::RopeType::Llama3);
    EXPECT_DOUBLE_EQ(l3.rope_scaling.factor, 8.0);
    EXPECT_DOUBLE_EQ(l3.rope_scaling.low_freq_factor, 1.0);
    EXPECT_DOUBLE_EQ(l3.rope_scaling.high_freq_factor, 4.0);
    EXPECT_EQ(l3.rope_scaling.original_max_position_embeddings, 256);
    // The export writes both dialects, and reads back what it wrote.
    for (const kvs::ModelConfig& m : {plain, l3}) {
      const json e = kvs::hf::export_config(m, "float32", {});
      EXPECT_DOUBLE_EQ(e["rope_theta"].get<double>(), 500000.0);
      EXPECT_DOUBLE_EQ(e["rope_parameters"]["rope_theta"].get<double>(), 500000.0);
      EXPECT_EQ(e["rope_parameters"]["rope_type"], m.rope_scaling.rope_type == kvs::RopeType::Llama3 ? "llama3"
                                                                                                  : "default");
      EXPECT_EQ(e["rope_scaling"].is_null(), m.rope_scaling.rope_type == kvs::RopeType::Default);
      EXPECT_EQ(kvs::hf::import_config(e, "e.json"), m);
    }
  }
  // A Llama without any RoPE key: LlamaConfig's default theta, in both lines.
  json bare = saved_by("5.24.0", false);
  bare.erase("rope_parameters");
  EXPECT_DOUBLE_EQ(kvs::hf::import_config(bare, "c.json").rope_theta, 10000.0);
}

TEST(HfConfig, RopeVariantsWeDoNotImplementAreRefused) {
  auto with = [](const char* key, json v) {
    json j = saved_by("5.24.0", false);
    j.erase("rope_parameters");
    j[key] = v;
    return j;
  };
  for (const char* type : {"linear", "dynamic", "yarn", "longrope", "proportional"})
    EXPECT_KVS_ERROR(kvs::hf::import_config(with("rope_parameters", {{"rope_type", type}, {"factor", 2.0}}), "c.json"),
                     "c.json", std::string("rope_parameters.rope_type \"") + type + "\"");
  EXPECT_KVS_ERROR(kvs::hf::import_config(with("rope_scaling", {{"type", "dynamic"}, {"factor", 2.0}}), "c.json"),
                   "rope_scaling.rope_type \"dynamic\"");
  EXPECT_KVS_ERROR(kvs::hf::import_config(with("partial_rotary_factor", 0.5), "c.json"), "partial_rotary_factor 0.5");
  EXPECT_KVS_ERROR(kvs::hf::import_config(with("rope_parameters", {{"rope_type", "default"},
                                                                   {"partial_rotary_factor", 0.5}}), "c.json"),
                   "rope_parameters.partial_rotary_factor 0.5");
  json l3 = saved_by("5.24.0", true);
  l3["rope_parameters"]["attention_factor"] = 1.5;
  EXPECT_KVS_ERROR(kvs::hf::import_config(l3, "c.json"), "rope_parameters.attention_factor 1.5");
  l3 = saved_by("5.24.0", true);
  l3["rope_parameters"].erase("original_max_position_embeddings");
  EXPECT_KVS_ERROR(kvs::hf::import_config(l3, "c.json"), "rope_parameters.original_max_position_embeddings: missing");
  l3 = saved_by("4.44.2", true);
  l3["rope_parameters"] = {{"rope_type", "default"}, {"rope_theta", 500000.0}};
  EXPECT_KVS_ERROR(kvs::hf::import_config(l3, "c.json"), "describe different RoPE");
  l3 = saved_by("4.44.2", false);
  l3["rope_parameters"] = {{"rope_type", "default"}, {"rope_theta", 10000.0}};
  EXPECT_KVS_ERROR(kvs::hf::import_config(l3, "c.json"), "disagree");
}

TEST(HfShards, SizesAndPlans) {
  EXPECT_EQ(kvs::hf::parse_size("5GB", "x"), 5000000000ull);
  EXPECT_EQ(kvs::hf::parse_size("2GiB", "x"), 2147483648ull);
  EXPECT_EQ(kvs::hf::parse_size("40kb", "x"), 40000ull);
  EXPECT_EQ(kvs::hf::parse_size("123", "x"), 123ull);
  EXPECT_KVS_ERROR(kvs::hf::parse_size("5XB", "--max-shard-size"), "--max-shard-size", "5XB");
  EXPECT_KVS_ERROR(kvs::hf::parse_size("GB", "x"), "not a size");
  using Plan = std::vector<std::vector<size_t>>;
  EXPECT_EQ(kvs::hf::plan_shards({10, 10, 10}, 100), (Plan{{0, 1, 2}}));
  EXPECT_EQ(kvs::hf::plan_shards({10, 10, 10}, 20), (Plan{{0, 1}, {2}}));
  EXPECT_EQ(kvs::hf::plan_shards({50, 10, 10}, 20), (Plan{{0}, {1, 2}}));  // an oversized tensor alone
  EXPECT_EQ(kvs::hf::shard_file_name(1, 3), "model-00002-of-00003.safetensors");
}

TEST(HfStagedDir, AllOrNothing) {
  TmpDir tmp;
  const std::string out = tmp / "out";
  {
    kvs::hf::StagedDir d(out, false, {});
    kvs::testing_util::spit(d.file("a.txt"), "a");
    // no commit: as if an error was thrown
  }
  EXPECT_FALSE(std::filesystem::exists(out));
  EXPECT_EQ(std::distance(std::filesystem::directory_iterator(tmp.str()), {}), 0);
  {
    kvs::hf::StagedDir d(out, false, {});
    kvs::testing_util::spit(d.file("a.txt"), "a");
    d.commit();
  }
  EXPECT_EQ(kvs::testing_util::slurp(out + "/a.txt"), "a");
  EXPECT_KVS_ERROR(kvs::hf::StagedDir(out, false, {}), out, "--force");
  {
    kvs::hf::StagedDir d(out, true, {});
    kvs::testing_util::spit(d.file("b.txt"), "b");
    d.commit();
  }
  EXPECT_FALSE(std::filesystem::exists(out + "/a.txt"));
  EXPECT_EQ(kvs::testing_util::slurp(out + "/b.txt"), "b");
  EXPECT_KVS_ERROR(kvs::hf::StagedDir(tmp.str(), true, {out}), "must not be");
}

TEST(HfSentencepiece, ReadsPiecesFromWireFormat) {
  TmpDir tmp;
  // ModelProto { pieces { piece: "<unk>" score: 0 type: 2 } pieces { piece: "<s>" } } + a trainer_spec field.
  std::string pb;
  auto piece = [&](const std::string& s) {
    std::string sub = "\x0a" + std::string(1, static_cast<char>(s.size())) + s + std::string("\x15\0\0\0\0\x18\x02", 7);
    pb += "\x0a" + std::string(1, static_cast<char>(sub.size())) + sub;
  };
  piece("<unk>");
  piece("<s>");
  pb += std::string("\x12\x02\x08\x01", 4);  // field 2 (trainer_spec), length 2
  kvs::testing_util::spit(tmp / "tokenizer.model", pb);
  EXPECT_EQ(kvs::hf::read_sentencepiece_pieces(tmp / "tokenizer.model"), (std::vector<std::string>{"<unk>", "<s>"}));
  kvs::testing_util::spit(tmp / "bad.model", "\x0a\x7f");
  EXPECT_KVS_ERROR(kvs::hf::read_sentencepiece_pieces(tmp / "bad.model"), "bad.model", "sentencepiece");
}

}  // namespace
