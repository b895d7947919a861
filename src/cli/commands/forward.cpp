// `forward` and `backward`: the model as a function, for checks by other tools
// (the PyTorch oracle test, Hugging Face export checks).
#include <cmath>
#include <fstream>
#include <set>
#include <sstream>

#include "cli/commands/commands.h"
#include "cli/commands/common.h"
#include "core/atomic_dir.h"
#include "core/error.h"
#include "core/fs.h"
#include "core/npy.h"

namespace kvs::cli {

namespace {

std::vector<int32_t> read_token_file(const std::string& path) {
  std::istringstream in(read_file(path));
  std::vector<int32_t> ids;
  std::string word;
  while (in >> word) {
    char* end = nullptr;
    const long v = std::strtol(word.c_str(), &end, 10);
    KVS_CHECK(end && *end == '\0' && v >= 0 && v <= INT32_MAX, "{}: token {} ('{}') is not a non-negative integer",
              path, ids.size(), word);
    ids.push_back(static_cast<int32_t>(v));
  }
  KVS_CHECK(!ids.empty(), "{}: no tokens", path);
  return ids;
}

// The checks `generate` and `train` make too: a sequence within the model's
// positions, token ids within its vocabulary (the engines index the embedding
// with them unchecked).
void check_length(const std::string& file, int T, const ModelConfig& m) {
  KVS_CHECK(T <= m.max_position_embeddings, "{}: {} positions exceed the model's max_position_embeddings {}", file, T,
            m.max_position_embeddings);
}
void check_ids(const std::string& file, const char* what, const std::vector<int32_t>& ids, int T,
               const ModelConfig& m, const std::vector<float>* mask = nullptr) {
  for (size_t i = 0; i < ids.size(); ++i)
    KVS_CHECK((mask && (*mask)[i] == 0.0f) || (ids[i] >= 0 && ids[i] < m.vocab_size),
              "{}: {} token {} at [{}, {}] is outside [0, vocab_size {})", file, what, ids[i], i / T, i % T,
              m.vocab_size);
}

}  // namespace

void add_forward(CLI::App& app) {
  auto* cmd = app.add_subcommand("forward", "Write the float32 logits [T, vocab] of one token sequence as .npy");
  struct Args {
    std::string checkpoint, tokens, out, device = "cpu";
  };
  auto a = std::make_shared<Args>();
  cmd->add_option("--checkpoint", a->checkpoint,
                  "A checkpoint (step_* dir), a checkpoints/ dir or a run dir (their latest checkpoint)")
      ->required();
  cmd->add_option("--tokens", a->tokens, "Text file of whitespace-separated token ids")->required();
  cmd->add_option("--out", a->out, "Output .npy file")->required();
  cmd->add_option("--device", a->device, "cpu or cuda");
  cmd->callback([a]() {
    const std::string dir = resolve_checkpoint_dir(a->checkpoint);
    check_output_file_apart_from_inputs(a->out, {dir, a->tokens});
    const OpenedCheckpoint ck = open_model_checkpoint(dir, false);
    std::vector<int32_t> ids = read_token_file(a->tokens);
    const int T = static_cast<int>(ids.size());
    check_length(a->tokens, T, ck.model);
    check_ids(a->tokens, "input", ids, T, ck.model);
    auto engine = engine_for(ck, 1, T, device_flag(a->device));
    std::vector<float> logits(static_cast<size_t>(T) * ck.model.vocab_size);
    engine->forward(Batch{1, T, ids.data(), nullptr, nullptr}, nullptr, nullptr, logits.data());
    write_npy_f32(a->out, logits.data(), {T, ck.model.vocab_size});
  });
}

void add_backward(CLI::App& app) {
  auto* cmd = app.add_subcommand(
      "backward", "Logits, masked mean loss and every parameter gradient of one batch, as safetensors");
  struct Args {
    std::string checkpoint, batch, out, device = "cpu";
  };
  auto a = std::make_shared<Args>();
  cmd->add_option("--checkpoint", a->checkpoint,
                  "A checkpoint (step_* dir), a checkpoints/ dir or a run dir (their latest checkpoint)")
      ->required();
  cmd->add_option("--batch", a->batch, "safetensors with inputs I32 [B,T], targets I32 [B,T], mask F32 [B,T]")
      ->required();
  cmd->add_option("--out", a->out, "Output safetensors: logits, loss, grad.<param name>")->required();
  cmd->add_option("--device", a->device, "cpu or cuda");
  cmd->callback([a]() {
    const std::string dir = resolve_checkpoint_dir(a->checkpoint);
    check_output_file_apart_from_inputs(a->out, {dir, a->batch});
    const OpenedCheckpoint ck = open_model_checkpoint(dir, false);
    std::vector<int32_t> inputs, targets;
    std::vector<float> mask;
    std::vector<int64_t> shape;
    std::set<std::string> found;
    for (const auto& t : read_safetensors(a->batch)) {
      KVS_CHECK(t.name == "inputs" || t.name == "targets" || t.name == "mask",
                "{}: tensor '{}' is not one of inputs, targets, mask (a misspelt name would be left out)", a->batch,
                t.name);
      found.insert(t.name);
      try {
        if (t.name == "inputs") inputs = tensor_to_i32(t), shape = t.shape;
        if (t.name == "targets") targets = tensor_to_i32(t);
        if (t.name == "mask") mask = tensor_to_f32(t);
      } catch (const Error& e) {  // a dtype the tensor cannot take: name the file
        fail("{}: {}", a->batch, e.what());
      }
    }
    for (const char* name : {"inputs", "targets", "mask"})
      KVS_CHECK(found.count(name), "{}: no tensor '{}' (a batch holds inputs I32 [B, T], targets I32 [B, T], mask F32 "
                "[B, T])", a->batch, name);
    KVS_CHECK(shape.size() == 2, "{}: needs 'inputs' of shape [B, T]", a->batch);
    const size_t n = inputs.size();
    KVS_CHECK(targets.size() == n && mask.size() == n, "{}: 'targets' and 'mask' must match 'inputs' [B, T]",
              a->batch);
    const int B = static_cast<int>(shape[0]), T = static_cast<int>(shape[1]), V = ck.model.vocab_size;
    check_length(a->batch, T, ck.model);
    check_ids(a->batch, "input", inputs, T, ck.model);
    for (size_t i = 0; i < n; ++i)
      KVS_CHECK(std::isfinite(mask[i]) && mask[i] >= 0, "{}: mask value {} at [{}, {}] is not a finite weight >= 0",
                a->batch, mask[i], i / T, i % T);
    check_ids(a->batch, "target", targets, T, ck.model, &mask);
    // Unscored positions' targets may be anything (-100, as PyTorch's ignore_index):
    // the loss does not read them, and the engines take ids in range.
    for (size_t i = 0; i < n; ++i)
      if (mask[i] == 0.0f) targets[i] = 0;
    double scored = 0;
    for (float m : mask) scored += m;
    KVS_CHECK(scored > 0, "{}: the mask scores no token", a->batch);
    auto engine = engine_for(ck, B, T, device_flag(a->device));
    Batch b{B, T, inputs.data(), targets.data(), mask.data()};
    std::vector<float> logits(n * V);
    engine->forward(b, nullptr, nullptr, logits.data());
    engine->zero_grad();
    const float loss = static_cast<float>(engine->forward_backward(b, 1.0 / scored) / scored);
    std::vector<float> grads(engine->layout().total);
    engine->read_grads(grads.data());
    std::vector<StTensor> out;
    out.push_back(make_f32_tensor("logits", {B, T, V}, logits.data()));
    out.push_back(make_f32_tensor("loss", {1}, &loss));
    for (const auto& t : engine->layout().tensors)
      out.push_back(make_f32_tensor("grad." + t.name, t.shape, grads.data() + t.offset));
    write_safetensors(a->out, out);
  });
}

}  // namespace kvs::cli
