// Ring attention's kernels (context parallelism, model/cuda_engine_cp.cpp):
// the queries of one chunk (positions T .. 2T - 1) against the keys of the
// chunk before it (positions 0 .. T - 1, every key visible: causal = false)
// and of their own chunk (the diagonal: causal), merged by attention_merge,
// must be attention over all 2T keys; the backward of each block from the
// merged output and lse, dq summed in fp32 (add_bf16_to_f32), must be its
// gradient. Against kvs::cpu::attention_forward/backward in double with the
// flash tests' tolerances (tests/simt/simt_flash.cpp). The same with document
// masks (ops.h AttentionDocs: the starts in the query chunk's rows, the earlier
// chunk's keys at key_row0 = -T; queries whose document starts in their own
// chunk see none of its keys), on the mma.sync and, on a 9.0 GPU, the Hopper
// kernels:
//   out: rtol 1e-2, atol 1e-2 (bf16 partial outputs merged in fp32); lse: rtol 1e-5, atol 2e-4;
//   dq, dk, dv: rtol 2e-2, atol 1e-2 max|ref| + 1e-3.
#ifdef KVS_CUDA
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <limits>
#include <vector>

#include "cuda_test_util.h"
#include "kernels/cpu/ops.h"
#include "kernels/cuda/ops.h"

namespace {

using namespace kvs::cuda_test;
namespace kc = kvs::cuda;
using FVec = std::vector<float>;
using DVec = std::vector<double>;

double max_abs(const DVec& x) {
  double m = 0;
  for (double v : x) m = std::max(m, std::fabs(v));
  return m;
}

// Rows [b][t0, t0 + T) of an [B][2T][width] tensor.
FVec half_of(const FVec& x, int B, int T, int width, int t0) {
  FVec out(static_cast<size_t>(B) * T * width);
  for (int b = 0; b < B; ++b)
    std::copy_n(x.begin() + (static_cast<size_t>(b) * 2 * T + t0) * width, static_cast<size_t>(T) * width,
                out.begin() + static_cast<size_t>(b) * T * width);
  return out;
}

// Document starts over 2T positions: documents of 1 to 3T/4 rows, so some
// run from the first chunk into the second.
std::vector<int32_t> document_starts(int B, int T2) {
  std::vector<int32_t> doc(static_cast<size_t>(B) * T2);
  for (int b = 0; b < B; ++b) {
    int start = 0, next = 1 + (5 + 7 * b) % T2;
    for (int t = 0; t < T2; ++t) {
      if (t == next) start = t, next = t + 1 + (t * 37 + b * 11) % (3 * T2 / 8);
      doc[static_cast<size_t>(b) * T2 + t] = start;
    }
  }
  return doc;
}

void expect_ring_of_two_blocks_is_whole_attention(int B, int T, int Hq, int Hkv, int D, uint64_t seed,
                                                  bool docs = false, kc::FlashLoads loads = kc::FlashLoads::kAsync) {
  SCOPED_TRACE(testing::Message() << "B " << B << " T " << T << " Hq " << Hq << " Hkv " << Hkv << " D " << D
                                  << (docs ? " documents" : "") << (loads == kc::FlashLoads::kHopper ? " wgmma" : ""));
  const int QD = Hq * D, KD = Hkv * D;
  const size_t NQ = static_cast<size_t>(B) * T * QD, NK = static_cast<size_t>(B) * T * KD;
  const FVec q = random_bf16_values(NQ, seed), k2 = random_bf16_values(2 * NK, seed + 1),
             v2 = random_bf16_values(2 * NK, seed + 2), dout = random_bf16_values(NQ, seed + 3);
  const DVec qd = to_double(q), kd = to_double(k2), vd = to_double(v2), dod = to_double(dout);
  // The queries' document starts: positions for the reference, rows of
  // their own chunk for the kernels.
  std::vector<int32_t> ref_doc, row_doc;
  if (docs) {
    const std::vector<int32_t> all = document_starts(B, 2 * T);
    for (int b = 0; b < B; ++b)
      for (int t = 0; t < T; ++t) {
        ref_doc.push_back(all[static_cast<size_t>(b) * 2 * T + T + t]);
        row_doc.push_back(ref_doc.back() - T);
      }
  }
  DVec out(NQ), lse(static_cast<size_t>(B) * Hq * T), att(static_cast<size_t>(B) * Hq * T * 2 * T);
  kvs::cpu::attention_forward<double>(out.data(), att.data(), lse.data(), qd.data(), kd.data(), vd.data(), B, T, 2 * T,
                                      Hq, Hkv, D, T, 0, docs ? ref_doc.data() : nullptr);
  DVec dq(NQ, 0.0), dk(2 * NK, 0.0), dv(2 * NK, 0.0);
  kvs::cpu::attention_backward<double>(dq.data(), dk.data(), dv.data(), dod.data(), qd.data(), kd.data(),
                                       vd.data(), att.data(), B, T, 2 * T, Hq, Hkv, D, T, 0);

  DeviceBuffer<bf16> d_q(to_bf16(q)), d_dout(to_bf16(dout)), d_part(NQ), d_out(NQ), d_dq(NQ);
  DeviceBuffer<bf16> d_k[2] = {DeviceBuffer<bf16>(to_bf16(half_of(k2, B, T, KD, 0))),
                               DeviceBuffer<bf16>(to_bf16(half_of(k2, B, T, KD, T)))};
  DeviceBuffer<bf16> d_v[2] = {DeviceBuffer<bf16>(to_bf16(half_of(v2, B, T, KD, 0))),
                               DeviceBuffer<bf16>(to_bf16(half_of(v2, B, T, KD, T)))};
  DeviceBuffer<bf16> d_dk[2] = {DeviceBuffer<bf16>(NK), DeviceBuffer<bf16>(NK)};
  DeviceBuffer<bf16> d_dv[2] = {DeviceBuffer<bf16>(NK), DeviceBuffer<bf16>(NK)};
  DeviceBuffer<float> d_acc(FVec(NQ, std::nanf(""))), d_part_lse(lse.size()),
      d_lse(FVec(lse.size(), -std::numeric_limits<float>::infinity())), d_dq_acc(FVec(NQ, 0.0f)),
      d_scratch(kc::flash_attention_backward_scratch_floats(B, T, Hq, D));
  DeviceBuffer<int32_t> d_doc(docs ? row_doc : std::vector<int32_t>(1));
  auto docs_of = [&](int blk) { return kc::AttentionDocs{docs ? d_doc.get() : nullptr, blk == 1 ? 0 : -T}; };
  for (int blk = 0; blk < 2; ++blk) {  // the earlier chunk (full), then the diagonal (causal)
    kc::flash_attention_forward(d_part.get(), d_part_lse.get(), d_q.get(), QD, d_k[blk].get(), d_v[blk].get(), KD, B,
                                T, Hq, Hkv, D, blk == 1, loads, 0, docs_of(blk));
    kc::attention_merge(d_acc.get(), d_lse.get(), d_part.get(), d_part_lse.get(), B, T, Hq, D, 0);
  }
  const FVec got_out = d_acc.download(), got_lse = d_lse.download();
  EXPECT_TRUE(all_close(got_out, to_float(out), 1e-2, 1e-2)) << "merged output";
  EXPECT_TRUE(all_close(got_lse, to_float(lse), 1e-5, 2e-4)) << "merged lse";

  kc::f32_to_bf16(d_out.get(), d_acc.get(), NQ, 0);
  for (int blk = 0; blk < 2; ++blk) {
    kc::flash_attention_backward(d_dq.get(), d_dk[blk].get(), d_dv[blk].get(), d_dout.get(), d_out.get(), d_lse.get(),
                                 d_q.get(), QD, d_k[blk].get(), d_v[blk].get(), KD, B, T, Hq, Hkv, D, blk == 1,
                                 loads, d_scratch.get(), 0, docs_of(blk));
    kc::add_bf16_to_f32(d_dq_acc.get(), d_dq.get(), NQ, 0);
  }
  FVec got_dk(2 * NK), got_dv(2 * NK);
  for (int blk = 0; blk < 2; ++blk) {
    const FVec a = download_f32(d_dk[blk]), b = download_f32(d_dv[blk]);
    for (int s = 0; s < B; ++s) {
      std::copy_n(a.begin() + static_cast<size_t>(s) * T * KD, static_cast<size_t>(T) * KD,
                  got_dk.begin() + (static_cast<size_t>(s) * 2 * T + blk * T) * KD);
      std::copy_n(b.begin() + static_cast<size_t>(s) * T * KD, static_cast<size_t>(T) * KD,
                  got_dv.begin() + (static_cast<size_t>(s) * 2 * T + blk * T) * KD);
    }
  }
  EXPECT_TRUE(all_close(d_dq_acc.download(), to_float(dq), 2e-2, 1e-2 * max_abs(dq) + 1e-3)) << "dq";
  EXPECT_TRUE(all_close(got_dk, to_float(dk), 2e-2, 1e-2 * max_abs(dk) + 1e-3)) << "dk";
  EXPECT_TRUE(all_close(got_dv, to_float(dv), 2e-2, 1e-2 * max_abs(dv) + 1e-3)) << "dv";
}

TEST(CudaRingAttention, TwoMergedBlocksAreAttentionOverBothChunks) {
  KVS_REQUIRE_GPU();
  expect_ring_of_two_blocks_is_whole_attention(2, 37, 4, 2, 16, 7100);  // a partial tile, GQA
  expect_ring_of_two_blocks_is_whole_attention(1, 70, 4, 4, 64, 7200);  // two tiles per block
  expect_ring_of_two_blocks_is_whole_attention(1, 130, 4, 2, 128, 7300, false, kc::FlashLoads::kHopper);
}

TEST(CudaRingAttention, DocumentMasksAcrossChunks) {
  KVS_REQUIRE_GPU();
  expect_ring_of_two_blocks_is_whole_attention(2, 37, 4, 2, 16, 7400, true);
  expect_ring_of_two_blocks_is_whole_attention(2, 130, 4, 2, 64, 7500, true);
  // kHopper: the Hopper kernels on a 9.0 GPU (elsewhere the mma.sync ones again).
  expect_ring_of_two_blocks_is_whole_attention(2, 130, 4, 2, 64, 7600, true, kc::FlashLoads::kHopper);
  expect_ring_of_two_blocks_is_whole_attention(1, 200, 4, 1, 128, 7700, true, kc::FlashLoads::kHopper);
}

}  // namespace
#endif  // KVS_CUDA
