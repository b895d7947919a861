// kvshift: pretraining Llama models with KV shifting attention.
// Subcommands live in src/cli/commands/; errors (usage errors too) become one line and exit 1.
#include <algorithm>
#include <cerrno>
#include <csignal>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <exception>
#include <iostream>
#include <memory>
#include <new>
#include <sstream>
#include <string>
#include <system_error>

#include <fmt/format.h>

#include "cli/commands/commands.h"
#include "cli/commands/world_guard.h"
#include "core/cpu_budget.h"
#include "core/error.h"
#include "core/log.h"
#include "core/runtime_env.h"
#include "dist/launch.h"
#include "kernels/cpu/blas_kernels.h"
#include "kernels/cpu/gemm_library.h"
#include "model/cpu_replicas.h"

namespace {

// The one-line message of a usage error. It names the deepest subcommand the
// arguments reach ("tokenizer train"), an unknown subcommand of one that takes
// subcommands, or the first --option that subcommand does not have (CLI11 would
// report a missing required option first, hiding the misspelt one).
std::string usage_error(CLI::App& app, const CLI::ParseError& e, int argc, char** argv) {
  CLI::App* at = &app;
  std::string path;
  int next = 1;
  for (; next < argc; ++next) {
    CLI::App* sub = nullptr;
    try {
      sub = at->get_subcommand(argv[next]);
    } catch (const CLI::OptionNotFound&) {  // not one of ours
    }
    if (!sub) break;
    path += (path.empty() ? "" : " ") + std::string(argv[next]);
    at = sub;
  }
  const bool option_next = next < argc && argv[next][0] == '-';
  if (path.empty())
    return next < argc && !option_next
               ? fmt::format("unknown subcommand '{}' (kvshift --help lists them)", argv[next])
               : next < argc ? fmt::format("unknown option '{}' before the subcommand (kvshift --help lists them)",
                                           argv[next])
                             : fmt::format("{} (kvshift --help lists the subcommands)", e.what());
  if (!at->get_subcommands({}).empty() && next < argc && !option_next)
    return fmt::format("unknown subcommand '{} {}' (kvshift {} --help lists them)", path, argv[next], path);
  for (int i = next; i < argc; ++i) {
    const std::string arg = argv[i];
    if (arg.rfind("--", 0) != 0 || arg == "--") continue;
    const std::string name = arg.substr(0, arg.find('='));
    if (!at->get_option_no_throw(name) && name != "--help" && name != "--help-all")
      return fmt::format("{}: unknown option '{}' (kvshift {} --help lists its options)", path, name, path);
  }
  return fmt::format("{}: {} (kvshift {} --help lists its options)", path, e.what(), path);
}

// --help-all with every level expanded: CLI11 expands one level below the
// command asked about, so `tokenizer train` and `data prepare` showed only
// their names. The same as CLI::Formatter::make_expanded, with the nested
// subcommands in AppFormatMode::All (each expanded in turn).
class ExpandEveryLevel : public CLI::Formatter {
 public:
  std::string make_expanded(const CLI::App* sub) const override {
    std::stringstream out;
    out << sub->get_display_name(true) << "\n";
    out << make_description(sub);
    out << make_positionals(sub);
    out << make_groups(sub, CLI::AppFormatMode::Sub);
    out << make_subcommands(sub, CLI::AppFormatMode::All);
    std::string text = CLI::detail::find_and_replace(out.str(), "\n\n", "\n");
    text = text.substr(0, text.size() - 1);  // the final newline
    return CLI::detail::find_and_replace(text, "\n", "\n  ") + "\n";  // indented under the name
  }
};

// The one line for a failed allocation in the command the arguments chose.
std::string out_of_memory(CLI::App& app) {
  std::string command;
  for (const CLI::App* sub : app.get_subcommands()) command = sub->get_name();
  return fmt::format(
      "out of memory{}: an allocation failed (the machine's memory, or the process's limit: ulimit -v, a cgroup's "
      "memory.max); `kvshift info --config F` estimates what a run needs",
      command.empty() ? "" : " in " + command);
}

// This process's rank as its launcher set it (0 without one): under a
// launcher every rank usually fails alike (a config error), and the line is
// printed once, not once per rank (print_rank_error).
int launch_rank() {
  try {
    return kvs::dist::detect_launch().rank;
  } catch (const std::exception&) {  // a bad launcher variable: its own error is the one printed
    return 0;
  }
}

}  // namespace

int main(int argc, char** argv) {
  // A file-size limit (ulimit -f) makes a write fail (EFBIG), which every
  // writer reports in one line naming its file, instead of killing the
  // process with SIGXFSZ half-way through (data prepare, export-hf, a checkpoint).
  std::signal(SIGXFSZ, SIG_IGN);
  // A log pipe that closes (`| tee log` killed, a log shipper gone) makes writes
  // to stdout/stderr fail (EPIPE, ignored) instead of killing a training run
  // between checkpoints with SIGPIPE.
  std::signal(SIGPIPE, SIG_IGN);
  kvs::tune_runtime_environment(argc, argv);  // may re-execute once with OpenMP settings (train, bench, ...)
  kvs::cpu::select_blas_kernels();      // before any BLAS call: the GEMM kernels for this CPU
  kvs::default_threads_to_cpu_budget();  // a container's CPU quota caps the default thread count
  CLI::App app{"kvshift: pretrain Llama-architecture language models with KV shifting attention"};
  app.require_subcommand(1);
  app.formatter(std::make_shared<ExpandEveryLevel>());  // before the subcommands: they copy it
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
  kvs::cli::add_bench_gemm(app);
  kvs::cli::add_tokenizer(app);
  kvs::cli::add_data(app);
  kvs::cli::add_dist_check(app);
  kvs::cli::add_dist_selftest(app);
  // Every subcommand but these runs in one process: launched as several ranks, an error (world_guard.h).
  for (CLI::App* sub : app.get_subcommands({})) {
    const std::string name = sub->get_name();
    if (name != "train" && name != "bench" && name != "eval" && name != "dist-check" && name != "dist-selftest")
      sub->parse_complete_callback([name] { kvs::cli::refuse_launched_ranks(name); });
  }
  // A bad_alloc on another thread (an OpenMP worker's, a library's) ends in
  // std::terminate: the same one line as on the main thread, not an abort.
  static CLI::App* const terminating_app = &app;
  static const std::terminate_handler previous = std::set_terminate([] {
    if (const std::exception_ptr e = std::current_exception()) {
      try {
        std::rethrow_exception(e);
      } catch (const std::bad_alloc&) {
        kvs::cli::print_rank_error(launch_rank(), out_of_memory(*terminating_app).c_str());
        std::_Exit(1);
      } catch (...) {
      }
    }
    previous();
  });
  bool help = false;
  int help_errno = 0;  // why printing --help failed, if it did (a long help fails while it is written)
  try {
    kvs::init_logging();
    // A bad KVS_CPU_GEMM(_THREADS) or KVS_CPU_REPLICAS is an error here, before any work; --help
    // reads no variable and prints whatever it holds.
    const bool asks_for_help = std::any_of(argv + 1, argv + argc, [](const char* a) {
      return std::strcmp(a, "--help") == 0 || std::strcmp(a, "-h") == 0 || std::strcmp(a, "--help-all") == 0;
    });
    if (!asks_for_help) {
      kvs::cpu::check_gemm_library_variable();
      kvs::check_cpu_replicas_variable();
    }
    app.parse(argc, argv);
  } catch (const CLI::ParseError& e) {
    if (e.get_exit_code() == 0) {
      errno = 0;
      help = true;
      app.exit(e);  // --help and --help-all: CLI11 prints them (std::cout), an output like any other (below)
      help_errno = errno;
    } else {
      // A usage error is one line too, naming the subcommand whose options were wrong.
      kvs::cli::print_rank_error(launch_rank(), usage_error(app, e, argc, argv).c_str());
      return 1;
    }
  } catch (const std::bad_alloc&) {
    // Not the bare "std::bad_alloc": what ran out, and where to look. (The
    // engine's own allocations say how much the model needs.)
    kvs::cli::print_rank_error(launch_rank(), out_of_memory(app).c_str());
    return 1;
  } catch (const std::system_error& e) {
    // std::thread's EAGAIN says only "Resource temporarily unavailable".
    const bool thread = e.code() == std::errc::resource_unavailable_try_again;
    kvs::cli::print_rank_error(
        launch_rank(), thread ? fmt::format("{}: a thread could not start (its stack did not fit under ulimit -v, or "
                                            "ulimit -u's process count is reached)",
                                            e.what())
                                    .c_str()
                              : e.what());
    return 1;
  } catch (const std::exception& e) {
    kvs::cli::print_rank_error(launch_rank(), e.what());
    return 1;
  }
  // What a command printed (eval --json, inspect, generate) is its result: a
  // full disk or a closed pipe that lost it is an error, not exit 0.
  errno = 0;
  std::cout.flush();  // CLI11's help goes through std::cout
  if (!std::cout || std::fflush(stdout) != 0 || std::ferror(stdout)) {
    const int err = errno ? errno : help_errno;
    if (help && err == EPIPE) return 0;  // `kvshift --help | head`: the reader had what it wanted
    const std::string why = err ? std::strerror(err) : "write error";
    kvs::cli::print_rank_error(launch_rank(), ("stdout: " + why + ": the output was not all written").c_str());
    return 1;
  }
  return 0;
}
