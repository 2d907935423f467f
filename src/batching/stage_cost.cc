#include "batching/stage_cost.h"

#include <fmt/core.h>

#include <algorithm>
#include <array>
#include <cmath>
#include <mutex>

#include "batching/micro_batch.h"
#include "batching/nonneg_fit.h"
#include "model/chunk_cut.h"

namespace sluice {
namespace {

// The per-kind costs of one micro-batch shape: looked up once, combined over stages.
struct KindCosts {
  LayerCost encoder;
  LayerCost decoder;
  LayerCost embedding;
  LayerCost head;
};

// One device stage's cost from its layers and the per-kind costs. The layers run in the order
// embedding, encoder layers, decoder layers, output head (true for every cut of model/chunk_cut.h), so
// the high-water mark is the largest "stored before this layer + this layer's peak".
ChunkCost CombineStage(const StageLayers& l, const KindCosts& k) {
  ChunkCost s;
  Bytes stored;
  Bytes peak;
  auto add = [&](const LayerCost& c, int64_t count) {
    if (count <= 0) return;
    s.forward += c.forward * count;
    s.backward_input += c.backward_input * count;
    s.backward_weight += c.backward_weight * count;
    peak = std::max(peak, stored + c.stored_activation * (count - 1) + c.peak_activation);
    stored += c.stored_activation * count;
  };
  add(k.embedding, l.embedding ? 1 : 0);
  add(k.encoder, l.encoder_layers);
  add(k.decoder, l.decoder_layers);
  add(k.head, l.output_head ? 1 : 0);
  s.stored = stored;
  s.peak = peak;
  return s;
}

// Accumulates a CostSummary stage by stage.
class SummaryBuilder {
 public:
  // `held` and `transient`: the stage's buffers (StageCostEvaluator::HeldBuffers and
  // TransientBuffers).
  void Add(const ChunkCost& s, int64_t in_flight, Bytes budget, Bytes held, Bytes transient) {
    const Duration t = s.forward + s.backward();
    summary_.bottleneck = std::max(summary_.bottleneck, t);
    summary_.total += t;
    summary_.max_stored = std::max(summary_.max_stored, s.stored);
    summary_.max_peak = std::max(summary_.max_peak, s.peak);
    const double need = static_cast<double>(
        ((s.stored + held) * (in_flight - 1) + s.peak + held + transient).count());
    summary_.memory_load =
        std::max(summary_.memory_load, need / static_cast<double>(budget.count()));
    summary_.memory_load_alone =
        std::max(summary_.memory_load_alone, static_cast<double>((s.peak + held + transient).count()) /
                                                 static_cast<double>(budget.count()));
  }
  CostSummary Finish(bool lookups_ok) {
    summary_.feasible = lookups_ok && summary_.memory_load <= 1.0;
    return summary_;
  }

 private:
  CostSummary summary_;
};

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

StatusOr<StageCostEvaluator> StageCostEvaluator::Create(const CostModel& cost,
                                                        const ParallelConfig& par,
                                                        const ClusterSpec& cluster,
                                                        const StageCostOptions& options) {
  const ModelSpec& model = cost.model();
  SLUICE_RETURN_IF_ERROR(ValidateParallelConfig(par, "parallel config"));
  SLUICE_RETURN_IF_ERROR(CheckParallelFits(par, model, &cluster, "parallel config"));
  if (!cost.SupportsTp(par.tp)) {
    return InvalidArgumentError(
        fmt::format("parallel config: tp={} is not supported by the cost "
                    "model ({})",
                    par.tp, cost.Describe()));
  }
  if (options.pad_multiple < 1) {
    return InvalidArgumentError(
        fmt::format("stage cost options: pad_multiple must be >= 1, got {}", options.pad_multiple));
  }
  if (options.transient_boundary_buffers < 0) {
    return InvalidArgumentError(
        fmt::format("stage cost options: transient_boundary_buffers must be >= 0, got {}",
                    options.transient_boundary_buffers));
  }
  StageCostEvaluator e;
  e.cost_ = &cost;
  e.kinds_ = std::make_shared<KindCostCache>();
  e.par_ = par;
  e.options_ = options;
  e.limit_ = par.MemoryLimit(cluster);
  e.ring_ = CpRing{par.cp, CpRingLink(cluster, par)};
  e.chunk_layers_ = ChunkStageLayers(model, par.chunks());
  const std::vector<StageLayers>& chunks = e.chunk_layers_;
  e.stage_layers_.assign(static_cast<size_t>(par.pp), StageLayers{});
  for (int64_t c = 0; c < par.chunks(); ++c) {
    StageLayers& s = e.stage_layers_[static_cast<size_t>(c % par.pp)];
    s.encoder_layers += chunks[c].encoder_layers;
    s.decoder_layers += chunks[c].decoder_layers;
    s.embedding = s.embedding || chunks[c].embedding;
    s.output_head = s.output_head || chunks[c].output_head;
    s.decoder_embedding = s.decoder_embedding || chunks[c].decoder_embedding;
  }
  for (int64_t s = 0; s < par.pp; ++s) {
    const ModelStateMemory states = cost.ModelStates(e.stage_layers_[s], par);
    e.stage_states_.push_back(states);
    const Bytes budget = e.limit_ - states.total();
    if (budget <= Bytes::Zero()) {
      return FailedPreconditionError(
          fmt::format("parallel config: stage {} of {} needs {} of model states (mixed-precision "
                      "Adam, ZeRO-{}) "
                      "but the memory limit is {}; raise pp, tp, dp with ZeRO, or the memory limit",
                      s, model.name, FormatBytes(states.total()), par.zero, FormatBytes(e.limit_)));
    }
    e.budgets_.push_back(budget);
  }
  SLUICE_RETURN_IF_ERROR(e.FitVarlen());
  return e;
}

int64_t StageCostEvaluator::InFlight(int64_t stage, int64_t num_micro_batches) const {
  const int64_t m = std::max<int64_t>(1, num_micro_batches);
  if (options_.in_flight == InFlightPolicy::kGPipe) return m;
  if (options_.in_flight == InFlightPolicy::kInterleaved && par_.vpp > 1) {
    const int64_t chunks = (par_.pp - stage - 1) * 2 + (par_.vpp - 1) * par_.pp + 1;
    return std::max<int64_t>(1, std::min((chunks + par_.vpp - 1) / par_.vpp, m));
  }
  return std::max<int64_t>(1, std::min(par_.pp - stage, m));
}

int64_t StageCostEvaluator::SeqLen(const Sample& s) const {
  return model().is_encoder_decoder() ? s.input_len : s.input_len + s.target_len;
}

int64_t StageCostEvaluator::DecLen(const Sample& s) const {
  return model().is_encoder_decoder() ? s.target_len : 0;
}

int64_t StageCostEvaluator::Pad(int64_t len) const {
  const int64_t m = options_.pad_multiple;
  return (len + m - 1) / m * m;
}

namespace {

// Looks up the layer kinds the model uses at `shape`; false when one is infeasible.
// With cp > 1, per device of the cp group (cost/context_parallel.h).
bool LookupKindsUncached(const CostModel& cost, const LayerShape& shape, int64_t tp,
                         const CpRing& ring, Recompute rc, KindCosts* k) {
  const bool encdec = cost.model().is_encoder_decoder();
  if (shape.mbs < 1 || shape.seqlen < 1 || (encdec && shape.dec_seqlen < 1)) return false;
  k->encoder = ContextParallelLayer(cost, LayerKind::kEncoder, shape, tp, rc, ring);
  if (!k->encoder.feasible) return false;
  if (encdec) {
    k->decoder = ContextParallelLayer(cost, LayerKind::kDecoder, shape, tp, rc, ring);
    if (!k->decoder.feasible) return false;
  }
  k->embedding = ContextParallelLayer(cost, LayerKind::kEmbedding, shape, tp, rc, ring);
  if (!k->embedding.feasible) return false;
  k->head = ContextParallelLayer(cost, LayerKind::kOutputHead, shape, tp, rc, ring);
  return k->head.feasible;
}

}  // namespace

// The memo of one evaluator's LookupKindsUncached answers (stage_cost.h): a direct-mapped table
// of StageCostEvaluator::kKindCacheEntries slots (allocated at the first lookup), a new answer
// replacing the one in its slot. The evaluator's cost model, tp and ring are fixed, so (shape,
// recompute level) is the whole key.
class KindCostCache {
 public:
  // The answer for (shape, rc), from the memo or computed (outside the lock) and stored.
  bool Lookup(const CostModel& cost, const LayerShape& shape, int64_t tp, const CpRing& ring,
              Recompute rc, KindCosts* k) {
    const Key key{shape.mbs, shape.seqlen, shape.dec_seqlen, static_cast<int64_t>(rc)};
    const size_t slot = SlotOf(key);
    {
      std::lock_guard<std::mutex> lock(mu_);
      if (!slots_.empty() && slots_[slot].used && slots_[slot].key == key) {
        *k = slots_[slot].costs;
        return slots_[slot].ok;
      }
    }
    Slot fresh;
    fresh.key = key;
    fresh.used = true;
    fresh.ok = LookupKindsUncached(cost, shape, tp, ring, rc, &fresh.costs);
    *k = fresh.costs;
    std::lock_guard<std::mutex> lock(mu_);
    if (slots_.empty()) slots_.resize(static_cast<size_t>(StageCostEvaluator::kKindCacheEntries));
    slots_[slot] = fresh;
    return fresh.ok;
  }

 private:
  using Key = std::array<int64_t, 4>;  // mbs, seqlen, dec_seqlen, recompute level
  static_assert((StageCostEvaluator::kKindCacheEntries &
                 (StageCostEvaluator::kKindCacheEntries - 1)) == 0);
  static size_t SlotOf(const Key& k) {
    uint64_t h = 0x9E3779B97F4A7C15ull;
    for (int64_t x : k) h = (h ^ static_cast<uint64_t>(x)) * 0xBF58476D1CE4E5B9ull;
    h ^= h >> 31;
    return static_cast<size_t>(h) &
           static_cast<size_t>(StageCostEvaluator::kKindCacheEntries - 1);
  }
  struct Slot {
    Key key{};
    bool used = false;
    bool ok = false;
    KindCosts costs;  // as LookupKindsUncached left it (partly filled when !ok)
  };
  std::mutex mu_;
  std::vector<Slot> slots_;  // empty until the first answer is stored
};

namespace {

// LookupKindsUncached through `cache`.
bool LookupKinds(KindCostCache& cache, const CostModel& cost, const LayerShape& shape, int64_t tp,
                 const CpRing& ring, Recompute rc, KindCosts* k) {
  return cache.Lookup(cost, shape, tp, ring, rc, k);
}

}  // namespace

bool StageCostEvaluator::EvaluateStages(const LayerShape& shape, Recompute rc,
                                        std::vector<ChunkCost>* out) const {
  out->assign(static_cast<size_t>(par_.pp), ChunkCost{});
  KindCosts k;
  if (!LookupKinds(*kinds_, *cost_, shape, par_.tp, ring_, rc, &k)) return false;
  for (int64_t s = 0; s < par_.pp; ++s) (*out)[s] = CombineStage(stage_layers_[s], k);
  return true;
}

bool StageCostEvaluator::EvaluateChunks(const LayerShape& shape, Recompute rc,
                                        std::vector<ChunkCost>* out) const {
  out->assign(chunk_layers_.size(), ChunkCost{});
  KindCosts k;
  if (!LookupKinds(*kinds_, *cost_, shape, par_.tp, ring_, rc, &k)) return false;
  for (size_t c = 0; c < chunk_layers_.size(); ++c) (*out)[c] = CombineStage(chunk_layers_[c], k);
  return true;
}

CostSummary StageCostEvaluator::Summarize(const LayerShape& shape, Recompute rc,
                                          int64_t num_micro_batches) const {
  KindCosts k;
  if (!LookupKinds(*kinds_, *cost_, shape, par_.tp, ring_, rc, &k)) return CostSummary{};
  SummaryBuilder b;
  for (int64_t s = 0; s < par_.pp; ++s) {
    b.Add(CombineStage(stage_layers_[s], k), InFlight(s, num_micro_batches), budgets_[s],
          HeldBuffers(shape, s), TransientBuffers(shape, s));
  }
  return b.Finish(true);
}

namespace {

// share = part / whole, or 1 / n when the whole is zero.
double Share(int64_t part, int64_t whole, int64_t n) {
  return whole > 0 ? static_cast<double>(part) / static_cast<double>(whole)
                   : 1.0 / static_cast<double>(n);
}

}  // namespace

void StageCostEvaluator::SplitOverChunks(const LayerShape& shape, Recompute rc,
                                         std::span<const ChunkCost> stages,
                                         std::vector<ChunkCost>* out) const {
  const int64_t pp = par_.pp, vpp = par_.vpp, n = pp * vpp;
  out->assign(static_cast<size_t>(n), ChunkCost{});
  if (vpp == 1) {
    for (int64_t c = 0; c < n; ++c) {
      (*out)[c] = stages[c];
      (*out)[c].stored_until_w = Bytes::Zero();
    }
    return;
  }
  std::vector<ChunkCost> chunk;
  const bool shares = EvaluateChunks(shape, rc, &chunk);
  for (int64_t c = 0; c < n; ++c) {
    const int64_t d = c % pp;
    const ChunkCost& st = stages[d];
    // The chunk's shares of its device's figures; its peak is its own high-water mark at the
    // padded shape, scaled like its stored bytes.
    const double even = 1.0 / static_cast<double>(vpp);
    double fw = even, bi = even, bw = even, mem = even, peak_scale = 1.0;
    if (shares) {
      ChunkCost sum;
      for (int64_t k = d; k < n; k += pp) {
        sum.forward += chunk[k].forward;
        sum.backward_input += chunk[k].backward_input;
        sum.backward_weight += chunk[k].backward_weight;
        sum.stored += chunk[k].stored;
      }
      fw = Share(chunk[c].forward.nanos(), sum.forward.nanos(), vpp);
      bi = Share(chunk[c].backward_input.nanos(), sum.backward_input.nanos(), vpp);
      bw = Share(chunk[c].backward_weight.nanos(), sum.backward_weight.nanos(), vpp);
      mem = Share(chunk[c].stored.count(), sum.stored.count(), vpp);
      peak_scale = Share(st.stored.count(), sum.stored.count(), 1);
    }
    ChunkCost& cc = (*out)[c];
    cc.forward = st.forward.Scaled(fw);
    cc.backward_input = st.backward_input.Scaled(bi);
    cc.backward_weight = st.backward_weight.Scaled(bw);
    cc.stored = st.stored.Scaled(mem);
    // Without shares the running layer's transient stays whole.
    cc.peak = shares ? chunk[c].peak.Scaled(peak_scale)
                     : cc.stored + std::max(Bytes::Zero(), st.peak - st.stored);
  }
}

CostSummary StageCostEvaluator::SummaryFromStages(const LayerShape& shape,
                                                  const std::vector<ChunkCost>& stages, bool ok,
                                                  int64_t num_micro_batches) const {
  if (!ok) return CostSummary{};
  SummaryBuilder b;
  for (int64_t s = 0; s < par_.pp; ++s) {
    b.Add(stages[s], InFlight(s, num_micro_batches), budgets_[s], HeldBuffers(shape, s),
          TransientBuffers(shape, s));
  }
  return b.Finish(true);
}

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
