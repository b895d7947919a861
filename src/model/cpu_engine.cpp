// The CPU reference engine: the embedding, the decoder layers of
// model/cpu_block.h one by one, the final norm, the LM head and the masked
// cross-entropy, on one activation buffer planned in the constructor.
#include "model/cpu_engine.h"

#include <omp.h>

#include <algorithm>
#include <cmath>
#include <new>

#include "core/blas_address_space.h"
#include "core/error.h"
#include "core/profile_range.h"
#include "dist/comm.h"
#include "kernels/cpu/op_profile.h"
#include "kernels/cpu/ops.h"
#include "kernels/cpu/row_reduce.h"
#include "model/rope_frequencies.h"
#include "parallel/linear.h"
#include "parallel/vocab_parallel_loss.h"

namespace kvs {

namespace prof = cpu::profile;

namespace {
void zero(float* p, size_t n) {
  const prof::Scope timed("zero grads/scratch");
  cpu::zero_fill(p, n);
}
}  // namespace

ActivationPlan ActivationPlan::build(const ModelConfig& m, const LocalDims& d, int B, int T, int sp_ranks, int cp) {
  return build(m, d, B, T, sp_ranks, cp, std::vector<int>(m.num_hidden_layers, 0), true);
}

ActivationPlan ActivationPlan::build(const ModelConfig& m, const LocalDims& d, int B, int T, int sp_ranks, int cp,
                                     const std::vector<int>& chunk_of, bool head) {
  ActivationPlan p;
  const size_t N = static_cast<size_t>(B) * T / cp, L = chunk_of.size(), C = d.C;
  const size_t chunks = L ? static_cast<size_t>(chunk_of.back()) + 1 : 1;
  const size_t Nl = N / sp_ranks;  // the residual stream's rows on this rank
  const size_t QD = d.QD(), KD = d.KD(), F = d.F, V = d.V;
  const size_t H = d.Hq, D = d.D;
  size_t off = 0;
  auto take = [&](size_t n) {
    size_t at = off;
    off += (n + 15) / 16 * 16;  // 64-byte aligned slices
    return at;
  };
  p.resid_stride = Nl * C;
  p.res_mid_stride = Nl * C;
  p.ln_stride = Nl * C;
  p.rstd_stride = Nl;
  p.q_stride = N * QD;
  p.kv_stride = N * KD;
  p.att_stride = cp > 1 ? ContextParallelAttention::att_floats(cp, B, static_cast<int>(H), T)
                        : static_cast<size_t>(B) * H * T * T;
  p.ffn_stride = N * F;
  const bool shift_q = m.kv_shift.enabled && m.kv_shift.shift_q;
  p.qraw_stride = shift_q ? N * QD : 0;
  p.coef_stride = (H + 2 * static_cast<size_t>(d.Hkv)) * (m.kv_shift.window + 1);
  // A layer's input, then its output as the next layer's input; each chunk ends in one more entry.
  for (size_t li = 0; li < L; ++li) p.resid_index.push_back(static_cast<int>(li) + chunk_of[li]);
  p.resid = take((L + chunks) * p.resid_stride);
  p.res_mid = take(L * p.res_mid_stride);
  p.ln1 = take(L * p.ln_stride);
  p.rstd1 = take(L * p.rstd_stride);
  p.q = take(L * p.q_stride);
  p.qraw = take(L * p.qraw_stride);
  p.coef = take(L * p.coef_stride);
  p.k = take(L * p.kv_stride);
  p.v = take(L * p.kv_stride);
  p.khat = take(L * p.kv_stride);
  p.vhat = take(L * p.kv_stride);
  p.att = take(L * p.att_stride);
  p.attout = take(L * p.q_stride);
  p.ln2 = take(L * p.ln_stride);
  p.rstd2 = take(L * p.rstd_stride);
  p.gate_up = take(L * 2 * p.ffn_stride);
  p.h = take(L * p.ffn_stride);
  p.lnf = take(head ? Nl * C : 0);
  p.rstdf = take(head ? Nl : 0);
  p.logits = take(head ? N * V : 0);
  p.losses = take(head ? N : 0);
  p.rope_cos = take(static_cast<size_t>(T) * D / 2);
  p.rope_sin = take(static_cast<size_t>(T) * D / 2);
  p.dresid = take(Nl * C);
  p.dln = take(Nl * C);
  if (sp_ranks > 1) {
    p.sp_full = take(N * C);
    p.sp_full2 = take(N * C);
    p.norm_grads = take((2 * L + 1) * C);
  }
  p.dh = take(N * F);
  p.dgate_up = take(N * 2 * F);
  p.dattout = take(N * QD);
  p.dq = take(N * QD);
  p.dq_pre = take(N * QD);
  p.dkhat = take(N * KD);
  p.dks = take(N * KD);
  p.dk = take(N * KD);
  p.dvhat = take(N * KD);
  p.dv = take(N * KD);
  p.dqs = take(p.qraw_stride);
  p.dcoef = take(p.coef_stride);
  p.total = off;
  p.v_shifted = m.kv_shift.enabled && m.kv_shift.shift_v;
  return p;
}

LayerActs ActivationPlan::layer(float* a, int li) const {
  const size_t L = li, R = resid_index[li];
  LayerActs x;
  x.resid = a + resid + R * resid_stride;
  x.res_mid = a + res_mid + L * res_mid_stride;
  x.out = a + resid + (R + 1) * resid_stride;
  x.ln1 = a + ln1 + L * ln_stride;
  x.rstd1 = a + rstd1 + L * rstd_stride;
  x.ln2 = a + ln2 + L * ln_stride;
  x.rstd2 = a + rstd2 + L * rstd_stride;
  x.qraw = qraw_stride ? a + qraw + L * qraw_stride : nullptr;
  x.q = a + q + L * q_stride;
  x.k = a + k + L * kv_stride;
  x.v = a + v + L * kv_stride;
  x.khat = a + khat + L * kv_stride;
  x.vhat = v_shifted ? a + vhat + L * kv_stride : x.v;
  x.att = a + att + L * att_stride;
  x.attout = a + attout + L * q_stride;
  x.gate_up = a + gate_up + L * 2 * ffn_stride;
  x.h = a + h + L * ffn_stride;
  x.coef = a + coef + L * coef_stride;
  return x;
}

LayerScratch ActivationPlan::scratch(float* a) const {
  return {a + dln, a + dh, a + dgate_up, a + dattout, a + dq, a + dq_pre, a + dkhat,
          a + dks, a + dk, a + dvhat, a + dv, a + dqs, a + dcoef};
}

CpuEngine::CpuEngine(const ModelConfig& m, int max_batch, int max_seq_len, TensorParallel tp, ContextParallel cp,
                     const ModelPart* part, int slots)
    : m_(m),
      tp_(tp),
      region_(tp, tp.sequence_parallel),
      cp_(cp),
      part_(part ? *part : ModelPart::whole(m)),
      d_(LocalDims::of(m, tp.rank, tp.size)),
      layout_(ParamLayout::build(m, tp.rank, tp.size, part)),
      max_B_(max_batch),
      max_T_(max_seq_len) {
  KVS_CHECK(max_batch >= 1 && max_seq_len >= 1, "engine: batch and sequence length must be positive");
  KVS_CHECK(tp.size == 1 || (tp.comm && tp.comm->size() == tp.size && tp.comm->rank() == tp.rank),
            "engine: tensor-parallel rank {} of {} needs a communicator of that size and rank", tp.rank, tp.size);
  check_tensor_parallel(m, tp.size, "engine");
  KVS_CHECK(!region_.sequence_parallel() || static_cast<int64_t>(max_batch) * max_seq_len / cp.size % tp.size == 0,
            "engine: sequence parallelism needs micro-batch rows ({} x {} / cp {}) divisible by tp ({})", max_batch,
            max_seq_len, cp.size, tp.size);
  KVS_CHECK(slots >= 1, "engine: {} activation slots", slots);
  // The held layers in runs of consecutive ones (pipeline chunks).
  local_of_.assign(m.num_hidden_layers, -1);
  std::vector<int> chunk_of;
  for (size_t li = 0; li < part_.layers.size(); ++li) {
    const int l = part_.layers[li];
    local_of_[l] = static_cast<int>(li);
    const bool starts = li == 0 || part_.layers[li - 1] != l - 1;
    if (starts) chunks_.push_back({static_cast<int>(li), static_cast<int>(li), false, false});
    chunks_.back().last = static_cast<int>(li);
    chunk_of.push_back(static_cast<int>(chunks_.size()) - 1);
  }
  KVS_CHECK(!chunks_.empty(), "engine: a pipeline stage without layers");
  chunks_.front().embedding = part_.embedding;
  chunks_.back().head = part_.head;
  plan_ = ActivationPlan::build(m, d_, max_batch, max_seq_len, region_.sequence_parallel() ? tp.size : 1, cp.size,
                                chunk_of, part_.head);
  const size_t rows = static_cast<size_t>(max_batch) * max_seq_len, local = rows / cp.size;
  if (cp.size > 1) {
    cp_attn_ = std::make_unique<ContextParallelAttention>(cp, d_, m.kv_shift.window, max_batch, max_seq_len);
    cp_gather_.assign(rows, 0.0f);
    cp_ids_.assign(rows, 0.0f);
  }
  const bool docs = m_.document_boundaries != DocumentBoundaries::None;
  slots_.resize(slots);
  for (Slot& s : slots_) {
    s.acts = ZeroedHostBuffer<float>(plan_.total);
    cpu::rope_tables(s.acts.data() + plan_.rope_cos, s.acts.data() + plan_.rope_sin, max_T_, m_.head_dim(),
                     rope_frequencies(m_));
    if (docs) s.doc_start.assign(local, 0);
    if (cp.size > 1) {
      s.cp_inputs.assign(local, 0);
      s.cp_targets.assign(local, 0);
      s.cp_mask.assign(local, 0.0f);
      if (docs) {
        s.cp_shift_doc.assign(local, 0);
        s.cp_doc_full.assign(rows, 0);
      }
    }
  }
  cur_ = &slots_[0];
  params_.assign(layout_.total, 0.0f);
  grads_ = ZeroedHostBuffer<float>(layout_.total);
  opt_end_ = layout_.total;  // the moments are allocated on first use (ensure_moments)
  argmax_.assign(local, 0);
  P_ = bind_params(layout_, m_, params_.data());
  G_ = bind_params(layout_, m_, grads_.data());
}

void CpuEngine::share_params_of(CpuEngine& owner) {
  KVS_CHECK(owner.layout_.total == layout_.total && !owner.params_.empty(),
            "engine: a replica shares the parameters of an engine of the same model");
  params_ = HostVector<float>();
  P_ = bind_params(layout_, m_, owner.params_.data());
}

void CpuEngine::read_params_range(size_t begin, size_t n, float* host) const {
  KVS_CHECK(begin + n <= layout_.total, "read_params_range: [{}, {}) past the {} parameters", begin, begin + n,
            layout_.total);
  std::copy_n(params_.begin() + begin, n, host);
}
void CpuEngine::write_params_range(size_t begin, size_t n, const float* host) {
  KVS_CHECK(begin + n <= layout_.total, "write_params_range: [{}, {}) past the {} parameters", begin, begin + n,
            layout_.total);
  std::copy_n(host, n, params_.begin() + begin);
}
void CpuEngine::read_grads(float* host) const { std::copy(grads_.begin(), grads_.end(), host); }
void CpuEngine::read_optimizer_range(size_t begin, size_t n, float* m, float* v) const {
  KVS_CHECK(begin + n <= layout_.total, "read_optimizer_range: [{}, {}) past the {} parameters", begin, begin + n,
            layout_.total);
  const HeldPart h = held_part(begin, n, opt_begin_, opt_end_);
  for (auto [out, held] : {std::pair{m, &exp_avg_}, std::pair{v, &exp_avg_sq_}}) {
    if (!out) continue;
    std::fill(out, out + n, 0.0f);
    if (h.n && !held->empty()) std::copy_n(held->begin() + (begin + h.at - opt_begin_), h.n, out + h.at);
  }
}
void CpuEngine::write_optimizer_range(size_t begin, size_t n, const float* m, const float* v) {
  KVS_CHECK(begin + n <= layout_.total, "write_optimizer_range: [{}, {}) past the {} parameters", begin, begin + n,
            layout_.total);
  const HeldPart h = held_part(begin, n, opt_begin_, opt_end_);
  if (!h.n) return;
  ensure_moments();
  if (m) std::copy_n(m + h.at, h.n, exp_avg_.begin() + (begin + h.at - opt_begin_));
  if (v) std::copy_n(v + h.at, h.n, exp_avg_sq_.begin() + (begin + h.at - opt_begin_));
}

void CpuEngine::keep_optimizer_range(size_t begin, size_t end) {
  KVS_CHECK(opt_begin_ <= begin && begin <= end && end <= opt_end_,
            "keep_optimizer_range: [{}, {}) is not inside the moments held, [{}, {})", begin, end, opt_begin_, opt_end_);
  if (!exp_avg_.empty()) {
    HostVector<float> m(exp_avg_.begin() + (begin - opt_begin_), exp_avg_.begin() + (end - opt_begin_));
    HostVector<float> v(exp_avg_sq_.begin() + (begin - opt_begin_), exp_avg_sq_.begin() + (end - opt_begin_));
    exp_avg_.swap(m);  // the old, larger buffers are freed here
    exp_avg_sq_.swap(v);
  }
  opt_begin_ = begin;
  opt_end_ = end;
}
void CpuEngine::ensure_moments() {
  if (!exp_avg_.empty() || opt_end_ == opt_begin_) return;
  exp_avg_.assign(opt_end_ - opt_begin_, 0.0f);
  exp_avg_sq_.assign(opt_end_ - opt_begin_, 0.0f);
}
void CpuEngine::reserve_optimizer_state() {
  try {
    ensure_moments();
  } catch (const std::bad_alloc&) {
    const double bytes = 8.0 * static_cast<double>(opt_end_ - opt_begin_);
    const std::string limit = address_space_limit_clause(
        static_cast<uint64_t>(bytes), "the weights, gradients, activations, libraries and threads already take");
    if (!limit.empty())
      fail("the AdamW moments of {} parameters ({:.3g} GiB) do not fit: {}; or lower train.micro_batch_size or "
           "train.seq_len, or shard them (ZeRO-1: more data-parallel processes)",
           opt_end_ - opt_begin_, bytes / (1 << 30), limit);
    fail("the AdamW moments of {} parameters ({:.3g} GiB) do not fit in memory beside the weights, gradients and "
         "activations; lower train.micro_batch_size or train.seq_len, or shard them (ZeRO-1: more data-parallel "
         "processes)",
         opt_end_ - opt_begin_, bytes / (1 << 30));
  }
}
void CpuEngine::zero_grad() { zero(grads_.data(), grads_.size()); }

CpuEngine::Slot& CpuEngine::use(int slot) {
  KVS_CHECK(slot >= 0 && slot < static_cast<int>(slots_.size()), "engine: activation slot {} of {}", slot,
            slots_.size());
  cur_ = &slots_[slot];
  return *cur_;
}

BlockContext CpuEngine::block_context(int B, int T) {
  BlockContext c;
  c.B = B;
  c.T = T;
  c.d = d_;
  c.window = m_.kv_shift.window;
  c.rope = m_.position_encoding == PositionEncoding::Rope;  // else q and k-hat enter attention unrotated
  c.sigmoid_gate = m_.kv_shift.sigmoid_gate();
  c.eps = m_.rms_norm_eps;
  c.rope_cos = acts() + plan_.rope_cos;
  c.rope_sin = acts() + plan_.rope_sin;
  c.shift_doc = shift_doc_start();
  c.attention_doc = attention_doc_start();
  c.tp = region_;
  c.cp = cp_attn_.get();
  c.cp_layout = &cur_->cp_layout;
  if (region_.sequence_parallel()) {
    c.sp_full = acts() + plan_.sp_full;
    c.sp_full2 = acts() + plan_.sp_full2;
  }
  if (shift_term_squares_) c.shift_terms = {grads_.data(), shift_term_squares_->data()};
  return c;
}

void CpuEngine::collect_shift_term_squares(std::vector<double>* sq) {
  KVS_CHECK(!sq || sq->size() == layout_.total, "collect_shift_term_squares: {} entries for {} parameters",
            sq ? sq->size() : 0, layout_.total);
  shift_term_squares_ = sq;
}

void CpuEngine::forward_layer(int l, int B, int T) {
  ProfileRange range("forward layer", l);
  const int li = local_of_[l];
  KVS_CHECK(li >= 0, "engine: layer {} is not held by this pipeline stage", l);
  block_forward(P_.layers[l], plan_.layer(acts(), li), block_context(B, T));
}

void CpuEngine::backward_layer(int l, int B, int T) {
  ProfileRange range("backward layer", l);
  const int li = local_of_[l];
  KVS_CHECK(li >= 0, "engine: layer {} is not held by this pipeline stage", l);
  float* a = acts();
  LayerView g = G_.layers[l];
  if (region_.sequence_parallel()) {  // this rank's rows' share of the norm gains, summed after the backward
    g.ln1 = a + plan_.norm_grads + (2 * static_cast<size_t>(li)) * d_.C;
    g.ln2 = g.ln1 + d_.C;
  }
  block_backward(P_.layers[l], g, plan_.layer(a, li), plan_.scratch(a), a + plan_.dresid, block_context(B, T));
}

size_t CpuEngine::stage_floats(const Batch& b) const {
  return region_.local_rows(static_cast<size_t>(b.B) * b.T / cp_.size) * d_.C;
}

double CpuEngine::stage_forward(int slot, int chunk, const Batch& b, const float* input, float* output,
                                double grad_scale, float* token_losses, int32_t* argmax) {
  Slot& s = use(slot);
  take_rows(s, b);
  const Batch& lb = s.rows;
  // This rank's sizes (the whole model without tensor parallelism); Nl rows of
  // the residual stream (N / tp under sequence parallelism).
  const int B = lb.B, T = lb.T, N = B * T, C = d_.C, V = d_.V;
  const int Nl = static_cast<int>(region_.local_rows(N));
  const ActivationPlan& p = plan_;
  const Chunk& c = chunks_.at(chunk);
  float* a = acts();
  float* full = region_.sequence_parallel() ? a + p.sp_full : nullptr;
  float* in = a + p.resid + p.resid_index[c.first] * p.resid_stride;
  if (c.embedding) {
    const prof::Scope timed("embedding fwd");
    vocab_parallel_embedding_forward(in, lb.inputs, P_.embed, N, C, d_.v_begin, V, region_, full);
  } else {
    KVS_CHECK(input != nullptr, "engine: chunk {} needs the previous stage's activations", chunk);
    std::copy(input, input + static_cast<size_t>(Nl) * C, in);
  }
  for (int li = c.first; li <= c.last; ++li) forward_layer(part_.layers[li], B, T);
  const float* out = a + p.resid + (p.resid_index[c.last] + 1) * p.resid_stride;
  if (!c.head) {
    KVS_CHECK(output != nullptr, "engine: chunk {} has no place for its activations", chunk);
    std::copy(out, out + static_cast<size_t>(Nl) * C, output);
    return 0.0;
  }
  {
    const prof::Scope timed("rmsnorm fwd");
    cpu::rmsnorm_forward(a + p.lnf, a + p.rstdf, out, P_.norm, Nl, C, m_.rms_norm_eps);
  }
  {
    // The LM head is column-parallel over the vocabulary.
    const prof::Label label("lm head");
    column_parallel_forward(a + p.lnf, N, C, {{a + p.logits, P_.lm_head, V}}, region_, full);
  }
  if (!lb.targets) return 0.0;
  const bool train = grad_scale >= 0;
  {
    const prof::Scope timed("cross-entropy fwd+bwd");
    cross_entropy(train ? a + p.logits : nullptr, train ? nullptr : argmax_.data(), lb, train ? grad_scale : 1.0);
  }
  double sum = 0;
  for (int i = 0; i < N; ++i) sum += a[p.losses + i];
  if (cp_.size == 1) {
    if (token_losses) std::copy(a + p.losses, a + p.losses + N, token_losses);
    if (argmax) std::copy(argmax_.begin(), argmax_.begin() + N, argmax);
  } else {
    // The whole micro-batch's per-token outputs from every rank's chunks (ids
    // as floats: exact below 2^24, and vocabularies are smaller).
    if (token_losses) gather_rows(a + p.losses, token_losses, b);
    if (argmax) {
      const std::vector<float> ids(argmax_.begin(), argmax_.begin() + N);
      gather_rows(ids.data(), cp_ids_.data(), b);
      for (size_t i = 0; i < static_cast<size_t>(b.B) * b.T; ++i) argmax[i] = static_cast<int32_t>(cp_ids_[i]);
    }
  }
  return sum_over_cp(sum);
}

void CpuEngine::stage_backward(int slot, int chunk, const float* doutput, float* dinput) {
  Slot& s = use(slot);
  const Batch& lb = s.rows;
  const int B = lb.B, T = lb.T, N = B * T, C = d_.C, V = d_.V;
  const int Nl = static_cast<int>(region_.local_rows(N));
  const ActivationPlan& p = plan_;
  const Chunk& c = chunks_.at(chunk);
  float* a = acts();
  float* dresid = a + p.dresid;
  float* dln = a + p.dln;
  const bool sp = region_.sequence_parallel();
  float* full = sp ? a + p.sp_full : nullptr;
  const size_t layers = part_.layers.size();
  float* norm_grads = sp ? a + p.norm_grads : nullptr;
  if (sp) zero(norm_grads, (2 * layers + 1) * C);
  if (c.head) {
    // LM head and final norm (dlogits were written over the logits).
    const float* last = a + p.resid + (p.resid_index[c.last] + 1) * p.resid_stride;
    {
      const prof::Label label("lm head");
      column_parallel_backward(dln, a + p.lnf, N, C, {{a + p.logits, P_.lm_head, G_.lm_head, V}}, region_, full,
                               sp ? a + p.sp_full2 : nullptr);
    }
    zero(dresid, static_cast<size_t>(Nl) * C);
    float* dnorm = sp ? norm_grads + 2 * layers * C : G_.norm;
    const prof::Scope timed("rmsnorm bwd");
    cpu::rmsnorm_backward(dresid, dnorm, dln, last, P_.norm, a + p.rstdf, Nl, C);
  } else {
    KVS_CHECK(doutput != nullptr, "engine: chunk {} needs the next stage's gradient", chunk);
    std::copy(doutput, doutput + static_cast<size_t>(Nl) * C, dresid);
  }
  for (int li = c.last; li >= c.first; --li) backward_layer(part_.layers[li], B, T);
  if (c.embedding) {
    const prof::Scope timed("embedding bwd");
    vocab_parallel_embedding_backward(G_.embed, dresid, lb.inputs, N, C, d_.v_begin, V, region_, full);
  } else {
    KVS_CHECK(dinput != nullptr, "engine: chunk {} has no place for its input gradient", chunk);
    std::copy(dresid, dresid + static_cast<size_t>(Nl) * C, dinput);
  }
  if (sp) add_norm_grads(norm_grads);
}

void CpuEngine::add_norm_grads(float* norm_grads) {
  // Each rank's norm gains saw only its rows: the gradient is the sum over the
  // group, the same on every rank (they stay replicated).
  const size_t C = d_.C, L = part_.layers.size();
  region_.tp().comm->all_reduce(norm_grads, (2 * L + 1) * C, dist::DType::F32, dist::ReduceOp::Sum);
  auto add = [&](float* g, const float* part) {
    for (size_t i = 0; i < C; ++i) g[i] += part[i];
  };
  for (size_t li = 0; li < L; ++li) {
    const LayerView& g = G_.layers[part_.layers[li]];
    add(g.ln1, norm_grads + 2 * li * C);
    add(g.ln2, norm_grads + (2 * li + 1) * C);
  }
  if (G_.norm) add(G_.norm, norm_grads + 2 * L * C);
}

void CpuEngine::take_rows(Slot& s, const Batch& b) {
  validate_batch(b, m_, max_B_, max_T_);
  if (cp_.size == 1) {
    s.rows = b;
    find_documents(s, b);
    return;
  }
  s.cp_layout = CpLayout(cp_, b.B, b.T);
  check_cp_chunks_hold_the_window(s.cp_layout, m_);
  const CpLayout& l = s.cp_layout;
  l.take(b.inputs, s.cp_inputs.data(), 1);
  if (b.targets) l.take(b.targets, s.cp_targets.data(), 1);
  if (b.mask) l.take(b.mask, s.cp_mask.data(), 1);
  find_documents(s, b);
  s.rows = {b.B, b.T / cp_.size, s.cp_inputs.data(), b.targets ? s.cp_targets.data() : nullptr,
            b.mask ? s.cp_mask.data() : nullptr};
}

double CpuEngine::sum_over_cp(double local_sum) {
  if (cp_.size > 1) cp_.comm->all_reduce(&local_sum, 1, dist::DType::F64, dist::ReduceOp::Sum);
  return local_sum;
}

void CpuEngine::gather_rows(const float* local, float* full, const Batch& b) {
  const size_t n = static_cast<size_t>(b.B) * b.T / cp_.size;
  cp_.comm->all_gather(local, cp_gather_.data(), n, dist::DType::F32);
  for (int r = 0; r < cp_.size; ++r) {
    const CpLayout l({r, cp_.size, nullptr}, b.B, b.T);
    const float* src = cp_gather_.data() + r * n;
    for (int h = 0; h < 2; ++h)
      for (int s = 0; s < b.B; ++s)
        for (int t = 0; t < l.Tc; ++t) full[l.full_row(h, s, t)] = src[(static_cast<size_t>(h) * b.B + s) * l.Tc + t];
  }
}

double CpuEngine::forward_backward(const Batch& b, double grad_scale) {
  KVS_CHECK(part_.is_whole(m_), "engine: forward_backward needs the whole model (a pipeline stage runs stage_forward)");
  const double loss = stage_forward(0, 0, b, nullptr, nullptr, grad_scale);
  stage_backward(0, 0, nullptr, nullptr);
  return loss;
}

double CpuEngine::forward(const Batch& b, float* token_losses, int32_t* argmax, float* logits) {
  KVS_CHECK(part_.is_whole(m_), "engine: forward needs the whole model (a pipeline stage runs stage_forward)");
  KVS_CHECK(!logits || tp_.size == 1, "forward: full logits are not gathered under tensor parallelism");
  KVS_CHECK(!logits || cp_.size == 1, "forward: full logits are not gathered under context parallelism");
  const double loss = stage_forward(0, 0, b, nullptr, nullptr, -1.0, token_losses, argmax);
  if (logits) {
    const size_t n = static_cast<size_t>(b.B) * b.T * m_.vocab_size;
    std::copy(acts() + plan_.logits, acts() + plan_.logits + n, logits);
  }
  return loss;
}

void CpuEngine::find_documents(Slot& s, const Batch& b) {
  if (m_.document_boundaries == DocumentBoundaries::None) return;
  // The first position of each position's document, over the whole sequences.
  int32_t* full = cp_.size > 1 ? s.cp_doc_full.data() : s.doc_start.data();
  find_document_starts(b, m_.bos_token_id, full);
  if (cp_.size == 1) return;
  // This rank's rows: attention takes positions, the shift each half's row
  // coordinates (negative: the document began in an earlier chunk).
  const CpLayout& l = s.cp_layout;
  l.take(full, s.doc_start.data(), 1);
  for (int h = 0; h < 2; ++h)
    for (size_t i = h * l.rows() / 2; i < (h + 1) * l.rows() / 2; ++i) s.cp_shift_doc[i] = s.doc_start[i] - l.pos0(h);
}

const int32_t* CpuEngine::shift_doc_start() const {
  if (m_.document_boundaries == DocumentBoundaries::None) return nullptr;
  return cp_.size > 1 ? cur_->cp_shift_doc.data() : cur_->doc_start.data();
}

const int32_t* CpuEngine::attention_doc_start() const {
  return m_.document_boundaries == DocumentBoundaries::ShiftAndAttention ? cur_->doc_start.data() : nullptr;
}

void CpuEngine::cross_entropy(float* dlogits, int32_t* argmax, const Batch& b, double grad_scale) {
  float* a = acts();
  const int N = b.B * b.T;
  if (tp_.size == 1) {
    cpu::cross_entropy_forward_backward(a + plan_.losses, dlogits, argmax, a + plan_.logits, b.targets, b.mask, N,
                                        m_.vocab_size, grad_scale);
    return;
  }
  vocab_parallel_cross_entropy(a + plan_.losses, dlogits, argmax, a + plan_.logits, b.targets, b.mask, N, d_,
                               grad_scale, *tp_.comm, ce_scratch_);
}

double CpuEngine::grad_norm() { return std::sqrt(grad_sq_sum_range(0, grads_.size())); }

double CpuEngine::grad_sq_sum_range(size_t begin, size_t end) {
  // Fixed chunks summed in a fixed order: the same bits for any thread count.
  constexpr size_t kChunk = 1 << 16;
  KVS_CHECK(begin <= end && end <= grads_.size(), "grad_sq_sum_range: [{}, {}) outside {} floats", begin, end,
            grads_.size());
  const prof::Scope timed("grad norm", 2.0 * (end - begin));
  const size_t n = end - begin, chunks = (n + kChunk - 1) / kChunk;
  std::vector<double>& partial = norm_partials_;
  partial.assign(chunks, 0.0);
  const float* g = grads_.data() + begin;
#pragma omp parallel for schedule(static)
  for (size_t c = 0; c < chunks; ++c) {
    const size_t e = std::min(n, (c + 1) * kChunk);
    partial[c] = cpu::detail::row_dot_wide<double>(g + c * kChunk, g + c * kChunk, e - c * kChunk);
  }
  double total = 0;
  for (double s : partial) total += s;
  return total;
}

void CpuEngine::adamw_step(const AdamWHyper& hp) { adamw_step_range(hp, 0, layout_.total); }

void CpuEngine::adamw_step_range(const AdamWHyper& hp, size_t begin, size_t end) {
  KVS_CHECK(opt_begin_ <= begin && begin <= end && end <= opt_end_,
            "adamw_step_range: [{}, {}) outside the optimizer moments held, [{}, {})", begin, end, opt_begin_, opt_end_);
  ensure_moments();
  const double bc1 = 1.0 - std::pow(hp.beta1, static_cast<double>(hp.step));
  const double bc2 = 1.0 - std::pow(hp.beta2, static_cast<double>(hp.step));
  const float b1 = static_cast<float>(hp.beta1), b2 = static_cast<float>(hp.beta2);
  const float lr = static_cast<float>(hp.lr), eps = static_cast<float>(hp.eps);
  const float scale = static_cast<float>(hp.grad_scale);
  const float step_size = static_cast<float>(hp.lr / bc1);
  const float inv_sqrt_bc2 = static_cast<float>(1.0 / std::sqrt(bc2));
  const prof::Scope timed("adamw");
  for (const ParamTensor& t : layout_.tensors) {
    // The part of this tensor inside [begin, end): a shard boundary may cut a
    // tensor, and each element keeps its own tensor's decay and projection.
    const size_t lo = std::max(begin, t.offset), hi = std::min(end, t.offset + t.numel);
    if (lo >= hi) continue;
    // Decoupled weight decay (as torch.optim.AdamW): p *= 1 - lr * wd, then the Adam update.
    const float decay = t.decay() ? 1.0f - lr * static_cast<float>(hp.weight_decay) : 1.0f;
    float* p = params_.data() + lo;
    const float* g = grads_.data() + lo;
    float* m = exp_avg_.data() + (lo - opt_begin_);
    float* v = exp_avg_sq_.data() + (lo - opt_begin_);
    const auto n = static_cast<ptrdiff_t>(hi - lo);
#pragma omp parallel for schedule(static)
    for (ptrdiff_t i = 0; i < n; ++i) {
      const float gi = g[i] * scale;
      m[i] = b1 * m[i] + (1.0f - b1) * gi;
      v[i] = b2 * v[i] + (1.0f - b2) * gi * gi;
      const float denom = std::sqrt(v[i]) * inv_sqrt_bc2 + eps;
      p[i] = p[i] * decay - step_size * m[i] / denom;
    }
    // "clamp01": project the shift coefficients back onto [0, 1] after the
    // update. A clamp inside the forward would give the same values but a zero
    // gradient outside the box, so a coefficient that left it could never
    // come back; the projection keeps the forward in [0, 1] and keeps learning.
    if (t.kind == ParamKind::Shift && m_.kv_shift.parametrization == ShiftParametrization::Clamp01)
      for (ptrdiff_t i = 0; i < n; ++i) p[i] = std::clamp(p[i], 0.0f, 1.0f);
  }
}

}  // namespace kvs
