// The one-process commands that only run the model forward hold its weights
// once: eval's engine leaves its gradients and backward scratch unwritten, so
// they take no memory (ZeroedHostBuffer), and generate and forward read the
// weights straight from model.safetensors into the generator or engine (and
// export-hf into the tensors it writes), not through a whole copy of the
// file's tensors. Each command's anonymous
// resident memory is sampled by a Python parent of its own, against the same
// command on a tiny model (what the binary and its libraries take).
#include <gtest/gtest.h>

#include <nlohmann/json.hpp>
#include <regex>
#include <string>

#include "test_util.h"

namespace {

using kvs::testing_util::run_kvshift;
using kvs::testing_util::TmpDir;

// The most anonymous resident memory (KiB: heap and mappings, not the
// binary's and libraries' file pages) `kvshift args` held, sampled every
// millisecond by a Python parent; the command must succeed.
long peak_anon_kib(const std::string& args) {
  const std::string parent =
      "/usr/bin/python3 -c 'import re, subprocess, sys, time\n"
      "p = subprocess.Popen(sys.argv[1:], stdout=subprocess.DEVNULL)\n"
      "peak = 0\n"
      "while p.poll() is None:\n"
      "    try:\n"
      "        peak = max(peak, int(re.search(r\"RssAnon:\\s+(\\d+)\", open(\"/proc/%d/status\" % p.pid).read())[1]))\n"
      "    except (OSError, TypeError):\n"
      "        pass\n"
      "    time.sleep(0.001)\n"
      "print(\"peak_anon_kib\", peak, \"rc\", p.returncode)'";
  const auto r = run_kvshift(args, parent);
  std::smatch m;
  const bool found = std::regex_search(r.out, m, std::regex("peak_anon_kib (\\d+) rc (\\d+)"));
  EXPECT_TRUE(found && m[2] == "0") << args << ": " << r.out;
  return found ? std::stol(m[1]) : 0;
}

// A run of one step with a checkpoint, of a model of `hidden` x 2 hidden
// MLP width, 4 layers and 64 tokens, under tmp/name.
std::string train_one_step(const TmpDir& tmp, const std::string& name, int hidden) {
  const nlohmann::json cfg = {
      {"name", "memory"},
      {"model",
       {{"hidden_size", hidden},
        {"intermediate_size", 2 * hidden},
        {"num_hidden_layers", 4},
        {"num_attention_heads", 8},
        {"num_key_value_heads", 8},
        {"vocab_size", 64},
        {"max_position_embeddings", 32},
        {"kv_shift", {{"enabled", true}, {"window", 1}}}}},
      {"data", {{"type", "induction"}, {"induction", {{"token_lo", 2}, {"token_hi", 64}, {"pool_size", 8}}}}},
      {"train",
       {{"seq_len", 16},
        {"micro_batch_size", 1},
        {"steps", 1},
        {"eval_every", 0},
        {"eval_sequences", 2},
        {"checkpoint_every", 1},
        {"threads", 2}}}};
  kvs::testing_util::spit(tmp / (name + ".json"), cfg.dump());
  const std::string run = tmp / name;
  const auto trained = run_kvshift("train --quiet --config " + tmp / (name + ".json") + " --run-dir " + run);
  EXPECT_EQ(trained.code, 0) << trained.out;
  return run;
}

TEST(Memory, EvalGenerateForwardAndExportHoldTheWeightsOnce) {
  TmpDir tmp;
  // 42M parameters (168 MB of fp32) and tiny activations: the weights dominate.
  const std::string big = train_one_step(tmp, "big", 1024), tiny = train_one_step(tmp, "tiny", 32);
  auto weights_kib = [](double h) { return 4.0 * (4 * (4.0 * h * h + 3.0 * h * 2 * h) + 2.0 * 64 * h) / 1024; };
  const double weights = weights_kib(1024) - weights_kib(32);
  kvs::testing_util::spit(tmp / "ids.txt", "3 9 4 7\n");
  for (const std::string& cmd : {std::string("eval --checkpoint "),
                                 std::string("generate --prompt-ids 3,9,4,7 --max-new-tokens 4 --checkpoint "),
                                 "forward --tokens " + tmp / "ids.txt" + " --out " + tmp / "logits.npy" +
                                     " --checkpoint ",
                                 "export-hf --dtype fp32 --force --out " + tmp / "hf" + " --checkpoint "}) {
    const long base = peak_anon_kib(cmd + tiny);
    const double above = static_cast<double>(peak_anon_kib(cmd + big) - base);
    // Once (plus activations, the KV cache, the data, and eval's 64 MiB window
    // for reading the weights, kWindowFloats): not twice, as before (eval's
    // gradients; generate's and forward's copy of the file's tensors; export's
    // too, and a third copy for its shards).
    const double window = 64 * 1024;
    EXPECT_GT(above, 0.9 * weights) << cmd << ": the weights are not all counted? tiny model " << base << " KiB";
    EXPECT_LT(above, 1.25 * weights + window)
        << cmd << ": " << above / weights << "x the weights above the tiny model's";
  }
}

}  // namespace
