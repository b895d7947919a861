// kvshift: pretraining Llama models with KV shifting attention.
// Subcommands live in src/cli/commands/; errors (usage errors too) become one line and exit 1.
#include <cstdio>

#include "cli/commands/commands.h"
#include "core/cpu_budget.h"
#include "core/error.h"
#include "core/log.h"
#include "core/runtime_env.h"
#include "kernels/cpu/blas_kernels.h"

int main(int argc, char** argv) {
  kvs::tune_runtime_environment(argc, argv);  // may re-execute once with OpenMP settings (train, bench, ...)
  kvs::cpu::select_blas_kernels();      // before any BLAS call: the GEMM kernels for this CPU
  kvs::default_threads_to_cpu_budget();  // a container's CPU quota caps the default thread count
  CLI::App app{"kvshift: pretrain Llama-architecture language models with KV shifting attention"};
  app.require_subcommand(1);
  app.set_help_all_flag("--help-all", "Show the help of every subcommand");
  kvs::cli::add_train(app);
  kvs::cli::add_eval(app);
  kvs::cli::add_forward(app);
  kvs::cli::add_backward(app);
  kvs::cli::add_export_hf(app);
  kvs::cli::add_import_hf(app);
  kvs::cli::add_info(app);
  kvs::cli::add_bench(app);
  kvs::cli::add_inspect(app);
  kvs::cli::add_generate(app);
  kvs::cli::add_bench_attention(app);
  kvs::cli::add_tokenizer(app);
  kvs::cli::add_data(app);
  kvs::cli::add_dist_check(app);
  kvs::cli::add_dist_selftest(app);
  try {
    kvs::init_logging();
    app.parse(argc, argv);
  } catch (const CLI::ParseError& e) {
    if (e.get_exit_code() == 0) return app.exit(e);  // --help and --help-all: CLI11 prints them
    // A usage error is one line too, naming the subcommand whose options were wrong.
    const CLI::App* sub = nullptr;
    try {
      if (argc > 1) sub = app.get_subcommand(argv[1]);
    } catch (const CLI::OptionNotFound&) {  // not one of ours
    }
    if (argc > 1 && argv[1][0] != '-' && !sub) {
      std::fprintf(stderr, "kvshift: error: unknown subcommand '%s' (kvshift --help lists them)\n", argv[1]);
    } else if (argc > 1 && argv[1][0] == '-') {  // CLI11 would say a subcommand is required
      std::fprintf(stderr, "kvshift: error: unknown option '%s' before the subcommand (kvshift --help lists them)\n",
                   argv[1]);
    } else if (sub) {
      std::fprintf(stderr, "kvshift: error: %s: %s (kvshift %s --help lists its options)\n", argv[1], e.what(),
                   argv[1]);
    } else {
      std::fprintf(stderr, "kvshift: error: %s (kvshift --help lists the subcommands)\n", e.what());
    }
    return 1;
  } catch (const kvs::Error& e) {
    std::fprintf(stderr, "kvshift: error: %s\n", e.what());
    return 1;
  } catch (const std::exception& e) {
    std::fprintf(stderr, "kvshift: error: %s\n", e.what());
    return 1;
  }
  return 0;
}
