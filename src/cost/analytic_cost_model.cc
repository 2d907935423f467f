#include "cost/analytic_cost_model.h"

#include <fmt/core.h>

#include <algorithm>
#include <bit>
#include <cmath>
#include <cstdlib>
#include <utility>

namespace sluice {
namespace {

PassFactors Pass(double overhead_ms, double gemm, double attention, double sharpness) {
  PassFactors f;
  f.overhead = Duration::Millis(overhead_ms);
  f.gemm_efficiency = gemm;
  f.attention_efficiency = attention;
  f.sharpness = sharpness;
  return f;
}

bool PositiveFinite(double x) { return std::isfinite(x) && x > 0; }

// A layer pass longer than this (about 30 years) is not a schedule; it also keeps Duration's
// int64 nanoseconds far from overflow.
constexpr double kMaxSeconds = 1e9;

Status CheckPass(const PassFactors& f, std::string_view what) {
  if (f.overhead < Duration::Zero() || !PositiveFinite(f.gemm_efficiency) ||
      !PositiveFinite(f.attention_efficiency) || !PositiveFinite(f.memory_efficiency) ||
      !std::isfinite(f.sharpness) || f.sharpness < 1) {
    return InvalidArgumentError(fmt::format(
        "analytic cost model: {} factors must have overhead >= 0, positive finite efficiencies "
        "and sharpness >= 1",
        what));
  }
  return Status::Ok();
}

int Log2Distance(int64_t a, int64_t b) {
  const double d = std::fabs(std::log2(static_cast<double>(a)) - std::log2(static_cast<double>(b)));
  return static_cast<int>(std::lround(d * 1024));  // integral for a deterministic tie rule
}

}  // namespace

LayerFactors DefaultLayerFactors(LayerKind kind, Recompute rc) {
  LayerFactors f;
  if (kind == LayerKind::kOutputHead) {
    f.forward = Pass(1.16, 0.67, 1.0, 2.4);
    f.backward = Pass(1.0, 0.85, 1.0, 1.35);
    return f;
  }
  f.forward = Pass(1.85, 0.70, 0.735, 4.0);
  const double floor_ms = rc == Recompute::kFull ? 3.7 : rc == Recompute::kSelective ? 2.5 : 1.8;
  f.backward = Pass(floor_ms, 0.77, 0.93, 6.0);
  return f;
}

void AnalyticFactors::Set(LayerKind kind, int64_t tp, Recompute rc, const LayerFactors& factors) {
  for (Entry& e : entries_) {
    if (e.kind == kind && e.tp == tp && e.recompute == rc) {
      e.factors = factors;
      return;
    }
  }
  entries_.push_back(Entry{kind, tp, rc, factors});
}

const AnalyticFactors::Entry* AnalyticFactors::Nearest(LayerKind kind, int64_t tp,
                                                       Recompute rc) const {
  const Entry* best = nullptr;
  int best_distance = 0;
  for (const Entry& e : entries_) {
    if (e.kind != kind || e.recompute != rc) continue;
    const int d = Log2Distance(e.tp, tp);
    if (best == nullptr || d < best_distance || (d == best_distance && e.tp < best->tp)) {
      best = &e;
      best_distance = d;
    }
  }
  return best;
}

LayerFactors AnalyticFactors::Resolve(LayerKind kind, int64_t tp, Recompute rc) const {
  if (const Entry* e = Nearest(kind, tp, rc)) return e->factors;
  if (kind == LayerKind::kDecoder) {
    if (const Entry* e = Nearest(LayerKind::kEncoder, tp, rc)) return e->factors;
  }
  return DefaultLayerFactors(kind, rc);
}

AnalyticCostModel::AnalyticCostModel(ModelSpec model, DeviceSpec device, AnalyticOptions options)
    : model_(std::move(model)), device_(std::move(device)), options_(std::move(options)) {
  for (int k = 0; k < 4; ++k) {
    for (int r = 0; r < 3; ++r) {
      for (int i = 0; i < kCachedTps; ++i) {
        cache_[k][r][i] = options_.factors.Resolve(static_cast<LayerKind>(k), int64_t{1} << i,
                                                   static_cast<Recompute>(r));
      }
    }
  }
}

StatusOr<std::unique_ptr<AnalyticCostModel>> AnalyticCostModel::Create(ModelSpec model,
                                                                       DeviceSpec device,
                                                                       AnalyticOptions options) {
  SLUICE_RETURN_IF_ERROR(ValidateModelSpec(model, model.name.empty() ? "model" : model.name));
  if (!PositiveFinite(device.peak_flops) || !PositiveFinite(device.hbm_bandwidth) ||
      device.memory <= Bytes::Zero()) {
    return InvalidArgumentError(fmt::format(
        "analytic cost model: device '{}' needs positive peak_flops, hbm_bandwidth and memory",
        device.name));
  }
  if (!PositiveFinite(options.tp_link.bandwidth) || options.tp_link.latency < Duration::Zero()) {
    return InvalidArgumentError(
        "analytic cost model: tp_link needs a positive bandwidth and a latency >= 0");
  }
  SLUICE_RETURN_IF_ERROR(CheckPass(options.embedding, "embedding"));
  for (const AnalyticFactors::Entry& e : options.factors.entries()) {
    const std::string what = fmt::format("{} tp={} recompute={}", LayerKindName(e.kind), e.tp,
                                         RecomputeName(e.recompute));
    SLUICE_RETURN_IF_ERROR(CheckPass(e.factors.forward, what + " forward"));
    SLUICE_RETURN_IF_ERROR(CheckPass(e.factors.backward, what + " backward"));
  }
  return std::unique_ptr<AnalyticCostModel>(
      new AnalyticCostModel(std::move(model), std::move(device), std::move(options)));
}

std::string AnalyticCostModel::Describe() const {
  return fmt::format(
      "analytic: {} roofline ({:.0f} TFLOP/s, {:.0f} GB/s HBM, tp link {:.0f} GB/s), factors: "
      "{}{}; backward I/W split by the FLOP ratio",
      device_.name, device_.peak_flops * 1e-12, device_.hbm_bandwidth * 1e-9,
      options_.tp_link.bandwidth * 1e-9, options_.factors_source,
      options_.work.flash_attention ? ", flash attention" : "");
}

bool AnalyticCostModel::SupportsTp(int64_t tp) const {
  if (tp < 1 || model_.heads % tp != 0) return false;
  const int64_t kv = model_.kv_heads > 0 ? model_.kv_heads : model_.heads;
  return kv % tp == 0 || tp % kv == 0;
}

double AnalyticCostModel::SmoothMax(double c, double w, double p) {
  const double m = std::max(c, w);
  if (m <= 0) return 0;
  return m * std::pow(std::pow(c / m, p) + std::pow(w / m, p), 1.0 / p);
}

double AnalyticCostModel::PassSeconds(const PassWork& work, const PassFactors& f,
                                      const DeviceSpec& device, const LinkSpec& link, int64_t tp) {
  double w =
      work.gemm_flops / (f.gemm_efficiency * device.peak_flops) +
      (work.attention_flops / device.peak_flops + work.attention_bytes / device.hbm_bandwidth) /
          f.attention_efficiency +
      work.memory_bytes / (f.memory_efficiency * device.hbm_bandwidth);
  w += TpAllReduceSeconds(work, link, tp);
  return SmoothMax(f.overhead.seconds(), w, f.sharpness);
}

double AnalyticCostModel::TpAllReduceSeconds(const PassWork& work, const LinkSpec& link,
                                             int64_t tp) {
  if (tp <= 1 || work.tp_allreduces == 0) return 0;
  const double n = static_cast<double>(tp);
  return 2 * (n - 1) / n * work.tp_allreduce_bytes / link.bandwidth +
         static_cast<double>(work.tp_allreduces) * 2 * (n - 1) * link.latency.seconds();
}

LayerFactors AnalyticCostModel::Factors(LayerKind kind, int64_t tp, Recompute rc) const {
  if (kind == LayerKind::kEmbedding) return LayerFactors{options_.embedding, options_.embedding};
  if (std::has_single_bit(static_cast<uint64_t>(tp))) {
    const int i = std::countr_zero(static_cast<uint64_t>(tp));
    if (i < kCachedTps) return cache_[static_cast<int>(kind)][static_cast<int>(rc)][i];
  }
  return options_.factors.Resolve(kind, tp, rc);
}

LayerCost AnalyticCostModel::Layer(LayerKind kind, const LayerShape& shape, int64_t tp,
                                   Recompute rc) const {
  SLUICE_CHECK(shape.mbs >= 1 && shape.seqlen >= 1);
  LayerCost cost;
  if (!SupportsTp(tp)) return cost;
  if (shape.seqlen > model_.max_position || shape.dec_seqlen > model_.max_position) return cost;
  if (kind == LayerKind::kDecoder && (!model_.is_encoder_decoder() || shape.dec_seqlen < 1)) {
    return cost;
  }
  if (kind == LayerKind::kOutputHead && HeadLength(model_, shape) < 1) return cost;
  const LayerWork work = ComputeLayerWork(model_, kind, shape, tp, rc, options_.work);
  const ActivationBytes act = ComputeActivation(model_, kind, shape, tp, rc, options_.work);
  const double weights = 4.0 * static_cast<double>(LayerParams(kind, tp));
  if (act.peak + weights > static_cast<double>(device_.memory.count())) return cost;
  const LayerFactors f = Factors(kind, tp, rc);
  const double forward = PassSeconds(work.forward, f.forward, device_, options_.tp_link, tp);
  const double backward = PassSeconds(work.backward, f.backward, device_, options_.tp_link, tp);
  if (!(forward < kMaxSeconds && backward < kMaxSeconds)) return cost;
  cost.feasible = true;
  cost.forward = Duration::Seconds(forward);
  cost.backward = Duration::Seconds(backward);
  cost.backward_weight = cost.backward.Scaled(work.WeightGradFraction());
  cost.backward_input = cost.backward - cost.backward_weight;
  cost.stored_activation = Bytes::Of(std::llround(act.stored));
  cost.peak_activation = Bytes::Of(std::llround(act.peak));
  return cost;
}

int64_t AnalyticCostModel::LayerParams(LayerKind kind, int64_t tp) const {
  return AnalyticLayerParams(model_, kind, tp);
}

}  // namespace sluice
