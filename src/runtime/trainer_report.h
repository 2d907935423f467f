// What `sluice train` reports per iteration (trainer.cc). Every rank posts its figures of an
// iteration to the store (RankStats, as JSON text); rank 0 combines them over the ranks
// (IterationFigures: the loss summed, the times from the first start to the last end, peaks and
// all-to-all times the largest), prints the iteration's line, appends its --metrics line and,
// with --calibration, keeps the running error of the predictions (PredictionTotals).
//
// Thread safety: value types and pure functions.
#pragma once

#include <cstdint>
#include <nlohmann/json.hpp>
#include <optional>
#include <string>
#include <vector>

#include "base/status.h"
#include "runtime/plan_service.h"

namespace sluice::runtime {

// One rank's figures of one iteration.
struct RankStats {
  double loss = 0;
  int64_t start_ns = 0, end_ns = 0, peak_rss = 0, compute_ns = 0, wait_ns = 0;
  int64_t peak_tensors = -1;  // peak CPU tensor bytes (CpuMemoryCounter); -1: not counted
  double moe_aux_loss = 0;    // MoE (executor.h IterationResult)
  int64_t moe_assignments = 0, moe_dropped = 0, all_to_all_ns = 0;
  int64_t micro_batches = 0;       // the replica's, on its first process (else 0)
  int64_t all_to_all_span_ns = 0;  // post to completion (IterationResult::all_to_all_span)
};
std::string StatsToText(const RankStats& s);
// Errors: text that is not a JSON object.
StatusOr<RankStats> StatsFromText(const std::string& text);

// What rank 0 knows about an iteration until every rank's figures are in.
struct IterationInfo {
  int64_t iteration = 0, batch_index = 0, tokens = 0, micro_batches = 0;
  std::optional<IterationOptimization> optimized;  // --optimize-budget-ms: what it did
  std::optional<IterationPrediction> predicted;    // --calibration: the simulated plan
};

// Every rank's figures of one iteration, combined.
struct IterationFigures {
  double loss = 0, aux_loss = 0;
  int64_t assignments = 0, dropped = 0, all_to_all_max_ns = 0, all_to_all_span_max_ns = 0;
  int64_t start_ns = INT64_MAX, end_ns = 0, peak_rss = 0, peak_rss_rank = 0;
  int64_t peak_tensors = -1, peak_tensors_rank = 0;  // -1: no rank counted them
  std::vector<int64_t> peak_tensors_by_rank;         // in rank order, -1 where not counted
  int64_t micro_batches = 0;                         // summed over the ranks

  // Adds rank `rank`'s figures. REQUIRES: ranks in increasing order.
  void Add(int64_t rank, const RankStats& s);
  double seconds() const { return static_cast<double>(end_ns - start_ns) * 1e-9; }
};

// --calibration: the predictions against what ran, over the iterations so far.
struct PredictionTotals {
  int64_t n = 0, memory_n = 0;
  double abs_error = 0, predicted_ms = 0, measured_ms = 0, memory_abs_error = 0;

  // Adds one iteration; returns the " | predicted S s (E%), peak M MB (E%)" part of its line.
  std::string Add(const IterationPrediction& predicted, const IterationFigures& f);
  // The closing line ("" before any iteration). `calibrated`: the plans carry a calibration.
  std::string Summary(bool calibrated) const;
};

// The printed line of an iteration (no newline). `info.micro_batches` as counted; `moe`: the
// model has MoE layers, `ep` its expert parallelism; `predicted_text` from PredictionTotals::Add.
std::string IterationLine(const IterationInfo& info, const IterationFigures& f, bool moe,
                          int64_t ep, const std::string& predicted_text);
// Its --metrics line.
nlohmann::json MetricsLine(const IterationInfo& info, const IterationFigures& f, bool moe);
// Rank 0, --optimize-budget-ms: what the optimizer did over every plan it ran on ("" when it ran
// on none).
std::string OptimizerSummary(const OptimizerTotals& t);

}  // namespace sluice::runtime
