#include "cost/profiled_cost_model.h"

#include <fmt/core.h>

#include <algorithm>
#include <cmath>
#include <limits>
#include <map>
#include <utility>

#include "cost/layer_work.h"

namespace sluice {
namespace {

constexpr double kNaN = std::numeric_limits<double>::quiet_NaN();

// Position of x on a sorted axis: the lower index and the upper neighbour's weight. x at or
// below the first point rounds up to it; x on a point has weight 0 on the neighbour. False when
// x lies above the last point.
inline bool Bracket(const std::vector<int64_t>& axis, int64_t x, size_t* lower, double* upper_w) {
  if (x <= axis.front()) {
    *lower = 0;
    *upper_w = 0;
    return true;
  }
  if (x > axis.back()) return false;
  size_t i = 1;
  while (axis[i] < x) ++i;  // axis[i - 1] < x <= axis[i]; axes hold a dozen points
  if (axis[i] == x) {
    *lower = i;
    *upper_w = 0;
    return true;
  }
  *lower = i - 1;
  *upper_w = static_cast<double>(x - axis[i - 1]) / static_cast<double>(axis[i] - axis[i - 1]);
  return true;
}

// Builds a grid from one series per metric. `pair_keys`: 3-D (enc_seqlen, dec_seqlen, mbs).
ProfiledCostModel::Grid BuildGrid(const std::vector<const CostSeries*>& series, bool pair_keys) {
  ProfiledCostModel::Grid g;
  g.dims = pair_keys ? 3 : 2;
  g.metrics = static_cast<int>(series.size());
  std::vector<int64_t> keys0, keys1, mbs;
  for (const CostSeries* s : series) {
    for (const CostRow& row : *s) {
      keys0.push_back(row.seqlen);
      if (pair_keys) keys1.push_back(row.dec_seqlen);
      mbs.insert(mbs.end(), row.mbs.begin(), row.mbs.end());
    }
  }
  auto unique_sorted = [](std::vector<int64_t> v) {
    std::sort(v.begin(), v.end());
    v.erase(std::unique(v.begin(), v.end()), v.end());
    return v;
  };
  g.axes[0] = unique_sorted(std::move(keys0));
  if (pair_keys) g.axes[1] = unique_sorted(std::move(keys1));
  g.axes[g.dims - 1] = unique_sorted(std::move(mbs));
  size_t points = 1;
  for (int d = 0; d < g.dims; ++d) points *= g.axes[d].size();
  g.values.assign(points * static_cast<size_t>(g.metrics), kNaN);
  auto index_of = [](const std::vector<int64_t>& axis, int64_t x) {
    return static_cast<size_t>(std::lower_bound(axis.begin(), axis.end(), x) - axis.begin());
  };
  const std::vector<int64_t>& mbs_axis = g.axes[g.dims - 1];
  for (int m = 0; m < g.metrics; ++m) {
    for (const CostRow& row : *series[m]) {
      size_t base = index_of(g.axes[0], row.seqlen);
      if (pair_keys) base = base * g.axes[1].size() + index_of(g.axes[1], row.dec_seqlen);
      for (size_t k = 0; k < row.mbs.size(); ++k) {
        const size_t point = base * mbs_axis.size() + index_of(mbs_axis, row.mbs[k]);
        g.values[point * static_cast<size_t>(g.metrics) + static_cast<size_t>(m)] = row.value[k];
      }
    }
  }
  return g;
}

Status Require(const LayerCostTable& t, size_t i, const CostSeries& s, std::string_view field,
               const ModelSpec& m) {
  if (!s.empty()) return Status::Ok();
  return InvalidArgumentError(
      fmt::format("{}: field 'tables[{}].{}': is required to cost model "
                  "'{}' ({}) and missing or empty",
                  t.path, i, field, m.name, ModelKindName(m.kind)));
}

}  // namespace

bool ProfiledCostModel::Grid::Lookup(int64_t* point, double* out) const {
  size_t lower[3] = {0, 0, 0};
  double upper_w[3] = {0, 0, 0};
  for (int d = 0; d < dims; ++d) {
    if (!Bracket(axes[d], point[d], &lower[d], &upper_w[d])) return false;
    point[d] = std::max(point[d], axes[d].front());
  }
  for (int m = 0; m < metrics; ++m) out[m] = 0;
  const size_t n1 = dims == 3 ? axes[1].size() : 1;
  const size_t nm = axes[dims - 1].size();
  for (int corner = 0; corner < (1 << dims); ++corner) {
    double w = 1;
    size_t idx[3] = {0, 0, 0};
    for (int d = 0; d < dims; ++d) {
      const bool up = (corner >> d) & 1;
      w *= up ? upper_w[d] : 1 - upper_w[d];
      idx[d] = lower[d] + (up ? 1 : 0);
    }
    if (w == 0) continue;  // never read a corner that does not count (it may be out of range)
    const size_t point_index =
        dims == 3 ? (idx[0] * n1 + idx[1]) * nm + idx[2] : idx[0] * nm + idx[1];
    const double* v = &values[point_index * static_cast<size_t>(metrics)];
    for (int m = 0; m < metrics; ++m) {
      if (std::isnan(v[m])) return false;
      out[m] += w * v[m];
    }
  }
  return true;
}

ProfiledCostModel::ProfiledCostModel(LayerCostTable table, ModelSpec model,
                                     std::unique_ptr<AnalyticCostModel> analytic)
    : table_(std::move(table)), model_(std::move(model)), analytic_(std::move(analytic)) {}

StatusOr<std::unique_ptr<ProfiledCostModel>> ProfiledCostModel::Create(LayerCostTable table,
                                                                       ModelSpec model,
                                                                       ProfiledOptions options) {
  SLUICE_RETURN_IF_ERROR(ValidateModelSpec(model, model.name.empty() ? "model" : model.name));
  SLUICE_RETURN_IF_ERROR(CheckTableMatchesModel(table, model));
  const bool enc_dec = model.is_encoder_decoder();
  const double moe_share = MoeLayerFraction(model, LayerKind::kEncoder);
  for (size_t i = 0; i < table.configs.size(); ++i) {
    const TableConfig& c = table.configs[i];
    std::vector<int> stages;
    if (moe_share < 1) stages.push_back(static_cast<int>(TableStage::kEncoder));
    if (moe_share > 0) stages.push_back(static_cast<int>(TableStage::kMoeEncoder));
    if (enc_dec) stages.push_back(static_cast<int>(TableStage::kDecoder));
    for (int s : stages) {
      const std::string name(TableStageName(static_cast<TableStage>(s)));
      SLUICE_RETURN_IF_ERROR(
          Require(table, i, c.forward_ms[s], "time_ms." + name + "_forward", model));
      SLUICE_RETURN_IF_ERROR(
          Require(table, i, c.backward_ms[s], "time_ms." + name + "_backward", model));
      SLUICE_RETURN_IF_ERROR(
          Require(table, i, c.stored_activation_mb[s], "stored_activation_mb." + name, model));
      SLUICE_RETURN_IF_ERROR(
          Require(table, i, c.peak_activation_mb[s], "peak_activation_mb." + name, model));
    }
    const int post = static_cast<int>(TableStage::kPostprocess);
    SLUICE_RETURN_IF_ERROR(
        Require(table, i, c.forward_ms[post], "time_ms.postprocess_forward", model));
    SLUICE_RETURN_IF_ERROR(
        Require(table, i, c.backward_ms[post], "time_ms.postprocess_backward", model));
  }
  SLUICE_ASSIGN_OR_RETURN(std::unique_ptr<AnalyticCostModel> analytic,
                          AnalyticCostModel::Create(model, options.device, options.analytic));
  std::unique_ptr<ProfiledCostModel> out(
      new ProfiledCostModel(std::move(table), std::move(model), std::move(analytic)));
  out->moe_share_ = moe_share;
  std::map<int64_t, TpParams> by_tp;
  for (const TableConfig& c : out->table_.configs) {
    ConfigGrids g;
    g.tp = c.tp;
    g.recompute = c.recompute;
    const int e = static_cast<int>(TableStage::kEncoder);
    const int d = static_cast<int>(TableStage::kDecoder);
    const int p = static_cast<int>(TableStage::kPostprocess);
    const int me = static_cast<int>(TableStage::kMoeEncoder);
    if (moe_share < 1) {
      g.encoder = BuildGrid({&c.forward_ms[e], &c.backward_ms[e], &c.stored_activation_mb[e],
                             &c.peak_activation_mb[e]},
                            /*pair_keys=*/false);
    }
    if (moe_share > 0) {
      g.moe_encoder = BuildGrid({&c.forward_ms[me], &c.backward_ms[me],
                                 &c.stored_activation_mb[me], &c.peak_activation_mb[me]},
                                /*pair_keys=*/false);
    }
    if (enc_dec) {
      g.decoder = BuildGrid({&c.forward_ms[d], &c.backward_ms[d], &c.stored_activation_mb[d],
                             &c.peak_activation_mb[d]},
                            /*pair_keys=*/true);
    }
    g.head = BuildGrid({&c.forward_ms[p], &c.backward_ms[p]}, /*pair_keys=*/false);
    out->configs_.push_back(std::move(g));
    // Parameters per tp: the first entry with the value wins (rc does not change them).
    TpParams& tp = by_tp[c.tp];
    tp.tp = c.tp;
    auto set = [&](LayerKind kind, const std::optional<double>& mb) {
      int64_t& slot = tp.params[static_cast<int>(kind)];
      if (slot < 0 && mb.has_value()) slot = std::llround(*mb * 1e6 / 2.0);
    };
    set(LayerKind::kEncoder, c.param_mb[e]);
    set(LayerKind::kDecoder, c.param_mb[d]);
    set(LayerKind::kEmbedding, c.embedding_param_mb);
    if (tp.moe_encoder < 0 && c.param_mb[me].has_value()) {
      tp.moe_encoder = std::llround(*c.param_mb[me] * 1e6 / 2.0);
    }
  }
  for (auto& [tp, params] : by_tp) out->params_.push_back(params);
  return out;
}

std::string ProfiledCostModel::Describe() const {
  return fmt::format(
      "profiled: {} ({}); multilinear interpolation, infeasible outside the measured grid; "
      "embedding time and output-head memory analytic ({}); backward I/W split by the analytic "
      "FLOP ratio",
      table_.path, table_.measured_on, analytic_->device().name);
}

bool ProfiledCostModel::SupportsTp(int64_t tp) const {
  for (const ConfigGrids& c : configs_) {
    if (c.tp == tp) return true;
  }
  return false;
}

const ProfiledCostModel::ConfigGrids* ProfiledCostModel::FindConfig(int64_t tp,
                                                                    Recompute rc) const {
  for (const ConfigGrids& c : configs_) {
    if (c.tp == tp && c.recompute == rc) return &c;
  }
  return nullptr;
}

LayerCost ProfiledCostModel::Layer(LayerKind kind, const LayerShape& shape, int64_t tp,
                                   Recompute rc) const {
  SLUICE_CHECK(shape.mbs >= 1 && shape.seqlen >= 1);
  LayerCost cost;
  const ConfigGrids* c = FindConfig(tp, rc);
  if (c == nullptr) return cost;
  if (shape.seqlen > model_.max_position || shape.dec_seqlen > model_.max_position) return cost;
  if (kind == LayerKind::kEmbedding) return analytic_->Layer(kind, shape, tp, rc);
  double v[4] = {0, 0, 0, 0};
  LayerShape at = shape;  // the shape answered for: below-grid coordinates rounded up
  switch (kind) {
    case LayerKind::kEncoder: {
      if (!LookupEncoder(*c, shape, v, &at)) return cost;
      break;
    }
    case LayerKind::kDecoder: {
      if (c->decoder.dims == 0 || shape.dec_seqlen < 1) return cost;
      int64_t point[3] = {shape.seqlen, shape.dec_seqlen, shape.mbs};
      if (!c->decoder.Lookup(point, v)) return cost;
      at = LayerShape{point[2], point[0], point[1]};
      break;
    }
    case LayerKind::kOutputHead: {
      const int64_t len = HeadLength(model_, shape);
      if (len < 1) return cost;
      int64_t point[2] = {len, shape.mbs};
      if (!c->head.Lookup(point, v)) return cost;
      at.mbs = point[1];
      (model_.is_encoder_decoder() ? at.dec_seqlen : at.seqlen) = point[0];
      const ActivationBytes act =
          ComputeActivation(model_, kind, at, tp, rc, analytic_->options().work);
      v[2] = act.stored * 1e-6;
      v[3] = act.peak * 1e-6;
      break;
    }
    case LayerKind::kEmbedding:
      return cost;  // answered above
  }
  const LayerWork work = ComputeLayerWork(model_, kind, at, tp, rc, analytic_->options().work);
  cost.feasible = true;
  cost.forward = Duration::Millis(v[0]);
  cost.backward = Duration::Millis(v[1]);
  cost.backward_weight = cost.backward.Scaled(work.WeightGradFraction());
  cost.backward_input = cost.backward - cost.backward_weight;
  cost.stored_activation = Bytes::MB(v[2]);
  cost.peak_activation = Bytes::MB(v[3]);
  return cost;
}

bool ProfiledCostModel::LookupEncoder(const ConfigGrids& c, const LayerShape& shape, double* v,
                                      LayerShape* at) const {
  // The dense and the MoE layer, each where it weighs; the answer at the larger rounded shape.
  const std::pair<const Grid*, double> parts[] = {{&c.encoder, 1 - moe_share_},
                                                  {&c.moe_encoder, moe_share_}};
  for (int m = 0; m < 4; ++m) v[m] = 0;
  for (const auto& [grid, weight] : parts) {
    if (weight <= 0) continue;
    int64_t point[2] = {shape.seqlen, shape.mbs};
    double part[4] = {0, 0, 0, 0};
    if (!grid->Lookup(point, part)) return false;
    for (int m = 0; m < 3; ++m) v[m] += weight * part[m];
    v[3] = std::max(v[3], part[3]);  // peaks do not add up: the larger layer's
    at->seqlen = std::max(at->seqlen, point[0]);
    at->mbs = std::max(at->mbs, point[1]);
  }
  return true;
}

int64_t ProfiledCostModel::LayerParams(LayerKind kind, int64_t tp) const {
  if (kind == LayerKind::kOutputHead) return AnalyticLayerParams(model_, kind, tp);
  if (kind == LayerKind::kEncoder && moe_share_ > 0) {
    for (const TpParams& p : params_) {
      const int64_t dense = p.params[static_cast<int>(kind)];
      if (p.tp != tp || p.moe_encoder < 0 || (moe_share_ < 1 && dense < 0)) continue;
      return std::llround((1 - moe_share_) * static_cast<double>(std::max<int64_t>(dense, 0)) +
                          moe_share_ * static_cast<double>(p.moe_encoder));
    }
    return AnalyticLayerParams(model_, kind, tp);
  }
  for (const TpParams& p : params_) {
    if (p.tp == tp && p.params[static_cast<int>(kind)] >= 0) {
      return p.params[static_cast<int>(kind)];
    }
  }
  return AnalyticLayerParams(model_, kind, tp);
}

}  // namespace sluice
