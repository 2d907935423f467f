// StageCostEvaluator's varlen micro-batches (packed rows priced at the cost model's own shapes,
// batching.md "Varlen micro-batches") and its per-stage quadratic fits.
#include <fmt/core.h>

#include <algorithm>
#include <array>
#include <cmath>
#include <span>
#include <vector>

#include "batching/nonneg_fit.h"
#include "batching/stage_cost.h"
#include "batching/stage_cost_internal.h"

namespace sluice {

using stage_cost_internal::CombineStage;
using stage_cost_internal::KindCosts;
using stage_cost_internal::LookupKinds;
using stage_cost_internal::SummaryBuilder;

namespace {

// Lengths the varlen fits sample: 64, 96, 128, 192, ... up to max_position (included).
std::vector<int64_t> FitLengths(int64_t max_position) {
  std::vector<int64_t> out;
  for (int64_t p = 64; p <= max_position; p *= 2) {
    out.push_back(p);
    if (p + p / 2 <= max_position) out.push_back(p + p / 2);
  }
  if (out.empty() || out.back() != max_position) out.push_back(max_position);
  std::sort(out.begin(), out.end());
  out.erase(std::unique(out.begin(), out.end()), out.end());
  return out;
}

}  // namespace

Status StageCostEvaluator::FitVarlen() {
  for (auto& f : fits_) f.assign(static_cast<size_t>(par_.pp), StageFit{});
  varlen_supported_ = false;
  if (model().is_encoder_decoder()) {
    // No per-sequence fit; varlen prices come from the moment-matched shapes (header).
    const int64_t len = std::min<int64_t>(64, model().max_position);
    KindCosts k;
    varlen_supported_ = LookupKinds(*kinds_, *cost_, LayerShape{1, len, len}, par_.tp, ring_,
                                    Recompute::kFull, &k);
    return Status::Ok();
  }
  const std::vector<int64_t> lengths = FitLengths(model().max_position);
  constexpr double kScale = 1024.0;  // fit in units of 1024 tokens for conditioning
  constexpr int64_t kMaxFitMbs = int64_t{1} << 20;
  std::vector<ChunkCost> stages;
  for (int r = 0; r < 3; ++r) {
    const Recompute rc = static_cast<Recompute>(r);
    // The micro-batches that can exist: every length at micro-batch sizes 1, 2, 4, ... for as
    // long as the cost model answers and (beyond one sequence) one such micro-batch alone fits
    // the memory rule. So the points span both regimes of a layer's cost, the per-call floor
    // (few tokens) and the work that grows with tokens (many), at every tp: where one gives way
    // to the other grows with tp (at length 512 on the A100 GPT table: about 1,000 tokens at
    // tp 1, 4,000-8,000 at tp 8).
    std::vector<std::vector<ChunkCost>> points;
    std::vector<double> xs, ms;
    for (int64_t len : lengths) {
      for (int64_t mbs = 1; mbs <= kMaxFitMbs; mbs *= 2) {
        if (!EvaluateStages(LayerShape{mbs, len, 0}, rc, &stages)) break;
        if (mbs > 1 && !SummaryFromStages(LayerShape{mbs, len, 0}, stages, true, 1).feasible) {
          break;
        }
        points.push_back(stages);
        xs.push_back(static_cast<double>(len));
        ms.push_back(static_cast<double>(mbs));
      }
    }
    if (points.size() < 3) continue;
    for (int64_t s = 0; s < par_.pp; ++s) {
      std::vector<std::array<double, 3>> x3;
      std::vector<double> t, wt;
      for (size_t p = 0; p < points.size(); ++p) {
        const ChunkCost& c = points[p][s];
        const double u = xs[p] / kScale;
        const double m = ms[p];
        x3.push_back({m * u * u, m * u, 1.0});
        const double time = (c.forward + c.backward()).millis();
        t.push_back(time);
        wt.push_back(1.0 / std::max(time * time, 1e-12));  // relative error (guarding zeros)
      }
      const std::array<double, 3> tc = FitNonNegative<3>(x3, t, wt);
      StageFit& f = fits_[r][s];
      f.time = Quadratic{tc[0] / (kScale * kScale), tc[1] / kScale, tc[2]};
      f.max_len = static_cast<int64_t>(*std::max_element(xs.begin(), xs.end()));
    }
    varlen_supported_ = true;
  }
  return Status::Ok();
}

namespace {

// Keeps T^2 within int64 (a micro-batch of two billion tokens is no micro-batch).
constexpr int64_t kMaxVarlenTokens = int64_t{1} << 31;

// The tokens T = sum s and attention work Q = sum s^2 of a varlen micro-batch; false when
// `lengths` is empty, a length is outside [1, max_len] or the tokens are absurd.
bool VarlenMoments(std::span<const int64_t> lengths, int64_t max_len, int64_t* t, int64_t* q) {
  if (lengths.empty()) return false;
  *t = 0;
  *q = 0;
  for (int64_t len : lengths) {
    if (len < 1 || len > max_len) return false;
    *t += len;
    if (*t > kMaxVarlenTokens) return false;
    *q += len * len;  // <= T * max_len: max_len is a model length (at most 2^24)
  }
  return true;
}

// acc += w * k, field by field.
void AddScaled(const LayerCost& k, double w, LayerCost* acc) {
  acc->forward += k.forward.Scaled(w);
  acc->backward += k.backward.Scaled(w);
  acc->backward_input += k.backward_input.Scaled(w);
  acc->backward_weight += k.backward_weight.Scaled(w);
  acc->stored_activation += k.stored_activation.Scaled(w);
  acc->peak_activation += k.peak_activation.Scaled(w);
}

void AddScaled(const KindCosts& k, double w, KindCosts* acc) {
  AddScaled(k.encoder, w, &acc->encoder);
  AddScaled(k.embedding, w, &acc->embedding);
  AddScaled(k.head, w, &acc->head);
}

// The per-kind costs of a varlen micro-batch of T tokens and attention work Q (decoder-only).
//
// A padded micro-batch of m rows of T / m tokens has the same T and attention work T^2 / m,
// so the varlen micro-batch matches m* = T^2 / Q rows of L* = Q / T tokens (1 <= m* <= n,
// min s <= L* <= max s). m* is fractional in general: the price is linear in Q between the two
// integer row counts around it, m_a = floor(m*) (Q_a = T^2 / m_a >= Q) and m_a + 1, each with
// rows of T / m tokens rounded to the nearest integer (at most half a token per row). Every
// shape queried holds T tokens (up to that rounding), none more than the micro-batch.
// k sequences of length L give m* = k, T / k = L: the padded k x L shape itself, exactly.
// False when a shape with a nonzero weight has no cost (a row longer than the model's positions,
// beyond a profile table's range, or in one of its out-of-memory holes).
// The two integer row counts around m* = T^2 / Q and the weight of the larger (above).
struct RowBlend {
  int64_t m_a = 1;   // floor(m*)
  double w_b = 0;    // weight of m_a + 1 rows; 0: m* = m_a exactly
};
RowBlend BlendOf(int64_t t, int64_t q) {
  const int64_t t2 = t * t;
  RowBlend b;
  b.m_a = t2 / q;
  // Weight of m_a + 1 rows: (Q_a - Q) / (Q_a - Q_b) = (m_a + 1) (T^2 - m_a Q) / T^2.
  b.w_b = static_cast<double>(b.m_a + 1) * static_cast<double>(t2 - b.m_a * q) /
          static_cast<double>(t2);
  return b;
}

bool LookupVarlen(KindCostCache& cache, const CostModel& cost, int64_t tp, const CpRing& ring,
                  std::span<const int64_t> lengths, Recompute rc, KindCosts* out) {
  int64_t t = 0, q = 0;
  if (!VarlenMoments(lengths, cost.model().max_position, &t, &q)) return false;
  const RowBlend rb = BlendOf(t, q);
  const int64_t m_a = rb.m_a;
  const double w_b = rb.w_b;
  if (!LookupKinds(cache, cost, LayerShape{m_a, (t + m_a / 2) / m_a, 0}, tp, ring, rc, out)) {
    return false;
  }
  // m* a whole number of rows (uniform rows: the padded shape itself).
  if (w_b == 0) return true;
  const int64_t m_b = m_a + 1;  // <= n <= T: m* < n here
  KindCosts b;
  if (!LookupKinds(cache, cost, LayerShape{m_b, (t + m_b / 2) / m_b, 0}, tp, ring, rc, &b)) {
    return false;
  }
  KindCosts blend;
  AddScaled(*out, 1 - w_b, &blend);
  AddScaled(b, w_b, &blend);
  *out = blend;
  return true;
}

// One layer kind blended over the row counts of `rb` at the shapes `shape_of(m)` gives.
template <typename ShapeOf>
bool BlendKind(const CostModel& cost, LayerKind kind, int64_t tp, const CpRing& ring,
               Recompute rc, RowBlend rb, ShapeOf shape_of, LayerCost* out) {
  *out = ContextParallelLayer(cost, kind, shape_of(rb.m_a), tp, rc, ring);
  if (!out->feasible) return false;
  if (rb.w_b == 0) return true;
  const LayerCost b = ContextParallelLayer(cost, kind, shape_of(rb.m_a + 1), tp, rc, ring);
  if (!b.feasible) return false;
  LayerCost blend;
  AddScaled(*out, 1 - rb.w_b, &blend);
  AddScaled(b, rb.w_b, &blend);
  blend.feasible = true;
  *out = blend;
  return true;
}

// The per-kind costs of a varlen micro-batch of encoder-decoder samples (stage_cost.h): encoder
// layers and the embedding at the encoder side's moment-matched rows, decoder layers and the
// output head at the decoder side's, each decoder row against Qx / Td encoder tokens.
// False as LookupVarlen, or when the two length lists differ in size.
bool LookupVarlenSeq2Seq(const CostModel& cost, int64_t tp, const CpRing& ring,
                         std::span<const int64_t> lengths, std::span<const int64_t> dec_lengths,
                         Recompute rc, KindCosts* out) {
  const int64_t max_len = cost.model().max_position;
  int64_t te = 0, qe = 0, td = 0, qd = 0;
  if (lengths.size() != dec_lengths.size() || !VarlenMoments(lengths, max_len, &te, &qe)) {
    return false;
  }
  // A sample without a target has no decoder segment (and no labels).
  __int128 qx = 0;
  for (size_t i = 0; i < lengths.size(); ++i) {
    const int64_t d = dec_lengths[i];
    if (d < 0 || d > max_len) return false;
    td += d;
    if (td > kMaxVarlenTokens) return false;
    qd += d * d;
    qx += static_cast<__int128>(lengths[i]) * d;
  }
  // No target at all: one decoder token, as a padded micro-batch's Pad(max(1, longest target)).
  if (td == 0) td = qd = 1;
  // Encoder tokens each decoder row attends to: a weighted mean of input lengths, <= max_len.
  const int64_t cross = std::max<int64_t>(1, static_cast<int64_t>((qx + td / 2) / td));
  const auto enc_shape = [&](int64_t m) {
    return LayerShape{m, (te + m / 2) / m, std::clamp<int64_t>((td + m / 2) / m, 1, max_len)};
  };
  const auto dec_shape = [&](int64_t m) {
    return LayerShape{m, cross, std::max<int64_t>(1, (td + m / 2) / m)};
  };
  const RowBlend be = BlendOf(te, qe), bd = BlendOf(td, qd);
  return BlendKind(cost, LayerKind::kEncoder, tp, ring, rc, be, enc_shape, &out->encoder) &&
         BlendKind(cost, LayerKind::kEmbedding, tp, ring, rc, be, enc_shape, &out->embedding) &&
         BlendKind(cost, LayerKind::kDecoder, tp, ring, rc, bd, dec_shape, &out->decoder) &&
         BlendKind(cost, LayerKind::kOutputHead, tp, ring, rc, bd, dec_shape, &out->head);
}

}  // namespace

bool StageCostEvaluator::EvaluateVarlenStages(std::span<const int64_t> lengths,
                                              std::span<const int64_t> dec_lengths, Recompute rc,
                                              std::vector<ChunkCost>* out) const {
  out->assign(static_cast<size_t>(par_.pp), ChunkCost{});
  if (!varlen_supported_ || !model().is_encoder_decoder()) return false;
  KindCosts k;
  if (!LookupVarlenSeq2Seq(*cost_, par_.tp, ring_, lengths, dec_lengths, rc, &k)) return false;
  for (int64_t s = 0; s < par_.pp; ++s) (*out)[s] = CombineStage(stage_layers_[s], k);
  return true;
}

CostSummary StageCostEvaluator::SummarizeVarlen(std::span<const int64_t> lengths,
                                                std::span<const int64_t> dec_lengths, Recompute rc,
                                                int64_t num_micro_batches) const {
  if (!varlen_supported_ || !model().is_encoder_decoder()) return CostSummary{};
  KindCosts k;
  if (!LookupVarlenSeq2Seq(*cost_, par_.tp, ring_, lengths, dec_lengths, rc, &k)) {
    return CostSummary{};
  }
  // Buffers at one row of all the tokens on each side.
  int64_t tokens = 0, dec_tokens = 0;
  for (int64_t len : lengths) tokens += len;
  for (int64_t len : dec_lengths) dec_tokens += len;
  const LayerShape packed{1, Pad(tokens), Pad(dec_tokens)};
  SummaryBuilder b;
  for (int64_t s = 0; s < par_.pp; ++s) {
    b.Add(CombineStage(stage_layers_[s], k), InFlight(s, num_micro_batches), budgets_[s],
          HeldBuffers(packed, s), TransientBuffers(packed, s));
  }
  return b.Finish(true);
}

bool StageCostEvaluator::EvaluateVarlenStages(std::span<const int64_t> lengths, Recompute rc,
                                              std::vector<ChunkCost>* out) const {
  out->assign(static_cast<size_t>(par_.pp), ChunkCost{});
  if (!varlen_supported_ || model().is_encoder_decoder()) return false;
  KindCosts k;
  if (!LookupVarlen(*kinds_, *cost_, par_.tp, ring_, lengths, rc, &k)) return false;
  for (int64_t s = 0; s < par_.pp; ++s) (*out)[s] = CombineStage(stage_layers_[s], k);
  return true;
}

CostSummary StageCostEvaluator::SummarizeVarlen(std::span<const int64_t> lengths, Recompute rc,
                                                int64_t num_micro_batches) const {
  if (!varlen_supported_ || model().is_encoder_decoder()) return CostSummary{};
  KindCosts k;
  if (!LookupVarlen(*kinds_, *cost_, par_.tp, ring_, lengths, rc, &k)) return CostSummary{};
  // Buffers at one row of all the tokens (the packed rows' boundary tensors hold at least that).
  int64_t tokens = 0;
  for (int64_t len : lengths) tokens += len;
  const LayerShape packed{1, Pad(tokens), 0};
  SummaryBuilder b;
  for (int64_t s = 0; s < par_.pp; ++s) {
    b.Add(CombineStage(stage_layers_[s], k), InFlight(s, num_micro_batches), budgets_[s],
          HeldBuffers(packed, s), TransientBuffers(packed, s));
  }
  return b.Finish(true);
}

StageCostEvaluator::Quadratic StageCostEvaluator::BottleneckQuadratic(Recompute rc) const {
  if (!varlen_supported_) return Quadratic{};
  const std::vector<StageFit>& fits = fits_[static_cast<int>(rc)];
  if (fits.empty() || fits[0].max_len <= 0) return Quadratic{};
  const double len = static_cast<double>(fits[0].max_len);
  size_t best = 0;
  double best_ms = -1;
  for (size_t s = 0; s < fits.size(); ++s) {
    const Quadratic& q = fits[s].time;
    const double ms = q.a * len * len + q.b * len + q.c;
    if (ms > best_ms) {
      best_ms = ms;
      best = s;
    }
  }
  return fits[best].time;
}

}  // namespace sluice
