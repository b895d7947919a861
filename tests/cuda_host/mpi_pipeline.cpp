// The host-built CUDA engine as pipeline stages under mpirun -np 2
// (tests/cuda_host): 1F1B at pp = 2 and the interleaved schedule (pp = 2, 2
// virtual stages), shifted GQA with tied embeddings, over both of the
// runner's paths, against one process with the same global batch:
//   - MPI: the activations and their gradients leave the engine as host fp32
//     (bf16 -> fp32 -> bf16 is exact) through its pinned staging buffer, and
//     the tied embedding's gradient is summed through the host;
//   - NCCL (the shim's, over MPI): the engine's own bf16 device buffers go
//     through ncclSend/ncclRecv, each send grouped with the next receive;
//     under ctest a send waits for its receive, as on GPUs
//     (KVS_SHIM_NCCL_RENDEZVOUS); the interleaved schedule runs there too, in
//     the device path's plan of rounds (pipeline_rounds).
// A stage boundary changes no bits of the math (cuda_engine_stage.cpp) and
// every gradient is accumulated over the micro-batches in the same order as
// in one process, except the tied embedding: one process adds the LM head's
// and the embedding's contributions micro-batch by micro-batch, the pipeline
// sums each stage's total, so its fp32 rounding may differ (kTiedTol, 1e-5
// relative, allows for that; these runs measured 0). The untied runs are
// checked bit for bit. Under mpirun -np 4 (ctest cuda_host_mpi_np4) the
// stages combine with context parallelism, with tensor + sequence
// parallelism and with data parallelism (HostCudaPipelineWithParallel).
// With document boundaries ("shift_and_attention"), every stage shifts and
// attends within the documents (pp = 2 under MPI).
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <filesystem>
#include <map>
#include <memory>
#include <string>
#include <vector>

#include "dist/launch.h"
#include "dist/nccl_comm.h"
#include "hostcuda.h"
#include "model/config.h"
#include "mpi_runs.h"
#include "parallel/dist_test_util.h"
#include "parallel/mpi_world.h"
#include "train/trainer.h"

namespace {

using kvs::testing_util::world;

constexpr double kTiedTol = 1e-5;
constexpr int kSteps = 3;

// Shifted GQA (2 query heads, 1 KV head), 4 layers: two per stage at pp = 2,
// one per virtual stage at pp = 2 x 2; 4 micro-batches of one sequence per
// step, so the interleaved schedule has a steady state.
kvs::Config config(bool tied, int pp, int virtual_stages, const std::string& recompute) {
  nlohmann::json j = {
      {"name", "cuda-host-pipeline"},
      {"device", "cuda"},
      {"model",
       {{"hidden_size", 32},  // head_dim 16: the smallest the CUDA attention kernels take
        {"intermediate_size", 64},
        {"num_hidden_layers", 4},
        {"num_attention_heads", 2},
        {"num_key_value_heads", 1},
        {"vocab_size", 32},
        {"max_position_embeddings", 16},
        {"tie_word_embeddings", tied},
        {"kv_shift", {{"enabled", true}}}}},
      {"data", {{"type", "induction"}, {"induction", {{"token_lo", 2}, {"token_hi", 32}, {"pool_size", 8}}}}},
      {"parallel", {{"pp", pp}, {"virtual_stages", virtual_stages}}},
      {"train",
       {{"seq_len", 16},
        {"micro_batch_size", 1},
        {"grad_accum_steps", 4},
        {"steps", kSteps},
        {"lr", 1e-2},
        {"warmup_steps", 2},
        {"eval_every", 0},
        {"eval_sequences", 4},
        {"checkpoint_every", 0},
        {"recompute", recompute},
        {"threads", 1}}}};
  kvs::Config c = kvs::config_from_json(j, "cuda-host-pipeline");
  kvs::validate(c, "cuda-host-pipeline");
  return c;
}

// Two stages of one layer each, every stage split again over 2 ranks (4 in
// all): GQA with 4 query and 2 KV heads (so tp = 2 holds whole groups),
// q, k and v shifted with window 2 (at cp = 2 every chunk but the first reads
// a 2-row halo), 2 micro-batches of 2 sequences per step.
kvs::Config config_4ranks(int tp, bool sequence_parallel, int cp) {
  nlohmann::json j = {
      {"name", "cuda-host-pipeline-4"},
      {"device", "cuda"},
      {"model",
       {{"hidden_size", 64},  // head_dim 16
        {"intermediate_size", 128},
        {"num_hidden_layers", 2},
        {"num_attention_heads", 4},
        {"num_key_value_heads", 2},
        {"vocab_size", 32},
        {"max_position_embeddings", 16},
        {"kv_shift", {{"enabled", true}, {"window", 2}, {"shift_q", true}}}}},
      {"data", {{"type", "induction"}, {"induction", {{"token_lo", 2}, {"token_hi", 32}, {"pool_size", 8}}}}},
      {"parallel", {{"pp", 2}, {"tp", tp}, {"sequence_parallel", sequence_parallel}, {"cp", cp}}},
      {"train",
       {{"seq_len", 16},
        {"micro_batch_size", 2},
        {"grad_accum_steps", 2},
        {"steps", kSteps},
        {"lr", 1e-2},
        {"warmup_steps", 2},
        {"eval_every", 0},
        {"eval_sequences", 4},
        {"checkpoint_every", 0},
        {"threads", 1}}}};
  kvs::Config c = kvs::config_from_json(j, "cuda-host-pipeline-4");
  kvs::validate(c, "cuda-host-pipeline-4");
  return c;
}

std::string own_dir(const std::string& name) { return kvs::testing_util::own_run_dir("kvs_cuda_host_pp_", name); }
std::string shared_dir(const std::string& name) { return kvs::testing_util::shared_run_dir("kvs_cuda_host_pp_", name); }

// A run and its directory (its metrics.jsonl).
struct Reference {
  kvs::TrainSummary summary;
  std::string dir;
};

// One process, the reference: rank 0 runs it alone and sends its losses and
// evaluation to the other ranks (every rank running it at once took twice one
// run's time at -np 4 on a 2-core host); rank 0 reads its metrics. One run per
// configuration, shared by the tests. NaN losses reach the other ranks if
// rank 0's run throws, so they fail instead of waiting for the broadcast.
Reference one_process(kvs::Config c) {
  c.parallel.pp = 1;
  c.parallel.virtual_stages = 1;
  c.parallel.tp = 1;
  c.parallel.sequence_parallel = false;
  c.parallel.cp = 1;
  c.train.recompute = kvs::Recompute::None;
  static std::map<std::string, Reference> runs;
  const std::string key = kvs::to_json(c).dump();
  if (auto run = runs.find(key); run != runs.end()) return run->second;
  Reference ref{{}, shared_dir("one_" + std::to_string(runs.size()))};
  std::vector<double> shared(kSteps + 1, std::nan(""));
  if (world().rank() == 0) {
    try {
      ref.summary = kvs::train(c, {ref.dir, false, true});
      if (ref.summary.losses.size() == static_cast<size_t>(kSteps)) {
        std::copy(ref.summary.losses.begin(), ref.summary.losses.end(), shared.begin());
        shared[kSteps] = ref.summary.final_eval.loss;
      }
    } catch (const std::exception& e) {
      ADD_FAILURE() << "the one-process reference failed: " << e.what();
    }
  }
  world().broadcast_bytes(shared.data(), shared.size() * sizeof(double), 0);
  ref.summary.losses.assign(shared.begin(), shared.begin() + kSteps);
  ref.summary.final_eval.loss = shared[kSteps];
  return runs.emplace(key, ref).first->second;
}

// A parallel run's losses against a reference's; every rank compares the
// losses (all-reduced from the last stage), rank 0 the evaluation. tol 0: the
// same bits.
void expect_close(const kvs::TrainSummary& par, const kvs::TrainSummary& ref, const std::string& what, double tol) {
  SCOPED_TRACE(what);
  ASSERT_EQ(par.losses.size(), static_cast<size_t>(kSteps));
  ASSERT_EQ(ref.losses.size(), static_cast<size_t>(kSteps));
  double worst = 0;
  for (int i = 0; i < kSteps; ++i) {
    const double rel = std::fabs(par.losses[i] - ref.losses[i]) / ref.losses[i];
    worst = std::max(worst, rel);
    EXPECT_LE(rel, tol) << "step " << i + 1 << ": " << par.losses[i] << " vs " << ref.losses[i];
  }
  if (world().rank() != 0) return;
  EXPECT_LE(std::fabs(par.final_eval.loss - ref.final_eval.loss) / ref.final_eval.loss, tol) << "evaluation";
  std::printf("[ %s ] max relative loss difference %.3g over %d steps\n", what.c_str(), worst, kSteps);
}

// `comm`'s ranks as pipeline stages against the reference (and, where given,
// against `same_bits`, a run without pipeline stages, bit for bit). The
// gradient norm of every step too (rank 0): the stages' sums of squares are
// added over the pipeline (the tied copy once), so a stage left out or counted
// twice moves it while clipping may leave the loss close; the sum's order
// differs from one process, hence at least 1e-6. Steps 1 and 2 only: from step
// 3 the tp + SP run's bf16 weights have drifted enough that its norm differs
// by 0.7% while its losses agree within 5e-3 (as in mpi_parallel.cpp).
void expect_follows(const Reference& one, const kvs::Config& c, kvs::dist::Communicator& comm, const std::string& what,
                    double tol, const kvs::TrainSummary* same_bits = nullptr) {
  const uint64_t collectives = hostcuda::stats().collectives;
  const std::string dir = shared_dir(what);
  const kvs::TrainSummary par = kvs::train(c, {dir, false, true, &comm});
  if (comm.backend() == "nccl") {
    EXPECT_GT(hostcuda::stats().collectives - collectives, 10u) << what;
  }
  expect_close(par, one.summary, what, tol);
  if (same_bits) expect_close(par, *same_bits, what + " vs the same without pp", 0.0);
  if (world().rank() != 0) return;
  const auto norms = kvs::testing_util::read_metrics(dir).grad_norm,
             want = kvs::testing_util::read_metrics(one.dir).grad_norm;
  ASSERT_EQ(norms.size(), static_cast<size_t>(kSteps)) << what;
  ASSERT_EQ(want.size(), static_cast<size_t>(kSteps)) << what;
  for (int step = 1; step <= 2; ++step)
    EXPECT_LE(kvs::testing_util::rel(norms.at(step), want.at(step)), std::max(tol, 1e-6))
        << what << ": gradient norm at step " << step << ": " << norms.at(step) << " vs " << want.at(step);
}

}  // namespace

// Untied, the same bits as one process: 1F1B at pp = 2 (layers 0-1 with the
// embedding on rank 0, layers 2-3 with the head on rank 1) over both paths,
// and with attention recomputation over MPI; the interleaved schedule (rank 0
// holds layers 0 and 2, rank 1 layers 1 and 3: a micro-batch crosses the
// ranks three times) over both paths, with full recomputation on one (every layer
// recomputed before its backward since the slots' other micro-batches ran in
// between). ctest runs this with KVS_SHIM_NCCL_RENDEZVOUS, so the shim's NCCL
// sends wait for their receives, as large NCCL sends do: the interleaved
// order hung over NCCL before the device path followed its plan of rounds
// (pipeline_rounds).
TEST(HostCudaPipeline, FollowsOneProcessBitForBit) {
  if (world().size() != 2) GTEST_SKIP() << "needs 2 ranks";
  const Reference one = one_process(config(false, 2, 1, "none"));
  auto nccl = kvs::testing_util::shim_nccl_world();
  expect_follows(one, config(false, 2, 1, "none"), world(), "pp2_mpi", 0.0);
  expect_follows(one, config(false, 2, 1, "none"), *nccl, "pp2_nccl", 0.0);
  expect_follows(one, config(false, 2, 1, "attention"), world(), "pp2_attention_mpi", 0.0);
  expect_follows(one, config(false, 2, 2, "full"), world(), "pp2v2_full_mpi", 0.0);
  expect_follows(one, config(false, 2, 2, "none"), *nccl, "pp2v2_nccl", 0.0);
}

// Document boundaries ("shift_and_attention": the shift restarts at each BOS,
// here token 5, which the induction data holds now and then, and attention
// sees the query's document only): every stage takes the micro-batch's
// document starts (the last stage uploads no tokens of its own), so the
// pipeline gives one process's bits; and one process with them differs from
// one without (the documents are in the data).
TEST(HostCudaPipeline, DocumentBoundariesFollowOneProcessBitForBit) {
  if (world().size() != 2) GTEST_SKIP() << "needs 2 ranks";
  kvs::Config c = config(false, 2, 1, "none");
  c.model.bos_token_id = 5;
  c.model.document_boundaries = kvs::DocumentBoundaries::ShiftAndAttention;
  kvs::validate(c, "cuda-host-pipeline-docs");
  const Reference one = one_process(c);
  expect_follows(one, c, world(), "pp2_docs_mpi", 0.0);
  const Reference plain = one_process(config(false, 2, 1, "none"));
  EXPECT_NE(one.summary.losses.back(), plain.summary.losses.back()) << "the documents changed nothing";
}

// Tied embeddings: the last stage's LM head copy and the first stage's
// embedding summed over the embedding group (through the host under MPI).
TEST(HostCudaPipeline, TiedEmbeddingsFollowOneProcess) {
  if (world().size() != 2) GTEST_SKIP() << "needs 2 ranks";
  const Reference one = one_process(config(true, 2, 1, "none"));
  auto nccl = kvs::testing_util::shim_nccl_world();
  expect_follows(one, config(true, 2, 1, "none"), *nccl, "pp2_tied_nccl", kTiedTol);
  expect_follows(one, config(true, 2, 2, "none"), world(), "pp2v2_tied_mpi", kTiedTol);
  expect_follows(one, config(true, 2, 2, "full"), *nccl, "pp2v2_tied_nccl", kTiedTol);
}

// 4 ranks: pp = 2 with cp = 2 (each stage's ranks hold chunks r and 3 - r of
// every sequence; the stages pass those 16 of a micro-batch's 32 rows) and
// pp = 2 with tp = 2 and sequence parallelism (the stages pass this rank's 16
// rows; the first stage's embedding is reduce-scattered, its gradient
// gathered; the final norm's gain gradient summed over the group), over both
// of the runner's paths (the NCCL runs with recomputation). Against one
// process the differences are those of cp = 2 and tp = 2 + SP alone
// (tests/cuda_host/mpi_parallel.cpp: where bf16 rounds in ring attention,
// re-associated sums over the group), with their tolerance, 5e-3 relative
// per step. A stage boundary changes no bits, so each run also equals the
// same cp = 2 or tp = 2 + SP run without pipeline stages (each half of the
// world runs it alone) bit for bit: that catches what a loss within 5e-3
// cannot (with the final norm's gain gradient left unsummed over the group
// the losses still follow one process within 3e-4).
TEST(HostCudaPipelineWithParallel, ContextAndSequenceParallelFollowOneProcess) {
  if (world().size() != 4) GTEST_SKIP() << "needs 4 ranks";
  const Reference one = one_process(config_4ranks(1, false, 1));
  auto half = world().split(world().rank() / 2, world().rank());
  auto without_pp = [&](kvs::Config c, const std::string& what) {
    c.parallel.pp = 1;
    return kvs::train(c, {own_dir(what), false, true, half.get()});
  };
  const kvs::TrainSummary cp2 = without_pp(config_4ranks(1, false, 2), "cp2_alone");
  const kvs::TrainSummary sp2 = without_pp(config_4ranks(2, true, 1), "tp2sp_alone");
  // Recomputation changes no bits: the NCCL runs recompute (full under cp:
  // the halo and the ring again, from the slot's rows; attention under SP).
  auto recomputing = [](kvs::Config c, kvs::Recompute r) {
    c.train.recompute = r;
    return c;
  };
  auto nccl = kvs::testing_util::shim_nccl_world();
  expect_follows(one, config_4ranks(1, false, 2), world(), "pp2cp2_mpi", 5e-3, &cp2);
  expect_follows(one, recomputing(config_4ranks(1, false, 2), kvs::Recompute::Full), *nccl, "pp2cp2_full_nccl", 5e-3,
                 &cp2);
  expect_follows(one, config_4ranks(2, true, 1), world(), "pp2tp2sp_mpi", 5e-3, &sp2);
  expect_follows(one, recomputing(config_4ranks(2, true, 1), kvs::Recompute::Attention), *nccl,
                 "pp2tp2sp_attention_nccl", 5e-3, &sp2);
}

// 4 ranks as pp = 2 x dp = 2: ZeRO-1 over each stage's data-parallel group on
// the engine's device buffers, and the global grad norm (the clip) summed over
// the stages. Against one process: the data-parallel tests' 2e-3 (the
// gradient all-reduce re-associates the micro-batches' sums). Against the same
// dp = 2 run without stages (each half of the world runs it alone) only the
// grad norm's sum of squares is split differently (per stage, then summed), so
// the clip scale may differ in its last bits: 1e-6 relative per step. Then
// the run's checkpoint, resumed in the same layout.
TEST(HostCudaPipelineWithParallel, DataParallelStagesFollowOneProcess) {
  if (world().size() != 4) GTEST_SKIP() << "needs 4 ranks";
  const kvs::TrainSummary one = one_process(config_4ranks(1, false, 1)).summary;
  auto half = world().split(world().rank() / 2, world().rank());
  kvs::Config alone = config_4ranks(1, false, 1);
  alone.parallel.pp = 1;
  const kvs::TrainSummary dp2 = kvs::train(alone, {own_dir("dp2_alone"), false, true, half.get()});
  expect_close(dp2, one, "dp2 alone vs one process", 2e-3);
  auto nccl = kvs::testing_util::shim_nccl_world();
  for (kvs::dist::Communicator* comm : {&world(), nccl.get()}) {
    const std::string what = "pp2dp2_" + comm->backend();
    const kvs::TrainSummary par = kvs::train(config_4ranks(1, false, 1), {shared_dir(what), false, true, comm});
    expect_close(par, one, what, 2e-3);
    expect_close(par, dp2, what + " vs the same without pp", 1e-6);
    // ZeRO-1's checkpoint of the stages' shards: saved after step 1 (each
    // stage's dp group gathers its moments, rank 0 writes the whole model),
    // resumed in the same layout: steps 2-3 and the evaluation are `par`'s bits.
    kvs::Config head = config_4ranks(1, false, 1);
    head.train.steps = 1;
    const std::string dir = shared_dir(what + "_resumed");
    kvs::train(head, {dir, false, true, comm});
    const kvs::TrainSummary rest = kvs::train(config_4ranks(1, false, 1), {dir, true, true, comm});
    ASSERT_EQ(rest.losses.size(), static_cast<size_t>(kSteps - 1));
    for (int i = 0; i + 1 < kSteps; ++i)
      EXPECT_EQ(rest.losses[i], par.losses[i + 1]) << what << " resumed, step " << i + 2;
    if (world().rank() == 0) {
      EXPECT_EQ(rest.final_eval.loss, par.final_eval.loss) << what << " resumed";
    }
  }
}
