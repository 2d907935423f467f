#include "cost/cost_fit.h"

#include <fmt/core.h>

#include <algorithm>
#include <cmath>
#include <limits>
#include <numeric>
#include <utility>

#include "cost/layer_work.h"

namespace sluice {
namespace {

// One measured point with its work split into the model's regressors (seconds at efficiency 1).
struct Point {
  LayerShape shape;
  PassWork work;
  double gemm_s = 0;       // gemm_flops / peak
  double attention_s = 0;  // attention_flops / peak + attention_bytes / hbm
  double memory_s = 0;     // memory_bytes / hbm
  double comm_s = 0;       // tp all-reduces on the link
  double measured_s = 0;
};

// Parameters in log space: x = [log c_ms, log e_gemm, (log e_attn,) (log(p - 1))]; p is
// absent from x when `fixed_p` > 0.
PassFactors FromX(const std::vector<double>& x, bool attention, double memory_efficiency,
                  double fixed_p) {
  auto e = [](double v) { return std::exp(std::clamp(v, -30.0, 30.0)); };
  PassFactors f;
  f.overhead = Duration::Millis(e(x[0]));
  f.gemm_efficiency = e(x[1]);
  f.attention_efficiency = attention ? e(x[2]) : 1.0;
  f.memory_efficiency = memory_efficiency;
  f.sharpness = fixed_p > 0 ? fixed_p : 1 + e(x[attention ? 3 : 2]);
  return f;
}

double Predict(const Point& p, const PassFactors& f) {
  const double w = p.gemm_s / f.gemm_efficiency + p.attention_s / f.attention_efficiency +
                   p.memory_s / f.memory_efficiency + p.comm_s;
  return AnalyticCostModel::SmoothMax(f.overhead.seconds(), w, f.sharpness);
}

struct GroupSpec {
  LayerKind kind;
  bool backward;
  const CostSeries* series;
};

LayerShape ShapeOf(const ModelSpec& model, LayerKind kind, const CostRow& row, int64_t mbs) {
  LayerShape s;
  s.mbs = mbs;
  s.seqlen = row.seqlen;
  if (kind == LayerKind::kDecoder) s.dec_seqlen = row.dec_seqlen;
  // An encoder-decoder model's head is keyed by the decoder length (docs/formats.md).
  if (kind == LayerKind::kOutputHead && model.is_encoder_decoder()) s.dec_seqlen = row.seqlen;
  return s;
}

FitGroup FitOne(const std::vector<Point>& points, LayerKind kind, int64_t tp, Recompute rc,
                bool backward, const DeviceSpec& device, const FitOptions& options) {
  const double mem_eff = options.memory_efficiency;
  const double fixed_p = options.fixed_sharpness;
  bool attention = false;
  for (const Point& p : points) attention = attention || p.attention_s > 0;
  auto objective = [&](const std::vector<double>& x) {
    const PassFactors f = FromX(x, attention, mem_eff, fixed_p);
    double sum = 0;
    for (const Point& p : points) {
      const double r = std::log(Predict(p, f) / p.measured_s);
      sum += r * r;
    }
    const double v = sum / static_cast<double>(points.size());
    return std::isfinite(v) ? v : std::numeric_limits<double>::max();
  };
  // Two starts: (c 1.5 ms, e_gemm 0.6, e_attn 0.37, p 3.7) and (1.5 or 1 ms, 0.8, 0.75, 2.6).
  std::vector<std::vector<double>> starts = {{std::log(1.5), std::log(0.6), std::log(0.37), 1.0},
                                             {std::log(1.5), std::log(0.8), std::log(0.75), 0.5}};
  if (!attention)
    starts = {{std::log(1.5), std::log(0.6), 1.0}, {std::log(1.0), std::log(0.8), 0.5}};
  if (fixed_p > 0) {
    for (std::vector<double>& x0 : starts) x0.pop_back();
  }
  NelderMeadResult best;
  best.value = std::numeric_limits<double>::infinity();
  for (const std::vector<double>& x0 : starts) {
    NelderMeadResult r = MinimizeNelderMead(objective, x0, 0.5, options.max_evaluations, 1e-12);
    for (int i = 0; i < options.restarts; ++i) {
      r = MinimizeNelderMead(objective, r.x, 0.2, options.max_evaluations, 1e-12);
    }
    if (r.value < best.value) best = std::move(r);
  }
  FitGroup g;
  g.kind = kind;
  g.tp = tp;
  g.recompute = rc;
  g.backward = backward;
  g.factors = FromX(best.x, attention, mem_eff, fixed_p);
  g.points = static_cast<int64_t>(points.size());
  double sum = 0;
  for (const Point& p : points) {
    const double predicted =
        AnalyticCostModel::PassSeconds(p.work, g.factors, device, options.base.tp_link, tp);
    const double err = std::fabs(predicted - p.measured_s) / p.measured_s;
    sum += err;
    if (err >= g.max_rel_error) {
      g.max_rel_error = err;
      g.worst_shape = p.shape;
      g.worst_measured_ms = p.measured_s * 1e3;
      g.worst_predicted_ms = predicted * 1e3;
    }
  }
  g.mean_rel_error = sum / static_cast<double>(points.size());
  return g;
}

std::string ShapeText(LayerKind kind, const LayerShape& s) {
  if (kind == LayerKind::kDecoder) return fmt::format("{}x{}x{}", s.mbs, s.seqlen, s.dec_seqlen);
  if (kind == LayerKind::kOutputHead && s.dec_seqlen > 0)
    return fmt::format("{}x{}", s.mbs, s.dec_seqlen);
  return fmt::format("{}x{}", s.mbs, s.seqlen);
}

// An MoE table's mean layer (what the analytic model prices for kEncoder): (1 - phi) x the dense
// layer's value + phi x the MoE layer's, at the points both rows measured (phi = 1: the MoE rows).
CostSeries MeanLayerSeries(const CostSeries& dense, const CostSeries& moe, double phi) {
  if (phi >= 1) return moe;
  CostSeries out;
  for (const CostRow& m : moe) {
    auto d = std::find_if(dense.begin(), dense.end(),
                          [&](const CostRow& r) { return r.seqlen == m.seqlen; });
    if (d == dense.end()) continue;
    CostRow row{m.seqlen, 0, {}, {}};
    for (size_t i = 0; i < m.mbs.size(); ++i) {
      auto at = std::find(d->mbs.begin(), d->mbs.end(), m.mbs[i]);
      if (at == d->mbs.end()) continue;
      row.mbs.push_back(m.mbs[i]);
      row.value.push_back((1 - phi) * d->value[static_cast<size_t>(at - d->mbs.begin())] +
                          phi * m.value[i]);
    }
    if (!row.mbs.empty()) out.push_back(std::move(row));
  }
  return out;
}

}  // namespace

NelderMeadResult MinimizeNelderMead(const std::function<double(const std::vector<double>&)>& f,
                                    std::vector<double> x0, double step, int max_evaluations,
                                    double tolerance) {
  const size_t n = x0.size();
  std::vector<std::vector<double>> simplex(n + 1, x0);
  std::vector<double> values(n + 1);
  NelderMeadResult out;
  auto eval = [&](const std::vector<double>& x) {
    ++out.evaluations;
    return f(x);
  };
  for (size_t i = 0; i < n; ++i) simplex[i + 1][i] += step;
  for (size_t i = 0; i <= n; ++i) values[i] = eval(simplex[i]);
  std::vector<size_t> order(n + 1);
  std::vector<double> centroid(n), trial(n), trial2(n);
  while (out.evaluations < max_evaluations) {
    std::iota(order.begin(), order.end(), 0);
    std::stable_sort(order.begin(), order.end(),
                     [&](size_t a, size_t b) { return values[a] < values[b]; });
    const size_t best = order[0], worst = order[n], second = order[n - 1];
    if (std::fabs(values[worst] - values[best]) <= tolerance) break;
    std::fill(centroid.begin(), centroid.end(), 0.0);
    for (size_t i = 0; i <= n; ++i) {
      if (i == worst) continue;
      for (size_t k = 0; k < n; ++k) centroid[k] += simplex[i][k] / static_cast<double>(n);
    }
    auto along = [&](double t, std::vector<double>* x) {
      for (size_t k = 0; k < n; ++k) (*x)[k] = centroid[k] + t * (simplex[worst][k] - centroid[k]);
    };
    along(-1.0, &trial);  // reflection
    const double fr = eval(trial);
    if (fr < values[best]) {
      along(-2.0, &trial2);  // expansion
      const double fe = eval(trial2);
      if (fe < fr) {
        simplex[worst] = trial2;
        values[worst] = fe;
      } else {
        simplex[worst] = trial;
        values[worst] = fr;
      }
    } else if (fr < values[second]) {
      simplex[worst] = trial;
      values[worst] = fr;
    } else {
      along(fr < values[worst] ? -0.5 : 0.5, &trial2);  // outside / inside contraction
      const double fc = eval(trial2);
      if (fc < std::min(fr, values[worst])) {
        simplex[worst] = trial2;
        values[worst] = fc;
      } else {  // shrink towards the best point
        for (size_t i = 0; i <= n; ++i) {
          if (i == best) continue;
          for (size_t k = 0; k < n; ++k) {
            simplex[i][k] = simplex[best][k] + 0.5 * (simplex[i][k] - simplex[best][k]);
          }
          values[i] = eval(simplex[i]);
        }
      }
    }
  }
  const size_t best =
      static_cast<size_t>(std::min_element(values.begin(), values.end()) - values.begin());
  out.x = simplex[best];
  out.value = values[best];
  return out;
}

StatusOr<FitReport> FitAnalyticToTable(const LayerCostTable& table, const ModelSpec& model,
                                       const DeviceSpec& device, const FitOptions& options) {
  SLUICE_RETURN_IF_ERROR(CheckTableMatchesModel(table, model));
  // Validates the model and the device the same way the fitted model will be built.
  SLUICE_ASSIGN_OR_RETURN(std::unique_ptr<AnalyticCostModel> check,
                          AnalyticCostModel::Create(model, device, options.base));
  FitReport report;
  report.table_path = table.path;
  report.model_name = model.name;
  report.device_name = device.name;
  struct Probe {  // forward points, to count what the fitted model calls infeasible
    LayerKind kind;
    int64_t tp;
    Recompute rc;
    std::vector<LayerShape> shapes;
  };
  std::vector<Probe> probes;
  double error_sum = 0;
  for (const TableConfig& c : table.configs) {
    if (!check->SupportsTp(c.tp)) continue;
    std::vector<GroupSpec> groups;
    auto add = [&](LayerKind kind, TableStage stage) {
      const int s = static_cast<int>(stage);
      if (!c.forward_ms[s].empty()) groups.push_back({kind, false, &c.forward_ms[s]});
      if (!c.backward_ms[s].empty()) groups.push_back({kind, true, &c.backward_ms[s]});
    };
    // MoE models: the encoder factors are fitted to the stack's mean layer, which the analytic
    // model prices (its work is the mean layer's), from the dense and the MoE layer's rows.
    const double phi = MoeLayerFraction(model, LayerKind::kEncoder);
    CostSeries mean_forward, mean_backward;
    if (phi > 0) {
      const int e = static_cast<int>(TableStage::kEncoder);
      const int me = static_cast<int>(TableStage::kMoeEncoder);
      mean_forward = MeanLayerSeries(c.forward_ms[e], c.forward_ms[me], phi);
      mean_backward = MeanLayerSeries(c.backward_ms[e], c.backward_ms[me], phi);
      if (!mean_forward.empty()) groups.push_back({LayerKind::kEncoder, false, &mean_forward});
      if (!mean_backward.empty()) groups.push_back({LayerKind::kEncoder, true, &mean_backward});
    } else {
      add(LayerKind::kEncoder, TableStage::kEncoder);
    }
    if (model.is_encoder_decoder()) add(LayerKind::kDecoder, TableStage::kDecoder);
    add(LayerKind::kOutputHead, TableStage::kPostprocess);
    LayerFactors fitted[4] = {};
    bool have[4][2] = {};
    for (const GroupSpec& gs : groups) {
      std::vector<Point> points;
      for (const CostRow& row : *gs.series) {
        for (size_t k = 0; k < row.mbs.size(); ++k) {
          Point p;
          p.shape = ShapeOf(model, gs.kind, row, row.mbs[k]);
          const LayerWork w =
              ComputeLayerWork(model, gs.kind, p.shape, c.tp, c.recompute, options.base.work);
          p.work = gs.backward ? w.backward : w.forward;
          p.gemm_s = p.work.gemm_flops / device.peak_flops;
          p.attention_s = p.work.attention_flops / device.peak_flops +
                          p.work.attention_bytes / device.hbm_bandwidth;
          p.memory_s = p.work.memory_bytes / device.hbm_bandwidth;
          p.comm_s = AnalyticCostModel::TpAllReduceSeconds(p.work, options.base.tp_link, c.tp);
          p.measured_s = row.value[k] * 1e-3;
          points.push_back(p);
        }
      }
      if (points.empty()) continue;
      FitGroup g = FitOne(points, gs.kind, c.tp, c.recompute, gs.backward, device, options);
      LayerFactors& lf = fitted[static_cast<int>(gs.kind)];
      (gs.backward ? lf.backward : lf.forward) = g.factors;
      have[static_cast<int>(gs.kind)][gs.backward ? 1 : 0] = true;
      report.points += g.points;
      error_sum += g.mean_rel_error * static_cast<double>(g.points);
      report.max_rel_error = std::max(report.max_rel_error, g.max_rel_error);
      if (!gs.backward) {
        Probe probe{gs.kind, c.tp, c.recompute, {}};
        for (const Point& p : points) probe.shapes.push_back(p.shape);
        probes.push_back(std::move(probe));
      }
      report.groups.push_back(std::move(g));
    }
    for (int k = 0; k < 4; ++k) {
      if (!have[k][0] && !have[k][1]) continue;
      LayerFactors lf = DefaultLayerFactors(static_cast<LayerKind>(k), c.recompute);
      if (have[k][0]) lf.forward = fitted[k].forward;
      if (have[k][1]) lf.backward = fitted[k].backward;
      report.factors.Set(static_cast<LayerKind>(k), c.tp, c.recompute, lf);
    }
  }
  if (report.points > 0) report.mean_rel_error = error_sum / static_cast<double>(report.points);
  AnalyticOptions fitted_options = options.base;
  fitted_options.factors = report.factors;
  SLUICE_ASSIGN_OR_RETURN(std::unique_ptr<AnalyticCostModel> fitted,
                          AnalyticCostModel::Create(model, device, fitted_options));
  for (const Probe& probe : probes) {
    for (const LayerShape& shape : probe.shapes) {
      if (!fitted->Layer(probe.kind, shape, probe.tp, probe.rc).feasible) {
        ++report.infeasible_points;
      }
    }
  }
  return report;
}

std::string FormatFitReport(const FitReport& r) {
  std::string out = fmt::format(
      "analytic cost model fitted to {} (model {}, device {})\n"
      "time = (c^p + W^p)^(1/p), W = gemm/(e_gemm*peak) + attention/e_attn + bytes/(e_mem*hbm)"
      " + tp all-reduce\n\n",
      r.table_path, r.model_name, r.device_name);
  out +=
      fmt::format("{:<12} {:>3} {:<9} {:<8} {:>6} {:>8} {:>7} {:>7} {:>6} {:>6} {:>8} {:>8}  {}\n",
                  "layer", "tp", "recompute", "pass", "points", "c_ms", "e_gemm", "e_attn", "e_mem",
                  "p", "mean_err", "max_err",
                  "worst at (mbs x len[x dec]): ms "
                  "measured -> predicted");
  for (const FitGroup& g : r.groups) {
    const std::string attn = g.kind == LayerKind::kOutputHead
                                 ? std::string("-")
                                 : fmt::format("{:.3f}", g.factors.attention_efficiency);
    out += fmt::format(
        "{:<12} {:>3} {:<9} {:<8} {:>6} {:>8.3f} {:>7.3f} {:>7} {:>6.2f} {:>6.2f} {:>7.1f}% "
        "{:>7.1f}%  {} : {:.2f} -> {:.2f}\n",
        LayerKindName(g.kind), g.tp, RecomputeName(g.recompute),
        g.backward ? "backward" : "forward", g.points, g.factors.overhead.millis(),
        g.factors.gemm_efficiency, attn, g.factors.memory_efficiency, g.factors.sharpness,
        100 * g.mean_rel_error, 100 * g.max_rel_error, ShapeText(g.kind, g.worst_shape),
        g.worst_measured_ms, g.worst_predicted_ms);
  }
  out += fmt::format(
      "\n{} points in {} groups: mean relative error {:.1f}%, worst {:.1f}%; {} points the "
      "fitted model calls infeasible (memory estimate above the device)\n",
      r.points, r.groups.size(), 100 * r.mean_rel_error, 100 * r.max_rel_error,
      r.infeasible_points);
  return out;
}

}  // namespace sluice
