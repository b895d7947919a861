// TensorStream: the queue between the gathering thread and the checkpoint writer.
#include <fmt/format.h>
#include <gtest/gtest.h>

#include <atomic>
#include <chrono>
#include <thread>

#include "core/error.h"
#include "test_util.h"
#include "train/checkpoint.h"
#include "train/tensor_stream.h"

namespace {

using kvs::testing_util::TmpDir;

kvs::StTensor tensor(const std::string& name, size_t floats, float value) {
  std::vector<float> v(floats, value);
  return kvs::make_f32_tensor(name, {static_cast<int64_t>(floats)}, v.data());
}

// The producer waits while the queue holds its budget; one tensor always
// fits, however large; tensors come out in order.
TEST(TensorStream, HoldsAtMostTheBudgetAndKeepsOrder) {
  kvs::TensorStream s(3 * 16);  // three tensors of 4 floats
  std::thread producer([&] {
    for (int i = 0; i < 20; ++i) s.push(tensor(fmt::format("t{}", i), i == 7 ? 100 : 4, float(i)));
    s.close();
  });
  std::this_thread::sleep_for(std::chrono::milliseconds(50));  // let the producer fill the queue
  for (int i = 0; i < 20; ++i) {
    const kvs::StTensor t = s.pop();
    EXPECT_EQ(t.name, fmt::format("t{}", i));
    EXPECT_EQ(kvs::tensor_to_f32(t)[0], float(i));
  }
  producer.join();
  EXPECT_EQ(s.peak_bytes(), 400u);  // the 100-float tensor alone: the only one over the budget
  kvs::TensorStream t(3 * 16);
  std::thread p2([&] {
    for (int i = 0; i < 10; ++i) t.push(tensor("x", 4, 0));
  });
  std::this_thread::sleep_for(std::chrono::milliseconds(50));
  EXPECT_EQ(t.peak_bytes(), 48u);
  for (int i = 0; i < 10; ++i) t.pop();
  p2.join();
}

// A writer that fails lets the producer go on (its collectives must finish on
// every rank), and a producer that fails ends the writer with its reason.
TEST(TensorStream, EitherSideStoppingReleasesTheOther) {
  kvs::TensorStream s(16);
  std::atomic<int> pushed{0};
  std::thread producer([&] {
    for (int i = 0; i < 50; ++i, ++pushed) s.push(tensor("t", 4, 0));
  });
  s.pop();
  s.abort();
  producer.join();
  EXPECT_EQ(pushed.load(), 50);
  kvs::TensorStream t(16);
  t.push(tensor("a", 4, 0));
  t.close("ranks 0 and 1 hold different copies of 'x'");
  t.pop();
  EXPECT_KVS_ERROR(t.pop(), "stopped coming", "different copies");
}

// A streamed save writes the same bytes as one from whole tensors, and a
// stream that stops early leaves no checkpoint (and no temp directory).
TEST(TensorStream, StreamedSaveIsTheSameCheckpoint) {
  TmpDir tmp;
  kvs::CheckpointData whole;
  whole.hf_config = {{"model_type", "llama"}};
  whole.model = {tensor("a", 5, 1), tensor("b", 3, 2)};
  whole.optimizer = {tensor("exp_avg.a", 5, 3), tensor("exp_avg.b", 3, 4)};
  whole.trainer_state = {{"step", 2}};
  const std::string a = kvs::save_checkpoint(tmp / "whole", 2, whole);

  kvs::CheckpointData headers = whole;
  for (auto* v : {&headers.model, &headers.optimizer})
    for (auto& t : *v) t.bytes.clear();
  headers.stream = std::make_shared<kvs::TensorStream>(1);
  std::thread producer([&] {
    for (const auto* v : {&whole.model, &whole.optimizer})
      for (const auto& t : *v) headers.stream->push(t);
    headers.stream->close();
  });
  const std::string b = kvs::save_checkpoint(tmp / "streamed", 2, headers);
  producer.join();
  for (const char* f : {"model.safetensors", "optimizer.safetensors", "manifest.json", "trainer_state.json"})
    EXPECT_EQ(kvs::testing_util::slurp(a + "/" + f), kvs::testing_util::slurp(b + "/" + f)) << f;

  headers.stream = std::make_shared<kvs::TensorStream>(1);
  headers.stream->push(whole.model[0]);
  headers.stream->close("gather failed");
  EXPECT_KVS_ERROR(kvs::save_checkpoint(tmp / "cut", 2, headers), "stopped coming", "gather failed");
  EXPECT_TRUE(std::filesystem::is_empty(tmp / "cut"));
}

}  // namespace
