#include "batching/stage_cost.h"

#include <fmt/core.h>

#include <algorithm>
#include <array>
#include <cmath>

#include "batching/micro_batch.h"
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
  void Add(const ChunkCost& s, int64_t in_flight, Bytes budget) {
    const Duration t = s.forward + s.backward();
    summary_.bottleneck = std::max(summary_.bottleneck, t);
    summary_.total += t;
    summary_.max_stored = std::max(summary_.max_stored, s.stored);
    summary_.max_peak = std::max(summary_.max_peak, s.peak);
    const double need = static_cast<double>((s.stored * (in_flight - 1) + s.peak).count());
    summary_.memory_load =
        std::max(summary_.memory_load, need / static_cast<double>(budget.count()));
  }
  CostSummary Finish(bool lookups_ok) {
    summary_.feasible = lookups_ok && summary_.memory_load <= 1.0;
    return summary_;
  }

 private:
  CostSummary summary_;
};

// Non-negative least squares with weights w over up to three basis columns: tries every subset
// of active columns, keeps the best solution with all coefficients >= 0. Returns the coefficients.
template <int K>
std::array<double, K> FitNonNegative(const std::vector<std::array<double, K>>& x,
                                     const std::vector<double>& y, const std::vector<double>& w) {
  std::array<double, K> best{};
  double best_err = -1;
  for (int mask = 1; mask < (1 << K); ++mask) {
    int idx[K];
    int n = 0;
    for (int k = 0; k < K; ++k) {
      if (mask & (1 << k)) idx[n++] = k;
    }
    // Normal equations A c = b over the active columns, Gaussian elimination with pivoting.
    double a[K][K + 1] = {};
    for (size_t p = 0; p < y.size(); ++p) {
      for (int r = 0; r < n; ++r) {
        for (int c = 0; c < n; ++c) a[r][c] += w[p] * x[p][idx[r]] * x[p][idx[c]];
        a[r][n] += w[p] * x[p][idx[r]] * y[p];
      }
    }
    bool singular = false;
    for (int col = 0; col < n && !singular; ++col) {
      int piv = col;
      for (int r = col + 1; r < n; ++r) {
        if (std::abs(a[r][col]) > std::abs(a[piv][col])) piv = r;
      }
      if (std::abs(a[piv][col]) < 1e-300) {
        singular = true;
        break;
      }
      for (int c = 0; c <= n; ++c) std::swap(a[col][c], a[piv][c]);
      for (int r = 0; r < n; ++r) {
        if (r == col) continue;
        const double f = a[r][col] / a[col][col];
        for (int c = col; c <= n; ++c) a[r][c] -= f * a[col][c];
      }
    }
    if (singular) continue;
    std::array<double, K> coef{};
    bool nonneg = true;
    for (int r = 0; r < n; ++r) {
      coef[idx[r]] = a[r][n] / a[r][r];
      if (!(coef[idx[r]] >= 0)) nonneg = false;
    }
    if (!nonneg) continue;
    double err = 0;
    for (size_t p = 0; p < y.size(); ++p) {
      double v = 0;
      for (int k = 0; k < K; ++k) v += coef[k] * x[p][k];
      err += w[p] * (v - y[p]) * (v - y[p]);
    }
    if (best_err < 0 || err < best_err) {
      best_err = err;
      best = coef;
    }
  }
  return best;
}

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
  StageCostEvaluator e;
  e.cost_ = &cost;
  e.par_ = par;
  e.options_ = options;
  e.limit_ = par.MemoryLimit(cluster);
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
bool LookupKinds(const CostModel& cost, const LayerShape& shape, int64_t tp, Recompute rc,
                 KindCosts* k) {
  const bool encdec = cost.model().is_encoder_decoder();
  if (shape.mbs < 1 || shape.seqlen < 1 || (encdec && shape.dec_seqlen < 1)) return false;
  k->encoder = cost.Layer(LayerKind::kEncoder, shape, tp, rc);
  if (!k->encoder.feasible) return false;
  if (encdec) {
    k->decoder = cost.Layer(LayerKind::kDecoder, shape, tp, rc);
    if (!k->decoder.feasible) return false;
  }
  k->embedding = cost.Layer(LayerKind::kEmbedding, shape, tp, rc);
  if (!k->embedding.feasible) return false;
  k->head = cost.Layer(LayerKind::kOutputHead, shape, tp, rc);
  return k->head.feasible;
}

}  // namespace

bool StageCostEvaluator::EvaluateStages(const LayerShape& shape, Recompute rc,
                                        std::vector<ChunkCost>* out) const {
  out->assign(static_cast<size_t>(par_.pp), ChunkCost{});
  KindCosts k;
  if (!LookupKinds(*cost_, shape, par_.tp, rc, &k)) return false;
  for (int64_t s = 0; s < par_.pp; ++s) (*out)[s] = CombineStage(stage_layers_[s], k);
  return true;
}

bool StageCostEvaluator::EvaluateChunks(const LayerShape& shape, Recompute rc,
                                        std::vector<ChunkCost>* out) const {
  out->assign(chunk_layers_.size(), ChunkCost{});
  KindCosts k;
  if (!LookupKinds(*cost_, shape, par_.tp, rc, &k)) return false;
  for (size_t c = 0; c < chunk_layers_.size(); ++c) (*out)[c] = CombineStage(chunk_layers_[c], k);
  return true;
}

CostSummary StageCostEvaluator::Summarize(const LayerShape& shape, Recompute rc,
                                          int64_t num_micro_batches) const {
  KindCosts k;
  if (!LookupKinds(*cost_, shape, par_.tp, rc, &k)) return CostSummary{};
  SummaryBuilder b;
  for (int64_t s = 0; s < par_.pp; ++s) {
    b.Add(CombineStage(stage_layers_[s], k), InFlight(s, num_micro_batches), budgets_[s]);
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

CostSummary StageCostEvaluator::SummaryFromStages(const std::vector<ChunkCost>& stages, bool ok,
                                                  int64_t num_micro_batches) const {
  if (!ok) return CostSummary{};
  SummaryBuilder b;
  for (int64_t s = 0; s < par_.pp; ++s) {
    b.Add(stages[s], InFlight(s, num_micro_batches), budgets_[s]);
  }
  return b.Finish(true);
}

Status StageCostEvaluator::FitVarlen() {
  for (auto& f : fits_) f.assign(static_cast<size_t>(par_.pp), StageFit{});
  varlen_supported_ = false;
  if (model().is_encoder_decoder()) return Status::Ok();
  const std::vector<int64_t> lengths = FitLengths(model().max_position);
  constexpr double kScale = 1024.0;  // fit in units of 1024 tokens for conditioning
  std::vector<ChunkCost> stages;
  for (int r = 0; r < 3; ++r) {
    const Recompute rc = static_cast<Recompute>(r);
    // Points at several micro-batch sizes (up to max_position tokens in all), so that the fit
    // separates the per-micro-batch floor c from work that grows with tokens: a varlen
    // micro-batch of many short samples pays b per token, not just c.
    std::vector<std::vector<ChunkCost>> points;
    std::vector<double> xs, ms;
    for (int64_t len : lengths) {
      for (int64_t mbs = 1; mbs == 1 || mbs * len <= model().max_position; mbs *= 2) {
        if (!EvaluateStages(LayerShape{mbs, len, 0}, rc, &stages)) continue;
        points.push_back(stages);
        xs.push_back(static_cast<double>(len));
        ms.push_back(static_cast<double>(mbs));
      }
    }
    if (points.size() < 3) continue;
    for (int64_t s = 0; s < par_.pp; ++s) {
      std::vector<std::array<double, 3>> x3;
      std::vector<std::array<double, 2>> x2;
      std::vector<double> t, st, pk, wt, wst, wpk;
      double fw = 0, all = 0, bw = 0, bww = 0;
      for (size_t p = 0; p < points.size(); ++p) {
        const ChunkCost& c = points[p][s];
        const double u = xs[p] / kScale;
        const double m = ms[p];
        x3.push_back({m * u * u, m * u, 1.0});
        x2.push_back({m * u * u, m * u});
        const double time = (c.forward + c.backward()).millis();
        t.push_back(time);
        st.push_back(c.stored.mb());
        pk.push_back(c.peak.mb());
        // Relative error: weight 1 / y^2 (guarding zeros).
        wt.push_back(1.0 / std::max(time * time, 1e-12));
        wst.push_back(1.0 / std::max(st.back() * st.back(), 1e-12));
        wpk.push_back(1.0 / std::max(pk.back() * pk.back(), 1e-12));
        fw += c.forward.millis();
        all += time;
        bw += c.backward().millis();
        bww += c.backward_weight.millis();
      }
      const std::array<double, 3> tc = FitNonNegative<3>(x3, t, wt);
      const std::array<double, 2> sc = FitNonNegative<2>(x2, st, wst);
      const std::array<double, 2> pc = FitNonNegative<2>(x2, pk, wpk);
      StageFit& f = fits_[r][s];
      f.time = Quadratic{tc[0] / (kScale * kScale), tc[1] / kScale, tc[2]};
      f.fw_fraction = all > 0 ? fw / all : 0.5;
      f.wgrad_fraction = bw > 0 ? bww / bw : 0.5;
      f.mem_a = sc[0] * 1e6 / (kScale * kScale);  // bytes per token^2
      f.mem_b = sc[1] * 1e6 / kScale;
      f.peak_a = pc[0] * 1e6 / (kScale * kScale);
      f.peak_b = pc[1] * 1e6 / kScale;
      f.max_len = static_cast<int64_t>(*std::max_element(xs.begin(), xs.end()));
    }
    varlen_supported_ = true;
  }
  return Status::Ok();
}

namespace {

// Sum of lengths and of squared lengths; false when a length is outside [1, max_len].
bool LengthMoments(std::span<const int64_t> lengths, int64_t max_len, double* s1, double* s2) {
  *s1 = 0;
  *s2 = 0;
  if (lengths.empty() || max_len <= 0) return false;
  for (int64_t len : lengths) {
    if (len < 1 || len > max_len) return false;
    const double v = static_cast<double>(len);
    *s1 += v;
    *s2 += v * v;
  }
  return true;
}

// One stage's varlen cost from its fit (a StageFit) and the length moments.
template <typename Fit>
ChunkCost VarlenStage(const Fit& f, double s1, double s2) {
  const double ms = f.time.a * s2 + f.time.b * s1 + f.time.c;
  ChunkCost c;
  c.forward = Duration::Millis(ms * f.fw_fraction);
  const Duration backward = Duration::Millis(ms) - c.forward;
  c.backward_weight = backward.Scaled(f.wgrad_fraction);
  c.backward_input = backward - c.backward_weight;
  c.stored = Bytes::Of(std::llround(f.mem_a * s2 + f.mem_b * s1));
  c.peak = std::max(c.stored, Bytes::Of(std::llround(f.peak_a * s2 + f.peak_b * s1)));
  return c;
}

}  // namespace

bool StageCostEvaluator::EvaluateVarlenStages(std::span<const int64_t> lengths, Recompute rc,
                                              std::vector<ChunkCost>* out) const {
  out->assign(static_cast<size_t>(par_.pp), ChunkCost{});
  if (!varlen_supported_) return false;
  const std::vector<StageFit>& fits = fits_[static_cast<int>(rc)];
  double s1 = 0, s2 = 0;
  if (!LengthMoments(lengths, fits[0].max_len, &s1, &s2)) return false;
  for (int64_t s = 0; s < par_.pp; ++s) (*out)[s] = VarlenStage(fits[s], s1, s2);
  return true;
}

CostSummary StageCostEvaluator::SummarizeVarlen(std::span<const int64_t> lengths, Recompute rc,
                                                int64_t num_micro_batches) const {
  if (!varlen_supported_) return CostSummary{};
  const std::vector<StageFit>& fits = fits_[static_cast<int>(rc)];
  double s1 = 0, s2 = 0;
  if (!LengthMoments(lengths, fits[0].max_len, &s1, &s2)) return CostSummary{};
  SummaryBuilder b;
  for (int64_t s = 0; s < par_.pp; ++s) {
    b.Add(VarlenStage(fits[s], s1, s2), InFlight(s, num_micro_batches), budgets_[s]);
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

Bytes StageCostEvaluator::BoundaryBytes(const LayerShape& shape, int64_t stage) const {
  Bytes out;
  for (int64_t v = 0; v < par_.vpp; ++v) {
    out = std::max(out, ChunkBoundaryBytes(shape, stage + v * par_.pp));
  }
  return out;
}

Bytes StageCostEvaluator::ChunkBoundaryBytes(const LayerShape& shape, int64_t chunk) const {
  const int64_t chunks = par_.chunks();
  if (chunk >= chunks - 1) return Bytes::Zero();
  int64_t tokens = shape.mbs * shape.seqlen;
  if (model().is_encoder_decoder() && chunk >= EncoderEndChunk(model(), chunks)) {
    tokens += shape.mbs * shape.dec_seqlen;
  }
  return Bytes::Of(2 * tokens * model().hidden);
}

std::optional<MemoryViolation> FindMemoryViolation(const StageCostEvaluator& eval,
                                                   std::span<const MicroBatch> micro_batches) {
  const int64_t m = static_cast<int64_t>(micro_batches.size());
  for (int64_t s = 0; s < eval.pp(); ++s) {
    const int64_t k = eval.InFlight(s, m);
    const Bytes budget = eval.ActivationBudget(s);
    // Windows [w, w + k); with m <= k there is one window holding all of them.
    for (int64_t w = 0; w < m; ++w) {
      const int64_t end = std::min(m, w + k);
      Bytes stored;
      for (int64_t i = w; i < end; ++i) stored += micro_batches[i].stages[s].stored;
      for (int64_t i = w; i < end; ++i) {
        const MicroBatch& run = micro_batches[i];
        const Bytes need = stored - run.stages[s].stored + run.stages[s].peak;
        if (need > budget) return MemoryViolation{s, w, end, i, need, budget};
      }
      if (end == m) break;
    }
  }
  return std::nullopt;
}

std::string CheckSequenceMemory(const StageCostEvaluator& eval,
                                std::span<const MicroBatch> micro_batches) {
  const int64_t pp = eval.pp();
  for (size_t i = 0; i < micro_batches.size(); ++i) {
    const MicroBatch& mb = micro_batches[i];
    if (static_cast<int64_t>(mb.stages.size()) != pp) {
      return fmt::format("micro-batch {}: memory given for {} stages, the pipeline has {}", i,
                         mb.stages.size(), pp);
    }
  }
  const std::optional<MemoryViolation> v = FindMemoryViolation(eval, micro_batches);
  if (!v) return "";
  return fmt::format(
      "stage {}: micro-batches {}..{} in flight with {} running need {} of activations (stored of "
      "the others + its peak {}), budget {} (memory limit {} - model states {})",
      v->stage, v->begin, v->end - 1, v->running, FormatBytes(v->need),
      FormatBytes(micro_batches[v->running].stages[v->stage].peak), FormatBytes(v->budget),
      FormatBytes(eval.memory_limit()), FormatBytes(eval.stage_states()[v->stage].total()));
}

}  // namespace sluice
