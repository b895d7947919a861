// kvshift: pretraining Llama models with KV shifting attention.
// Subcommands live in src/cli/commands/; errors become one line and exit 1.
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
    return app.exit(e);
  } catch (const kvs::Error& e) {
    std::fprintf(stderr, "kvshift: error: %s\n", e.what());
    return 1;
  } catch (const std::exception& e) {
    std::fprintf(stderr, "kvshift: error: %s\n", e.what());
    return 1;
  }
  return 0;
}
