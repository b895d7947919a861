// The tensor-parallel pieces of src/parallel, each against one process: the
// world is one TP group of size n (1, 2 or 4 under ctest); every rank computes
// the full single-process result too and compares its slice.
#include <gtest/gtest.h>

#include <algorithm>
#include <vector>

#include "kernels/cpu/ops.h"
#include "parallel/linear.h"
#include "parallel/mpi_world.h"
#include "parallel/parallel_groups.h"
#include "parallel/tensor_parallel.h"
#include "parallel/tp_region.h"
#include "parallel/vocab_parallel_loss.h"

namespace kvs {
namespace {

using testing_util::rel_err;
using testing_util::seeded;
using testing_util::world;

TensorParallel world_tp() { return {world().rank(), world().size(), &world()}; }

// Rows [r*n/tp, (r+1)*n/tp) of a row-major [rows, cols] matrix.
std::vector<float> row_slice(const std::vector<float>& m, int rows, int cols, int r, int tp) {
  const int n = rows / tp;
  return {m.begin() + static_cast<size_t>(r) * n * cols, m.begin() + static_cast<size_t>(r + 1) * n * cols};
}
// Columns [r*n/tp, (r+1)*n/tp) of a row-major [rows, cols] matrix.
std::vector<float> col_slice(const std::vector<float>& m, int rows, int cols, int r, int tp) {
  const int n = cols / tp;
  std::vector<float> out;
  for (int i = 0; i < rows; ++i)
    out.insert(out.end(), m.begin() + static_cast<size_t>(i) * cols + r * n,
               m.begin() + static_cast<size_t>(i) * cols + (r + 1) * n);
  return out;
}

// [N, 2F] from two [N, F]: a's row, then b's (SwiGLU's gate_up).
std::vector<float> side_by_side(const std::vector<float>& a, const std::vector<float>& b, int N, int F) {
  std::vector<float> out;
  for (int i = 0; i < N; ++i) {
    out.insert(out.end(), a.begin() + static_cast<size_t>(i) * F, a.begin() + static_cast<size_t>(i + 1) * F);
    out.insert(out.end(), b.begin() + static_cast<size_t>(i) * F, b.begin() + static_cast<size_t>(i + 1) * F);
  }
  return out;
}
// Its inverse: the first F columns of each row into a, the other F into b.
void split_halves(const std::vector<float>& ab, int N, int F, std::vector<float>& a, std::vector<float>& b) {
  a.resize(static_cast<size_t>(N) * F);
  b.resize(static_cast<size_t>(N) * F);
  for (size_t i = 0; i < static_cast<size_t>(N); ++i)
    for (size_t j = 0; j < static_cast<size_t>(F); ++j) a[i * F + j] = ab[i * 2 * F + j], b[i * F + j] = ab[i * 2 * F + F + j];
}

TEST(TensorParallelRegion, SumsAcrossTheGroupOnlyWhereMegatronDoes) {
  const TensorParallelRegion region(world_tp());
  const int n = world().size(), r = world().rank();
  std::vector<float> y = {1.0f + r, 10.0f * r}, dx = y;
  region.exit_forward(y.data(), y.size());
  region.enter_backward(dx.data(), dx.size());
  const float sum0 = n + n * (n - 1) / 2.0f, sum1 = 10.0f * n * (n - 1) / 2.0f;
  EXPECT_EQ(y, (std::vector<float>{sum0, sum1}));
  EXPECT_EQ(dx, y);
  EXPECT_EQ(region.active(), n > 1);
}

// The MLP of a decoder layer: {gate, up} = column-parallel(x) as a group of
// two layers, h = SwiGLU, y = row-parallel(h), forward and backward, against
// the full matrices.
TEST(ParallelLinear, ColumnThenRowParallelMlpMatchesOneProcess) {
  const int tp = world().size(), r = world().rank();
  const int N = 6, C = 8, F = 16, Fl = F / tp;
  const std::vector<float> x = seeded(N * C, 1), wg = seeded(F * C, 2, 0.5f), wu = seeded(F * C, 3, 0.5f);
  const std::vector<float> wd = seeded(C * F, 4, 0.5f), dy = seeded(N * C, 5);

  // One process, full tensors.
  std::vector<float> g(N * F), u(N * F), h(N * F), y(N * C);
  cpu::matmul_forward(g.data(), x.data(), wg.data(), N, C, F);
  cpu::matmul_forward(u.data(), x.data(), wu.data(), N, C, F);
  const std::vector<float> gu = side_by_side(g, u, N, F);
  cpu::swiglu_forward(h.data(), gu.data(), N, F);
  cpu::matmul_forward(y.data(), h.data(), wd.data(), N, F, C);
  std::vector<float> dh(N * F, 0.0f), dgu(N * 2 * F, 0.0f), dg, du, dx(N * C, 0.0f);
  std::vector<float> dwg(F * C, 0.0f), dwu(F * C, 0.0f), dwd(C * F, 0.0f);
  cpu::matmul_backward(dh.data(), dwd.data(), dy.data(), h.data(), wd.data(), N, F, C);
  cpu::swiglu_backward(dgu.data(), dh.data(), gu.data(), N, F);
  split_halves(dgu, N, F, dg, du);
  cpu::matmul_backward(dx.data(), dwg.data(), dg.data(), x.data(), wg.data(), N, C, F);
  cpu::matmul_backward(dx.data(), dwu.data(), du.data(), x.data(), wu.data(), N, C, F);

  // This rank's slices through the parallel layers.
  const TensorParallelRegion region(world_tp());
  const std::vector<float> wg_l = row_slice(wg, F, C, r, tp), wu_l = row_slice(wu, F, C, r, tp);
  const std::vector<float> wd_l = col_slice(wd, C, F, r, tp);
  std::vector<float> g_l(N * Fl), u_l(N * Fl), h_l(N * Fl), y_p(N * C);
  column_parallel_forward(x.data(), N, C, {{g_l.data(), wg_l.data(), Fl}, {u_l.data(), wu_l.data(), Fl}}, region);
  const std::vector<float> gu_l = side_by_side(g_l, u_l, N, Fl);
  cpu::swiglu_forward(h_l.data(), gu_l.data(), N, Fl);
  row_parallel_forward(y_p.data(), h_l.data(), wd_l.data(), N, Fl, C, region);
  EXPECT_LT(rel_err(y_p.data(), y.data(), y.size()), 1e-6);
  const std::vector<float> g_ref = col_slice(g, N, F, r, tp);
  // (BLAS may block a narrower GEMM differently: equal up to rounding, not bits.)
  EXPECT_LT(rel_err(g_l.data(), g_ref.data(), g_ref.size()), 1e-6);

  std::vector<float> dh_l(N * Fl, 0.0f), dgu_l(N * 2 * Fl, 0.0f), dg_l, du_l, dx_p(N * C, 7.0f);
  std::vector<float> dwg_l(Fl * C, 0.0f), dwu_l(Fl * C, 0.0f), dwd_l(C * Fl, 0.0f);
  row_parallel_backward(dh_l.data(), dwd_l.data(), dy.data(), h_l.data(), wd_l.data(), N, Fl, C, region);
  cpu::swiglu_backward(dgu_l.data(), dh_l.data(), gu_l.data(), N, Fl);
  split_halves(dgu_l, N, Fl, dg_l, du_l);
  column_parallel_backward(dx_p.data(), x.data(), N, C,
                           {{dg_l.data(), wg_l.data(), dwg_l.data(), Fl}, {du_l.data(), wu_l.data(), dwu_l.data(), Fl}},
                           region);  // dx_p starts as garbage: the group overwrites it
  EXPECT_LT(rel_err(dx_p.data(), dx.data(), dx.size()), 1e-6);
  const std::vector<float> dwg_ref = row_slice(dwg, F, C, r, tp), dwu_ref = row_slice(dwu, F, C, r, tp);
  const std::vector<float> dwd_ref = col_slice(dwd, C, F, r, tp);
  EXPECT_LT(rel_err(dwg_l.data(), dwg_ref.data(), dwg_ref.size()), 1e-6);
  EXPECT_LT(rel_err(dwu_l.data(), dwu_ref.data(), dwu_ref.size()), 1e-6);
  EXPECT_LT(rel_err(dwd_l.data(), dwd_ref.data(), dwd_ref.size()), 1e-6);
}

// The same MLP under sequence parallelism, as the CPU engine runs it: every
// rank holds only its N/tp rows of x and of dy; one column-parallel layer
// (this rank's gate rows and up rows as one [2F/tp, C] matrix) gathers them,
// the row-parallel layer reduce-scatters its output, and the rows each rank
// ends with are those rows of the one-process results.
TEST(ParallelLinear, SequenceParallelMlpMatchesOneProcessRows) {
  const int tp = world().size(), r = world().rank();
  const int N = 8, C = 8, F = 16, Fl = F / tp, Nl = N / tp;
  const std::vector<float> x = seeded(N * C, 11), wg = seeded(F * C, 12, 0.5f), wu = seeded(F * C, 13, 0.5f);
  const std::vector<float> wd = seeded(C * F, 14, 0.5f), dy = seeded(N * C, 15);
  std::vector<float> g(N * F), u(N * F), h(N * F), y(N * C), dh(N * F, 0.0f), dgu(N * 2 * F, 0.0f), dg, du;
  std::vector<float> dx(N * C, 0.0f), dwg(F * C, 0.0f), dwu(F * C, 0.0f), dwd(C * F, 0.0f);
  cpu::matmul_forward(g.data(), x.data(), wg.data(), N, C, F);
  cpu::matmul_forward(u.data(), x.data(), wu.data(), N, C, F);
  const std::vector<float> gu = side_by_side(g, u, N, F);
  cpu::swiglu_forward(h.data(), gu.data(), N, F);
  cpu::matmul_forward(y.data(), h.data(), wd.data(), N, F, C);
  cpu::matmul_backward(dh.data(), dwd.data(), dy.data(), h.data(), wd.data(), N, F, C);
  cpu::swiglu_backward(dgu.data(), dh.data(), gu.data(), N, F);
  split_halves(dgu, N, F, dg, du);
  cpu::matmul_backward(dx.data(), dwg.data(), dg.data(), x.data(), wg.data(), N, C, F);
  cpu::matmul_backward(dx.data(), dwu.data(), du.data(), x.data(), wu.data(), N, C, F);

  const TensorParallelRegion region({r, tp, &world(), true}, true);
  ASSERT_EQ(region.local_rows(N), static_cast<size_t>(tp > 1 ? Nl : N));
  const size_t lo = region.first_row(N) * C, rows = region.local_rows(N);
  const std::vector<float> x_l(x.begin() + lo, x.begin() + lo + rows * C), dy_l(dy.begin() + lo, dy.begin() + lo + rows * C);
  std::vector<float> wgu_l = row_slice(wg, F, C, r, tp);
  const std::vector<float> wu_l = row_slice(wu, F, C, r, tp), wd_l = col_slice(wd, C, F, r, tp);
  wgu_l.insert(wgu_l.end(), wu_l.begin(), wu_l.end());
  std::vector<float> full(N * C), full2(N * C), gu_l(N * 2 * Fl), h_l(N * Fl), y_l(rows * C);
  column_parallel_forward(x_l.data(), N, C, {{gu_l.data(), wgu_l.data(), 2 * Fl}}, region, full.data());
  cpu::swiglu_forward(h_l.data(), gu_l.data(), N, Fl);
  row_parallel_forward(y_l.data(), h_l.data(), wd_l.data(), N, Fl, C, region, full.data());
  EXPECT_LT(rel_err(y_l.data(), y.data() + lo, y_l.size()), 1e-6);

  std::vector<float> dh_l(N * Fl, 0.0f), dgu_l(N * 2 * Fl, 7.0f), dx_l(rows * C);
  std::vector<float> dwgu_l(2 * Fl * C, 0.0f), dwd_l(C * Fl, 0.0f);
  row_parallel_backward(dh_l.data(), dwd_l.data(), dy_l.data(), h_l.data(), wd_l.data(), N, Fl, C, region, full.data());
  cpu::swiglu_backward(dgu_l.data(), dh_l.data(), gu_l.data(), N, Fl, /*overwrite=*/true);
  column_parallel_backward(dx_l.data(), x_l.data(), N, C, {{dgu_l.data(), wgu_l.data(), dwgu_l.data(), 2 * Fl}},
                           region, full.data(), full2.data());
  EXPECT_LT(rel_err(dx_l.data(), dx.data() + lo, dx_l.size()), 1e-6);
  std::vector<float> dwgu_ref = row_slice(dwg, F, C, r, tp);
  const std::vector<float> dwu_ref = row_slice(dwu, F, C, r, tp), dwd_ref = col_slice(dwd, C, F, r, tp);
  dwgu_ref.insert(dwgu_ref.end(), dwu_ref.begin(), dwu_ref.end());
  EXPECT_LT(rel_err(dwgu_l.data(), dwgu_ref.data(), dwgu_ref.size()), 1e-6);
  EXPECT_LT(rel_err(dwd_l.data(), dwd_ref.data(), dwd_ref.size()), 1e-6);
}

TEST(ParallelLinear, VocabParallelEmbeddingMatchesOneProcessExactly) {
  const int tp = world().size(), r = world().rank();
  const int N = 9, C = 4, V = 12, Vl = V / tp;
  const std::vector<float> wte = seeded(V * C, 6), dout = seeded(N * C, 7);
  const std::vector<int32_t> tokens = {0, 11, 3, 3, 7, 5, 11, 1, 6};
  std::vector<float> out(N * C), dwte(V * C, 0.0f);
  cpu::embedding_forward(out.data(), tokens.data(), wte.data(), N, C);
  cpu::embedding_backward(dwte.data(), dout.data(), tokens.data(), N, C);

  const std::vector<float> wte_l = row_slice(wte, V, C, r, tp);
  std::vector<float> out_p(N * C), dwte_l(Vl * C, 0.0f);
  vocab_parallel_embedding_forward(out_p.data(), tokens.data(), wte_l.data(), N, C, r * Vl, Vl,
                                   TensorParallelRegion(world_tp()));
  vocab_parallel_embedding_backward(dwte_l.data(), dout.data(), tokens.data(), N, C, r * Vl, Vl,
                                    TensorParallelRegion(world_tp()));
  EXPECT_EQ(out_p, out);  // one rank's row plus zeros
  EXPECT_EQ(dwte_l, row_slice(dwte, V, C, r, tp));
}

// Megatron's vocab-parallel cross-entropy against the single-process op:
// losses, the gradient slice and the argmax (ties go to the lowest id), with
// masked rows and a vocabulary padded to 128 * tp.
TEST(VocabParallelCrossEntropy, MatchesTheSingleProcessOp) {
  const int tp = world().size(), r = world().rank();
  ModelConfig m;
  m.hidden_size = 8;
  m.num_attention_heads = m.num_key_value_heads = 4;
  m.intermediate_size = 16;
  m.vocab_size = 300;
  const LocalDims d = LocalDims::of(m, r, tp);
  const int N = 5, V = m.vocab_size;
  std::vector<float> logits = seeded(static_cast<size_t>(N) * V, 8, 4.0f);
  logits[2 * V + 17] = logits[2 * V + 250] = 50.0f;  // a tie across ranks: id 17 wins
  const std::vector<int32_t> targets = {3, 299, -1, 128, 0};
  const std::vector<float> mask = {1, 1, 0, 1, 1};
  const double scale = 0.25;
  std::vector<float> losses(N), dlogits(static_cast<size_t>(N) * V);
  std::vector<int32_t> argmax(N);
  cpu::cross_entropy_forward_backward(losses.data(), dlogits.data(), argmax.data(), logits.data(), targets.data(),
                                      mask.data(), N, V, scale);

  // This rank's columns of the padded vocabulary (padding columns hold garbage: never read).
  std::vector<float> local(static_cast<size_t>(N) * d.V, 1e30f);
  for (int n = 0; n < N; ++n)
    for (int j = 0; j < d.V; ++j)
      if (d.v_begin + j < V) local[static_cast<size_t>(n) * d.V + j] = logits[static_cast<size_t>(n) * V + d.v_begin + j];
  std::vector<float> losses_p(N), dlocal(local.size());
  std::vector<int32_t> argmax_p(N);
  std::vector<double> scratch;
  vocab_parallel_cross_entropy(losses_p.data(), dlocal.data(), argmax_p.data(), local.data(), targets.data(),
                               mask.data(), N, d, scale, world(), scratch);
  EXPECT_LT(rel_err(losses_p.data(), losses.data(), N), 1e-6);
  EXPECT_EQ(argmax_p, argmax);
  for (int n = 0; n < N; ++n)
    for (int j = 0; j < d.V; ++j) {
      const int id = d.v_begin + j;
      const float want = id < V ? dlogits[static_cast<size_t>(n) * V + id] : 0.0f;
      EXPECT_NEAR(dlocal[static_cast<size_t>(n) * d.V + j], want, 1e-7) << "row " << n << " id " << id;
    }
}

// dp x tp groups: consecutive ranks form a TP group; the DP group holds the
// ranks with the same TP rank. Checked through sums over each group.
TEST(ParallelGroups, TensorParallelRanksAreAdjacent) {
  const int n = world().size(), r = world().rank();
  for (int tp = 1; tp <= n; tp *= 2) {
    if (n % tp) continue;
    ParallelGroups g = ParallelGroups::make(world(), tp);
    EXPECT_EQ(g.tp_rank, r % tp);
    EXPECT_EQ(g.dp_rank, r / tp);
    EXPECT_EQ(g.tp_comm->size(), tp);
    EXPECT_EQ(g.dp_comm->size(), n / tp);
    double tp_sum = r, dp_sum = r;
    g.tp_comm->all_reduce(&tp_sum, 1, dist::DType::F64, dist::ReduceOp::Sum);
    g.dp_comm->all_reduce(&dp_sum, 1, dist::DType::F64, dist::ReduceOp::Sum);
    const int first = r / tp * tp;  // this replica's first rank
    EXPECT_EQ(tp_sum, tp * first + tp * (tp - 1) / 2.0);
    double want = 0;
    for (int q = r % tp; q < n; q += tp) want += q;
    EXPECT_EQ(dp_sum, want);
  }
}

}  // namespace
}  // namespace kvs
