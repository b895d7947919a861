// Embedding under the emulator, with tests/kernels/cuda/test_embedding.cpp's and
// tests/parallel/test_cuda_tp.cpp's shapes and tolerances:
// - embedding_forward_kernel (whole table and a vocabulary slice: other
//   tokens give zero rows) vs kvs::cpu::embedding_forward: exact (a copy),
//   every output element written (output starts NaN);
// - embedding_backward_kernel with the real host plan (embedding_backward_plan)
//   vs kvs::cpu::embedding_backward in double, adding into random initial
//   values: rtol 1e-5, atol 1e-5; rows of absent tokens bit-identical.
// Launches mirror embedding_forward_vocab_slice (256 threads, grid-stride) and
// embedding_backward (U blocks of row_threads(C / V)).
#include "gen_embedding.h"
#include "kernels/cpu/ops.h"
#include "simt_util.h"

#include <climits>

namespace simt {
namespace {

namespace kc = kvs::cuda;

std::vector<int32_t> random_tokens(int N, int V, uint64_t seed) {
  std::mt19937_64 g(seed);
  std::vector<int32_t> t(N);
  for (auto& x : t) x = int32_t(g() % uint64_t(V));
  return t;
}

// vec: the launcher's V = 8 path (C % 8 == 0) or V = 1; grid 0: the launcher's.
// tokens: given, or random in [0, V) when empty.
void forward(int N, int C, int V, int v_begin, int v_rows, bool vec, unsigned grid = 0,
             std::vector<int32_t> tokens = {}) {
  const std::string tag = "embedding fwd W=" + std::to_string(vec ? 8 : 1) + " N" + std::to_string(N) + " C" +
                          std::to_string(C) + " V" + std::to_string(V) + " slice " + std::to_string(v_begin) + "+" +
                          (v_rows == INT_MAX ? std::string("all") : std::to_string(v_rows)) +
                          (grid ? " grid " + std::to_string(grid) : "");
  if (tokens.empty()) tokens = random_tokens(N, V, 1 + N);
  N = (int)tokens.size();
  const int rows = v_rows == INT_MAX ? V - v_begin : v_rows;  // the table holds this rank's rows only
  const auto wte_full = randn((size_t)V * C, 2 + C);
  const std::vector<float> wte(wte_full.begin() + (size_t)v_begin * C, wte_full.begin() + (size_t)(v_begin + rows) * C);
  std::vector<float> want((size_t)N * C);
  kvs::cpu::embedding_forward<float>(want.data(), tokens.data(), wte.data(), N, C, v_begin, rows);
  // One NaN row after the table: reading a row past the slice shows.
  std::vector<bf16> wb = b16(wte);
  wb.resize(wb.size() + C, poison_bf16());
  std::vector<bf16> out((size_t)N * C, poison_bf16());
  const int threads = 256;
  const size_t chunks = (size_t)N * (vec ? C / 8 : C);
  if (!grid) grid = (unsigned)std::min<size_t>((chunks + threads - 1) / threads, 1u << 16);
  emu::launch(emu::Dim{grid, 1, 1}, threads, [&] {
    if (vec) kc::embedding_forward_kernel<8>(out.data(), tokens.data(), wb.data(), N, C, v_begin, v_rows);
    else kc::embedding_forward_kernel<1>(out.data(), tokens.data(), wb.data(), N, C, v_begin, v_rows);
  });
  check(tag, "out", f32(out), want, 0.0, 0.0);
  done(tag);
}

void backward(int N, int C, int Vtok, bool vec) {
  const std::string tag = "embedding bwd W=" + std::to_string(vec ? 8 : 1) + " N" + std::to_string(N) + " C" +
                          std::to_string(C) + " V" + std::to_string(Vtok);
  const int V = Vtok + 3;  // tokens V .. V + 2 never occur
  const auto tokens = random_tokens(N, Vtok, 3 + N);
  const auto dout = randn((size_t)N * C, 4 + C);
  const auto dwte0 = randu((size_t)V * C, 5 + C, -1.0f, 1.0f, false);
  std::vector<double> want(dwte0.begin(), dwte0.end());
  const std::vector<double> doutd(dout.begin(), dout.end());
  kvs::cpu::embedding_backward<double>(want.data(), doutd.data(), tokens.data(), N, C);
  std::vector<int32_t> uniq(N), offsets(N + 1), positions(N);
  const int U = kc::embedding_backward_plan(tokens.data(), N, uniq.data(), offsets.data(), positions.data());
  const auto db = b16(dout);
  std::vector<float> dwte = dwte0;
  emu::launch(emu::Dim{(unsigned)U, 1, 1}, kc::row_threads(vec ? C / 8 : C), [&] {
    if (vec) kc::embedding_backward_kernel<8>(dwte.data(), db.data(), uniq.data(), offsets.data(), positions.data(), C);
    else kc::embedding_backward_kernel<1>(dwte.data(), db.data(), uniq.data(), offsets.data(), positions.data(), C);
  });
  check(tag, "dwte", dwte, want, 1e-5, 1e-5);
  bool untouched = true;
  for (size_t i = (size_t)Vtok * C; i < (size_t)V * C; ++i) untouched &= dwte[i] == dwte0[i];
  expect(untouched, tag, "rows of absent tokens changed");
  done(tag);
}

}  // namespace

void run_embedding() {
  // tests/kernels/cuda/test_embedding.cpp's kEmbShapes {N, C, V}: {1, 8, 3}, {7, 5, 11}, {33, 24, 50},
  // {64, 768, 100}, {5, 1001, 7}, {300, 64, 4}
  const int shapes[][3] = {{1, 8, 3}, {7, 5, 11}, {33, 24, 50}, {64, 768, 100}, {5, 1001, 7}, {300, 64, 4}};
  for (const auto& s : shapes) {
    const bool vec = s[1] % 8 == 0;
    forward(s[0], s[1], s[2], 0, INT_MAX, vec);
    if (vec) forward(s[0], s[1], s[2], 0, INT_MAX, false);
    backward(s[0], s[1], s[2], vec);
    if (vec) backward(s[0], s[1], s[2], false);
  }
  // Vocabulary slices (tests/parallel/test_cuda_tp.cpp: vocab 257 over tp 2, 128 rows each), tokens on both
  // sides of each slice's edges: rank 1's rows, rank 0's, and the whole table.
  const std::vector<int32_t> edges = {0, 127, 128, 200, 255, 256, 130, 3, 254};
  forward(9, 24, 257, 128, 128, true, 0, edges);
  forward(9, 24, 257, 128, 128, false, 0, edges);
  forward(9, 20, 257, 0, 128, false, 0, edges);
  forward(9, 24, 257, 0, 128, true, 0, edges);
  forward(9, 24, 257, 0, INT_MAX, true, 0, edges);
  // Grid-stride loop: fewer blocks than chunks.
  forward(700, 64, 512, 256, 256, true, 3);
  forward(700, 24, 512, 256, 256, false, 5);
}

}  // namespace simt
