// `kvshift generate`: text (or token ids) in, a continuation out, decoded on
// the CPU with a KV cache (model/generator.h) and streamed as it is produced.
#include <omp.h>

#include <algorithm>
#include <cerrno>
#include <chrono>
#include <cmath>
#include <cstdio>
#include <cstring>
#include <filesystem>
#include <memory>
#include <nlohmann/json.hpp>
#include <string>
#include <vector>

#include "cli/commands/commands.h"
#include "cli/commands/common.h"
#include "cli/commands/text_stream.h"
#include "core/cpu_budget.h"
#include "core/error.h"
#include "data/tokenizer_check.h"
#include "model/generator.h"
#include "model/sampler.h"
#include "tokenizer/tokenizer.h"
#include "tokenizer/tokenizer_meta.h"


namespace kvs::cli {

namespace {

struct Args {
  std::string checkpoint, prompt, prompt_ids, tokenizer, stop_ids;
  bool has_prompt = false, has_prompt_ids = false, has_stop_ids = false, json = false;
  int threads = 0;         // 0 = auto
  int max_new_tokens = 0;  // not given (max_new_given false): 128, or fewer to fit the model's positions
  bool max_new_given = false;
  SamplingConfig sampling;
};

// "1,2,3" (commas and/or spaces) -> ids; errors name `flag`.
std::vector<int32_t> parse_ids(const std::string& text, const char* flag) {
  std::vector<int32_t> ids;
  std::string item;
  auto flush = [&] {
    if (item.empty()) return;
    char* end = nullptr;
    const long v = std::strtol(item.c_str(), &end, 10);
    KVS_CHECK(end && *end == '\0' && v >= 0 && v <= INT32_MAX,
              "{}: item {} ('{}') is not a non-negative integer", flag, ids.size(), item);
    ids.push_back(static_cast<int32_t>(v));
    item.clear();
  };
  for (size_t i = 0; i < text.size(); ++i) {
    const char ch = text[i];
    if (ch == ',' && item.empty() && (ids.empty() || text[i - 1] == ','))  // "1,,2", ",1": an id left out
      fail("{}: an empty item at character {} of '{}'", flag, i, text);
    if (ch == ',' || ch == ' ')
      flush();
    else
      item += ch;
  }
  KVS_CHECK(text.empty() || text.back() != ',', "{}: an empty item after the last comma of '{}'", flag, text);
  flush();
  KVS_CHECK(!ids.empty(), "{}: no ids in '{}'", flag, text);
  return ids;
}

// --tokenizer, else the run config's data.tokenizer, else the checkpoint's own
// tokenizer/ (import-hf's), else bytes for a 256-token model; nullptr when
// there is none (ids in, ids out).
std::unique_ptr<Tokenizer> find_tokenizer(const Args& a, const OpenedCheckpoint& ck) {
  if (!a.tokenizer.empty()) {
    KVS_CHECK(std::filesystem::is_directory(a.tokenizer), "--tokenizer {}: no such directory", a.tokenizer);
    check_checkpoint_tokenizer(ck.files.trainer_state, ck.dir, a.tokenizer);
    return load_tokenizer(a.tokenizer);
  }
  KVS_CHECK(ck.files.run_config_error.empty(), "{} (it names the tokenizer); fix it or pass --tokenizer DIR",
            ck.files.run_config_error);
  const nlohmann::json& rc = ck.files.run_config;
  if (rc.is_object() && rc.contains("data") && rc["data"].is_object() && rc["data"].contains("tokenizer")) {
    const auto& t = rc["data"]["tokenizer"];
    KVS_CHECK(t.is_string(), "{}/run_config.json: data.tokenizer is not a string", ck.dir);
    const std::string dir = t.get<std::string>();
    KVS_CHECK(std::filesystem::exists(dir),
              "{}/run_config.json: tokenizer directory '{}' (data.tokenizer) not found from {}; pass --tokenizer DIR",
              ck.dir, dir, std::filesystem::current_path().string());
    check_checkpoint_tokenizer(ck.files.trainer_state, ck.dir, dir);
    return load_tokenizer(dir);
  }
  const std::string own = ck.dir + "/tokenizer";
  if (std::filesystem::exists(own + "/" + kTokenizerMetaFile)) {
    check_checkpoint_tokenizer(ck.files.trainer_state, ck.dir, own);
    return load_tokenizer(own);
  }
  if (ck.model.vocab_size == 256) return make_byte_tokenizer();
  return nullptr;
}

// One token's ops are small (rows of 1), so a thread team mostly waits at its
// barriers: lm-small (hidden 256) decoded 20x slower with 2 threads than with
// 1 on the shared 2-core development machine. Auto is one thread below hidden
// size 1024 (a guess, not measured above 256) and every core from there on.
int pick_threads(int requested, const ModelConfig& m) {
  if (requested > 0) return requested;
  return m.hidden_size < 1024 ? 1 : resolve_threads(0);
}

// Prints `text` at once (streaming).
// Streams text as it is generated; a reader that went away (`| head -c 3`,
// SIGPIPE is ignored) or a full disk ends the generation with an error.
void emit(const std::string& text) {
  if (text.empty()) return;
  errno = 0;
  if (std::fwrite(text.data(), 1, text.size(), stdout) != text.size() || std::fflush(stdout) != 0)
    fail("stdout: {}: the generated text was not all written", errno ? std::strerror(errno) : "write error");
}

double seconds_since(std::chrono::steady_clock::time_point t0) {
  return std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
}

void run_generate(const Args& a) {
  KVS_CHECK(a.has_prompt != a.has_prompt_ids, "give exactly one of --prompt TEXT and --prompt-ids 1,2,3");
  KVS_CHECK(!a.max_new_given || a.max_new_tokens >= 1, "--max-new-tokens {} must be >= 1", a.max_new_tokens);
  validate_sampling(a.sampling);
  const std::string dir = resolve_checkpoint_dir(a.checkpoint);
  const OpenedCheckpoint ck = open_model_checkpoint(dir, false);
  const ModelConfig& m = ck.model;
  std::unique_ptr<Tokenizer> tok = find_tokenizer(a, ck);
  KVS_CHECK(tok || !a.has_prompt,
            "{}: no tokenizer for this {}-token model ({}, and no tokenizer/ in it); pass --tokenizer DIR "
            "or --prompt-ids 1,2,3",
            dir, m.vocab_size,
            ck.files.run_config.is_object() ? "no data.tokenizer in its run_config.json"
            : ck.files.run_config.is_null() ? "no run_config.json: not a training run's checkpoint"
                                           : "its run_config.json is not a JSON object");
  if (tok)
    KVS_CHECK(tok->vocab_size() <= m.vocab_size, "tokenizer ({}) has {} tokens, the model only {}", tok->describe(),
              tok->vocab_size(), m.vocab_size);

  // Data preparation frames each document with BOS, so a text prompt starts with it too.
  std::vector<int32_t> ids;
  if (a.has_prompt) {
    if (tok->bos_id() >= 0) ids.push_back(tok->bos_id());
    for (int32_t id : tok->encode(a.prompt)) ids.push_back(id);
    KVS_CHECK(!ids.empty(), "--prompt: empty text and the tokenizer has no BOS to start from; give some text");
  } else {
    ids = parse_ids(a.prompt_ids, "--prompt-ids");
  }
  const int n_prompt = static_cast<int>(ids.size());
  for (int i = 0; i < n_prompt; ++i)
    KVS_CHECK(ids[i] < m.vocab_size, "{}: token {} at position {} is >= vocab_size {}",
              a.has_prompt ? "--prompt" : "--prompt-ids", ids[i], i, m.vocab_size);
  KVS_CHECK(n_prompt < m.max_position_embeddings, "the prompt's {} tokens leave no room in max_position_embeddings {}",
            n_prompt, m.max_position_embeddings);
  const int max_new = a.max_new_given ? a.max_new_tokens : std::min(128, m.max_position_embeddings - n_prompt);
  KVS_CHECK(static_cast<int64_t>(n_prompt) + max_new <= m.max_position_embeddings,
            "--max-new-tokens {}: the prompt's {} tokens + {} new ones exceed the model's max_position_embeddings {}",
            max_new, n_prompt, max_new, m.max_position_embeddings);

  const int threads = use_threads(pick_threads(a.threads, m));
  Generator gen(m, read_model_weights(ck), n_prompt + max_new);
  Sampler sampler(a.sampling);
  // Where to stop: --stop-ids; else the tokenizer's EOS; else the
  // checkpoint's config.json eos_token_id (an import keeps the model's, an
  // int or a list as Llama 3's).
  std::vector<int32_t> stops;
  if (a.has_stop_ids) {
    stops = parse_ids(a.stop_ids, "--stop-ids");
    for (int32_t id : stops)
      KVS_CHECK(id >= 0 && id < m.vocab_size, "--stop-ids: {} is not a token id of this {}-token model", id,
                m.vocab_size);
  } else if (tok && tok->eos_id() >= 0) {
    stops = {tok->eos_id()};
  } else if (const nlohmann::json& e = ck.files.hf_config.value("eos_token_id", nlohmann::json()); !e.is_null()) {
    for (const auto& id : e.is_array() ? e : nlohmann::json::array({e})) stops.push_back(id.get<int32_t>());
  }
  const bool stream = !a.json;
  TextStream text(tok ? tok->decode(ids) : std::string());  // the prompt is not printed again

  const auto t0 = std::chrono::steady_clock::now();
  const float* logits = gen.prefill(ids);
  const double prefill_s = seconds_since(t0);
  const auto t1 = std::chrono::steady_clock::now();
  std::vector<int32_t> out;
  std::string stop = "length";
  // Only ids the tokenizer can decode (a model's vocabulary may be padded past it).
  const int sample_v = tok ? tok->vocab_size() : m.vocab_size;
  for (int i = 0; i < max_new; ++i) {
    for (int v = 0; v < sample_v; ++v)
      KVS_CHECK(std::isfinite(logits[v]), "{}: the model's logit for token {} is {} at generated token {}: its "
                "weights or activations are not finite", dir, v, logits[v], i + 1);
    const int32_t next = sampler.sample(logits, sample_v);
    if (std::find(stops.begin(), stops.end(), next) != stops.end()) {
      stop = "eos";
      break;
    }
    out.push_back(next);
    ids.push_back(next);
    if (stream) emit(tok ? text.update(tok->decode(ids)) : (out.size() > 1 ? " " : "") + std::to_string(next));
    if (i + 1 < max_new) logits = gen.step(next);
  }
  const double gen_s = seconds_since(t1);
  const std::string full = tok ? tok->decode(ids) : std::string();
  const double tps = out.empty() ? 0.0 : static_cast<double>(out.size()) / gen_s;
  if (stream) {
    emit(tok ? text.finish(full) : std::string());
    emit("\n");
  } else {
    nlohmann::json j = {{"checkpoint", dir},
                        {"prompt_ids", std::vector<int32_t>(ids.begin(), ids.begin() + n_prompt)},
                        {"ids", out},
                        {"stop", stop},
                        {"tokens_per_second", tps},
                        {"prefill_seconds", prefill_s},
                        {"threads", threads}};
    if (tok) {
      const std::string prompt_text = tok->decode({ids.begin(), ids.begin() + n_prompt});
      j["text"] = full.substr(std::min(full.size(), stable_utf8_length(prompt_text)));
      j["tokenizer"] = tok->describe();
    }
    std::printf("%s\n", j.dump(-1, ' ', false, nlohmann::json::error_handler_t::replace).c_str());
    std::fflush(stdout);  // before the stderr summary
  }
  std::fprintf(
      stderr,
      "kvshift generate: %zu tokens in %.3f s, %.1f tokens/s (prompt: %d tokens in %.3f s; stop: %s; %d thread%s)\n",
      out.size(), gen_s, tps, n_prompt, prefill_s, stop.c_str(), threads, threads == 1 ? "" : "s");
}

}  // namespace

void add_generate(CLI::App& app) {
  auto* cmd = app.add_subcommand("generate", "Continue a prompt with a checkpoint (CPU, KV cache), streaming tokens");
  auto a = std::make_shared<Args>();
  cmd->add_option("--checkpoint", a->checkpoint,
                  "A checkpoint (step_* dir), a checkpoints/ dir or a run dir (their latest checkpoint)")
      ->required();
  auto* prompt =
      cmd->add_option("--prompt", a->prompt, "Prompt text (encoded with the tokenizer, BOS first if it has one)");
  auto* prompt_ids =
      cmd->add_option("--prompt-ids", a->prompt_ids, "Prompt as token ids, e.g. 1,2,3 (taken as given: no BOS added)");
  auto* max_new = cmd->add_option("--max-new-tokens", a->max_new_tokens,
                                  "Tokens to generate at most; prompt + these <= max_position_embeddings "
                                  "(default: 128, or fewer to fit)");
  cmd->add_option("--temperature", a->sampling.temperature, "Softmax temperature; 0 = greedy (argmax)")
      ->capture_default_str();
  cmd->add_option("--top-k", a->sampling.top_k, "Sample among the K most likely tokens only; 0 = off")
      ->check(kNonNegativeInteger)
      ->capture_default_str();
  cmd->add_option("--top-p", a->sampling.top_p,
                  "Nucleus sampling: among the fewest most likely tokens whose probability reaches P; 1 = off")
      ->capture_default_str();
  cmd->add_option("--seed", a->sampling.seed, "Sampling seed (the same seed gives the same text)")
      ->check(kNonNegativeInteger)
      ->capture_default_str();
  cmd->add_option("--threads", a->threads,
                  "CPU threads; 0 = auto (1 below hidden size 1024, where a token's ops are too small to share; "
                  "else all cores)")
      ->check(kNonNegativeInteger)
      ->check(CLI::Range(0, 4096))  // train.threads' bound
      ->capture_default_str();
  cmd->add_option("--tokenizer", a->tokenizer,
                  "Tokenizer directory (default: the run config's data.tokenizer; bytes for a 256-token model)");
  CLI::Option* stop_ids = cmd->add_option("--stop-ids", a->stop_ids,
                  "Token ids that end the generation, e.g. 2 or 128001,128009 (default: the tokenizer's EOS, else "
                  "the checkpoint config.json's eos_token_id)");
  cmd->add_flag(
      "--json", a->json,
      "Print one JSON object at the end (prompt_ids, ids, text, stop, tokens_per_second) instead of streaming");
  cmd->callback([a, prompt, prompt_ids, stop_ids, max_new]() {
    a->has_prompt = prompt->count() > 0;  // --prompt "" is a prompt too (BOS alone)
    a->has_prompt_ids = prompt_ids->count() > 0;  // --prompt-ids "" is one, with no ids: an error of its own
    a->has_stop_ids = stop_ids->count() > 0;      // so is --stop-ids "" (not "the default")
    a->max_new_given = max_new->count() > 0;
    run_generate(*a);
  });
}

}  // namespace kvs::cli
