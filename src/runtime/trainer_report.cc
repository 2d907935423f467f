#include "runtime/trainer_report.h"

#include <fmt/core.h>

#include <algorithm>
#include <cmath>

namespace sluice::runtime {

std::string StatsToText(const RankStats& s) {
  return nlohmann::json{{"loss", s.loss},
                        {"start_ns", s.start_ns},
                        {"end_ns", s.end_ns},
                        {"peak_rss", s.peak_rss},
                        {"compute_ns", s.compute_ns},
                        {"wait_ns", s.wait_ns},
                        {"peak_tensors", s.peak_tensors},
                        {"moe_aux_loss", s.moe_aux_loss},
                        {"moe_assignments", s.moe_assignments},
                        {"moe_dropped", s.moe_dropped},
                        {"all_to_all_ns", s.all_to_all_ns},
                        {"micro_batches", s.micro_batches},
                        {"all_to_all_span_ns", s.all_to_all_span_ns}}
      .dump();
}

StatusOr<RankStats> StatsFromText(const std::string& text) {
  nlohmann::json j = nlohmann::json::parse(text, nullptr, false);
  if (j.is_discarded() || !j.is_object()) return InternalError("malformed rank statistics");
  RankStats s;
  s.loss = j.value("loss", 0.0);
  s.start_ns = j.value("start_ns", int64_t{0});
  s.end_ns = j.value("end_ns", int64_t{0});
  s.peak_rss = j.value("peak_rss", int64_t{0});
  s.compute_ns = j.value("compute_ns", int64_t{0});
  s.wait_ns = j.value("wait_ns", int64_t{0});
  s.peak_tensors = j.value("peak_tensors", int64_t{-1});
  s.moe_aux_loss = j.value("moe_aux_loss", 0.0);
  s.moe_assignments = j.value("moe_assignments", int64_t{0});
  s.moe_dropped = j.value("moe_dropped", int64_t{0});
  s.all_to_all_ns = j.value("all_to_all_ns", int64_t{0});
  s.micro_batches = j.value("micro_batches", int64_t{0});
  s.all_to_all_span_ns = j.value("all_to_all_span_ns", int64_t{0});
  return s;
}

void IterationFigures::Add(int64_t rank, const RankStats& s) {
  loss += s.loss;
  micro_batches += s.micro_batches;
  aux_loss += s.moe_aux_loss;
  assignments += s.moe_assignments;
  dropped += s.moe_dropped;
  all_to_all_max_ns = std::max(all_to_all_max_ns, s.all_to_all_ns);
  all_to_all_span_max_ns = std::max(all_to_all_span_max_ns, s.all_to_all_span_ns);
  start_ns = std::min(start_ns, s.start_ns);
  end_ns = std::max(end_ns, s.end_ns);
  if (s.peak_rss > peak_rss) {
    peak_rss = s.peak_rss;
    peak_rss_rank = rank;
  }
  if (s.peak_tensors > peak_tensors) {
    peak_tensors = s.peak_tensors;
    peak_tensors_rank = rank;
  }
  peak_tensors_by_rank.push_back(s.peak_tensors);
}

std::string PredictionTotals::Add(const IterationPrediction& pr, const IterationFigures& f) {
  const double measured = f.seconds() * 1e3;
  const double error = measured > 0 ? pr.iteration_ms / measured - 1 : 0;
  n += 1;
  abs_error += std::abs(error);
  predicted_ms += pr.iteration_ms;
  measured_ms += measured;
  int64_t peak_pred = 0, peak_meas = 0;
  const std::vector<int64_t>& by_rank = f.peak_tensors_by_rank;
  for (size_t r = 0; r < pr.peak_bytes.size() && r < by_rank.size(); ++r) {
    if (by_rank[r] < 0) continue;
    peak_pred = std::max(peak_pred, pr.peak_bytes[r]);
    peak_meas = std::max(peak_meas, by_rank[r]);
    if (by_rank[r] > 0) {
      memory_n += 1;
      memory_abs_error += std::abs(static_cast<double>(pr.peak_bytes[r]) / by_rank[r] - 1);
    }
  }
  return fmt::format(
      " | predicted {:.3f} s ({:+.1f}%){}", pr.iteration_ms * 1e-3, 100 * error,
      peak_meas > 0
          ? fmt::format(
                ", peak {:.1f} MB ({:+.1f}%)", static_cast<double>(peak_pred) / 1e6,
                100.0 * (static_cast<double>(peak_pred) / static_cast<double>(peak_meas) - 1))
          : std::string());
}

std::string PredictionTotals::Summary(bool calibrated) const {
  if (n == 0) return "";
  const double count = static_cast<double>(n);
  return fmt::format(
      "{} over {} iteration{}: mean |error| {:.1f}% per iteration, total "
      "{:.2f} s predicted vs {:.2f} s measured ({:+.1f}%){}",
      calibrated ? "calibrated prediction" : "prediction (the simulated plan)", n,
      n == 1 ? "" : "s", 100 * abs_error / count, predicted_ms * 1e-3, measured_ms * 1e-3,
      measured_ms > 0 ? 100 * (predicted_ms / measured_ms - 1) : 0.0,
      memory_n > 0 ? fmt::format("; peak tensor memory per rank mean |error| {:.1f}%",
                                 100 * memory_abs_error / static_cast<double>(memory_n))
                   : std::string());
}

std::string IterationLine(const IterationInfo& info, const IterationFigures& f, bool moe,
                          int64_t ep, const std::string& predicted_text) {
  const double seconds = f.seconds();
  const double tps = seconds > 0 ? static_cast<double>(info.tokens) / seconds : 0;
  const std::string tensor_text =
      f.peak_tensors >= 0
          ? fmt::format("peak tensors {:.1f} MB (rank {}), ",
                        static_cast<double>(f.peak_tensors) / 1e6, f.peak_tensors_rank)
          : std::string();
  const std::string opt_text =
      info.optimized ? fmt::format(" | optimizer: simulated {:.1f} -> {:.1f} ms, {} change{}",
                                   info.optimized->before_ms, info.optimized->after_ms,
                                   info.optimized->changes, info.optimized->changes == 1 ? "" : "s")
                     : std::string();
  const std::string moe_text =
      moe ? fmt::format(" | moe: aux loss {:.5f}, dropped {} of {} assignments{}", f.aux_loss,
                        f.dropped, f.assignments,
                        ep > 1 ? fmt::format(", all-to-all {:.3f} s",
                                             static_cast<double>(f.all_to_all_max_ns) * 1e-9)
                               : std::string())
          : std::string();
  return fmt::format(
      "iter {:>4} (batch {:>4}): loss {:.4f} | {:>3} micro-batches, {:>6} tokens | "
      "{:.3f} s, {:>7.0f} tokens/s | {}RSS {:.0f} MB (rank {}){}{}{}",
      info.iteration, info.batch_index, f.loss, info.micro_batches, info.tokens, seconds, tps,
      tensor_text, static_cast<double>(f.peak_rss) / 1e6, f.peak_rss_rank, moe_text, opt_text,
      predicted_text);
}

nlohmann::json MetricsLine(const IterationInfo& info, const IterationFigures& f, bool moe) {
  const double seconds = f.seconds();
  const double tps = seconds > 0 ? static_cast<double>(info.tokens) / seconds : 0;
  nlohmann::json line{{"iteration", info.iteration},
                      {"batch", info.batch_index},
                      {"loss", f.loss},
                      {"tokens", info.tokens},
                      {"micro_batches", info.micro_batches},
                      {"time_s", seconds},
                      {"tokens_per_s", tps},
                      {"peak_rss_bytes", f.peak_rss},
                      {"peak_rss_rank", f.peak_rss_rank}};
  if (f.peak_tensors >= 0) {
    line["peak_tensor_bytes"] = f.peak_tensors;
    line["peak_tensor_rank"] = f.peak_tensors_rank;
    line["peak_tensor_bytes_by_rank"] = f.peak_tensors_by_rank;
  }
  if (info.predicted) {
    line["predicted_time_s"] = info.predicted->iteration_ms * 1e-3;
    line["predicted_peak_bytes_by_rank"] = info.predicted->peak_bytes;
    if (moe) {
      line["predicted_all_to_all_s"] = info.predicted->all_to_all_ms * 1e-3;
      line["predicted_exposed_all_to_all_s"] = info.predicted->exposed_all_to_all_ms * 1e-3;
    }
  }
  if (moe) {
    line["moe_aux_loss"] = f.aux_loss;
    line["moe_assignments"] = f.assignments;
    line["moe_dropped"] = f.dropped;
    line["all_to_all_s"] = static_cast<double>(f.all_to_all_max_ns) * 1e-9;
    line["all_to_all_span_s"] = static_cast<double>(f.all_to_all_span_max_ns) * 1e-9;
  }
  if (info.optimized) {
    line["sim_before_ms"] = info.optimized->before_ms;
    line["sim_after_ms"] = info.optimized->after_ms;
    line["optimizer_changes"] = info.optimized->changes;
  }
  return line;
}

std::string OptimizerSummary(const OptimizerTotals& t) {
  if (t.plans == 0) return "";
  const double n = static_cast<double>(t.plans);
  return fmt::format(
      "optimizer: mean simulated iteration {:.1f} ms -> {:.1f} ms ({:.2f}% shorter), {} of "
      "{} plan{} changed, mean optimizer time {:.1f} ms{}",
      t.before_ms / n, t.after_ms / n,
      t.before_ms > 0 ? 100.0 * (t.before_ms - t.after_ms) / t.before_ms : 0.0, t.changed, t.plans,
      t.plans == 1 ? "" : "s", t.wall_ms / n,
      t.budget_hit > 0 ? fmt::format("; the time budget ended {} search{} (not reproducible)",
                                     t.budget_hit, t.budget_hit == 1 ? "" : "es")
                       : std::string());
}

}  // namespace sluice::runtime
