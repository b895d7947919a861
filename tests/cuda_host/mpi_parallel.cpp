// The host-built CUDA engine under mpirun -np 2 (tests/cuda_host; -np 4 for
// dp x cp): data parallelism (ZeRO-1 on the engine's device buffers), tensor
// parallelism, tensor + sequence parallelism and context parallelism, each
// over both of the engine's communication paths, against one process:
//   - MPI: the communicator takes host memory, so ZeRO-1 stages the device
//     buffers through the host (StagedFlatSync) and the tensor-parallel
//     all-reduces drain the stream and go through pinned memory;
//   - NCCL (the shim's, over MPI): ZeRO-1 reduces each layer's gradients on
//     the communicator's stream as the backward announces them, waiting for
//     the engine's events (DirectNccl), and the tensor-parallel all-reduces
//     (sequence parallel: all-gathers and reduce-scatters) are enqueued on the
//     engine's stream; context parallelism's halo all-gathers and ring steps
//     run on the communicator's stream after the engine's is drained.
// The data-parallel run's checkpoint (ZeRO-1's gathered moments) is resumed
// over both paths, and in one process.
// The GPU tests' tolerances (tests/parallel/test_cuda_zero1.cpp, test_cuda_tp.cpp:
// 2e-3 and 5e-3 relative per step), over 5 steps.
#include <gtest/gtest.h>

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
#include "model/cuda_engine.h"
#include "model/params.h"
#include "mpi_runs.h"
#include "parallel/dist_test_util.h"
#include "parallel/flat_sync.h"
#include "parallel/mpi_world.h"
#include "parallel/zero1.h"
#include "train/nonfinite_gradient_run.h"
#include "train/trainer.h"

namespace {

using kvs::testing_util::world;

kvs::Config config(bool shift, int vocab, int tp, bool sequence_parallel = false, int cp = 1, int window = 1) {
  nlohmann::json j = {
      {"name", "cuda-host-parallel"},
      {"device", "cuda"},
      {"model",
       {{"hidden_size", 64},  // head_dim 16: the smallest the CUDA attention kernels take
        {"intermediate_size", 128},
        {"num_hidden_layers", 2},
        {"num_attention_heads", 4},
        {"num_key_value_heads", 2},
        {"vocab_size", vocab},
        {"max_position_embeddings", 16},
        {"kv_shift", {{"enabled", shift}, {"window", window}, {"shift_q", cp > 1}}}}},
      {"data", {{"type", "induction"}, {"induction", {{"token_lo", 2}, {"token_hi", 32}, {"pool_size", 8}}}}},
      {"parallel", {{"tp", tp}, {"sequence_parallel", sequence_parallel}, {"cp", cp}}},
      {"train",
       {{"seq_len", 16},
        {"micro_batch_size", 2},
        {"grad_accum_steps", 2},
        {"steps", 5},
        {"lr", 1e-2},
        {"warmup_steps", 2},
        {"eval_every", 0},
        {"eval_sequences", 4},
        {"checkpoint_every", 0},
        {"threads", 1}}}};
  kvs::Config c = kvs::config_from_json(j, "cuda-host-parallel");
  kvs::validate(c, "cuda-host-parallel");
  return c;
}

// Document boundaries ("shift_and_attention") starting at token 5, which
// induction data over the tokens 2 .. 9 holds about once in 8 positions.
kvs::Config with_documents(kvs::Config c) {
  c.data.induction.token_hi = 10;
  c.model.bos_token_id = 5;
  c.model.document_boundaries = kvs::DocumentBoundaries::ShiftAndAttention;
  kvs::validate(c, "cuda-host-parallel-docs");
  return c;
}

std::string own_dir(const std::string& name) { return kvs::testing_util::own_run_dir("kvs_cuda_host_mpi_", name); }
std::string shared_dir(const std::string& name) { return kvs::testing_util::shared_run_dir("kvs_cuda_host_mpi_", name); }

// One process (every rank runs it alone, at the same time), then `comm`'s
// ranks together; every rank compares the losses, rank 0 the evaluation.
// (Each one-process run is done once per configuration and reused: the tests
// that differ only in the layout share it.)
void expect_follows_one_process(const kvs::Config& c, kvs::dist::Communicator& comm, const std::string& what,
                                double tol) {
  SCOPED_TRACE(what);
  kvs::Config alone = c;
  alone.parallel.tp = 1;
  alone.parallel.sequence_parallel = false;
  alone.parallel.cp = 1;
  struct Run {
    kvs::TrainSummary summary;
    std::string dir;
  };
  static std::map<std::string, Run> runs;
  const std::string key = kvs::to_json(alone).dump();
  auto run = runs.find(key);
  if (run == runs.end()) {
    const std::string dir = own_dir(what + "_one");
    run = runs.emplace(key, Run{kvs::train(alone, {dir, false, true}), dir}).first;
  }
  const kvs::TrainSummary& one = run->second.summary;
  const uint64_t collectives = hostcuda::stats().collectives;
  const std::string par_dir = shared_dir(what);
  const kvs::TrainSummary par = kvs::train(c, {par_dir, false, true, &comm});
  if (comm.backend() == "nccl") {
    EXPECT_GT(hostcuda::stats().collectives - collectives, 10u);
  }
  ASSERT_EQ(par.losses.size(), 5u);
  ASSERT_EQ(one.losses.size(), 5u);
  double worst = 0;
  for (size_t i = 0; i < 5; ++i) {
    const double rel = std::fabs(par.losses[i] - one.losses[i]) / one.losses[i];
    worst = std::max(worst, rel);
    EXPECT_LT(rel, tol) << "step " << i + 1 << ": " << par.losses[i] << " vs " << one.losses[i];
  }
  if (world().rank() != 0) return;
  EXPECT_LT(std::fabs(par.final_eval.loss - one.final_eval.loss) / one.final_eval.loss, tol) << "evaluation";
  // The gradient norms too: a gradient summed where NCCL should average (or the reverse) leaves
  // the losses within tol (clipping and AdamW absorb a constant factor), not the norm. Steps 1
  // and 2 only: from step 3 on, bf16 rounding has moved the tp and cp runs' parameters enough
  // that their norms differ by 2-8% while the losses still agree within 0.22% (measured).
  const auto norms = kvs::testing_util::read_metrics(par_dir).grad_norm,
             want = kvs::testing_util::read_metrics(run->second.dir).grad_norm;
  ASSERT_EQ(norms.size(), 5u);
  ASSERT_EQ(want.size(), 5u);
  double worst_norm = 0;
  for (int step = 1; step <= 2; ++step) {
    const double rel = kvs::testing_util::rel(norms.at(step), want.at(step));
    worst_norm = std::max(worst_norm, rel);
    EXPECT_LT(rel, tol) << "gradient norm at step " << step << ": " << norms.at(step) << " vs " << want.at(step);
  }
  std::printf("[ %s ] max relative difference: loss %.3g over 5 steps, gradient norm %.3g over 2\n", what.c_str(),
              worst, worst_norm);
}

}  // namespace

// dp = 2: each rank takes one of the two micro-batches of a step; ZeRO-1 sums
// the gradients into each rank's shard, steps it and gathers the parameters.
TEST(HostCudaParallel, DataParallelFollowsOneProcess) {
  if (world().size() != 2) GTEST_SKIP() << "needs 2 ranks";
  const kvs::Config c = config(true, 32, 1);
  expect_follows_one_process(c, world(), "dp2_mpi", 2e-3);
  auto nccl = kvs::testing_util::shim_nccl_world();
  expect_follows_one_process(c, *nccl, "dp2_nccl", 2e-3);
}

// tp = 2: each rank holds half the heads, FFN columns and vocabulary (200,
// padded to 256: rank 0 holds 128 real columns, rank 1 72 and 56 padding).
TEST(HostCudaParallel, TensorParallelFollowsOneProcess) {
  if (world().size() != 2) GTEST_SKIP() << "needs 2 ranks";
  const kvs::Config c = config(true, 200, 2);
  expect_follows_one_process(c, world(), "tp2_mpi", 5e-3);
  auto nccl = kvs::testing_util::shim_nccl_world();
  expect_follows_one_process(c, *nccl, "tp2_nccl", 5e-3);
}

// tp = 2 with sequence parallelism: the residual stream, the norms and the
// embedding's output hold 16 of a micro-batch's 32 rows per rank. Every sum
// is the tp = 2 test's (a reduce-scatter adds the same two bf16 partials as
// the all-reduce, an all-gather moves bf16 rows unchanged), the norm gains'
// gradients are fp32 sums of two halves instead of one pass: the same 5e-3.
TEST(HostCudaParallel, SequenceParallelFollowsOneProcess) {
  if (world().size() != 2) GTEST_SKIP() << "needs 2 ranks";
  const kvs::Config c = config(true, 200, 2, true);
  expect_follows_one_process(c, world(), "tp2sp_mpi", 5e-3);
  auto nccl = kvs::testing_util::shim_nccl_world();
  expect_follows_one_process(c, *nccl, "tp2sp_nccl", 5e-3);
}

// cp = 2: each rank holds chunks r and 3 - r (4 positions each) of every
// sequence; shifted GQA with window 2 and q, k and v shifted (shift_q), so
// every chunk but the first reads a 2-row halo from another rank or its own
// other chunk, and the ring merges up to three blocks per query chunk.
// Differences from one process come from where bf16 rounds (the merged output
// is rounded once from fp32; dq, dK̂, dV̂ are fp32 sums of bf16 block shares; a
// halo gradient is added to its row's bf16 gradient), the same kind and size
// as tensor parallelism's re-associated sums: its 5e-3.
TEST(HostCudaParallel, ContextParallelFollowsOneProcess) {
  if (world().size() != 2) GTEST_SKIP() << "needs 2 ranks";
  const kvs::Config c = config(true, 32, 1, false, 2, 2);
  expect_follows_one_process(c, world(), "cp2_mpi", 5e-3);
  auto nccl = kvs::testing_util::shim_nccl_world();
  expect_follows_one_process(c, *nccl, "cp2_nccl", 5e-3);
}

// cp = 2 with document boundaries (with_documents): each
// half's shift restarts at its documents, reading a halo row only when the
// document began in the chunk before; ring attention's blocks of earlier
// chunks mask the keys before each query's document (the key chunk at
// (kc - qc) Tc in the query chunk's rows). Against one process with the same
// documents, cp = 2's tolerance.
TEST(HostCudaParallel, ContextParallelWithDocumentsFollowsOneProcess) {
  if (world().size() != 2) GTEST_SKIP() << "needs 2 ranks";
  const kvs::Config c = with_documents(config(true, 32, 1, false, 2, 2));
  expect_follows_one_process(c, world(), "cp2_docs_mpi", 5e-3);
  auto nccl = kvs::testing_util::shim_nccl_world();
  expect_follows_one_process(c, *nccl, "cp2_docs_nccl", 5e-3);
}

// 4 ranks as dp = 2 x cp = 2 (rank = dp_rank * 2 + cp_rank): each replica's
// two ranks hold chunks r and 3 - r of its micro-batches, and ZeRO-1 sums the
// gradients over all four ranks (grad_comm: dp x cp) into each rank's shard.
// Against one process, cp = 2's tolerance, over MPI (ZeRO-1 staged through
// the host) and the shim's NCCL (ZeRO-1's reductions on the communicator's
// stream, the ring after the engine's stream is drained), with document
// boundaries on the NCCL run.
TEST(HostCudaParallelFourRanks, ContextAndDataParallelFollowOneProcess) {
  if (world().size() != 4) GTEST_SKIP() << "needs 4 ranks";
  const kvs::Config c = config(true, 32, 1, false, 2, 2);
  expect_follows_one_process(c, world(), "dp2cp2_mpi", 5e-3);
  auto nccl = kvs::testing_util::shim_nccl_world();
  expect_follows_one_process(with_documents(c), *nccl, "dp2cp2_docs_nccl", 5e-3);
}

// cp = 2 without recomputation against attention recomputation, which runs
// each layer's shift and ring attention again (halo all-gather included)
// before its backward: the same bits, so the backward's coefficient
// gradients read the halo rows of their own layer, not the last forward's.
TEST(HostCudaParallel, ContextParallelRecomputationChangesNoBits) {
  if (world().size() != 2) GTEST_SKIP() << "needs 2 ranks";
  kvs::Config c = config(true, 32, 1, false, 2, 2);
  c.train.steps = 2;  // the first update shows in the second step's loss
  const kvs::TrainSummary none = kvs::train(c, {shared_dir("cp2_recompute_none"), false, true, &world()});
  c.train.recompute = kvs::Recompute::Attention;
  const kvs::TrainSummary attention = kvs::train(c, {shared_dir("cp2_recompute_attention"), false, true, &world()});
  ASSERT_EQ(none.losses.size(), 2u);
  ASSERT_EQ(attention.losses.size(), 2u);
  for (size_t i = 0; i < 2; ++i) EXPECT_EQ(none.losses[i], attention.losses[i]) << "step " << i + 1;
}

// ZeRO-1's checkpoint on the engine's device buffers, over both paths: each
// rank's shard of the AdamW moments gathered into one optimizer file at step 2
// and scattered back on resume. Resumed at dp = 2, steps 3-5 are the
// uninterrupted run's bits (a shard saved or restored at the wrong offset moves
// step 3's update); resumed in one process (rank 0, a copy of the run
// directory), they follow the uninterrupted dp = 2 run within the data-parallel
// tolerance, so the file holds the moments in the one-process order (a
// permutation that the dp = 2 scatter would undo is not).
TEST(HostCudaParallel, DataParallelCheckpointResumes) {
  if (world().size() != 2) GTEST_SKIP() << "needs 2 ranks";
  const kvs::Config c = config(true, 32, 1);
  kvs::Config head = c;
  head.train.steps = 2;
  auto nccl = kvs::testing_util::shim_nccl_world();
  for (kvs::dist::Communicator* comm : {&world(), nccl.get()}) {
    const std::string what = "dp2_resume_" + comm->backend();
    SCOPED_TRACE(what);
    const kvs::TrainSummary full = kvs::train(c, {shared_dir(what + "_full"), false, true, comm});
    const std::string dir = shared_dir(what);
    kvs::train(head, {dir, false, true, comm});
    std::string copy;
    if (world().rank() == 0) {
      copy = dir + "_one";
      std::filesystem::remove_all(copy);
      std::filesystem::copy(dir, copy, std::filesystem::copy_options::recursive);
    }
    world().barrier();
    const kvs::TrainSummary rest = kvs::train(c, {dir, true, true, comm});
    ASSERT_EQ(full.losses.size(), 5u);
    ASSERT_EQ(rest.losses.size(), 3u);
    for (size_t i = 0; i < 3; ++i) EXPECT_EQ(rest.losses[i], full.losses[2 + i]) << "step " << 3 + i;
    if (world().rank() != 0) continue;
    EXPECT_EQ(rest.final_eval.loss, full.final_eval.loss);
    const kvs::TrainSummary one = kvs::train(c, {copy, true, true});
    ASSERT_EQ(one.losses.size(), 3u);
    for (size_t i = 0; i < 3; ++i)
      EXPECT_LT(kvs::testing_util::rel(one.losses[i], full.losses[2 + i]), 2e-3)
          << "step " << 3 + i << " resumed in one process: " << one.losses[i] << " vs " << full.losses[2 + i];
  }
  world().barrier();
}

// train.shard_master (on by default: each rank keeps the fp32 master of its
// ZeRO-1 shard, and the bf16 copy is gathered) against the whole master at
// dp = 2, over both paths (MPI: the bf16 copy staged through the host; the
// NCCL shim: broadcast as bf16, with the fp32 copies of the norm gains and
// shift coefficients): the same losses, evaluation and checkpoint bytes, bit
// for bit; and each rank's device memory peaks lower by exactly the master
// it does not keep, less its fp32 copies (the whole master never exists).
TEST(HostCudaParallel, ShardedMasterGivesTheWholeMastersBitsInLessMemory) {
  if (world().size() != 2) GTEST_SKIP() << "needs 2 ranks";
  kvs::Config c = config(true, 32, 1);
  const kvs::ParamLayout layout = kvs::ParamLayout::build(c.model, 0, 1);
  size_t copies = 0;
  for (const kvs::ParamTensor& t : layout.tensors)
    if (t.kind == kvs::ParamKind::Norm || t.kind == kvs::ParamKind::Shift) copies += t.numel;
  const kvs::ShardRange shard = kvs::shard_range(layout.total, 2, world().rank());
  for (const bool nccl : {false, true}) {
    const std::string what = std::string("dp2_master_") + (nccl ? "nccl" : "mpi");
    SCOPED_TRACE(what);
    std::map<bool, kvs::TrainSummary> runs;
    std::map<bool, size_t> peak;
    for (const bool sharded : {false, true}) {
      // A communicator per run: the NCCL one keeps the device buffer it stages host collectives through.
      std::unique_ptr<kvs::dist::Communicator> own = nccl ? kvs::testing_util::shim_nccl_world() : nullptr;
      c.train.shard_master = sharded;
      hostcuda::reset_device_bytes_peak();
      const size_t before = hostcuda::device_bytes_in_use();
      runs[sharded] = kvs::train(c, {shared_dir(what + (sharded ? "_sharded" : "_whole")), false, true,
                                     own ? own.get() : &world()});
      peak[sharded] = hostcuda::device_bytes_peak() - before;
    }
    ASSERT_EQ(runs[true].losses.size(), 5u);
    EXPECT_EQ(runs[true].losses, runs[false].losses);
    EXPECT_EQ(runs[true].final_eval.loss, runs[false].final_eval.loss);
    EXPECT_EQ(peak[false] - peak[true], sizeof(float) * (layout.total - (shard.end - shard.begin) - copies))
        << "peak device bytes, whole master " << peak[false] << ", sharded " << peak[true];
    if (world().rank() == 0) {
      for (const char* file : {"model.safetensors", "optimizer.safetensors"}) {
        const std::string a = runs[false].last_checkpoint, b = runs[true].last_checkpoint;
        ASSERT_FALSE(a.empty());
        ASSERT_FALSE(b.empty());
        EXPECT_TRUE(kvs::testing_util::slurp(a + "/" + file) == kvs::testing_util::slurp(b + "/" + file)) << file;
      }
    }
    world().barrier();
  }
}

// The staged path moves the shards chunk by chunk (StagedFlatSync): in
// chunks of 7 floats (every segment cut many times, the last one partly
// beyond the buffer) the reduced gradients, the gathered bf16 copy and the
// fp32 copies are the bytes of one chunk per shard (which the sharded-master
// test above checks against the whole master), on the device buffers.
TEST(HostCudaParallel, StagedSyncInChunksGivesTheWholeShardsBytes) {
  if (world().size() != 2) GTEST_SKIP() << "needs 2 ranks";
  const kvs::Config c = config(true, 32, 1);
  const int B = 2, T = 16;
  auto copy = [](cudaMemcpyKind kind) {
    return [kind](void* dst, const void* src, size_t bytes) {
      ASSERT_EQ(cudaMemcpy(dst, src, bytes, kind), cudaSuccess);
      if (kind == cudaMemcpyHostToDevice) {
        ASSERT_EQ(cudaDeviceSynchronize(), cudaSuccess);
      }
    };
  };
  struct Result {
    std::vector<float> grads, copies;
    std::vector<uint16_t> bits;
  };
  auto run = [&](size_t max_count) {
    kvs::CudaEngine e(c.model, B, T);
    const size_t total = e.layout().total;
    const kvs::ShardRange shard = kvs::shard_range(total, 2, world().rank());
    e.keep_optimizer_range(shard.begin, shard.end);
    e.keep_master_range(shard.begin, shard.end);
    kvs::StagedFlatSync sync(e, world(), shard, copy(cudaMemcpyDeviceToHost), copy(cudaMemcpyHostToDevice),
                             max_count);
    EXPECT_EQ(sync.chunk(), std::min(max_count, shard.padded_size));
    std::vector<float> init(total);
    kvs::init_params(e.layout(), c.model, 5, init.data());
    e.write_params(init.data());
    std::vector<int32_t> tokens(B * T), targets(B * T);
    for (int i = 0; i < B * T; ++i) {
      tokens[i] = 2 + (i * 7 + world().rank()) % 30;  // each rank its own batch
      targets[i] = 2 + (i * 5 + 1) % 30;
    }
    std::vector<float> mask(B * T, 1.0f);
    e.zero_grad();
    e.forward_backward({B, T, tokens.data(), targets.data(), mask.data()}, 1.0 / (2 * B * T));
    sync.reduce_grads();
    kvs::AdamWHyper h;
    h.lr = 1e-2;
    h.step = 1;
    e.adamw_step_range(h, shard.begin, shard.end);
    sync.all_gather_params16();
    Result r;
    r.grads.resize(shard.end - shard.begin);
    r.bits.resize(total);
    copy(cudaMemcpyDeviceToHost)(r.grads.data(), e.flat_grads() + shard.begin, r.grads.size() * sizeof(float));
    copy(cudaMemcpyDeviceToHost)(r.bits.data(), e.flat_params16(), total * sizeof(uint16_t));
    for (const kvs::Engine::Fp32Copy& t : e.fp32_copies()) {
      const size_t at = r.copies.size();
      r.copies.resize(at + t.n);
      copy(cudaMemcpyDeviceToHost)(r.copies.data() + at, t.data, t.n * sizeof(float));
    }
    return r;
  };
  const Result whole = run(kvs::StagedFlatSync::kMaxCount), chunks = run(7);
  EXPECT_TRUE(chunks.grads == whole.grads) << "the reduced shard";
  EXPECT_TRUE(chunks.bits == whole.bits) << "the gathered bf16 copy";
  EXPECT_TRUE(chunks.copies == whole.copies) << "the fp32 copies";
  EXPECT_FALSE(whole.copies.empty());
  world().barrier();
}

// ZeRO-1's gather of the bf16 copy over NCCL (the shim's) overlaps the next
// forward (DirectNccl::all_gather_params16, Engine::params_arriving), seen in
// the shim's queue, where an operation runs only when something waits for
// it: Zero1::step leaves the broadcasts of every range of the forward's
// order (the embedding, each of the 2 layers, the head: one bf16 piece per
// owner of a part of the range, one fp32 piece per owner of a part of the
// fp32 copies in it) in flight; layer 0's forward waits for the embedding's
// and its own only; a parameter read, or the next step's forward, for all of
// them. (Its bits: the sharded-master test above, whose NCCL runs overlap.)
TEST(HostCudaParallel, ShardedGatherIsWaitedForRangeByRange) {
  if (world().size() != 2) GTEST_SKIP() << "needs 2 ranks";
  auto nccl = kvs::testing_util::shim_nccl_world();
  const kvs::Config c = config(true, 32, 1);
  ASSERT_EQ(c.model.num_hidden_layers, 2);
  const int B = 2, T = 16;
  kvs::CudaEngine e(c.model, B, T);
  kvs::Zero1 z(e, *nccl, {}, {}, true);
  ASSERT_TRUE(z.master_sharded());
  std::vector<float> init(e.layout().total);
  kvs::init_params(e.layout(), c.model, 5, init.data());
  e.write_params(init.data());
  std::vector<int32_t> tokens(B * T), targets(B * T);
  for (int i = 0; i < B * T; ++i) {
    tokens[i] = 2 + (i * 7 + world().rank()) % 30;
    targets[i] = 2 + (i * 5 + 1) % 30;
  }
  std::vector<float> mask(B * T, 1.0f);
  const kvs::Batch b{B, T, tokens.data(), targets.data(), mask.data()};
  kvs::AdamWHyper h;
  h.lr = 1e-3;
  auto step = [&] {
    e.zero_grad();
    z.overlap_next_backward();
    e.forward_backward(b, 1.0 / (2 * B * T));
    z.reduce_gradients();
    ++h.step;
    z.step(h);
  };
  // The broadcasts of range i: a piece per owner of a part of it, bf16, and of the fp32 copies in it.
  const kvs::Engine::ParamArrival arrival = e.param_arrival();
  ASSERT_EQ(arrival.ends.size(), 4u);
  const std::vector<kvs::Engine::Fp32Copy> copies = e.fp32_copies();
  const size_t total = e.layout().total;
  auto pieces = [&](size_t i) {
    const size_t lo = i ? arrival.ends[i - 1] : 0, hi = arrival.ends[i];
    size_t n = 0;
    for (int r = 0; r < 2; ++r) {
      const kvs::ShardRange s = kvs::shard_range(total, 2, r);
      const size_t from = std::max(lo, s.begin), to = std::min(hi, s.end);
      if (from >= to) continue;
      ++n;
      for (const kvs::Engine::Fp32Copy& t : copies)
        if (t.offset < to && t.offset + t.n > from) {
          ++n;
          break;
        }
    }
    return n;
  };
  const size_t all = pieces(0) + pieces(1) + pieces(2) + pieces(3);
  ASSERT_EQ(hostcuda::queued_ops("ncclBroadcast"), 0u);
  step();
  EXPECT_EQ(hostcuda::queued_ops("ncclBroadcast"), all) << "Zero1::step waited for its gather";
  e.forward_layer(0, B, T);
  ASSERT_EQ(cudaStreamSynchronize(e.stream()), cudaSuccess);
  EXPECT_EQ(hostcuda::queued_ops("ncclBroadcast"), pieces(2) + pieces(3))
      << "layer 0's forward: the embedding's and layer 0's ranges";
  EXPECT_GT(pieces(2) + pieces(3), 0u);
  const kvs::ShardRange own = z.shard();
  std::vector<float> p(own.end - own.begin);
  e.read_params_range(own.begin, p.size(), p.data());
  EXPECT_EQ(hostcuda::queued_ops("ncclBroadcast"), 0u) << "a parameter read waits for the whole gather";
  step();
  EXPECT_EQ(hostcuda::queued_ops("ncclBroadcast"), all);
  e.zero_grad();
  e.forward_backward(b, 1.0 / (2 * B * T));  // the next step's forward waits for all of it
  EXPECT_EQ(hostcuda::queued_ops("ncclBroadcast"), 0u);
  world().barrier();
}

// Non-finite gradients on rank 1 only (its micro-batch of step 3) under ZeRO-1 over
// the NCCL shim, where the reduction starts inside the backward: both ranks
// stop on the gradient norm at step 3, and the resumed run is the
// uninterrupted one's bits.
TEST(HostCudaParallel, DataParallelNonFiniteGradientStopsEveryRank) {
  if (world().size() != 2) GTEST_SKIP() << "needs 2 ranks";
  auto nccl = kvs::testing_util::shim_nccl_world();
  kvs::testing_util::expect_nonfinite_gradient_stops_cleanly(config(true, 32, 1), 3, shared_dir("dp2_bad_grad_full"),
                                                       shared_dir("dp2_bad_grad"), nccl.get());
}
