// FullModelIO (train/full_model_io.h): each rank initialises and reads only
// its own slice of the full model, and a save assembles full tensors one at a
// time. Checked against the whole-model reference (init_params and
// slice_to_local on the full buffer), bit for bit, at tp 1, 2 and 4. The
// multi-process paths (gather over tp and pp, resume across layouts) are
// checked end to end by tests/parallel/test_dist_{tp,pp,dp,cp}.cpp.
#include <gtest/gtest.h>

#include <algorithm>
#include <cstring>
#include <string>
#include <vector>

#include "core/error.h"
#include "core/safetensors.h"
#include "dist/comm.h"
#include "model/config.h"
#include "model/params.h"
#include "parallel/tensor_parallel.h"
#include "test_util.h"
#include "train/full_model_io.h"

namespace {

using kvs::testing_util::TmpDir;

// GQA, a vocabulary padded at tp 2 and 4 (400 -> 512), a window-2 shift of
// Q, K and V: every kind of tensor and split the layouts have.
kvs::ModelConfig model(bool tied = false) {
  const nlohmann::json j = {{"name", "io"},
                            {"model",
                             {{"hidden_size", 32},
                              {"intermediate_size", 32},
                              {"num_hidden_layers", 2},
                              {"num_attention_heads", 8},
                              {"num_key_value_heads", 4},
                              {"vocab_size", 400},
                              {"max_position_embeddings", 16},
                              {"tie_word_embeddings", tied},
                              {"kv_shift", {{"enabled", true}, {"window", 2}, {"shift_q", true}}}}},
                            {"data", {{"type", "induction"}, {"induction", {{"token_lo", 2}, {"token_hi", 400}, {"pool_size", 8}}}}},
                            {"train", {{"seq_len", 16}, {"micro_batch_size", 1}, {"steps", 1}}}};
  kvs::Config c = kvs::config_from_json(j, "io");
  kvs::validate(c, "io");
  return c.model;
}

bool same_bits(const std::vector<float>& a, const std::vector<float>& b) {
  return a.size() == b.size() && std::memcmp(a.data(), b.data(), a.size() * sizeof(float)) == 0;
}

// The whole-model reference: rank r's slice of the full buffer.
std::vector<float> reference_slice(const kvs::ModelConfig& m, int r, int tp, const std::vector<float>& full) {
  const auto local = kvs::ParamLayout::build(m, r, tp);
  std::vector<float> out(local.total);
  kvs::slice_to_local(kvs::ParamLayout::build(m), local, r, full.data(), out.data());
  return out;
}

std::vector<float> full_values(const kvs::ModelConfig& m, float scale) {
  const auto full = kvs::ParamLayout::build(m);
  std::vector<float> v(full.total);
  kvs::init_params(full, m, 7, v.data());
  for (float& x : v) x *= scale;
  return v;
}

TEST(FullModelIO, EachRankInitialisesItsSliceAsTheFullModelWould) {
  for (bool tied : {false, true}) {
    const kvs::ModelConfig m = model(tied);
    const std::vector<float> full = full_values(m, 1.0f);
    for (int tp : {1, 2, 4})
      for (int r = 0; r < tp; ++r) {
        const auto local = kvs::ParamLayout::build(m, r, tp);
        const kvs::FullModelIO io(m, local, kvs::TensorParallel{r, tp}, true);
        std::vector<float> got(local.total, -1.0f);
        io.init_local(7, got.data());
        EXPECT_TRUE(same_bits(got, reference_slice(m, r, tp, full))) << "tp " << tp << " rank " << r;
      }
  }
}

// A checkpoint's file, as the trainer writes one: weights, or both moments under their prefixes.
std::string write_file(const std::string& path, const kvs::ModelConfig& m, const std::vector<std::string>& prefixes,
                       bool bf16) {
  const auto full = kvs::ParamLayout::build(m);
  std::vector<kvs::StTensor> tensors;
  for (size_t p = 0; p < prefixes.size(); ++p) {
    const std::vector<float> v = full_values(m, 1.0f + static_cast<float>(p));
    for (const auto& t : full.tensors)
      tensors.push_back(bf16 ? kvs::make_bf16_tensor(prefixes[p] + t.name, t.shape, v.data() + t.offset)
                             : kvs::make_f32_tensor(prefixes[p] + t.name, t.shape, v.data() + t.offset));
  }
  kvs::write_safetensors(path, tensors);
  return path;
}

TEST(FullModelIO, EachRankReadsItsSliceAndOnlyThatFromTheFile) {
  TmpDir tmp;
  const kvs::ModelConfig m = model();
  const std::vector<std::string> prefixes = {"exp_avg.", "exp_avg_sq."};
  for (bool bf16 : {false, true}) {
    const kvs::SafetensorsReader file(write_file(tmp / "o.safetensors", m, prefixes, bf16));
    for (int tp : {1, 2, 4}) {
      // Every rank reads the replicated tensors (the norms) whole, and its own rows or columns of the rest.
      uint64_t expected_bytes = 0;
      for (const auto& t : kvs::ParamLayout::build(m, 0, tp).tensors) {
        const uint64_t whole = kvs::ParamLayout::build(m).find(t.name)->numel * (bf16 ? 2 : 4);
        expected_bytes += prefixes.size() * whole * (t.split_dim < 0 ? tp : 1);
      }
      const uint64_t before = file.bytes_read();
      for (int r = 0; r < tp; ++r) {
        const auto local = kvs::ParamLayout::build(m, r, tp);
        const kvs::FullModelIO io(m, local, kvs::TensorParallel{r, tp}, true);
        io.check_file(file, prefixes);
        for (size_t p = 0; p < prefixes.size(); ++p) {
          std::vector<float> want = full_values(m, 1.0f + static_cast<float>(p));
          if (bf16)
            for (float& x : want) x = kvs::bf16_to_f32(kvs::f32_to_bf16(x));
          std::vector<float> got(local.total, -1.0f);
          io.read_local(file, prefixes[p], got.data());
          EXPECT_TRUE(same_bits(got, reference_slice(m, r, tp, want)))
              << prefixes[p] << " tp " << tp << " rank " << r << (bf16 ? " bf16" : " f32");
        }
      }
      // No rank reads another's rows or columns.
      EXPECT_EQ(file.bytes_read() - before, expected_bytes) << "tp " << tp;
    }
  }
}

// The trainer fills the engine a window at a time (and a ZeRO-1 shard's
// moments only): any window of init_local / read_local is those elements of
// the whole slice, read from the file alone (a partition of windows reads the
// bytes of one whole read, not a tensor per window).
TEST(FullModelIO, AWindowIsThoseElementsOfTheSliceAndReadsOnlyThem) {
  TmpDir tmp;
  const kvs::ModelConfig m = model(true);
  const kvs::SafetensorsReader file(write_file(tmp / "w.safetensors", m, {"exp_avg."}, false));
  for (int tp : {1, 2, 4})
    for (int r = 0; r < tp; ++r) {
      const auto local = kvs::ParamLayout::build(m, r, tp);
      const kvs::FullModelIO io(m, local, kvs::TensorParallel{r, tp}, true);
      std::vector<float> init_whole(local.total), read_whole(local.total);
      io.init_local(7, init_whole.data());
      uint64_t before = file.bytes_read();
      io.read_local(file, "exp_avg.", read_whole.data());
      const uint64_t whole_bytes = file.bytes_read() - before;
      for (size_t width : {size_t{1}, size_t{7}, size_t{333}, local.total}) {
        before = file.bytes_read();
        for (size_t at = 0; at < local.total; at += width) {
          const size_t n = std::min(width, local.total - at);
          std::vector<float> got(n, -1.0f);
          io.init_local(7, at, n, got.data());
          ASSERT_EQ(std::memcmp(got.data(), init_whole.data() + at, n * sizeof(float)), 0)
              << "init tp " << tp << " rank " << r << " window " << at << "+" << n;
          std::fill(got.begin(), got.end(), -1.0f);
          io.read_local(file, "exp_avg.", at, n, got.data());
          ASSERT_EQ(std::memcmp(got.data(), read_whole.data() + at, n * sizeof(float)), 0)
              << "read tp " << tp << " rank " << r << " window " << at << "+" << n;
        }
        EXPECT_EQ(file.bytes_read() - before, whole_bytes) << "tp " << tp << " rank " << r << " width " << width;
      }
      EXPECT_KVS_ERROR(io.read_local(file, "exp_avg.", local.total - 1, 2, read_whole.data()), "past this rank's");
    }
}

TEST(FullModelIO, AFileThatIsNotTheModelIsAnErrorNamingItAndTheTensor) {
  TmpDir tmp;
  const kvs::ModelConfig m = model();
  const kvs::SafetensorsReader weights(write_file(tmp / "w.safetensors", m, {""}, false));
  const auto local = kvs::ParamLayout::build(m, 1, 2);
  const kvs::FullModelIO io(m, local, kvs::TensorParallel{1, 2}, true);
  EXPECT_NO_THROW(io.check_file(weights, {""}));
  // Moments expected where weights are: every name is missing.
  EXPECT_KVS_ERROR(io.check_file(weights, {"exp_avg."}), tmp / "w.safetensors",
                   "missing tensor 'exp_avg.model.embed_tokens.weight'");
  // Another model (a wider MLP): a shape that differs.
  kvs::ModelConfig wider = m;
  wider.intermediate_size = 64;
  const kvs::SafetensorsReader other(write_file(tmp / "x.safetensors", wider, {""}, false));
  EXPECT_KVS_ERROR(io.check_file(other, {""}), tmp / "x.safetensors", "'model.layers.0.mlp.gate_proj.weight'",
                   "has shape [64, 32], expected [32, 32]");
}

// One process: the full tensors come back as they went in, in layout order, as F32.
TEST(FullModelIO, OneProcessGathersTheFullTensorsInLayoutOrder) {
  const kvs::ModelConfig m = model(true);
  const auto full = kvs::ParamLayout::build(m);
  const std::vector<float> v = full_values(m, 3.0f);
  auto comm = kvs::dist::make_single_process();
  const kvs::FullModelIO io(m, full, kvs::TensorParallel{0, 1, comm.get()}, true);
  const std::vector<kvs::StTensor> got = io.gather_full(v.data(), "exp_avg.");
  ASSERT_EQ(got.size(), full.tensors.size());
  for (size_t i = 0; i < got.size(); ++i) {
    const auto& t = full.tensors[i];
    EXPECT_EQ(got[i].name, "exp_avg." + t.name);
    EXPECT_EQ(got[i].shape, t.shape);
    ASSERT_EQ(got[i].dtype, kvs::DType::F32);
    EXPECT_EQ(std::memcmp(got[i].bytes.data(), v.data() + t.offset, t.numel * sizeof(float)), 0) << t.name;
  }
  // Asked tensor by tensor, in the order owned_local() gives the other replicas.
  std::vector<const kvs::ParamTensor*> asked;
  std::vector<kvs::StTensor> streamed;
  io.gather_full(
      [&](const kvs::ParamTensor& l) {
        asked.push_back(&l);
        return v.data() + l.offset;
      },
      "exp_avg.", [&](kvs::StTensor t) { streamed.push_back(std::move(t)); });
  EXPECT_EQ(asked, io.owned_local());
  ASSERT_EQ(streamed.size(), got.size());
  for (size_t i = 0; i < got.size(); ++i) EXPECT_EQ(streamed[i].bytes, got[i].bytes) << got[i].name;
  // A replica other than the first (dp or cp rank > 0) takes no part.
  const kvs::FullModelIO other(m, full, kvs::TensorParallel{0, 1, comm.get()}, false);
  EXPECT_TRUE(other.gather_full(v.data(), "").empty());
  EXPECT_EQ(other.owned_local(), io.owned_local());
}

}  // namespace
