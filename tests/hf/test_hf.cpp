// Hugging Face export/import pieces that need no Python: config mapping both
// ways, shard planning, sizes, the output directory's atomicity, and the
// sentencepiece piece reader. The end-to-end checks are tests/hf/run_hf.py.
#include <gtest/gtest.h>

#include <filesystem>

#include "hf/hf_config.h"
#include "hf/shard_plan.h"
#include "tokenizer/sp_model.h"
#include "hf/tokenizer_json.h"
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
  EXPECT_EQ(j["auto_map"]["AutoModel"], "modeling_kvshift_llama.KvShiftLlamaModel");
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

// A misspelt kv_shift key would import another model (shift_q off, say) without a word.
TEST(HfConfig, UnknownKvShiftKeysAreRefused) {
  json j = kvs::hf::export_config(small_model(true), "float32", {});
  j["kv_shift"]["shfit_q"] = true;
  EXPECT_KVS_ERROR(kvs::hf::import_config(j, "c.json"), "c.json: kv_shift.shfit_q: unknown key (known: enabled, "
                   "window, shift_k, shift_v, shift_q, parametrization)");
  j["kv_shift"] = true;
  EXPECT_KVS_ERROR(kvs::hf::import_config(j, "c.json"), "c.json: kv_shift: expected an object, got true");
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
  // --force replaces only an earlier output (it holds a config.json), never other files.
  EXPECT_KVS_ERROR(kvs::hf::StagedDir(out, true, {}), out, "holds files but no config.json");
  EXPECT_EQ(kvs::testing_util::slurp(out + "/a.txt"), "a");
  kvs::testing_util::spit(out + "/config.json", "{}");
  {
    kvs::hf::StagedDir d(out, true, {});
    kvs::testing_util::spit(d.file("b.txt"), "b");
    d.commit();
  }
  EXPECT_FALSE(std::filesystem::exists(out + "/a.txt"));
  EXPECT_EQ(kvs::testing_util::slurp(out + "/b.txt"), "b");
  // A training run and a checkpoint hold a config.json too: never replaced.
  for (const char* f : {"metrics.jsonl", "checkpoints", "trainer_state.json", "run_config.json",
                        "optimizer.safetensors"}) {
    const std::string run = tmp / (std::string("run_") + f);
    std::filesystem::create_directories(run);
    kvs::testing_util::spit(run + "/config.json", "{}");
    if (std::string(f) == "checkpoints") std::filesystem::create_directories(run + "/" + f);
    else kvs::testing_util::spit(run + "/" + f, "{}");
    EXPECT_KVS_ERROR(kvs::hf::StagedDir(run, true, {}), run, std::string("holds ") + f,
                     "a training run or a checkpoint");
    EXPECT_TRUE(std::filesystem::exists(run + "/" + f)) << f;
    EXPECT_EQ(kvs::testing_util::slurp(run + "/config.json"), "{}");
  }
  EXPECT_KVS_ERROR(kvs::hf::StagedDir(tmp.str(), true, {out}), "must not be");
  {  // "new/" names the directory new, which does not exist yet
    kvs::hf::StagedDir d(tmp / "new/", false, {});
    kvs::testing_util::spit(d.file("c.txt"), "c");
    d.commit();
  }
  EXPECT_EQ(kvs::testing_util::slurp(tmp / "new/c.txt"), "c");
  // An --out that is a link writes where it points; the link stays.
  kvs::testing_util::spit(tmp / "new/config.json", "{}");
  std::filesystem::create_symlink(tmp / "new", tmp / "link");
  {
    kvs::hf::StagedDir d(tmp / "link", true, {});
    kvs::testing_util::spit(d.file("config.json"), "{}");
    d.commit();
  }
  EXPECT_TRUE(std::filesystem::is_symlink(tmp / "link"));
  EXPECT_FALSE(std::filesystem::exists(tmp / "new/c.txt"));  // the new output, beside the link's target
  EXPECT_TRUE(std::filesystem::exists(tmp / "new/config.json"));
}

TEST(HfSentencepiece, ReadsPiecesAndSpecsFromWireFormat) {
  TmpDir tmp;
  // ModelProto { pieces { piece: "<unk>" score: 0 type: 2 } pieces { piece: "ab" score: -1.5 }
  //              trainer_spec { model_type: BPE byte_fallback: true } normalizer_spec { name: "identity" add_dummy_prefix: false } }
  std::string pb;
  auto bytes = [](std::initializer_list<int> b) {
    std::string s;
    for (int c : b) s += static_cast<char>(c);
    return s;
  };
  auto field = [](int key, const std::string& payload) {
    return std::string(1, static_cast<char>(key)) + std::string(1, static_cast<char>(payload.size())) + payload;
  };
  pb += field(0x0a, field(0x0a, "<unk>") + bytes({0x15, 0, 0, 0, 0, 0x18, 0x02}));
  pb += field(0x0a, field(0x0a, "ab") + bytes({0x15, 0x00, 0x00, 0xc0, 0xbf}));  // -1.5f, type absent: normal
  pb += field(0x12, bytes({0x18, 0x02, 0x98, 0x02, 0x01}));  // field 3 = 2, field 35 = 1
  pb += field(0x1a, field(0x0a, "identity") + bytes({0x18, 0x00}));
  kvs::testing_util::spit(tmp / "tokenizer.model", pb);
  const kvs::SpModel m = kvs::read_sentencepiece_model(tmp / "tokenizer.model");
  ASSERT_EQ(m.pieces.size(), 2u);
  EXPECT_EQ(m.pieces[0].piece, "<unk>");
  EXPECT_EQ(m.pieces[0].type, kvs::SpPiece::kUnknown);
  EXPECT_EQ(m.pieces[1].piece, "ab");
  EXPECT_EQ(m.pieces[1].score, -1.5f);
  EXPECT_EQ(m.pieces[1].type, kvs::SpPiece::kNormal);
  EXPECT_EQ(m.model_type, 2);
  EXPECT_TRUE(m.byte_fallback);
  EXPECT_EQ(m.normalizer_name, "identity");
  EXPECT_FALSE(m.add_dummy_prefix);
  EXPECT_TRUE(m.remove_extra_whitespaces);  // the proto's default
  EXPECT_EQ(kvs::hf::why_no_tokenizer_json(m), "it removes extra whitespace");
  kvs::testing_util::spit(tmp / "bad.model", "\x0a\x7f");
  EXPECT_KVS_ERROR(kvs::read_sentencepiece_model(tmp / "bad.model"), "bad.model", "sentencepiece");
}

// transformers' generate_merges, by hand: splits of normal pieces into two
// pieces of the vocabulary, by score, then longer left, then longer right, then
// (left id, right id); multi-byte characters are never cut.
TEST(HfTokenizerJson, MergesAreRankedAsTransformersRanksThem) {
  using P = kvs::SpPiece;
  const std::vector<P> pieces = {
      {"<unk>", 0, P::kUnknown}, {"<s>", 0, P::kControl}, {"<", -9, P::kNormal}, {"s>", -8, P::kNormal},
      {"a", -10, P::kNormal},    {"b", -10, P::kNormal},  {"c", -10, P::kNormal}, {"ab", -1, P::kNormal},
      {"bc", -2, P::kNormal},    {"abc", -2, P::kNormal}, {"é", -10, P::kNormal}, {"éa", -3, P::kNormal},
      // The two bytes of "é" as pieces: a cut inside "é" would find them.
      {"\xc3", -10, P::kNormal}, {"\xa9", -10, P::kNormal},
  };
  // "<s>" would rank first (score 0, from "<" + "s>") if control pieces were merged into.
  const std::vector<std::pair<std::string, std::string>> expect = {
      {"a", "b"},   // ab -1
      {"ab", "c"},  // abc -2: the longer left first
      {"a", "bc"},  // abc -2: then the longer right
      {"b", "c"},   // bc -2
      {"é", "a"},   // éa -3
  };
  EXPECT_EQ(kvs::hf::sentencepiece_merges(pieces), expect);
}

// The file tokenizers reads: vocabulary in id order, the dummy-prefix
// normalizer, BOS template, special and user-defined pieces as added tokens.
TEST(HfTokenizerJson, FileHoldsTheSentencepiecePipeline) {
  using P = kvs::SpPiece;
  kvs::SpModel m;
  m.model_type = 2;
  m.byte_fallback = true;
  m.normalizer_name = "identity";
  m.remove_extra_whitespaces = false;
  m.pieces = {{"<unk>", 0, P::kUnknown}, {"<s>", 0, P::kControl}, {"</s>", 0, P::kControl},
              {"<0x41>", 0, P::kByte},   {"\xe2\x96\x81", -1, P::kNormal}, {"t", -2, P::kNormal},
              {"\xe2\x96\x81t", -0.5, P::kNormal}, {"[X]", 0, P::kUserDefined}};
  ASSERT_EQ(kvs::hf::why_no_tokenizer_json(m), "");
  const auto j = kvs::hf::tokenizer_json(m, 1);
  ASSERT_EQ(j["model"]["vocab"].size(), 8u);
  EXPECT_EQ(j["model"]["vocab"].begin().key(), "<unk>");
  EXPECT_EQ(j["model"]["vocab"]["\xe2\x96\x81t"], 6);
  EXPECT_EQ(j["model"]["merges"], nlohmann::ordered_json::array({"\xe2\x96\x81 t"}));
  EXPECT_EQ(j["model"]["byte_fallback"], true);
  EXPECT_EQ(j["model"]["unk_token"], "<unk>");
  EXPECT_EQ(j["normalizer"]["normalizers"][0]["prepend"], "\xe2\x96\x81");
  EXPECT_TRUE(j["pre_tokenizer"].is_null());
  EXPECT_EQ(j["post_processor"]["single"][0]["SpecialToken"]["id"], "<s>");
  ASSERT_EQ(j["added_tokens"].size(), 4u);  // <unk>, <s>, </s> special; [X] not
  EXPECT_EQ(j["added_tokens"][3]["content"], "[X]");
  EXPECT_EQ(j["added_tokens"][3]["special"], false);
  EXPECT_TRUE(kvs::hf::tokenizer_json(m, -1)["post_processor"].is_null());
  m.pieces.push_back({"t", -3, P::kNormal});
  EXPECT_EQ(kvs::hf::why_no_tokenizer_json(m), "the piece 't' appears twice");
  m.pieces.pop_back();
  m.model_type = 1;
  EXPECT_EQ(kvs::hf::why_no_tokenizer_json(m), "not a BPE model (sentencepiece model_type 1)");
}

}  // namespace
