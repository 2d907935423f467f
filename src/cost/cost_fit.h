// Fitting AnalyticCostModel's factors to a measured LayerCostTable (`sluice cost fit`).
//
// For every (layer kind, tp, recompute, pass) the table measures, FitAnalyticToTable fits the
// pass's overhead c, gemm efficiency, attention efficiency (layers with attention only) and
// smooth-max sharpness p by least squares on log(predicted / measured) over all of the group's
// measured points, with a deterministic log-space Nelder-Mead (two starts, restarts from the
// best point). The memory efficiency stays at FitOptions::memory_efficiency: its bytes grow with
// the same tokens as the gemm FLOPs, so the data cannot tell the two apart. The report gives, per
// group, the factors and the mean and worst relative error |predicted - measured| / measured on
// the table's points, computed with AnalyticCostModel::PassSeconds (what the model answers).
//
// Thread safety: pure functions.
#pragma once

#include <cstdint>
#include <functional>
#include <string>
#include <vector>

#include "base/status.h"
#include "cost/analytic_cost_model.h"
#include "cost/cost_model.h"
#include "cost/profile_table.h"
#include "model/cluster_spec.h"
#include "model/model_spec.h"

namespace sluice {

struct FitOptions {
  AnalyticOptions base;            // work options and tp link used while fitting (factors ignored)
  double memory_efficiency = 0.7;  // e_mem, held fixed (not identifiable from the tables)
  // > 0: hold the smooth-max sharpness p at this value instead of fitting it (1: time =
  // overhead + work; large: time = max(overhead, work)). For comparing the model's forms.
  double fixed_sharpness = 0;
  int restarts = 2;            // Nelder-Mead restarts from each start's best point
  int max_evaluations = 1500;  // per Nelder-Mead run
};

struct FitGroup {
  LayerKind kind = LayerKind::kEncoder;
  int64_t tp = 1;
  Recompute recompute = Recompute::kNone;
  bool backward = false;      // false: forward times, true: backward times
  PassFactors factors;        // fitted
  int64_t points = 0;         // measured points in the group
  double mean_rel_error = 0;  // mean |predicted - measured| / measured
  double max_rel_error = 0;   // worst point's relative error
  LayerShape worst_shape;     // where the worst point is
  double worst_measured_ms = 0;
  double worst_predicted_ms = 0;
};

struct FitReport {
  std::string table_path;
  std::string model_name;
  std::string device_name;
  std::vector<FitGroup> groups;  // table order: per entry, kinds, forward then backward
  AnalyticFactors factors;       // the fitted factors, ready for AnalyticOptions::factors
  int64_t points = 0;            // over all groups
  double mean_rel_error = 0;     // over all points
  double max_rel_error = 0;
  // Table points the analytic model with these factors calls infeasible (its memory estimate
  // exceeds the device): the fit still counts them, the planner would not use them.
  int64_t infeasible_points = 0;
};

// Fits one group per (kind, tp, recompute, pass) present in `table`. Fails when the table does
// not profile `model` (CheckTableMatchesModel) or the device is invalid.
StatusOr<FitReport> FitAnalyticToTable(const LayerCostTable& table, const ModelSpec& model,
                                       const DeviceSpec& device, const FitOptions& options = {});

// An aligned text table: one line per group (factors, points, mean and worst error, where the
// worst is) and a summary line.
std::string FormatFitReport(const FitReport& report);

// Minimises `f` from `x0` with Nelder-Mead (reflection 1, expansion 2, contraction 1/2, shrink
// 1/2; initial simplex x0 + step * e_i). Stops after `max_evaluations` or when the simplex's
// values agree within `tolerance` (absolute). Deterministic.
struct NelderMeadResult {
  std::vector<double> x;
  double value = 0;
  int evaluations = 0;
};
NelderMeadResult MinimizeNelderMead(const std::function<double(const std::vector<double>&)>& f,
                                    std::vector<double> x0, double step, int max_evaluations,
                                    double tolerance);

}  // namespace sluice
