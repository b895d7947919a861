// The kvshift binary as a user runs it: help text, info on the paper configs,
// and one-line errors with a non-zero exit for bad input.
#include <gtest/gtest.h>
#include <sched.h>

#include <algorithm>
#include <array>
#include <cmath>
#include <cstdio>
#include <filesystem>
#include <fstream>
#include <map>
#include <regex>
#include <sstream>
#include <string>
#include <thread>
#include <tuple>
#include <utility>
#include <vector>

#include <nlohmann/json.hpp>

#include "build_paths.h"
#include "core/runtime_env.h"
#include "core/safetensors.h"
#include "core/sha256.h"
#include "data/shards.h"
#include "cuda_test_util.h"
#include "test_util.h"

namespace fs = std::filesystem;

namespace {

using Result = kvs::testing_util::CommandResult;

Result run_with_env(const std::string& prefix, const std::string& args) {
  return kvs::testing_util::run_kvshift(args, prefix);
}
Result run(const std::string& args) { return kvs::testing_util::run_kvshift(args); }

std::string src(const std::string& rel) { return std::string(kvs::test::source_dir()) + "/" + rel; }

std::string write_temp(const std::string& name, const std::string& text) {
  const std::string path = testing::TempDir() + name;
  std::ofstream(path) << text;
  return path;
}

int count_lines(const std::string& s) { return static_cast<int>(std::count(s.begin(), s.end(), '\n')); }

}  // namespace

namespace {

// The names in a help text's "Subcommands:" section.
std::vector<std::string> subcommands_in(const std::string& help) {
  std::vector<std::string> names;
  const size_t at = help.find("\nSubcommands:\n");
  if (at == std::string::npos) return names;
  std::istringstream in(help.substr(at + 14));
  for (std::string line; std::getline(in, line) && line.rfind("  ", 0) == 0;)
    if (line.size() > 2 && line[2] != ' ') names.push_back(line.substr(2, line.find(' ', 2) - 2));
  return names;
}

// Every subcommand, nested ones as "tokenizer train", with its help text.
void every_subcommand(const std::string& path, const std::string& help,
                      std::vector<std::pair<std::string, std::string>>& out) {
  for (const std::string& sub : subcommands_in(help)) {
    const std::string full = path.empty() ? sub : path + " " + sub;
    const Result r = run(full + " --help");
    ASSERT_EQ(r.code, 0) << full << ": " << r.out;
    out.push_back({full, r.out});
    every_subcommand(full, r.out, out);
  }
}

}  // namespace

// Every subcommand and every long option is in the README and its --help gives every option a
// description (CLI11 prints it from column 30, or on the next line for a long
// option); train's main flags are there.
TEST(Cli, HelpListsEverySubcommandAndFlag) {
  const Result top = run("--help");
  ASSERT_EQ(top.code, 0) << top.out;
  std::vector<std::pair<std::string, std::string>> subs;
  every_subcommand("", top.out, subs);
  for (const char* sub : {"train", "eval", "forward", "backward", "export-hf", "import-hf", "info", "bench", "inspect",
                          "generate", "bench-attention", "tokenizer", "data", "tokenizer train", "tokenizer encode",
                          "data prepare"})
    EXPECT_NE(std::find_if(subs.begin(), subs.end(), [&](const auto& s) { return s.first == sub; }), subs.end())
        << sub;
  const std::string readme = kvs::testing_util::slurp(src("README.md"));
  for (const auto& [sub, text] : subs) {
    SCOPED_TRACE(sub);
    EXPECT_NE(readme.find("`" + sub), std::string::npos) << "not in README.md";
    std::istringstream help(text);
    std::vector<std::string> lines;
    for (std::string line; std::getline(help, line);) lines.push_back(line);
    int options = 0;
    for (size_t i = 0; i < lines.size(); ++i) {
      if (lines[i].rfind("  -", 0) != 0) continue;
      ++options;
      // Each long option is named in README.md (the command table or the text).
      if (const size_t dash = lines[i].find("--"); dash != std::string::npos) {
        const size_t end = lines[i].find_first_not_of("abcdefghijklmnopqrstuvwxyz0123456789-", dash + 2);
        const std::string flag = lines[i].substr(dash, end - dash);
        if (flag != "--help" && flag != "--help-all") {
          EXPECT_NE(readme.find(flag), std::string::npos) << flag << " is not in README.md";
        }
      }
      const bool same_line = lines[i].size() > 30 && lines[i][29] == ' ' && lines[i][30] != ' ';
      const bool next_line = i + 1 < lines.size() && lines[i + 1].size() > 30 &&
                             lines[i + 1].find_first_not_of(' ') == 30;
      EXPECT_TRUE(same_line || next_line) << "no description: " << lines[i];
    }
    EXPECT_GE(options, 2) << "no options listed";  // --help and --help-all at least
  }
  // --help-all shows every subcommand's options, the nested ones' (tokenizer train) too: each
  // option line of a --help as many times as the subcommands that have it.
  const Result all = run("--help-all");
  ASSERT_EQ(all.code, 0) << all.out;
  std::map<std::string, int> option_lines;
  for (const auto& [sub, text] : subs) {
    std::istringstream help(text);
    for (std::string line; std::getline(help, line);)
      if (line.rfind("  -", 0) == 0 && line.find("--help") == std::string::npos) ++option_lines[line.substr(2)];
  }
  EXPECT_GT(option_lines.count("--character-coverage FLOAT=0.99995"), 0u);  // tokenizer train's
  for (const auto& [line, want] : option_lines) {
    int n = 0;
    for (size_t at = all.out.find(line); at != std::string::npos; at = all.out.find(line, at + 1)) ++n;
    EXPECT_GE(n, want) << "--help-all lacks: " << line;
  }
  Result t = run("train --help");
  for (const char* flag : {"--config", "--set", "--run-dir", "--resume", "--init-from", "--quiet"})
    EXPECT_NE(t.out.find(flag), std::string::npos) << flag;
}

// The live progress line (a plain line when stderr is not a terminal, at
// least at the last step): step, loss, lr, tokens/s and ETA.
TEST(Cli, TrainPrintsTheProgressLine) {
  const std::string dir = testing::TempDir() + "kvs_cli_progress";
  fs::remove_all(dir);
  const Result r = run("train --config " + src("configs/toy/induction-1l-kvshift.json") +
                       " --set train.steps=3 --set train.eval_every=0 --run-dir " + dir);
  ASSERT_EQ(r.code, 0) << r.out;
  EXPECT_TRUE(std::regex_search(
      r.out, std::regex("step 3/3 \\| loss [0-9]+\\.[0-9]{4} \\| lr [0-9]\\.[0-9]{2}e[-+][0-9]+ \\| [0-9.]+k? tok/s "
                        "\\| ETA 0s")))
      << r.out;
}

// --init-from takes a checkpoint as eval and generate do: a step directory,
// or a run or checkpoints/ directory standing for its latest step.
TEST(Cli, TrainInitFromTakesARunOrCheckpointsDirectory) {
  const std::string dir = testing::TempDir() + "kvs_cli_init_from";
  fs::remove_all(dir);
  const std::string train = "train --config " + src("configs/toy/induction-1l-kvshift.json") +
                            " --set train.steps=2 --set train.eval_every=0 --set train.checkpoint_every=1 --run-dir ";
  ASSERT_EQ(run(train + dir + "/first").code, 0);
  const std::string latest = dir + "/first/checkpoints/step_00000002";
  for (const std::string& from : {dir + "/first", dir + "/first/checkpoints", latest}) {
    SCOPED_TRACE(from);
    fs::remove_all(dir + "/second");
    const Result r = run(train + dir + "/second --init-from " + from);
    ASSERT_EQ(r.code, 0) << r.out;
    EXPECT_NE(r.out.find("weights from " + latest), std::string::npos) << r.out;
  }
  fs::create_directories(dir + "/empty");
  const Result r = run(train + dir + "/third --init-from " + dir + "/empty");
  EXPECT_NE(r.code, 0);
  EXPECT_NE(r.out.find(dir + "/empty: missing config.json"), std::string::npos) << r.out;
}

TEST(Cli, InfoReproducesThePaperParameterCounts) {
  const std::pair<const char*, long long> sizes[] = {{"1.5B", 1564198912LL},
                                                     {"2.9B", 2888337920LL},
                                                     {"6.7B", 6771183616LL},
                                                     {"13B", 13056824320LL},
                                                     {"19B", 19011803136LL}};
  for (auto [name, count] : sizes) {
    for (const char* kind : {"vanilla", "kvshift"}) {
      Result r = run("info --json --config " + src(std::string("configs/paper/") + name + "-" + kind + ".json"));
      ASSERT_EQ(r.code, 0) << r.out;
      auto j = nlohmann::json::parse(r.out);
      EXPECT_EQ(j["params_total"].get<long long>(), count) << name << " " << kind;
      // A checkpoint: fp32 weights and both moments, shift scalars included; rank 0 holds at
      // most 1 GB of it not yet written (the paper configs save synchronously).
      EXPECT_EQ(j["checkpoint_bytes"].get<double>(),
                12.0 * static_cast<double>(count + j["params_shift"].get<long long>()))
          << name << " " << kind;
      EXPECT_EQ(j["checkpoint_buffer_bytes"].get<double>(), 1e9) << name << " " << kind;
    }
  }
}

// The CPU estimate says what it leaves out (the process itself), in the text and the JSON.
TEST(Cli, InfoSaysWhatTheCpuEstimateLeavesOut) {
  const Result text = run("info --config " + src("configs/toy/lm-small-kvshift.json"));
  ASSERT_EQ(text.code, 0) << text.out;
  const size_t cpu = text.out.find("memory (CPU fp32 engine");
  ASSERT_NE(cpu, std::string::npos) << text.out;
  EXPECT_NE(text.out.find("not counted: the process itself", cpu), std::string::npos) << text.out;
  const Result js = run("info --json --config " + src("configs/toy/lm-small-kvshift.json"));
  ASSERT_EQ(js.code, 0) << js.out;
  EXPECT_NE(nlohmann::json::parse(js.out)["memory_bytes"]["not_counted"].get<std::string>().find("shared libraries"),
            std::string::npos);
}

// On 2 threads with 8 sequences a micro-batch the CPU engine runs as two
// thread replicas (make_engine's choice): the estimate counts each one's
// gradients and the activations of its 4 sequences; on 1 thread, or with
// KVS_CPU_REPLICAS=off, one engine's.
TEST(Cli, InfoCountsTheThreadReplicasOfThisMachinesThreads) {
  const std::string cfg = src("configs/toy/lm-small-kvshift.json");
  auto memory = [&](const std::string& env, int threads) {
    const Result r =
        run_with_env(env, " info --json --set train.threads=" + std::to_string(threads) + " --config " + cfg);
    EXPECT_EQ(r.code, 0) << r.out;
    return nlohmann::json::parse(r.out)["memory_bytes"];
  };
  const auto one = memory("", 1), two = memory("", 2), off = memory("KVS_CPU_REPLICAS=off", 2),
             off_one = memory("KVS_CPU_REPLICAS=off", 1);
  const Result half_batch = run(" info --json --set train.threads=1 --set train.micro_batch_size=4 --config " + cfg);
  ASSERT_EQ(half_batch.code, 0) << half_batch.out;
  const double share_acts = nlohmann::json::parse(half_batch.out)["memory_bytes"]["activations"].get<double>();
  EXPECT_EQ(one["cpu_replicas"], 1);
  EXPECT_EQ(two["cpu_replicas"], 2);
  EXPECT_EQ(off["cpu_replicas"], 1);
  EXPECT_EQ(two["threads"], 2);
  EXPECT_EQ(two["grads"].get<double>(), 2 * one["grads"].get<double>());
  EXPECT_EQ(two["params"], one["params"]);
  EXPECT_EQ(two["optimizer"], one["optimizer"]);
  EXPECT_EQ(two["activations"].get<double>(), 2 * share_acts);
  EXPECT_EQ(two["total"].get<double>(), two["params"].get<double>() + two["grads"].get<double>() +
                                            two["optimizer"].get<double>() + two["activations"].get<double>());
  EXPECT_EQ(off["total"], one["total"]);
  EXPECT_EQ(off_one["total"], one["total"]);
  const Result text = run(" info --set train.threads=2 --config " + cfg);
  EXPECT_NE(text.out.find("as 2 thread replicas of 4 sequences on this machine's 2 threads"), std::string::npos)
      << text.out;
}

#ifdef KVS_CUDA
// The memory target for the paper's 1.5B model, from the CUDA engine's own
// allocation plan (host arithmetic, no GPU): the 1.5B config at micro-batch 4 x 2048 needs less than
// 80 GB on one GPU without recomputation; the weight part is 10 bytes per
// parameter (fp32 master, fp32 grad, bf16 copy), and recomputation only ever
// shrinks the activations.
TEST(Cli, InfoPlansThePaper15BOnOneGpuUnder80GB) {
  double acts[3];
  const char* levels[] = {"none", "attention", "full"};
  for (int i = 0; i < 3; ++i) {
    Result r = run("info --json --config " + src("configs/paper/1.5B-kvshift.json") +
                   " --set train.micro_batch_size=4 --set train.recompute=" + levels[i]);
    ASSERT_EQ(r.code, 0) << r.out;
    const auto j = nlohmann::json::parse(r.out);
    const auto& c = j["memory_bytes_cuda"];
    ASSERT_TRUE(c.is_object()) << r.out;
    const double P = static_cast<double>(j["params_total"].get<long long>() + j["params_shift"].get<long long>());
    EXPECT_EQ(c["weights_and_grads"].get<double>(), 10.0 * P);
    EXPECT_EQ(c["optimizer_unsharded"].get<double>(), 8.0 * P);
    EXPECT_LT(c["total_unsharded"].get<double>(), 80e9) << levels[i];
    acts[i] = c["activations_and_workspaces"].get<double>();
  }
  EXPECT_LT(acts[1], acts[0]);
  EXPECT_LT(acts[2], acts[1]);
  // What the estimate leaves out is said, in the text and the JSON.
  const Result text = run("info --config " + src("configs/paper/1.5B-kvshift.json"));
  ASSERT_EQ(text.code, 0) << text.out;
  EXPECT_NE(text.out.find("not counted: the CUDA context"), std::string::npos) << text.out;
  const Result js = run("info --json --config " + src("configs/paper/1.5B-kvshift.json"));
  EXPECT_NE(nlohmann::json::parse(js.out)["memory_bytes_cuda"]["not_counted"].get<std::string>().find("NCCL"),
            std::string::npos);
}
#endif

TEST(Cli, MissingConfigIsOneLineError) {
  Result r = run("train --config /nonexistent/cfg.json --run-dir " + testing::TempDir() + "never");
  EXPECT_NE(r.code, 0);
  EXPECT_EQ(count_lines(r.out), 1) << r.out;
  EXPECT_NE(r.out.find("/nonexistent/cfg.json"), std::string::npos) << r.out;
}

// A value with a newline or a NUL in it (a path, a config string) stays one
// visible line: written as escapes, not a line break or the message's end.
TEST(Cli, ControlCharactersInValuesAreEscapedInTheErrorLine) {
  Result r = run("train --config \"$(printf '" + testing::TempDir() + "no\\nsuch.json')\" --run-dir " +
                 testing::TempDir() + "never");
  EXPECT_NE(r.code, 0);
  EXPECT_EQ(count_lines(r.out), 1) << r.out;
  EXPECT_NE(r.out.find("no\\nsuch.json"), std::string::npos) << r.out;
  std::ifstream in(src("configs/toy/induction-1l-kvshift.json"));
  auto j = nlohmann::json::parse(in);
  j["device"] = std::string("cu\0da\x1b", 6);
  const std::string path = write_temp("nul_value.json", j.dump());
  r = run("info --config " + path);
  EXPECT_NE(r.code, 0);
  EXPECT_EQ(count_lines(r.out), 1) << r.out;
  EXPECT_NE(r.out.find("\"cu\\0da\\x1b\""), std::string::npos) << r.out;
  EXPECT_EQ(kvs::escape_control_characters(std::string("a\tb\r\n\x7f\\", 7)), "a\tb\\r\\n\\x7f\\");
}

// What a resume changes is said, with the learning rate it gives next; a warmup
// longer than the run is warned about; a closed log pipe does not end the run
// (SIGPIPE killed it between checkpoints, exit 141).
TEST(Cli, TrainSaysWhatAResumeChangesAndOutlivesItsLogPipe) {
  const std::string dir = testing::TempDir() + "resume_changes";
  fs::remove_all(dir);
  const std::string cfg = src("configs/toy/induction-1l-kvshift.json");
  Result r = run("train --quiet --config " + cfg + " --run-dir " + dir +
                 " --set train.steps=2 train.eval_every=0 train.warmup_steps=4 train.lr=0.004");
  EXPECT_EQ(r.code, 0) << r.out;
  EXPECT_NE(r.out.find("train.warmup_steps 4 is more than train.steps 2: the learning rate rises to 0.002 (50% of "
                       "train.lr) and the run ends before it decays"),
            std::string::npos)
      << r.out;
  r = run("train --quiet --resume --config " + cfg + " --run-dir " + dir +
          " --set train.steps=4 train.eval_every=0 train.warmup_steps=4 train.lr=0.008");
  EXPECT_EQ(r.code, 0) << r.out;
  EXPECT_NE(r.out.find("resuming with training settings other than the checkpoint's: train.lr 0.004 -> 0.008, "
                       "train.steps 2 -> 4; the learning rate of step 3 is 0.006 under them"),
            std::string::npos)
      << r.out;
  EXPECT_EQ(r.out.find("warmup_steps 4 is more"), std::string::npos) << r.out;
  // A refused change is refused, not first listed as taken; a finished run has no next rate to name.
  r = run("train --quiet --resume --config " + cfg + " --run-dir " + dir +
          " --set train.steps=4 train.eval_every=0 train.warmup_steps=4 train.lr=0.008 train.seq_len=16");
  EXPECT_NE(r.code, 0) << r.out;
  EXPECT_NE(r.out.find("train.seq_len changed"), std::string::npos) << r.out;
  EXPECT_EQ(r.out.find("resuming with training settings"), std::string::npos) << r.out;
  r = run("train --quiet --resume --config " + cfg + " --run-dir " + dir +
          " --set train.steps=4 train.eval_every=0 train.warmup_steps=4 train.lr=0.002");
  EXPECT_EQ(r.code, 0) << r.out;
  EXPECT_NE(r.out.find("resuming with training settings other than the checkpoint's: train.lr 0.008 -> 0.002 (no "
                       "step is left to train)"),
            std::string::npos)
      << r.out;
  // The pipe closes after the first line; the run goes on to its last checkpoint.
  const std::string piped = testing::TempDir() + "piped_run";
  fs::remove_all(piped);
  const Result p = run_with_env("", "train --config " + cfg + " --run-dir " + piped +
                                         " --set train.steps=300 train.eval_every=0 train.checkpoint_every=300 2>&1 "
                                         "| head -1; test -f " + piped + "/checkpoints/step_00000300/manifest.json");
  EXPECT_EQ(p.code, 0) << p.out;
}

TEST(Cli, UnknownKeyNamesTheKey) {
  std::ifstream in(src("configs/toy/induction-1l-kvshift.json"));
  auto j = nlohmann::json::parse(in);
  j["train"]["lerning_rate"] = 1.0;
  const std::string path = write_temp("bad_key.json", j.dump());
  Result r = run("info --config " + path);
  EXPECT_NE(r.code, 0);
  EXPECT_EQ(count_lines(r.out), 1) << r.out;
  EXPECT_NE(r.out.find("train.lerning_rate"), std::string::npos) << r.out;
}

TEST(Cli, BadOverrideIsRejectedBeforeAnyWork) {
  const std::string dir = testing::TempDir() + "kvs_cli_badset";
  fs::remove_all(dir);
  Result r = run("train --config " + src("configs/toy/induction-1l-kvshift.json") +
                 " --set model.num_key_value_heads=3 --run-dir " + dir);
  EXPECT_NE(r.code, 0);
  EXPECT_NE(r.out.find("num_key_value_heads"), std::string::npos) << r.out;
  EXPECT_FALSE(fs::exists(dir + "/metrics.jsonl"));
}

TEST(Cli, OutOfVocabularyTokenInShardsNamesFileAndPosition) {
  const std::string dir = testing::TempDir() + "kvs_cli_oov";
  fs::remove_all(dir);
  fs::create_directories(dir);
  std::vector<uint32_t> tokens(4000);
  for (size_t i = 0; i < tokens.size(); ++i) tokens[i] = i % 200;
  tokens[100] = 300;  // >= vocab_size 256
  kvs::write_shard(dir + "/train_000.bin", tokens, 2);
  std::ifstream in(src("configs/toy/lm-small-kvshift.json"));
  auto j = nlohmann::json::parse(in);
  j["data"]["shards"]["train"] = {dir + "/train_000.bin"};
  j["data"]["shards"]["val"] = nlohmann::json::array();
  j["data"]["shards"]["val_fraction"] = 0.1;
  j["train"]["steps"] = 2;
  j["train"]["seq_len"] = 64;
  j["train"]["micro_batch_size"] = 64;
  const std::string path = write_temp("oov.json", j.dump());
  Result r = run("train --quiet --config " + path + " --run-dir " + dir + "/run");
  EXPECT_NE(r.code, 0);
  EXPECT_NE(r.out.find("train_000.bin"), std::string::npos) << r.out;
  EXPECT_NE(r.out.find("token ID 300 at position 100"), std::string::npos) << r.out;
}

namespace {

// n byte tokens in a fixed pattern, for a shard.
std::vector<uint32_t> byte_tokens(size_t n) {
  std::vector<uint32_t> tokens(n);
  for (size_t i = 0; i < n; ++i) tokens[i] = (i * 7) % 256;
  return tokens;
}

// lm-small reduced to one layer and two steps of 2 x 32 tokens, on the shards
// `glob` matches, 20% of them validation.
nlohmann::json tiny_shard_config(const std::string& glob) {
  auto j = nlohmann::json::parse(kvs::testing_util::slurp(src("configs/toy/lm-small-kvshift.json")));
  j["data"]["shards"]["train"] = {glob};
  j["data"]["shards"]["val"] = nlohmann::json::array();
  j["data"]["shards"]["val_fraction"] = 0.2;
  j["model"]["num_hidden_layers"] = 1;
  j["train"]["steps"] = 2;
  j["train"]["seq_len"] = 32;
  j["train"]["micro_batch_size"] = 2;
  return j;
}

}  // namespace

TEST(Cli, EvalOfAShardRunWorksFromAnotherDirectory) {
  // The run's saved config must not depend on the directory train was started from.
  const std::string dir = testing::TempDir() + "kvs_cli_shards";
  fs::remove_all(dir);
  fs::create_directories(dir + "/cfg/data");
  kvs::write_shard(dir + "/cfg/data/train_000.bin", byte_tokens(20000), 2);
  nlohmann::json j = tiny_shard_config("data/train_*.bin");  // relative to the config file
  j["train"]["eval_sequences"] = 4;
  std::ofstream(dir + "/cfg/lm.json") << j.dump();
  // Trained from the config's directory, by a relative path; evaluated from /.
  Result r = run_with_env("cd " + dir + "/cfg &&", "train --quiet --config lm.json --run-dir " + dir + "/run");
  ASSERT_EQ(r.code, 0) << r.out;
  const auto saved = nlohmann::json::parse(kvs::testing_util::slurp(dir + "/run/config.json"));
  EXPECT_EQ(saved["data"]["shards"]["train"][0], dir + "/cfg/data/train_*.bin");
  Result e = run_with_env("cd / &&", "eval --json --checkpoint " + dir + "/run/checkpoints");
  ASSERT_EQ(e.code, 0) << e.out;
  EXPECT_EQ(nlohmann::json::parse(e.out.substr(e.out.find('{')))["accuracy_kind"], "next_token");
  // The run's own config file (relative globs; the saved copy holds them absolute) is no other data.
  e = run_with_env("cd / &&", "eval --json --checkpoint " + dir + "/run/checkpoints --config " + dir + "/cfg/lm.json");
  ASSERT_EQ(e.code, 0) << e.out;
  EXPECT_EQ(e.out.find("data settings differ"), std::string::npos) << e.out;
  // More sequences asked for than the validation split holds: all of them,
  // and the output says so (train warns once at its start).
  e = run("eval --checkpoint " + dir + "/run --set train.eval_sequences=100000");
  ASSERT_EQ(e.code, 0) << e.out;
  EXPECT_NE(e.out.find(" (the whole validation split; train.eval_sequences asks for 100000)"), std::string::npos)
      << e.out;
  r = run_with_env("cd " + dir + "/cfg &&",
                   "train --config lm.json --set train.steps=1 --set train.eval_sequences=100000 --run-dir " + dir +
                       "/run_all_val");
  ASSERT_EQ(r.code, 0) << r.out;
  EXPECT_NE(r.out.find("train.eval_sequences is 100000, but the validation split holds "), std::string::npos) << r.out;
}

// A checkpoint's data position is a sequence index: over other shards (one
// more file matched by the glob) or another val split it names other
// windows, and the old val sequences become training data. Resume refuses it
// unless told; and a run that reads its data more than once says so.
TEST(Cli, ResumeRefusesDataThatChangedUnderIt) {
  const std::string dir = testing::TempDir() + "kvs_cli_data_change";
  fs::remove_all(dir);
  fs::create_directories(dir + "/data");
  const std::vector<uint32_t> tokens = byte_tokens(3000);
  kvs::write_shard(dir + "/data/train_000.bin", tokens, 2);
  nlohmann::json j = tiny_shard_config(dir + "/data/train_*.bin");
  j["train"]["grad_accum_steps"] = 1;
  j["train"]["eval_every"] = 0;
  j["train"]["eval_sequences"] = 2;
  std::ofstream(dir + "/lm.json") << j.dump();
  const std::string train = "train --quiet --config " + dir + "/lm.json --run-dir " + dir + "/run";
  Result r = run(train);
  ASSERT_EQ(r.code, 0) << r.out;
  // 2999 tokens, 20% val: 74 train windows of 32, of which 2 steps x 2 read 4.
  EXPECT_NE(r.out.find("reads 4 sequences: 0.0541 epochs of the training data's 74"), std::string::npos) << r.out;
  const auto state = nlohmann::json::parse(
      kvs::testing_util::slurp(dir + "/run/checkpoints/step_00000002/trainer_state.json"));
  EXPECT_EQ(state["data"], (nlohmann::json{{"train_sequences", 74}, {"val_sequences", 18}})) << state;

  kvs::write_shard(dir + "/data/train_001.bin", tokens, 2);  // the glob now matches one more file
  r = run(train + " --resume --set train.steps=3");
  EXPECT_NE(r.code, 0) << r.out;
  EXPECT_NE(r.out.find("step_00000002: the data changed since this checkpoint (sequences "
                       "{\"train_sequences\":74,\"val_sequences\":18} then, "
                       "{\"train_sequences\":149,\"val_sequences\":37} now)"),
            std::string::npos)
      << r.out;
  EXPECT_NE(r.out.find("--allow-data-change"), std::string::npos) << r.out;
  EXPECT_EQ(kvs::testing_util::slurp(dir + "/run/checkpoints/latest"), "step_00000002\n");
  // Told to, it goes on with the new data, and says so.
  r = run(train + " --resume --allow-data-change --set train.steps=3");
  EXPECT_EQ(r.code, 0) << r.out;
  EXPECT_NE(r.out.find("going on with these (--allow-data-change)"), std::string::npos) << r.out;
  // Step 3's checkpoint records the two files' counts: taking the file away again is a change too.
  fs::remove(dir + "/data/train_001.bin");
  r = run(train + " --resume --set train.steps=4");
  EXPECT_NE(r.code, 0) << r.out;
  EXPECT_NE(r.out.find("step_00000003: the data changed"), std::string::npos) << r.out;
  // Separate val files changing leave the training data as it was: a warning, not a refusal.
  fs::create_directories(dir + "/val");
  kvs::write_shard(dir + "/val/val_000.bin", tokens, 2);
  j["data"]["shards"]["val"] = {dir + "/val/val_*.bin"};
  std::ofstream(dir + "/lm_val.json") << j.dump();
  const std::string train_val = "train --quiet --config " + dir + "/lm_val.json --run-dir " + dir + "/run_val";
  r = run(train_val);
  ASSERT_EQ(r.code, 0) << r.out;
  kvs::write_shard(dir + "/val/val_001.bin", tokens, 2);
  r = run(train_val + " --resume --set train.steps=3");
  EXPECT_EQ(r.code, 0) << r.out;
  EXPECT_NE(r.out.find("the validation data only; its losses before and after are not comparable"),
            std::string::npos)
      << r.out;
  // More steps than the data has windows: a warning, once, at startup.
  r = run("train --quiet --config " + dir + "/lm.json --run-dir " + dir + "/long --set train.steps=40");
  ASSERT_EQ(r.code, 0) << r.out;
  EXPECT_NE(r.out.find("reads 80 sequences: 1.08 epochs of the training data's 74 sequences (it repeats"),
            std::string::npos)
      << r.out;
}

// The same counts over other contents: shards re-prepared from other text
// (their manifests' sha256s differ) keep every sequence count, which the
// check above compares. The checkpoint records what the splits were made of
// (trainer_state.json "data_contents"), and a resume compares that too. A
// train glob that takes in the validation shards is said at startup.
TEST(Cli, ResumeRefusesShardsWhoseContentsChangedUnderTheSameCounts) {
  const std::string dir = testing::TempDir() + "kvs_cli_data_contents";
  fs::remove_all(dir);
  fs::create_directories(dir + "/data");
  auto prepare = [&](uint32_t shift, uint32_t val_shift, size_t val_tokens = 1000) {  // another text per shift
    std::vector<uint32_t> train = byte_tokens(3000), val = byte_tokens(val_tokens);
    for (uint32_t& t : train) t = (t + shift) % 256;
    for (uint32_t& t : val) t = (t + val_shift) % 256;
    kvs::write_shard(dir + "/data/train_000.bin", train, 2);
    kvs::write_shard(dir + "/data/val_000.bin", val, 2);
    const nlohmann::json m = {
        {"splits",
         {{"train", {{"shards", {{{"file", "train_000.bin"}, {"tokens", 3000},
                                  {"sha256", kvs::sha256_file(dir + "/data/train_000.bin")}}}}}},
          {"val", {{"shards", {{{"file", "val_000.bin"}, {"tokens", val_tokens},
                                {"sha256", kvs::sha256_file(dir + "/data/val_000.bin")}}}}}}}}};
    std::ofstream(dir + "/data/manifest.json") << m.dump();
  };
  prepare(0, 0);
  nlohmann::json j = tiny_shard_config(dir + "/data/train_*.bin");
  j["data"]["shards"]["val"] = {dir + "/data/val_*.bin"};
  j["train"]["eval_sequences"] = 2;
  std::ofstream(dir + "/lm.json") << j.dump();
  const std::string train = "train --quiet --config " + dir + "/lm.json --run-dir " + dir + "/run";
  Result r = run(train);
  ASSERT_EQ(r.code, 0) << r.out;
  const auto state = nlohmann::json::parse(
      kvs::testing_util::slurp(dir + "/run/checkpoints/step_00000002/trainer_state.json"));
  EXPECT_EQ(state["data_contents"]["train"].get<std::string>().size(), 64u) << state;

  prepare(7, 0);  // other training text, the same 3000 tokens
  r = run(train + " --resume --set train.steps=3");
  EXPECT_NE(r.code, 0) << r.out;
  EXPECT_NE(r.out.find("step_00000002: the training data changed since this checkpoint: the same 93 sequences, but "
                       "other shards or other tokens in them"),
            std::string::npos)
      << r.out;
  EXPECT_EQ(kvs::testing_util::slurp(dir + "/run/checkpoints/latest"), "step_00000002\n");
  r = run(train + " --resume --allow-data-change --set train.steps=3");
  EXPECT_EQ(r.code, 0) << r.out;
  EXPECT_NE(r.out.find("going on with these (--allow-data-change)"), std::string::npos) << r.out;
  prepare(7, 9);  // other validation text only: a warning
  r = run(train + " --resume --set train.steps=4");
  EXPECT_EQ(r.code, 0) << r.out;
  EXPECT_NE(r.out.find("step_00000003: the validation data changed since this checkpoint: the same 31 sequences"),
            std::string::npos)
      << r.out;
  // Other training text together with another val count: refused, not taken for a val-only change.
  prepare(13, 9, 1500);
  r = run(train + " --resume --set train.steps=5");
  EXPECT_NE(r.code, 0) << r.out;
  EXPECT_NE(r.out.find("step_00000004: the data changed since this checkpoint"), std::string::npos) << r.out;

  // A train glob over the validation shards too, or a val list naming a train shard.
  for (const auto& [key, list, leaked] :
       {std::tuple{"train", "/data/*.bin", "/data/val_000.bin"}, {"val", "/data/train_000.bin", "/data/train_000.bin"}}) {
    r = run("train --quiet --config " + dir + "/lm.json --run-dir " + dir + "/leak_" + key +
            " --set train.steps=1 --set 'data.shards." + key + "=[\"" + dir + list + "\"]'");
    EXPECT_EQ(r.code, 0) << r.out;
    EXPECT_NE(r.out.find("data.shards.train: 1 of its files is validation data (" + dir + leaked + ")"),
              std::string::npos)
        << r.out;
  }
}

TEST(Cli, StartupSetsOpenMPSpinUnlessTheUserDid) {
  const std::string cfg = " bench --json --warmup 0 --steps 1 --config " + src("configs/toy/induction-1l-kvshift.json");
  auto env_of = [](const Result& r) { return nlohmann::json::parse(r.out.substr(r.out.find('{')))["env"]; };
  Result d = run_with_env("env -u GOMP_SPINCOUNT -u OMP_WAIT_POLICY", cfg);
  ASSERT_EQ(d.code, 0) << d.out;
  EXPECT_EQ(env_of(d)["GOMP_SPINCOUNT"], "20000");
  Result u = run_with_env("env -u OMP_WAIT_POLICY GOMP_SPINCOUNT=12345", cfg);
  ASSERT_EQ(u.code, 0) << u.out;
  EXPECT_EQ(env_of(u)["GOMP_SPINCOUNT"], "12345");
  Result p = run_with_env("env -u GOMP_SPINCOUNT OMP_WAIT_POLICY=PASSIVE", cfg);
  ASSERT_EQ(p.code, 0) << p.out;
  EXPECT_EQ(env_of(p)["GOMP_SPINCOUNT"], "");
  EXPECT_EQ(env_of(p)["OMP_WAIT_POLICY"], "PASSIVE");
}

// Re-executing loads every shared library again (0.13 s with the CUDA ones):
// only the commands that run many OpenMP regions are worth it.
TEST(Cli, OnlyTheLongRunningCommandsReExecuteForTheSpin) {
  for (const char* c : {"train", "bench", "eval", "generate"}) EXPECT_TRUE(kvs::tunes_runtime_for(c)) << c;
  for (const char* c : {"forward", "backward", "export-hf", "import-hf", "info", "inspect", "data", "tokenizer",
                        "bench-attention", "dist-check", "--help", "trainx"})
    EXPECT_FALSE(kvs::tunes_runtime_for(c)) << c;
  EXPECT_FALSE(kvs::tunes_runtime_for(nullptr));
}

TEST(Cli, StartupUnderOmpProcBindKeepsEveryCpuItWasStartedOn) {
  // libgomp binds the initial thread to its first place before main; the
  // re-execution that sets the spin must not inherit that one-CPU mask.
  cpu_set_t mine;
  ASSERT_EQ(sched_getaffinity(0, sizeof mine, &mine), 0);
  const int cpus = CPU_COUNT(&mine);
  if (cpus < 2) GTEST_SKIP() << "this process may use " << cpus << " CPU";
  const std::string cfg = " bench --json --warmup 0 --steps 1 --config " + src("configs/toy/induction-1l-kvshift.json");
  Result r = run_with_env("env -u GOMP_SPINCOUNT -u OMP_WAIT_POLICY OMP_PROC_BIND=close OMP_PLACES=threads", cfg);
  ASSERT_EQ(r.code, 0) << r.out;
  const auto j = nlohmann::json::parse(r.out.substr(r.out.find('{')));
  EXPECT_EQ(j["env"]["GOMP_SPINCOUNT"], "20000");  // it did re-execute
  EXPECT_EQ(j["omp_places"].get<int>(), cpus);     // one place per CPU of the mask it started with
}

TEST(Cli, BenchCompareShiftTimesBothVariantsInOneRun) {
  const std::string cfg = src("configs/toy/induction-1l-vanilla.json");
  Result r = run("bench --warmup 0 --steps 2 --compare-shift --config " + cfg);
  ASSERT_EQ(r.code, 0) << r.out;
  EXPECT_NE(r.out.find("kv_shift off"), std::string::npos) << r.out;
  EXPECT_NE(r.out.find("kv_shift on"), std::string::npos) << r.out;
  EXPECT_NE(r.out.find("KV shifting step-time overhead:"), std::string::npos) << r.out;
  Result j = run("bench --json --warmup 0 --steps 1 --compare-shift --config " + cfg);
  ASSERT_EQ(j.code, 0) << j.out;
  const auto arr = nlohmann::json::parse(j.out);
  ASSERT_TRUE(arr.is_array());
  ASSERT_EQ(arr.size(), 2u);
  EXPECT_FALSE(arr[0]["kv_shift"].get<bool>());
  EXPECT_TRUE(arr[1]["kv_shift"].get<bool>());
  EXPECT_GT(arr[1]["median_ms_per_step"].get<double>(), 0.0);
}

// bench --profile on the CPU: every op of lm-small's step has a row (GEMMs by
// projection, pass and shape), the rows' shares add up to the whole step, "=
// all GEMMs" is the sum of the GEMM rows, and each GEMM's GFLOP/s is its
// FLOPs (2 M N K per call) over its time. On one thread, and on two thread
// replicas, whose profile is the first replica's (half the rows each).
TEST(Cli, BenchProfileTimesEveryOpOfTheCpuStepAndItsSharesAddUp) {
  for (const int threads : {1, 2}) {
    SCOPED_TRACE(threads);
    Result j = run("bench --json --profile --warmup 0 --steps 2 --set train.threads=" + std::to_string(threads) +
                   " --config " + src("configs/toy/lm-small-kvshift.json"));
    ASSERT_EQ(j.code, 0) << j.out;
    const auto r = nlohmann::json::parse(j.out);
    ASSERT_EQ(r["cpu_replicas"], threads);
    const double peak = r["sgemm_peak_gflops"].get<double>() / threads;  // one replica's thread's share
    const std::string M = std::to_string(2048 / threads);
    ASSERT_TRUE(r.contains("profile")) << r;
    std::map<std::string, nlohmann::json> rows;
    double shares = 0, gemm_ms = 0;
    const std::regex gemm_shape(R"(.* (fwd|bwd dinp|bwd dW) (\d+)x(\d+)x(\d+))");
    for (const auto& row : r["profile"]) {
      const std::string op = row["op"];
      rows[op] = row;
      if (op.rfind("= ", 0) == 0) continue;
      shares += row["share"].get<double>();
      std::smatch m;
      if (!std::regex_match(op, m, gemm_shape)) continue;
      const double ms = row["ms_per_step"], calls = row["calls_per_step"];
      const double flops = 2.0 * std::stod(m[2]) * std::stod(m[3]) * std::stod(m[4]) * calls;
      EXPECT_NEAR(row["gflops"].get<double>(), flops / ms / 1e6, 1e-6 * flops / ms / 1e6) << op;
      EXPECT_NEAR(row["fraction_of_sgemm_peak"].get<double>(), flops / ms / 1e6 / peak, 1e-6) << op;
      gemm_ms += ms;
    }
    EXPECT_NEAR(shares, 1.0, 1e-9);
    for (const std::string& op : std::vector<std::string>{"embedding fwd", "rmsnorm fwd", "qkv proj fwd " + M + "x256x256",
                                 "qkv proj fwd " + M + "x128x256", "shift+rope fwd", "attention fwd",
                                 "o proj fwd " + M + "x256x256", "residual+rmsnorm fwd",
                                 "gate,up proj fwd " + M + "x1376x256", "swiglu fwd", "down proj fwd " + M + "x256x688",
                                 "lm head fwd " + M + "x256x256", "cross-entropy fwd+bwd",
                                 "down proj bwd dinp " + M + "x688x256", "down proj bwd dW 256x688x" + M, "swiglu bwd",
                                 "rmsnorm bwd", "attention bwd", "shift+rope bwd", "qkv proj bwd dW 128x256x" + M,
                                 "embedding bwd", "grad norm", "adamw", "other (outside the timed ops)", "= all GEMMs"})
      EXPECT_TRUE(rows.count(op)) << op;
    EXPECT_EQ(rows.count("replica grads sum"), threads > 1 ? 1u : 0u);
    // The gradient norm runs outside the replicas, on every thread: against the whole peak.
    EXPECT_NEAR(rows["grad norm"]["fraction_of_sgemm_peak"].get<double>(),
                rows["grad norm"]["gflops"].get<double>() / r["sgemm_peak_gflops"].get<double>(), 1e-9);
    ASSERT_TRUE(rows.count("= all GEMMs"));
    EXPECT_NEAR(rows["= all GEMMs"]["ms_per_step"].get<double>(), gemm_ms, 1e-9 * gemm_ms);
    EXPECT_EQ(rows["attention fwd"]["calls_per_step"], 4.0);  // one per layer
  }
}

// The GEMMs' threading: split and the library's own in one run, alternated
// step by step; KVS_CPU_GEMM_THREADS picks one, and a bad value is a one-line
// error before any work.
TEST(Cli, BenchCompareGemmThreadsTimesBothThreadingsAndKvsCpuGemmThreadsPicksOne) {
  const std::string cfg = src("configs/toy/induction-1l-vanilla.json");
  Result r = run("bench --warmup 1 --steps 2 --compare-gemm-threads --set train.threads=2 --config " + cfg);
  ASSERT_EQ(r.code, 0) << r.out;
  EXPECT_NE(r.out.find(" (2 threads), "), std::string::npos) << r.out;
  EXPECT_NE(r.out.find(", one tile per thread |"), std::string::npos) << r.out;
  EXPECT_NE(r.out.find(", the library's own threading |"), std::string::npos) << r.out;
  EXPECT_NE(r.out.find("GEMMs split over the threads against the library's own threading: "), std::string::npos)
      << r.out;
  Result j = run("bench --json --warmup 0 --steps 1 --compare-gemm-threads --set train.threads=2 --config " + cfg);
  ASSERT_EQ(j.code, 0) << j.out;
  const auto arr = nlohmann::json::parse(j.out);
  ASSERT_TRUE(arr.is_array());
  ASSERT_EQ(arr.size(), 2u);
  EXPECT_EQ(arr[0]["gemm_threading"], "library") << arr[0];
  EXPECT_EQ(arr[1]["gemm_threading"], "split") << arr[1];
  EXPECT_EQ(arr[0]["gemm_library"], arr[1]["gemm_library"]);
  // One thread has nothing to split: two identical variants would be timed.
  Result one_thread = run("bench --compare-gemm-threads --set train.threads=1 --config " + cfg);
  EXPECT_NE(one_thread.code, 0);
  EXPECT_EQ(count_lines(one_thread.out), 1) << one_thread.out;
  EXPECT_NE(one_thread.out.find("on 1 thread both are the same product"), std::string::npos) << one_thread.out;
  // Unset: split on OpenBLAS, oneDNN's own threading.
  for (const char* lib : {"openblas", "onednn"}) {
    Result one = run_with_env(std::string("KVS_CPU_GEMM=") + lib, " bench --json --warmup 0 --steps 1 --config " + cfg);
    ASSERT_EQ(one.code, 0) << one.out;
    const auto o = nlohmann::json::parse(one.out.substr(one.out.find('{')));
    EXPECT_EQ(o["gemm_threading"], std::string(lib) == "openblas" ? "split" : "library") << lib;
  }
  for (const char* value : {"split", "library"}) {
    Result one = run_with_env(std::string("KVS_CPU_GEMM_THREADS=") + value,
                              " bench --json --warmup 0 --steps 1 --config " + cfg);
    ASSERT_EQ(one.code, 0) << one.out;
    const auto o = nlohmann::json::parse(one.out.substr(one.out.find('{')));
    EXPECT_EQ(o["gemm_threading"], value);
    EXPECT_EQ(o["env"]["KVS_CPU_GEMM_THREADS"], value);
  }
  Result bad = run_with_env("KVS_CPU_GEMM_THREADS=auto", " bench --json --warmup 0 --steps 1 --config " + cfg);
  EXPECT_NE(bad.code, 0);
  EXPECT_EQ(count_lines(bad.out), 1) << bad.out;
  EXPECT_NE(bad.out.find("KVS_CPU_GEMM_THREADS=auto: expected split or library"), std::string::npos) << bad.out;
}

// Thread replicas: one engine whose threads share each op and one on
// replicas, in one run, steps alternated; the same weights, so the same
// losses to fp32 rounding. KVS_CPU_REPLICAS=off keeps one engine, a bad value
// is a one-line error before any work, and one thread or fewer sequences than
// threads are refused.
TEST(Cli, BenchCompareReplicasTimesBothEnginesAndKvsCpuReplicasTurnsThemOff) {
  const std::string cfg = src("configs/toy/induction-1l-vanilla.json");
  Result r = run("bench --warmup 1 --steps 2 --compare-replicas --set train.threads=2 --config " + cfg);
  ASSERT_EQ(r.code, 0) << r.out;
  EXPECT_NE(r.out.find(" | threads sharing each op | "), std::string::npos) << r.out;
  EXPECT_NE(r.out.find(" | 2 thread replicas | "), std::string::npos) << r.out;
  EXPECT_NE(r.out.find("Thread replicas against threads sharing each op: "), std::string::npos) << r.out;
  Result j = run("bench --json --warmup 1 --steps 2 --compare-replicas --set train.threads=2 --config " + cfg);
  ASSERT_EQ(j.code, 0) << j.out;
  const auto arr = nlohmann::json::parse(j.out);
  ASSERT_TRUE(arr.is_array());
  ASSERT_EQ(arr.size(), 2u);
  EXPECT_EQ(arr[0]["cpu_replicas"], 1);
  EXPECT_EQ(arr[1]["cpu_replicas"], 2);
  const auto l0 = arr[0]["losses"].get<std::vector<double>>(), l1 = arr[1]["losses"].get<std::vector<double>>();
  ASSERT_EQ(l0.size(), 3u);
  ASSERT_EQ(l1.size(), 3u);
  for (size_t i = 0; i < l0.size(); ++i) EXPECT_NEAR(l0[i], l1[i], 1e-5 * l0[i]) << i;
  Result off = run_with_env("KVS_CPU_REPLICAS=off", " bench --json --warmup 0 --steps 1 --set train.threads=2 --config " + cfg);
  ASSERT_EQ(off.code, 0) << off.out;
  const auto o = nlohmann::json::parse(off.out.substr(off.out.find('{')));
  EXPECT_EQ(o["cpu_replicas"], 1);
  EXPECT_EQ(o["env"]["KVS_CPU_REPLICAS"], "off");
  Result bad = run_with_env("KVS_CPU_REPLICAS=4", " bench --json --warmup 0 --steps 1 --config " + cfg);
  EXPECT_NE(bad.code, 0);
  EXPECT_EQ(count_lines(bad.out), 1) << bad.out;
  EXPECT_NE(bad.out.find("KVS_CPU_REPLICAS=4: expected auto or off"), std::string::npos) << bad.out;
  for (const std::string set : {"--set train.threads=1", "--set train.threads=2 --set train.micro_batch_size=1"}) {
    Result refused = run("bench --compare-replicas " + set + " --config " + cfg);
    EXPECT_NE(refused.code, 0);
    EXPECT_EQ(count_lines(refused.out), 1) << refused.out;
    EXPECT_NE(refused.out.find("--compare-replicas needs at least 2 threads and a micro-batch of at least as many"),
              std::string::npos)
        << refused.out;
  }
}

// The GEMM library: both in one run, alternated step by step; KVS_CPU_GEMM
// picks one, and a bad value is a one-line error before any work.
TEST(Cli, BenchCompareGemmTimesBothLibrariesInOneRunAndKvsCpuGemmPicksOne) {
  const std::string cfg = src("configs/toy/induction-1l-vanilla.json");
  Result r = run("bench --warmup 1 --steps 2 --compare-gemm --config " + cfg);
  ASSERT_EQ(r.code, 0) << r.out;
  EXPECT_NE(r.out.find("GEMMs: OpenBLAS "), std::string::npos) << r.out;
  EXPECT_NE(r.out.find("GEMMs: oneDNN "), std::string::npos) << r.out;
  EXPECT_NE(r.out.find("oneDNN's steps against OpenBLAS's: "), std::string::npos) << r.out;
  Result j = run("bench --json --warmup 0 --steps 1 --compare-gemm --config " + cfg);
  ASSERT_EQ(j.code, 0) << j.out;
  const auto arr = nlohmann::json::parse(j.out);
  ASSERT_TRUE(arr.is_array());
  ASSERT_EQ(arr.size(), 2u);
  EXPECT_EQ(arr[0]["gemm_library"].get<std::string>().rfind("OpenBLAS ", 0), 0u) << arr[0];
  EXPECT_EQ(arr[1]["gemm_library"].get<std::string>().rfind("oneDNN ", 0), 0u) << arr[1];
  for (const auto& [value, name] : {std::pair{"openblas", "OpenBLAS "}, std::pair{"onednn", "oneDNN "}}) {
    Result one =
        run_with_env(std::string("KVS_CPU_GEMM=") + value, " bench --json --warmup 0 --steps 1 --config " + cfg);
    ASSERT_EQ(one.code, 0) << one.out;
    const auto o = nlohmann::json::parse(one.out.substr(one.out.find('{')));
    EXPECT_EQ(o["gemm_library_source"], "KVS_CPU_GEMM") << value;
    EXPECT_EQ(o["gemm_library"].get<std::string>().rfind(name, 0), 0u) << o["gemm_library"];
  }
  Result bad = run_with_env("KVS_CPU_GEMM=mkl", " bench --json --warmup 0 --steps 1 --config " + cfg);
  EXPECT_NE(bad.code, 0);
  EXPECT_EQ(count_lines(bad.out), 1) << bad.out;
  EXPECT_NE(bad.out.find("KVS_CPU_GEMM=mkl: expected openblas or onednn"), std::string::npos) << bad.out;
  // --help prints whatever the variables hold.
  for (const char* help : {" --help", " bench --help", " train -h", " --help-all"}) {
    Result h = run_with_env("KVS_CPU_GEMM=mkl KVS_CPU_GEMM_THREADS=some", help);
    EXPECT_EQ(h.code, 0) << help << ": " << h.out;
    EXPECT_NE(h.out.find("Usage:"), std::string::npos) << help;
  }
  Result both = run("bench --compare-gemm --compare-shift --config " + cfg);
  EXPECT_NE(both.code, 0);
  EXPECT_NE(both.out.find("--compare-gemm, --compare-gemm-threads, --compare-replicas, --compare-gemm-timing, "
                          "--compare-shift and --compare-overlap are separate runs"),
            std::string::npos)
      << both.out;
  // The timed GEMM algorithms are cuBLASLt's, chosen after a first step.
  Result timing = run("bench --compare-gemm-timing --config " + cfg);
  EXPECT_NE(timing.code, 0);
  EXPECT_EQ(count_lines(timing.out), 1) << timing.out;
  EXPECT_NE(timing.out.find("--compare-gemm-timing times cuBLASLt's algorithms; this run's device is cpu"),
            std::string::npos)
      << timing.out;
  Result cold = run("bench --warmup 0 --steps 1 --set train.time_gemm_algorithms=true --config " + cfg);
  EXPECT_NE(cold.code, 0);
  EXPECT_NE(cold.out.find("--warmup must be at least 1"), std::string::npos) << cold.out;
}

TEST(Cli, CudaWithoutAGpuIsOneLineError) {
#ifdef KVS_CUDA
  if (kvs::cuda_test::have_gpu()) GTEST_SKIP() << "skipped: this machine has a GPU";
#endif
  Result r = run("bench --device cuda --config " + src("configs/toy/induction-1l-kvshift.json"));
  EXPECT_NE(r.code, 0);
  EXPECT_EQ(count_lines(r.out), 1) << r.out;
  EXPECT_NE(r.out.find("device 'cuda'"), std::string::npos) << r.out;
  Result g = run("bench-gemm --config " + src("configs/toy/induction-1l-kvshift.json"));
  EXPECT_NE(g.code, 0);
  EXPECT_EQ(count_lines(g.out), 1) << g.out;
  EXPECT_NE(g.out.find("bench-gemm: "), std::string::npos) << g.out;
}

TEST(Cli, TrainEvalForwardEndToEnd) {
  const std::string dir = testing::TempDir() + "kvs_cli_e2e";
  fs::remove_all(dir);
  Result r = run("train --quiet --config " + src("configs/toy/induction-1l-kvshift.json") +
                 " --set train.steps=3 --set train.eval_sequences=16 --run-dir " + dir);
  ASSERT_EQ(r.code, 0) << r.out;
  EXPECT_TRUE(fs::exists(dir + "/metrics.jsonl"));
  Result e = run("eval --json --checkpoint " + dir);  // a run dir: its latest checkpoint
  ASSERT_EQ(e.code, 0) << e.out;
  auto j = nlohmann::json::parse(e.out.substr(e.out.find('{')));
  EXPECT_NE(j["checkpoint"].get<std::string>().find("step_00000003"), std::string::npos);
  EXPECT_TRUE(std::isfinite(j["val_loss"].get<double>()));
  EXPECT_GE(j["accuracy"].get<double>(), 0.0);
  EXPECT_LE(j["accuracy"].get<double>(), 1.0);
  EXPECT_EQ(j["accuracy_kind"], "induction");
  const std::string tokens = write_temp("tokens.txt", "11 12 13 14 12");
  Result f = run("forward --checkpoint " + dir + "/checkpoints/step_00000003 --tokens " + tokens + " --out " + dir +
                 "/logits.npy");
  ASSERT_EQ(f.code, 0) << f.out;
  EXPECT_EQ(fs::file_size(dir + "/logits.npy"), 128u + 5 * 128 * 4);  // header + [5, vocab 128] float32
}

// Blended shards through the CLI: the epochs line counts each source, every
// evaluation (metrics.jsonl, the log, `eval`) gives each source's numbers, the
// checkpoint records the blend, and resuming with other weights is refused
// unless told (the same index would read another source).
TEST(Cli, BlendedShardsReportEachSourceAndGuardTheirWeights) {
  const std::string dir = testing::TempDir() + "kvs_cli_blend";
  fs::remove_all(dir);
  fs::create_directories(dir + "/data/web");
  fs::create_directories(dir + "/data/code");
  kvs::write_shard(dir + "/data/web/000.bin", byte_tokens(6000), 2);
  std::vector<uint32_t> code(3000);
  for (size_t i = 0; i < code.size(); ++i) code[i] = 40 + i % 5;
  kvs::write_shard(dir + "/data/code/000.bin", code, 2);
  nlohmann::json j = tiny_shard_config(dir + "/data/web/*.bin");
  j["data"]["shards"]["train"].push_back(dir + "/data/code/*.bin");
  j["data"]["shards"]["weights"] = {3, 1};
  j["train"]["eval_every"] = 1;
  j["train"]["eval_sequences"] = 8;
  std::ofstream(dir + "/lm.json") << j.dump();
  const std::string train = "train --config " + dir + "/lm.json --run-dir " + dir + "/run";
  Result r = run(train);
  ASSERT_EQ(r.code, 0) << r.out;
  // 4 sequences read: 3 from web (149 windows of 32 after its 20% val), 1 from code (74).
  EXPECT_NE(r.out.find("reads 4 sequences: 3 from web/*.bin, 0.0201 epochs of its 149 sequences; 1 from code/*.bin, "
                       "0.0135 epochs of its 74 sequences"),
            std::string::npos)
      << r.out;
  EXPECT_NE(r.out.find("| web/*.bin val_loss "), std::string::npos) << r.out;
  std::ifstream metrics(dir + "/run/metrics.jsonl");
  int evals = 0;
  for (std::string line; std::getline(metrics, line);) {
    const auto m = nlohmann::json::parse(line);
    if (m["type"] != "eval") continue;
    ++evals;
    const auto& web = m["sources"]["web/*.bin"];
    const auto& cd = m["sources"]["code/*.bin"];
    EXPECT_EQ(web["sequences"].get<int>() + cd["sequences"].get<int>(), 8) << line;
    EXPECT_EQ(web["scored_tokens"].get<int>() + cd["scored_tokens"].get<int>(), m["scored_tokens"].get<int>());
    const double mixed = (web["val_loss"].get<double>() * web["scored_tokens"].get<double>() +
                          cd["val_loss"].get<double>() * cd["scored_tokens"].get<double>()) /
                         m["scored_tokens"].get<double>();
    EXPECT_NEAR(mixed, m["val_loss"].get<double>(), 1e-6) << line;
  }
  EXPECT_EQ(evals, 2);
  const auto state = nlohmann::json::parse(
      kvs::testing_util::slurp(dir + "/run/checkpoints/step_00000002/trainer_state.json"));
  EXPECT_EQ(state["data"]["sources"],
            nlohmann::json::parse(R"([{"share":0.75,"train_sequences":149},{"share":0.25,"train_sequences":74}])"))
      << state;
  Result e = run("eval --json --checkpoint " + dir + "/run");
  ASSERT_EQ(e.code, 0) << e.out;
  const auto ej = nlohmann::json::parse(e.out.substr(e.out.find('{')));
  EXPECT_EQ(ej["sources"].size(), 2u) << e.out;
  // Other weights send the same index elsewhere: refused, then allowed when told.
  r = run(train + " --quiet --resume --set train.steps=3 --set 'data.shards.weights=[1,1]'");
  EXPECT_NE(r.code, 0) << r.out;
  EXPECT_NE(r.out.find("step_00000002: the data changed since this checkpoint"), std::string::npos) << r.out;
  r = run(train + " --quiet --resume --set train.steps=3 --set 'data.shards.weights=[1,1]' --allow-data-change");
  EXPECT_EQ(r.code, 0) << r.out;
  r = run(train + " --quiet --resume --set train.steps=4 --set 'data.shards.weights=[1,1]'");
  EXPECT_EQ(r.code, 0) << r.out;  // the same weights as step 3's checkpoint
}

namespace {

// A 3-step induction run with a checkpoint at each step: its directory.
std::string tiny_run(const std::string& name) {
  const std::string dir = testing::TempDir() + name;
  fs::remove_all(dir);
  const Result r = run("train --quiet --config " + src("configs/toy/induction-1l-kvshift.json") +
                       " --set train.steps=3 --set train.eval_every=0 --set train.checkpoint_every=1 --run-dir " + dir);
  EXPECT_EQ(r.code, 0) << r.out;
  return dir;
}

// eval runs on the run's train.threads, as training ran its evaluations: the
// same numbers as the run's eval line, to the bit (another thread count may
// sum in another order: OpenBLAS's products on some machines).
TEST(Cli, EvalReproducesTheRunsEvalLineOnItsThreads) {
  const std::string dir = testing::TempDir() + "kvs_cli_eval_threads";
  fs::remove_all(dir);
  Result r = run("train --quiet --config " + src("configs/toy/induction-1l-kvshift.json") +
                 " --set train.steps=60 train.warmup_steps=20 train.eval_every=0 train.eval_sequences=64 "
                 "train.threads=1 --run-dir " + dir);
  ASSERT_EQ(r.code, 0) << r.out;
  double logged = 0;
  std::istringstream lines(kvs::testing_util::slurp(dir + "/metrics.jsonl"));
  for (std::string line; std::getline(lines, line);)
    if (const auto j = nlohmann::json::parse(line); j["type"] == "eval") logged = j["val_loss"].get<double>();
  r = run("eval --json --checkpoint " + dir);
  ASSERT_EQ(r.code, 0) << r.out;
  nlohmann::json j = nlohmann::json::parse(r.out.substr(r.out.find('{')));
  EXPECT_EQ(j["val_loss"].get<double>(), logged) << r.out;
  EXPECT_EQ(j["threads"], 1) << r.out;  // the run's, not every core's
  // --set's thread count wins. Whether that changes the last bits depends on
  // the GEMM library and the machine (OpenBLAS's Zen kernels: yes; oneDNN's,
  // and OpenBLAS Cooperlake's on a Zen 4: not at these shapes), so the bits
  // are not the control: the count eval reports is.
  if (std::thread::hardware_concurrency() >= 2) {
    r = run("eval --json --checkpoint " + dir + " --set train.threads=2");
    ASSERT_EQ(r.code, 0) << r.out;
    j = nlohmann::json::parse(r.out.substr(r.out.find('{')));
    EXPECT_EQ(j["threads"], 2) << r.out;
    EXPECT_NEAR(j["val_loss"].get<double>(), logged, 1e-6 * std::abs(logged)) << r.out;
  }
}

// eval with other data settings than the run's says so: its val split may hold training text.
TEST(Cli, EvalWarnsWhenTheDataDifferFromTheRuns) {
  const std::string dir = tiny_run("eval_other_data");
  Result r = run("eval --checkpoint " + dir + " --set train.eval_sequences=8");
  EXPECT_EQ(r.code, 0) << r.out;
  EXPECT_EQ(r.out.find("data settings differ"), std::string::npos) << r.out;
  r = run("eval --checkpoint " + dir + " --set train.eval_sequences=8 data.induction.pool_size=7");
  EXPECT_EQ(r.code, 0) << r.out;
  EXPECT_NE(r.out.find("the data settings differ from the run's (data.induction.pool_size: 32 vs 7, run vs now): "
                       "these validation sequences are not the ones the run held out"),
            std::string::npos)
      << r.out;
  // A section the run's task never reads is no difference; another task is named as such.
  r = run("eval --checkpoint " + dir + " --set train.eval_sequences=8 data.ngram.num_pairs=7");
  EXPECT_EQ(r.code, 0) << r.out;
  EXPECT_EQ(r.out.find("data settings differ"), std::string::npos) << r.out;
  r = run("eval --checkpoint " + dir + " --set train.eval_sequences=8 data.type=ngram data.ngram.token_hi=100");
  EXPECT_EQ(r.code, 0) << r.out;
  EXPECT_NE(r.out.find("the data settings differ from the run's (data.type: \"induction\" vs \"ngram\", run vs "
                       "now)"),
            std::string::npos)
      << r.out;
  // The generated tasks' validation sequences follow train.seed too.
  r = run("eval --checkpoint " + dir + " --set train.eval_sequences=8 train.seed=999");
  EXPECT_EQ(r.code, 0) << r.out;
  EXPECT_NE(r.out.find("the data settings differ from the run's (train.seed: "), std::string::npos) << r.out;
  // A --set that breaks a rule is named as the --set, not as the run's file.
  r = run("eval --checkpoint " + dir + " --set train.eval_sequences=0");
  EXPECT_NE(r.code, 0) << r.out;
  EXPECT_NE(r.out.find("run_config.json with --set train.eval_sequences=0"), std::string::npos) << r.out;
}

// A [1, 4] batch for `backward`: inputs, targets, mask (safetensors).
std::string write_batch(const std::string& path, const std::array<int32_t, 4>& targets,
                        const std::array<float, 4>& mask) {
  const std::array<int32_t, 4> inputs = {11, 12, 13, 12};
  std::string header = R"({"inputs":{"dtype":"I32","shape":[1,4],"data_offsets":[0,16]},)"
                       R"("targets":{"dtype":"I32","shape":[1,4],"data_offsets":[16,32]},)"
                       R"("mask":{"dtype":"F32","shape":[1,4],"data_offsets":[32,48]}})";
  const uint64_t n = header.size();
  std::string bytes(reinterpret_cast<const char*>(&n), 8);
  bytes += header;
  bytes.append(reinterpret_cast<const char*>(inputs.data()), 16);
  bytes.append(reinterpret_cast<const char*>(targets.data()), 16);
  bytes.append(reinterpret_cast<const char*>(mask.data()), 16);
  kvs::testing_util::spit(path, bytes);
  return path;
}

}  // namespace

// `forward` and `backward` write their one output file; never over an input
// (the checkpoint's weights, the batch), and they leave the input as it was.
TEST(Cli, ForwardAndBackwardNeverWriteOverTheirInputs) {
  const std::string dir = tiny_run("kvs_cli_out_over_input"), step = dir + "/checkpoints/step_00000003";
  const std::string weights = kvs::testing_util::slurp(step + "/model.safetensors");
  const std::string tokens = write_temp("over_input_tokens.txt", "11 12 13");
  for (const std::string& out : {step + "/model.safetensors", step + "/", step + "/new.npy"}) {
    SCOPED_TRACE(out);
    const Result r = run("forward --checkpoint " + dir + " --tokens " + tokens + " --out " + out);
    EXPECT_NE(r.code, 0);
    EXPECT_NE(r.out.find("--out must not be (or lie inside) the input"), std::string::npos) << r.out;
  }
  const std::string batch = write_batch(dir + "/batch.st", {12, 13, 12, 13}, {1, 1, 1, 1});
  const std::string batch_bytes = kvs::testing_util::slurp(batch);
  Result r = run("backward --checkpoint " + step + " --batch " + batch + " --out " + batch);
  EXPECT_NE(r.code, 0);
  EXPECT_NE(r.out.find(batch + ": --out must not be (or lie inside) the input " + batch), std::string::npos) << r.out;
  r = run("backward --checkpoint " + step + " --batch " + batch + " --out " + step + "/model.safetensors");
  EXPECT_NE(r.code, 0);
  EXPECT_EQ(kvs::testing_util::slurp(step + "/model.safetensors"), weights);
  EXPECT_EQ(kvs::testing_util::slurp(batch), batch_bytes);
  EXPECT_FALSE(fs::exists(step + "/new.npy"));
}

// Input from a pipe (/dev/stdin, <(...)) is read, not taken for a directory
// holding --out; non-finite weights are refused as eval refuses them; a
// batch with a misspelt or missing tensor is named.
TEST(Cli, ForwardReadsAPipeAndRefusesBrokenWeightsAndBatches) {
  const std::string dir = tiny_run("kvs_cli_forward_pipe"), step = dir + "/checkpoints/step_00000003";
  const std::string out = testing::TempDir() + "pipe_logits.npy";
  Result r = run_with_env("echo 11 12 13 |", "forward --checkpoint " + dir + " --tokens /dev/stdin --out " + out);
  EXPECT_EQ(r.code, 0) << r.out;
  EXPECT_TRUE(fs::exists(out));
  const std::string batch = write_batch(testing::TempDir() + "pipe_batch.st", {12, 13, 12, 13}, {1, 1, 1, 1});
  const std::string renamed = testing::TempDir() + "pipe_batch_renamed.st";
  {
    std::vector<kvs::StTensor> t = kvs::read_safetensors(batch);
    for (auto& x : t)
      if (x.name == "mask") x.name = "masks";
    kvs::write_safetensors(renamed, t);
  }
  r = run("backward --checkpoint " + step + " --batch " + renamed + " --out " + testing::TempDir() + "g.st");
  EXPECT_NE(r.code, 0);
  EXPECT_NE(r.out.find("tensor 'masks' is not one of inputs, targets, mask"), std::string::npos) << r.out;
  // One NaN weight: forward and backward refuse the checkpoint (a copy without its manifest).
  const std::string broken = testing::TempDir() + "kvs_cli_nan_ckpt";
  fs::remove_all(broken);
  fs::create_directories(broken);
  for (const char* f : {"config.json", "model.safetensors"}) fs::copy_file(step + "/" + f, broken + "/" + f);
  std::vector<kvs::StTensor> w = kvs::read_safetensors(broken + "/model.safetensors");
  for (auto& t : w)
    if (t.name == "model.layers.0.mlp.down_proj.weight") reinterpret_cast<float*>(t.bytes.data())[5] = NAN;
  kvs::write_safetensors(broken + "/model.safetensors", w);
  r = run_with_env("echo 11 12 13 |", "forward --checkpoint " + broken + " --tokens /dev/stdin --out " + out);
  EXPECT_NE(r.code, 0);
  EXPECT_NE(r.out.find("tensor 'model.layers.0.mlp.down_proj.weight' element 5 is nan (refusing to run a broken "
                       "model)"),
            std::string::npos)
      << r.out;
}

// Generation stops at --stop-ids, else at the checkpoint config.json's
// eos_token_id (an import keeps the model's; an id or a list) when no
// tokenizer names an EOS.
TEST(Cli, GenerateStopsAtTheStopIdsOrTheModelsEos) {
  const std::string dir = tiny_run("kvs_cli_stop_ids"), step = dir + "/checkpoints/step_00000003";
  auto ids_of = [](const Result& r) {  // the JSON line; the summary follows on stderr
    const size_t at = r.out.find('{');
    return nlohmann::json::parse(r.out.substr(at, r.out.find('\n', at) - at))["ids"].get<std::vector<int>>();
  };
  const std::string gen = "generate --json --prompt-ids 11,12,13 --max-new-tokens 12 --checkpoint ";
  Result r = run(gen + dir);
  ASSERT_EQ(r.code, 0) << r.out;
  const std::vector<int> all = ids_of(r);
  ASSERT_EQ(all.size(), 12u);
  const int stop = all[4];
  const size_t first = static_cast<size_t>(std::find(all.begin(), all.end(), stop) - all.begin());
  r = run(gen + dir + " --stop-ids " + std::to_string(stop));
  ASSERT_EQ(r.code, 0) << r.out;
  EXPECT_EQ(ids_of(r), std::vector<int>(all.begin(), all.begin() + static_cast<std::ptrdiff_t>(first)));
  EXPECT_NE(r.out.find("\"stop\":\"eos\""), std::string::npos) << r.out;
  // The same id as config.json's eos_token_id (a list, as Llama 3's), in a copy without its manifest.
  const std::string copy = testing::TempDir() + "kvs_cli_stop_ids_copy";
  fs::remove_all(copy);
  fs::create_directories(copy);
  for (const char* f : {"config.json", "model.safetensors"}) fs::copy_file(step + "/" + f, copy + "/" + f);
  auto cfg = nlohmann::json::parse(kvs::testing_util::slurp(copy + "/config.json"));
  cfg["eos_token_id"] = {stop, 0};
  std::ofstream(copy + "/config.json") << cfg.dump();
  r = run(gen + copy);
  ASSERT_EQ(r.code, 0) << r.out;
  std::vector<int> want(all.begin(), all.begin() + static_cast<std::ptrdiff_t>(first));
  const auto zero = std::find(want.begin(), want.end(), 0);
  want.erase(zero, want.end());
  EXPECT_EQ(ids_of(r), want);
  cfg["eos_token_id"] = 100000;  // no token of this model
  std::ofstream(copy + "/config.json") << cfg.dump();
  r = run(gen + copy);
  EXPECT_NE(r.code, 0);
  EXPECT_NE(r.out.find("eos_token_id: 100000 is not a token id"), std::string::npos) << r.out;
  r = run(gen + dir + " --stop-ids 100000");
  EXPECT_NE(r.code, 0);
  EXPECT_NE(r.out.find("--stop-ids: 100000 is not a token id"), std::string::npos) << r.out;
  // A malformed list names the flag it came from; an empty one is an error, not the default.
  r = run(gen + dir + " --stop-ids 1,x");
  EXPECT_NE(r.code, 0);
  EXPECT_NE(r.out.find("--stop-ids: item 1 ('x') is not a non-negative integer"), std::string::npos) << r.out;
  r = run(gen + dir + " --stop-ids ''");
  EXPECT_NE(r.code, 0);
  EXPECT_NE(r.out.find("--stop-ids: no ids in ''"), std::string::npos) << r.out;
}

// What a command prints is its result: a write that fails (a full disk) is an
// error, not exit 0 with nothing written.
TEST(Cli, AFailedWriteToStdoutIsAnError) {
  const std::string dir = tiny_run("kvs_cli_stdout_full");
  const std::string err = testing::TempDir() + "stdout_full.err";
  for (const std::string& cmd : {"inspect --checkpoint " + dir + " --json", "eval --checkpoint " + dir + " --json",
                                 "generate --checkpoint " + dir + " --prompt-ids 11,12 --max-new-tokens 3", std::string("--help"),
                                 std::string("--help-all"), std::string("eval --help")}) {
    SCOPED_TRACE(cmd);
    const int status =
        std::system((std::string(kvs::test::cli_binary()) + " " + cmd + " > /dev/full 2> " + err).c_str());
    EXPECT_TRUE(WIFEXITED(status) && WEXITSTATUS(status) == 1) << status;
    EXPECT_NE(kvs::testing_util::slurp(err).find("stdout: No space left on device"), std::string::npos)
        << kvs::testing_util::slurp(err);
  }
}

// An unscored position's target may be anything (PyTorch's ignore_index -100):
// the loss and gradients are those with any valid id there.
TEST(Cli, BackwardIgnoresTheTargetsOfUnscoredPositions) {
  const std::string dir = tiny_run("kvs_cli_masked_targets"), step = dir + "/checkpoints/step_00000003";
  const std::string a = write_batch(dir + "/a.st", {12, 13, 0, 13}, {1, 1, 0, 1});
  const std::string b = write_batch(dir + "/b.st", {12, 13, -100, 13}, {1, 1, 0, 1});
  ASSERT_EQ(run("backward --checkpoint " + step + " --batch " + a + " --out " + dir + "/ga.st").code, 0);
  const Result r = run("backward --checkpoint " + step + " --batch " + b + " --out " + dir + "/gb.st");
  ASSERT_EQ(r.code, 0) << r.out;
  EXPECT_EQ(kvs::testing_util::slurp(dir + "/ga.st"), kvs::testing_util::slurp(dir + "/gb.st"));
  // Scored, the same id is an error naming the batch and the position.
  const std::string c = write_batch(dir + "/c.st", {12, 13, -100, 13}, {1, 1, 0.5f, 1});
  const Result bad = run("backward --checkpoint " + step + " --batch " + c + " --out " + dir + "/gc.st");
  EXPECT_NE(bad.code, 0);
  EXPECT_NE(bad.out.find(c + ": target token -100 at [0, 2] is outside [0, vocab_size 128)"), std::string::npos)
      << bad.out;
}

// Without `latest` (a crash between a save's two renames, or removed by hand)
// the readers take the newest step directory, as --resume does, and say so;
// a broken run_config.json (a copy for reference, outside the manifest) stops
// only the commands that read it.
TEST(Cli, CheckpointReadersWithoutLatestOrWithABrokenRunConfig) {
  const std::string dir = tiny_run("kvs_cli_readers");
  // The `latest` pointer file itself names its step directory.
  const Result via_latest = run("inspect --checkpoint " + dir + "/checkpoints/latest");
  EXPECT_EQ(via_latest.code, 0) << via_latest.out;
  EXPECT_EQ(via_latest.out, run("inspect --checkpoint " + dir + "/checkpoints/step_00000003").out);
  fs::remove(dir + "/checkpoints/latest");
  for (const std::string& where : {dir, dir + "/checkpoints"}) {
    SCOPED_TRACE(where);
    const Result r = run("eval --json --checkpoint " + where);
    ASSERT_EQ(r.code, 0) << r.out;
    EXPECT_NE(r.out.find("latest is missing: reading the newest step directory, " + dir +
                         "/checkpoints/step_00000003"),
              std::string::npos)
        << r.out;
  }
  const std::string step = dir + "/checkpoints/step_00000003";
  kvs::testing_util::spit(step + "/run_config.json", "{bad");
  const std::string tokens = write_temp("readers_tokens.txt", "11 12 13");
  EXPECT_EQ(run("inspect --checkpoint " + step).code, 0);
  EXPECT_EQ(run("forward --checkpoint " + step + " --tokens " + tokens + " --out " + dir + "/l.npy").code, 0);
  Result r = run("eval --checkpoint " + step);
  EXPECT_NE(r.code, 0);
  EXPECT_NE(r.out.find(step + "/run_config.json: invalid JSON"), std::string::npos) << r.out;
  r = run("eval --checkpoint " + step + " --config " + src("configs/toy/induction-1l-kvshift.json"));
  EXPECT_EQ(r.code, 0) << r.out;
}
