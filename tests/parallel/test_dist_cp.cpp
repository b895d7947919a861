// Sequence parallelism and context parallelism through `kvshift train` under
// mpirun (docs/PARALLEL.md): every layout follows the single-process loss
// curve with the same global batch (relative difference <= 1e-6 per step and
// evaluation), for vanilla and shifted GQA, window 2 with Q shifting, and
// packed documents; resume across layouts; one-line errors for bad layouts.
// The CP engine against one process op by op (halo gradients, documents on
// chunk edges) is tests/parallel/mpi_context_parallel.cpp.
#include <gtest/gtest.h>

#include <filesystem>
#include <string>

#include "dist_test_util.h"

using namespace kvs::testing_util;

namespace {

constexpr double kTol = 1e-6;

using Layout = TrainLayout;

const Layout kSp2{2, "--set parallel.tp=2 --set parallel.sequence_parallel=true", "tp2+sp"};
const Layout kDp2Sp2{4, "--set parallel.tp=2 --set parallel.sequence_parallel=true", "dp2 x tp2+sp"};
const Layout kCp2{2, "--set parallel.cp=2", "cp2"};
const Layout kCp4{4, "--set parallel.cp=4", "cp4"};
const Layout kDp2Cp2{4, "--set parallel.cp=2", "dp2 x cp2"};
const Layout kCp2Tp2Sp{4, "--set parallel.cp=2 --set parallel.tp=2 --set parallel.sequence_parallel=true",
                       "cp2 x tp2+sp"};

// Every layout in `layouts` against one process, on the config `cfg`.
void follow_single(const nlohmann::json& cfg, std::initializer_list<Layout> layouts, const std::string& what) {
  expect_layouts_follow_single_process(cfg, layouts, what, kTol);
}

nlohmann::json with_documents(nlohmann::json c) {
  // Token 70 starts a document wherever it occurs: with the induction tokens
  // drawn from 64..79 that is about once per 16-token sequence, so documents
  // begin inside chunks, on chunk edges and run across them. (Token 5, with
  // tokens 64..399, never occurred: the "documents" runs had none.)
  c["data"]["induction"]["token_hi"] = 80;
  c["model"]["document_boundaries"] = "shift_and_attention";
  c["model"]["bos_token_id"] = 70;
  return c;
}

}  // namespace

TEST(SequenceParallel, FollowsSingleProcess) {
  follow_single(tiny_config(false, 4), {kSp2, kDp2Sp2}, "vanilla");
  follow_single(tiny_config(true, 4), {kSp2, kDp2Sp2}, "shifted GQA");
}

TEST(ContextParallel, FollowsSingleProcess) {
  follow_single(tiny_config(false, 4), {kCp2}, "vanilla");
  follow_single(tiny_config(true, 4), {kCp2, kCp4, kDp2Cp2, kCp2Tp2Sp}, "shifted GQA");
}

TEST(ContextParallel, ShiftVariantsAndDocumentsFollowSingleProcess) {
  nlohmann::json w2 = tiny_config(true, 4);
  w2["model"]["kv_shift"]["window"] = 2;
  w2["model"]["kv_shift"]["shift_q"] = true;
  follow_single(w2, {kCp2, kCp4}, "window 2 + Q shift");
  follow_single(with_documents(tiny_config(true, 4)), {kCp2, kCp2Tp2Sp}, "documents");
  // The documents are there: one process with and without their boundaries differ.
  TmpDir tmp;
  nlohmann::json plain = with_documents(tiny_config(true, 4));
  plain["model"]["document_boundaries"] = "none";
  spit(tmp / "docs.json", with_documents(tiny_config(true, 4)).dump());
  spit(tmp / "plain.json", plain.dump());
  train(0, tmp / "docs.json", tmp / "docs");
  train(0, tmp / "plain.json", tmp / "plain");
  EXPECT_NE(read_metrics(tmp / "docs").train, read_metrics(tmp / "plain").train);
}

// Saved under one layout, resumed under another: the curve goes on as if uninterrupted.
TEST(ContextParallel, ResumeAcrossLayouts) {
  TmpDir tmp;
  const std::string cfg = tmp / "c.json";
  spit(cfg, tiny_config(true, 4).dump());
  train(0, cfg, tmp / "full");
  const Curve full = read_metrics(tmp / "full");
  const std::string a = tmp / "cp_to_one", b = tmp / "one_to_cptp";
  train(kCp2.np, cfg, a, kCp2.flags + " --set train.steps=10");
  train(0, cfg, a, "--resume");
  expect_close(read_metrics(a), full, 11, "resume cp2 -> one process", kTol);
  train(0, cfg, b, "--set train.steps=10");
  train(kCp2Tp2Sp.np, cfg, b, kCp2Tp2Sp.flags + " --resume");
  expect_close(read_metrics(b), full, 11, "resume one process -> cp2 x tp2+sp", kTol);
}

TEST(ContextParallel, BadLayoutsAreOneLineErrors) {
  TmpDir tmp;
  const std::string cfg = tmp / "c.json";
  spit(cfg, tiny_config(true, 4).dump());
  auto error_of_run = [&](int np, const std::string& flags) {
    const auto r = run_kvshift("train --quiet --config " + cfg + " --run-dir " + (tmp / "bad") + " " + flags,
                               np ? mpirun(np) : "");
    EXPECT_NE(r.code, 0) << r.out;
    EXPECT_FALSE(std::filesystem::exists(tmp / "bad/metrics.jsonl"));
    return r.out;
  };
  EXPECT_NE(error_of_run(0, "--set parallel.sequence_parallel=true")
                .find("parallel.sequence_parallel: needs tensor parallelism (parallel.tp > 1), got tp 1 (without it: "
                      "--set parallel.sequence_parallel=false)"),
            std::string::npos);
  EXPECT_NE(error_of_run(0, "--set parallel.cp=3").find("parallel.cp (3): train.seq_len (16) must be divisible by 2 x "
                                                        "cp = 6"),
            std::string::npos);
  // 16 positions over cp 4 are 4 per rank, which tp 8 cannot split (16 alone it could).
  EXPECT_NE(error_of_run(0, "--set parallel.cp=4 --set parallel.tp=8 --set parallel.sequence_parallel=true "
                            "--set model.num_attention_heads=8 --set model.num_key_value_heads=8")
                .find("parallel.sequence_parallel: train.seq_len / parallel.cp (16 / 4 = 4) must be divisible by "
                      "parallel.tp (8)"),
            std::string::npos);
  EXPECT_NE(error_of_run(2, "--set parallel.cp=2 --set parallel.tp=2")
                .find("parallel.tp x parallel.cp (2 x 2) must divide the number of processes (2)"),
            std::string::npos);
}
