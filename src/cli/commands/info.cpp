#include "cli/commands/commands.h"
#include "core/cpu_budget.h"
#include "model/config.h"
#include "model/cpu_engine.h"
#include "model/cpu_replicas.h"
#include "model/flops.h"
#include "model/params.h"
#include "parallel/pipeline.h"
#include "parallel/pipeline_schedule.h"
#include "parallel/tensor_parallel.h"
#include "train/train_step.h"
#ifdef KVS_CUDA
#include "model/cuda_engine.h"
#endif

namespace kvs::cli {

// What the CPU estimate leaves out: the process itself. An 82k-parameter
// model (configs/toy/induction-1l) estimated at 0.027 GiB ran at 0.25 GiB
// resident, lm-small at 0.46 GiB against 0.24 (2 threads, 2026-11-29). Most
// of the difference is loaded before main: libcublasLt adds 148 MiB (82 MiB
// its initialisers' allocations, 61 MiB relocated pages) and libnvrtc 29 MiB,
// also in a CPU run (a CUDA build links them).
constexpr const char* kCpuNotCounted =
    "the process itself: shared libraries (the CUDA ones too), the GEMM libraries' and the kernels' per-thread "
    "buffers, the data loader (about 0.2-0.3 GiB resident on a 2-core machine); thread replicas (docs/ARCHITECTURE.md "
    "\"Thread replicas\") are counted for this machine's threads (train.threads, 0: its cores), which another "
    "machine's may not match";

#ifdef KVS_CUDA
// What the CUDA estimate leaves out: allocations the libraries make
// themselves, whose size is only known on the GPU (an H100 run of the 1.5B
// config at 4 x 2048 had 45,727 MiB in use against 45,194 MiB estimated).
constexpr const char* kCudaNotCounted =
    "the CUDA context and the libraries' own allocations (about 0.5 GiB per GPU), NCCL's buffers (more "
    "than one rank), cuDNN's workspace (attention_backend \"cudnn\")";
#endif

void add_info(CLI::App& app) {
  auto* cmd = app.add_subcommand("info", "Parameter counts, FLOPs per token and a memory estimate for a config");
  struct Args {
    std::string config;
    std::vector<std::string> sets;
    bool json = false;
    int processes = 0;
  };
  auto a = std::make_shared<Args>();
  cmd->add_option("--config", a->config, "Experiment config (JSON)")->required();
  cmd->add_option("--set", a->sets, "Override a config key (repeatable)");
  cmd->add_flag("--json", a->json, "Print one JSON object instead of text");
  cmd->add_option("--processes", a->processes,
                  "Processes (GPUs) the run will use: checks the layout as train does and plans for dp = N / (tp x "
                  "cp x pp): the pipeline's micro-batches per replica (grad_accum_steps / dp) and, CUDA, ZeRO-1's "
                  "shards over dp x cp (default: tp x cp x pp, dp 1)")
      ->check(CLI::Range(1, 1 << 20));
  cmd->callback([a]() {
    const Config cfg = load_config(a->config, a->sets);
    const ModelConfig& m = cfg.model;
    // The world the plan is for: --processes, checked as train checks it, or one replica.
    const int replica = cfg.parallel.tp * cfg.parallel.cp * cfg.parallel.pp;
    const int processes = a->processes > 0 ? a->processes : replica;
    if (a->processes > 0) check_parallel_layout(cfg, processes);
    const int dp = processes / replica, micro_batches = cfg.train.grad_accum_steps / dp;
    const int zero_shards = dp * cfg.parallel.cp;
    const ParamCounts c = count_params(m);
    const int T = cfg.train.seq_len, B = cfg.train.micro_batch_size;
    const double flops = train_flops_per_token(m, T);
    // CPU reference engine: fp32 params, grads and two AdamW moments, plus its activation plan.
    const double GiB = 1024.0 * 1024.0 * 1024.0;
    const double all = static_cast<double>(c.total + c.shift);
    const double params_b = 4 * all, grads_b = 4 * all, opt_b = 8 * all;
    // A checkpoint, and what of it rank 0 holds not yet written.
    const double ckpt_b = 3 * params_b;
    const double ckpt_buffer_b =
        static_cast<double>(cfg.train.checkpoint_buffer_bytes(static_cast<uint64_t>(ckpt_b)));
    // On this machine's threads the CPU engine may run as thread replicas
    // (make_engine's choice, model/cpu_replicas.h): each its own gradients and
    // the activations of its share of the micro-batch (ceil(B / replicas)
    // sequences); the weights and AdamW moments are the first's.
    const int threads = resolve_threads(cfg.train.threads);
    const bool alone = cfg.parallel.tp == 1 && cfg.parallel.cp == 1 && cfg.parallel.pp == 1;
    const int replicas = cpu_replicas_for_model(m, threads, B, T, alone);
    const int share = (B + replicas - 1) / replicas;
    const double grads_all_b = grads_b * replicas;
    const double acts_b =
        4.0 * replicas * static_cast<double>(ActivationPlan::build(m, LocalDims::of(m, 0, 1), share, T).total);
    // One rank's activations under the config's parallel layout (tp, cp), with
    // and without sequence parallelism (which needs tp > 1 and splits the
    // residual stream and norms over the TP group).
    const ParallelConfig& par = cfg.parallel;
    auto rank_acts = [&](bool sp) {
      return 4.0 * static_cast<double>(
                       ActivationPlan::build(m, LocalDims::of(m, 0, par.tp), B, T, sp ? par.tp : 1, par.cp).total);
    };
    const double rank_acts_b = rank_acts(false), rank_acts_sp_b = par.tp > 1 ? rank_acts(true) : rank_acts_b;
    // Pipeline parallelism: each stage's activations, for the micro-batches its
    // schedule keeps in flight (m = grad_accum_steps / dp micro-batches per replica).
    nlohmann::json stages = nlohmann::json::array();
    if (par.pp > 1) {
      const StageSplit split = StageSplit::make(m, par.pp, par.virtual_stages, par.layers_per_stage, a->config);
      for (int r = 0; r < par.pp; ++r) {
        const ModelPart part = ModelPart::of(split, r);
        std::vector<int> chunk_of;
        for (size_t i = 0; i < part.layers.size(); ++i)
          chunk_of.push_back(chunk_of.empty() ? 0
                                              : chunk_of.back() + (part.layers[i] != part.layers[i - 1] + 1 ? 1 : 0));
        const int slots = micro_batches_in_flight(pipeline_schedule(split, r, micro_batches));
        const double per_slot = 4.0 * static_cast<double>(
                                          ActivationPlan::build(m, LocalDims::of(m, 0, par.tp), B, T,
                                                                par.sequence_parallel ? par.tp : 1, par.cp, chunk_of,
                                                                part.head)
                                              .total);
        stages.push_back({{"stage", r},
                          {"layers", part.layers},
                          {"embedding", part.embedding},
                          {"head", part.head},
                          {"micro_batches_in_flight", slots},
                          {"activations", per_slot * slots}});
      }
    }
    // The CUDA engine's device memory on TP rank 0 (the largest slice), from
    // the same plan its constructor allocates (host arithmetic, no GPU): the
    // one arena (fp32 grads + bf16 copy, activations for the micro-batch,
    // workspaces), the fp32 master (its own allocation; 10 B per parameter
    // with the arena's weights and grads), the two fp32 moments before ZeRO-1
    // shards them over dp x cp, and the 32 MiB cuBLASLt workspace. CUDA builds only.
    nlohmann::json cuda_mem = nullptr;
#ifdef KVS_CUDA
    {
      const int tp = cfg.parallel.tp;
      const ParamLayout layout = ParamLayout::build(m, 0, tp);
      // Under sequence / context parallelism the rank holds fewer rows (the plan sizes them).
      const int sp_rows = cfg.parallel.sequence_parallel ? tp : 1, cp = cfg.parallel.cp;
      const CudaPlan plan =
          CudaPlan::build(m, LocalDims::of(m, 0, tp), tp, layout, B, T, cfg.train.recompute, sp_rows, cp);
      const double P = static_cast<double>(layout.total);
      // The arena holds the fp32 grads and the bf16 copy (6 B); the fp32 master (4 B) is allocated apart.
      const double arena = static_cast<double>(plan.total), weights = 10.0 * P, master = 4.0 * P, moments = 8.0 * P;
      const double cublas = 32.0 * 1024 * 1024;
      // ZeRO-1 over dp x cp ranks keeps rank 0's shard (the largest, zero1.cpp's
      // shard_range) of the moments, and of the fp32 master with train.shard_master.
      auto per_gpu = [&](double params, double unsharded) {
        if (zero_shards == 1) return unsharded;
        const double shard = std::ceil(params / zero_shards);
        const double kept = 8.0 * shard + (cfg.train.shard_master ? 4.0 * shard : 4.0 * params);
        return unsharded - 12.0 * params + kept;
      };
      cuda_mem = {{"engine", "cuda-bf16"},
                  {"tp", tp},
                  {"recompute", cfg.train.recompute},
                  {"weights_and_grads", weights},
                  {"activations_and_workspaces", arena - (weights - master) + cublas},
                  {"optimizer_unsharded", moments},
                  {"total_unsharded", arena + master + cublas + moments},
                  {"zero1_shards", zero_shards},
                  {"total_per_gpu", per_gpu(P, arena + master + cublas + moments)},
                  {"not_counted", kCudaNotCounted}};
      // Under pipeline parallelism each stage's engine: its part's
      // parameters and a plan with its schedule's activation slots.
      nlohmann::json cuda_stages = nlohmann::json::array();
      if (par.pp > 1) {
        const StageSplit split = StageSplit::make(m, par.pp, par.virtual_stages, par.layers_per_stage, a->config);
        for (int r = 0; r < par.pp; ++r) {
          const ModelPart part = ModelPart::of(split, r);
          CudaStages st;
          for (size_t i = 0; i < part.layers.size(); ++i)
            st.chunk_of.push_back(i == 0 ? 0 : st.chunk_of.back() + (part.layers[i] != part.layers[i - 1] + 1));
          st.head = part.head;
          st.slots = micro_batches_in_flight(pipeline_schedule(split, r, micro_batches));
          st.staged = true;
          const ParamLayout sl = ParamLayout::build(m, 0, tp, &part);
          const CudaPlan sp =
              CudaPlan::build(m, LocalDims::of(m, 0, tp), tp, sl, B, T, cfg.train.recompute, st, sp_rows, cp);
          const double sP = static_cast<double>(sl.total), sw = 10.0 * sP, sa = static_cast<double>(sp.total);
          cuda_stages.push_back({{"stage", r},
                                 {"slots", st.slots},
                                 {"weights_and_grads", sw},
                                 {"activations_and_workspaces", sa - 6.0 * sP + cublas},
                                 {"optimizer_unsharded", 8.0 * sP},
                                 {"total_unsharded", sa + 4.0 * sP + cublas + 8.0 * sP},
                                 {"total_per_gpu", per_gpu(sP, sa + 4.0 * sP + cublas + 8.0 * sP)}});
        }
      }
      cuda_mem["pipeline_stages"] = cuda_stages;
    }
#endif
    if (a->json) {
      nlohmann::json j = {{"config", a->config},
                          {"params_total", c.total},
                          {"params_non_embedding", c.non_embedding},
                          {"params_embedding", c.embedding},
                          {"params_lm_head", c.lm_head},
                          {"params_shift", c.shift},
                          {"train_flops_per_token", flops},
                          {"flops_formula", kFlopsFormula},
                          {"memory_bytes",
                           {{"engine", "cpu-fp32"},
                            {"threads", threads},
                            {"cpu_replicas", replicas},
                            {"params", params_b},
                            {"grads", grads_all_b},
                            {"optimizer", opt_b},
                            {"activations", acts_b},
                            {"total", params_b + grads_all_b + opt_b + acts_b},
                            {"not_counted", kCpuNotCounted}}},
                          {"activations_per_rank",
                           {{"engine", "cpu-fp32"},
                            {"tp", par.tp},
                            {"cp", par.cp},
                            {"without_sequence_parallel", rank_acts_b},
                            {"with_sequence_parallel", par.tp > 1 ? nlohmann::json(rank_acts_sp_b) : nullptr}}},
                          {"pipeline_stages", stages},
                          {"memory_bytes_cuda", cuda_mem},
                          {"checkpoint_bytes", ckpt_b},
                          {"checkpoint_buffer_bytes", ckpt_buffer_b},
                          {"processes", processes},
                          {"dp", dp},
                          {"micro_batches_per_replica", micro_batches},
                          {"micro_batch_size", B},
                          {"seq_len", T}};
      std::printf("%s\n", j.dump().c_str());
      return;
    }
    std::printf("config          %s\n", a->config.c_str());
    std::printf("model           %d layers, hidden %d, heads %d (kv %d, head_dim %d), ffn %d, vocab %d, kv_shift %s\n",
                m.num_hidden_layers, m.hidden_size, m.num_attention_heads, m.num_key_value_heads, m.head_dim(),
                m.intermediate_size, m.vocab_size, describe_kv_shift(m.kv_shift).c_str());
    std::printf("parameters      %lld total (shift scalars excluded)\n", static_cast<long long>(c.total));
    std::printf("  non-embedding %lld\n", static_cast<long long>(c.non_embedding));
    std::printf("  embedding     %lld\n", static_cast<long long>(c.embedding));
    std::printf("  lm_head       %lld%s\n", static_cast<long long>(c.lm_head), m.tie_word_embeddings ? " (tied)" : "");
    std::printf("  shift scalars %lld\n", static_cast<long long>(c.shift));
    std::printf("train FLOPs     %.4g per token at T=%d  (%s)\n", flops, T, kFlopsFormula);
    std::printf("layout          %d processes: dp %d x pp %d x cp %d x tp %d, %d micro-batches of %d per replica and "
                "step%s\n",
                processes, dp, par.pp, par.cp, par.tp, micro_batches, B,
                a->processes > 0 ? "" : " (--processes for more replicas)");
    std::printf("memory (CPU fp32 engine, micro-batch %d x %d%s):\n", B, T,
                replicas > 1 ? fmt::format(", as {} thread replicas of {} sequences on this machine's {} threads",
                                           replicas, share, threads)
                                   .c_str()
                             : "");
    std::printf("  params %.3f GiB, grads %.3f GiB, AdamW %.3f GiB, activations %.3f GiB, total %.3f GiB\n",
                params_b / GiB, grads_all_b / GiB, opt_b / GiB, acts_b / GiB,
                (params_b + grads_all_b + opt_b + acts_b) / GiB);
    std::printf("  not counted: %s\n", kCpuNotCounted);
    if (par.tp > 1 || par.cp > 1) {
      std::printf("  activations per rank at tp %d, cp %d: %.3f GiB", par.tp, par.cp, rank_acts_b / GiB);
      if (par.tp > 1)
        std::printf(", with sequence parallelism %.3f GiB (%s)", rank_acts_sp_b / GiB,
                    par.sequence_parallel ? "on" : "parallel.sequence_parallel to turn it on");
      std::printf("\n");
    }
    for (const auto& st : stages)
      std::printf("  pipeline stage %d: %zu layers%s%s, %d micro-batches in flight (m = %d): activations %.3f GiB\n",
                  st["stage"].get<int>(), st["layers"].size(), st["embedding"].get<bool>() ? " + embedding" : "",
                  st["head"].get<bool>() ? " + head" : "", st["micro_batches_in_flight"].get<int>(),
                  micro_batches, st["activations"].get<double>() / GiB);
    // docs/PARALLEL.md "Checkpoints": rank 0 holds the gathered tensors not yet written, up to the buffer.
    std::printf("checkpoint      %.3f GiB (fp32 weights + AdamW moments); rank 0 holds at most %.3f GiB of it not yet "
                "written (train.checkpoint_buffer_gb)\n",
                ckpt_b / GiB, ckpt_buffer_b / GiB);
    if (!cuda_mem.is_null()) {
      std::printf("memory (CUDA bf16 engine, one GPU of tp %d, micro-batch %d x %d, recompute %s):\n",
                  cuda_mem["tp"].get<int>(), B, T, std::string(to_string(cfg.train.recompute)).c_str());
      std::printf("  fp32 master + fp32 grads + bf16 copy %.3f GiB, activations + workspaces %.3f GiB, "
                  "AdamW %.3f GiB, total %.3f GiB (before ZeRO-1 shards the AdamW moments, and with "
                  "train.shard_master the fp32 master, over dp x cp)\n",
                  cuda_mem["weights_and_grads"].get<double>() / GiB,
                  cuda_mem["activations_and_workspaces"].get<double>() / GiB,
                  cuda_mem["optimizer_unsharded"].get<double>() / GiB, cuda_mem["total_unsharded"].get<double>() / GiB);
      if (zero_shards > 1)
        std::printf("  with ZeRO-1 over dp x cp = %d ranks (the AdamW moments%s sharded): %.3f GiB per GPU\n",
                    zero_shards, cfg.train.shard_master ? " and the fp32 master" : "",
                    cuda_mem["total_per_gpu"].get<double>() / GiB);
      std::printf("  not counted: %s\n", kCudaNotCounted);
      for (const auto& st : cuda_mem["pipeline_stages"]) {
        std::printf("  pipeline stage %d: weights + grads + bf16 copy %.3f GiB, activations + workspaces %.3f GiB "
                    "(%d slots), AdamW %.3f GiB, total %.3f GiB",
                    st["stage"].get<int>(), st["weights_and_grads"].get<double>() / GiB,
                    st["activations_and_workspaces"].get<double>() / GiB, st["slots"].get<int>(),
                    st["optimizer_unsharded"].get<double>() / GiB, st["total_unsharded"].get<double>() / GiB);
        if (zero_shards > 1)
          std::printf(", %.3f GiB with ZeRO-1", st["total_per_gpu"].get<double>() / GiB);
        std::printf("\n");
      }
    }
  });
}

}  // namespace kvs::cli
