#include "trace/calibration.h"

#include <fmt/format.h>

#include <algorithm>
#include <array>
#include <bit>
#include <cmath>
#include <limits>
#include <map>
#include <nlohmann/json.hpp>
#include <set>

#include "base/json_util.h"
#include "plan/instruction.h"
#include "sim/simulator.h"

namespace sluice::trace {
namespace {

// The stage key of an instruction: its virtual stage, or for rank-wide ops the pipeline rank.
int64_t StageKey(const Instruction& in, const RankProgram& program) {
  return in.stage >= 0 && in.op != OpKind::kOptimizerStep ? in.stage : program.pp_index;
}

using Point = OpSample;

constexpr int kNumFeatures = 6;  // constant, predicted, tokens, attention, rows, recomputed

std::array<double, kNumFeatures> Row(const OpFeatures& f) {
  return {1.0, f.predicted_ns, f.tokens, f.attention, f.rows, f.recomputed_tokens};
}

// Weighted least squares on the features in `mask`; false when the system is singular. The
// columns are scaled to unit mean square first so that their sizes (1 vs token pairs) do not
// decide the pivots.
bool SolveSubset(const std::vector<Point>& pts, const std::vector<double>& w, unsigned mask,
                 std::array<double, kNumFeatures>* coef) {
  std::vector<int> cols;
  for (int j = 0; j < kNumFeatures; ++j) {
    if (mask & (1u << j)) cols.push_back(j);
  }
  const size_t k = cols.size();
  std::array<double, kNumFeatures> norm{};
  for (size_t i = 0; i < pts.size(); ++i) {
    const auto x = Row(pts[i].features);
    for (size_t a = 0; a < k; ++a) norm[a] += x[cols[a]] * x[cols[a]];
  }
  for (size_t a = 0; a < k; ++a) {
    if (norm[a] <= 0) return false;
    norm[a] = std::sqrt(norm[a] / static_cast<double>(pts.size()));
  }
  std::array<std::array<double, kNumFeatures + 1>, kNumFeatures> m{};  // normal equations
  for (size_t i = 0; i < pts.size(); ++i) {
    const auto x = Row(pts[i].features);
    for (size_t a = 0; a < k; ++a) {
      const double xa = x[cols[a]] / norm[a];
      for (size_t b = 0; b < k; ++b) m[a][b] += w[i] * xa * x[cols[b]] / norm[b];
      m[a][k] += w[i] * xa * pts[i].measured_ns;
    }
  }
  // Gaussian elimination with partial pivoting; a pivot below 1e-9 of the diagonal's scale is a
  // (near) collinear subset: refused, a smaller subset explains the same.
  double scale = 0;
  for (size_t a = 0; a < k; ++a) scale = std::max(scale, std::abs(m[a][a]));
  for (size_t c = 0; c < k; ++c) {
    size_t p = c;
    for (size_t r = c + 1; r < k; ++r) {
      if (std::abs(m[r][c]) > std::abs(m[p][c])) p = r;
    }
    if (std::abs(m[p][c]) <= 1e-9 * scale) return false;
    std::swap(m[p], m[c]);
    for (size_t r = 0; r < k; ++r) {
      if (r == c) continue;
      const double f = m[r][c] / m[c][c];
      for (size_t q = c; q <= k; ++q) m[r][q] -= f * m[c][q];
    }
  }
  coef->fill(0);
  for (size_t a = 0; a < k; ++a) (*coef)[cols[a]] = m[a][k] / m[a][a] / norm[a];
  return true;
}

double Dot(const std::array<double, kNumFeatures>& c, const OpFeatures& f) {
  const auto x = Row(f);
  double y = 0;
  for (int j = 0; j < kNumFeatures; ++j) y += c[j] * x[j];
  return y;
}

double MedianOf(std::vector<double> v) {
  if (v.empty()) return 0;
  std::nth_element(v.begin(), v.begin() + v.size() / 2, v.end());
  return v[v.size() / 2];
}

// The robust non-negative fit of calibration.h over the features `allowed` (a bit mask of Row's
// columns): for each subset, least squares with every coefficient > 0 (a subset with a
// negative one is not a candidate: its smaller subsets are tried too, which is the NNLS optimum
// over the allowed features), scored by BIC; Huber weights (k = 1.345 robust sigmas, sigma from
// the median absolute residual) are re-derived from the best candidate and the search re-run,
// at most 10 rounds.
std::array<double, kNumFeatures> RobustFit(const std::vector<Point>& pts, unsigned allowed) {
  const size_t n = pts.size();
  std::vector<double> w(n, 1.0);
  std::array<double, kNumFeatures> best{};
  for (int round = 0; round < 10; ++round) {
    double best_score = std::numeric_limits<double>::infinity();
    std::array<double, kNumFeatures> chosen{};
    for (unsigned mask = 1; mask < (1u << kNumFeatures); ++mask) {
      if ((mask & ~allowed) != 0) continue;
      const int k = std::popcount(mask);
      // At least one residual degree of freedom, except that one feature may fit one or two
      // instructions (an optimizer step fitted on one iteration).
      if (static_cast<size_t>(k) > std::max<size_t>(1, n - 1)) continue;
      std::array<double, kNumFeatures> c{};
      if (!SolveSubset(pts, w, mask, &c)) continue;
      bool positive = true;
      for (int j = 0; j < kNumFeatures; ++j) {
        if ((mask & (1u << j)) && !(c[j] > 0)) positive = false;
      }
      if (!positive) continue;
      double sse = 0, sw = 0;
      for (size_t i = 0; i < n; ++i) {
        const double r = pts[i].measured_ns - Dot(c, pts[i].features);
        sse += w[i] * r * r;
        sw += w[i];
      }
      const double score =
          sw * std::log(std::max(sse / sw, 1e-12)) + k * std::log(static_cast<double>(n));
      if (score < best_score) {
        best_score = score;
        chosen = c;
      }
    }
    if (!std::isfinite(best_score)) break;  // nothing positive fits: keep the last
    best = chosen;
    std::vector<double> abs_r(n);
    for (size_t i = 0; i < n; ++i)
      abs_r[i] = std::abs(pts[i].measured_ns - Dot(best, pts[i].features));
    const double sigma = 1.4826 * MedianOf(abs_r);
    if (sigma <= 0) break;
    std::vector<double> next(n);
    double change = 0;
    for (size_t i = 0; i < n; ++i) {
      const double u = abs_r[i] / (1.345 * sigma);
      next[i] = u <= 1 ? 1.0 : 1.0 / u;
      change = std::max(change, std::abs(next[i] - w[i]));
    }
    w = std::move(next);
    if (change < 1e-3) break;
  }
  return best;
}

// The "/1" line, measured = scale * predicted + offset by least squares (scale only, offset 0,
// when the predictions hardly vary or the line would have a negative offset or scale).
std::array<double, kNumFeatures> ScaleFit(const std::vector<Point>& pts) {
  const double n = static_cast<double>(pts.size());
  double sd = 0, sm = 0, sdd = 0, sdm = 0;
  for (const Point& p : pts) {
    sd += p.features.predicted_ns;
    sm += p.measured_ns;
    sdd += p.features.predicted_ns * p.features.predicted_ns;
    sdm += p.features.predicted_ns * p.measured_ns;
  }
  std::array<double, kNumFeatures> c{};
  if (sd <= 0) {  // nothing predicted: the op's measured mean becomes its offset
    c[0] = sm / n;
    c[1] = 1.0;
    return c;
  }
  const double mean_d = sd / n, mean_m = sm / n;
  const double var = sdd / n - mean_d * mean_d;
  const double cv = var > 0 ? std::sqrt(var) / mean_d : 0;
  if (pts.size() >= 3 && cv >= 0.05) {
    const double a = (sdm / n - mean_d * mean_m) / var;
    const double b = mean_m - a * mean_d;
    if (a > 0 && b >= 0) {
      c[0] = b;
      c[1] = a;
      return c;
    }
  }
  c[1] = sdm / sdd;
  return c;
}

}  // namespace

OpCorrection FitOpLine(const std::vector<OpSample>& pts, OpLine line) {
  const std::array<double, kNumFeatures> c =
      line == OpLine::kScale
          ? ScaleFit(pts)
          : RobustFit(pts, line == OpLine::kFeatures ? (1u << kNumFeatures) - 1 : 0b11u);
  OpCorrection o;
  o.samples = static_cast<int64_t>(pts.size());
  o.offset_us = c[0] * 1e-3;
  o.scale = c[1];
  o.per_token_ns = c[2];
  o.per_attention_ns = c[3];
  o.per_row_us = c[4] * 1e-3;
  o.per_recomputed_token_ns = c[5];
  const double n = static_cast<double>(pts.size());
  for (const Point& p : pts) {
    const double m = std::max(1.0, p.measured_ns);
    o.mean_abs_error_before += std::abs(p.features.predicted_ns - p.measured_ns) / m;
    o.mean_abs_error_after += std::abs(o.Predict(p.features) - p.measured_ns) / m;
  }
  o.mean_abs_error_before /= n;
  o.mean_abs_error_after /= n;
  return o;
}

OpFeatures FeaturesOf(const ExecutionPlan& plan, const RankProgram& program,
                      const Instruction& in) {
  OpFeatures f;
  f.predicted_ns = static_cast<double>(in.duration.nanos());
  if (in.microbatch < 0 || program.dp_index < 0 ||
      program.dp_index >= static_cast<int64_t>(plan.replicas.size())) {
    return f;
  }
  const std::vector<PlanMicroBatch>& mbs = plan.replicas[program.dp_index].micro_batches;
  if (in.microbatch >= static_cast<int64_t>(mbs.size())) return f;
  const LayerShape& s = mbs[in.microbatch].shape;
  const double rows = static_cast<double>(s.mbs);
  const double e = static_cast<double>(s.seqlen), d = static_cast<double>(s.dec_seqlen);
  f.rows = rows;
  f.tokens = rows * (e + d);
  f.attention = rows * (e * e + d * d + e * d);
  const bool recomputes = in.op == OpKind::kForward || in.op == OpKind::kBackward ||
                          in.op == OpKind::kBackwardInput;
  if (recomputes && in.recompute == Recompute::kFull) f.recomputed_tokens = f.tokens;
  return f;
}

double OpCorrection::Predict(const OpFeatures& f) const {
  return std::max(0.0, offset_us * 1e3 + scale * f.predicted_ns + per_token_ns * f.tokens +
                           per_attention_ns * f.attention + per_row_us * 1e3 * f.rows +
                           per_recomputed_token_ns * f.recomputed_tokens);
}

std::string OpCorrection::Describe() const {
  std::string out;
  auto term = [&](double v, const std::string& text) {
    if (v == 0) return;
    out += (out.empty() ? "" : " + ") + text;
  };
  term(scale, fmt::format("{:.3g} x plan", scale));
  term(offset_us, fmt::format("{:.1f} us", offset_us));
  term(per_token_ns, fmt::format("{:.3g} ns/token", per_token_ns));
  term(per_attention_ns, fmt::format("{:.3g} ns/token pair", per_attention_ns));
  term(per_row_us, fmt::format("{:.3g} us/row", per_row_us));
  term(per_recomputed_token_ns,
       fmt::format("{:.3g} ns/recomputed token", per_recomputed_token_ns));
  return out.empty() ? "0" : out;
}

std::vector<int64_t> MeasuredIterationTimes(const Analysis& a) {
  std::map<int64_t, std::pair<int64_t, int64_t>> span;
  std::map<int64_t, std::set<int64_t>> ranks;
  for (const GraphNode& n : a.graph.nodes) {
    if (n.iteration < 0 || n.stream < 0) continue;
    auto [it, inserted] = span.try_emplace(n.iteration, n.measured_start_ns, n.measured_end_ns);
    it->second.first = std::min(it->second.first, n.measured_start_ns);
    it->second.second = std::max(it->second.second, n.measured_end_ns);
    ranks[n.iteration].insert(n.rank);
  }
  std::vector<int64_t> out(span.empty() ? 0 : span.rbegin()->first + 1, -1);
  for (const auto& [it, s] : span) {
    if (ranks[it].size() == a.set.ranks.size()) out[it] = s.second - s.first;
  }
  return out;
}

StatusOr<Calibration> FitCalibration(const Analysis& a, const std::vector<ExecutionPlan>& plans,
                                     const FitOptions& options) {
  const TraceSet& set = a.set;
  for (const RankTrace& r : set.ranks) {
    if (r.format != TraceFormat::kSluice) {
      return InvalidArgumentError(fmt::format(
          "{}: calibration needs sluice's runtime traces (sluice train --plan ... --trace-dir); "
          "this is a {} trace",
          r.source, TraceFormatName(r.format)));
    }
  }
  std::set<int64_t> wanted(options.iterations.begin(), options.iterations.end());
  if (wanted.empty()) {
    for (size_t k = 0; k < plans.size(); ++k) wanted.insert(static_cast<int64_t>(k));
    // Every traced iteration is then tied to a plan: fewer plans would leave iterations out
    // without a word.
    int64_t traced = 0;
    for (const RankTrace& r : set.ranks) {
      for (const TraceOp& op : r.ops) traced = std::max(traced, op.iteration + 1);
    }
    if (traced > static_cast<int64_t>(plans.size())) {
      return InvalidArgumentError(fmt::format(
          "the traces hold {} iterations but {} plan file(s) are given: iteration {} has no plan "
          "(--plan, one per iteration in the order sluice train ran them; calibrate "
          "--fit-iterations picks some)",
          traced, plans.size(), plans.size()));
    }
  }
  for (int64_t k : wanted) {
    if (k < 0 || k >= static_cast<int64_t>(plans.size())) {
      return InvalidArgumentError(fmt::format(
          "iteration {} has no plan: {} plan file(s) given (--plan, one per iteration in the "
          "order sluice train ran them)",
          k, plans.size()));
    }
    // Every rank of the plan has its trace: a missing one would bias every fit.
    const ExecutionPlan& plan = plans[static_cast<size_t>(k)];
    std::vector<int64_t> missing;
    for (int64_t rank = 0; rank < static_cast<int64_t>(plan.ranks.size()); ++rank) {
      const bool traced = std::any_of(set.ranks.begin(), set.ranks.end(),
                                      [&](const RankTrace& r) { return r.rank == rank; });
      if (!traced) missing.push_back(rank);
    }
    if (!missing.empty()) {
      return InvalidArgumentError(fmt::format(
          "the plan of iteration {} has {} ranks but the traces hold {} (missing: rank {}): give "
          "every rank's trace (sluice train --trace-dir writes one per rank)",
          k, plan.ranks.size(), set.ranks.size(), fmt::join(missing, ", rank ")));
    }
  }
  std::map<std::pair<int64_t, std::string>, std::vector<Point>> points;  // (stage, op)
  std::map<std::string, std::vector<Point>> any_stage;
  std::vector<std::pair<double, double>> wires;  // (plan bytes, wire ns)
  // Transfer hubs by the (rank, op) of their send's post.
  // Only transfers some side waited for: their done time is the arrival, not a bound above it.
  std::map<std::pair<int64_t, int32_t>, int32_t> hub_of_send_post;
  std::vector<int32_t> rank_first(set.ranks.size() + 1, 0);
  for (size_t r = 0; r < set.ranks.size(); ++r) {
    rank_first[r + 1] = rank_first[r] + static_cast<int32_t>(set.ranks[r].ops.size());
  }
  for (size_t v = 0; v < a.graph.nodes.size(); ++v) {
    const GraphNode& n = a.graph.nodes[v];
    if (n.kind != NodeKind::kTransfer) continue;
    const MessageMatch& m = a.matching.messages[n.op];
    // The side done first must have been blocked in its wait (longer than a wait's own
    // overhead, 50 µs), so that its end is the arrival rather than a later look.
    bool waited = false;
    int64_t first_done = INT64_MAX;
    for (const auto& [rank, comm] : {std::pair{m.src, m.send}, std::pair{m.dst, m.recv}}) {
      const CommOp& op = set.ranks[rank].comms[comm];
      if (op.wait < 0 || op.done_ns == kUnknownTime || op.done_ns >= first_done) continue;
      first_done = op.done_ns;
      const GraphNode& w = a.graph.nodes[rank_first[rank] + op.wait];
      waited = w.measured_end_ns - w.measured_start_ns >= 50'000 &&
               w.measured_start_ns < n.measured_end_ns;
    }
    if (waited) {
      hub_of_send_post[{m.src, set.ranks[m.src].comms[m.send].post}] = static_cast<int32_t>(v);
    }
  }
  int32_t first_node = 0;
  int64_t nested_total = 0;
  for (const RankTrace& r : set.ranks) {
    // Ops of the compute stream by iteration, in order.
    std::map<int64_t, std::vector<int32_t>> by_iteration;
    // MoE all-to-alls as the runtime records them on the collective stream, by iteration: a
    // whole compute op performs its all-to-alls inside its own time, which is communication
    // (the plan prices it as the all-to-all instructions), not the op's computation.
    std::map<int64_t, std::vector<std::pair<int64_t, int64_t>>> a2a_by_iteration;
    for (size_t i = 0; i < r.ops.size(); ++i) {
      if (r.ops[i].stream == 0 && wanted.contains(r.ops[i].iteration)) {
        by_iteration[r.ops[i].iteration].push_back(static_cast<int32_t>(i));
      }
    }
    for (const TraceOp& a2a : r.all_to_alls) {
      a2a_by_iteration[a2a.iteration].push_back({a2a.start_ns, a2a.end_ns});
    }
    for (int64_t k : wanted) {
      const ExecutionPlan& plan = plans[k];
      if (r.rank >= static_cast<int64_t>(plan.ranks.size())) {
        return InvalidArgumentError(fmt::format(
            "{}: rank {} is not in the plan of iteration {} ({} ranks): a trace of another plan",
            r.source, r.rank, k, plan.ranks.size()));
      }
      const RankProgram& program = plan.ranks[r.rank];
      const std::vector<int32_t>& ops = by_iteration[k];
      if (ops.size() != program.instructions.size()) {
        return InvalidArgumentError(fmt::format(
            "{}: rank {} ran {} instructions in iteration {} but its plan has {}: a trace of "
            "another plan (give the plans in the order sluice train ran them; a run that "
            "rewrote or adjusted them, --moe-overlap or --calibration, ran the plan-K.json files "
            "its --trace-dir holds)",
            r.source, r.rank, ops.size(), k, program.instructions.size()));
      }
      double pending = 0;
      for (size_t i = 0; i < ops.size(); ++i) {
        const TraceOp& op = r.ops[ops[i]];
        const Instruction& in = program.instructions[i];
        const std::string text = InstructionText(in);
        if (op.name != text) {
          return InvalidArgumentError(fmt::format(
              "{}: traceEvents[{}]: rank {} iteration {} instruction {} is '{}' in the trace but "
              "'{}' in the plan: a trace of another plan",
              r.source, op.event_index, r.rank, k, i, op.name, text));
        }
        const GraphNode& node = a.graph.nodes[first_node + ops[i]];
        pending += static_cast<double>(node.own_ns) + (i > 0 ? static_cast<double>(node.gap_ns) : 0);
        if (IsSend(in.op) && IsCommStart(in.op)) {
          auto it = hub_of_send_post.find({r.rank, ops[i]});
          if (it != hub_of_send_post.end()) {
            wires.push_back({static_cast<double>(in.bytes.count()),
                             static_cast<double>(a.graph.nodes[it->second].own_ns)});
          }
        }
        if (!IsCalibratedOp(in.op)) continue;
        if (in.segment < 0 && in.op != OpKind::kBackwardWeight) {
          int64_t nested = 0;
          for (const auto& [start, end] : a2a_by_iteration[k]) {
            nested += std::max<int64_t>(
                0, std::min(end, op.end_ns) - std::max(start, op.start_ns));
          }
          nested = std::min<int64_t>(nested, static_cast<int64_t>(pending));
          pending -= static_cast<double>(nested);
          nested_total += nested;
        }
        const Point p{FeaturesOf(plan, program, in), pending};
        points[{StageKey(in, program), std::string(OpKindName(in.op))}].push_back(p);
        any_stage[std::string(OpKindName(in.op))].push_back(p);
        pending = 0;
      }
    }
    first_node += static_cast<int32_t>(r.ops.size());
  }
  if (options.nested_all_to_all_ns != nullptr) *options.nested_all_to_all_ns = nested_total;
  Calibration c;
  std::string its;
  for (int64_t k : wanted) its += (its.empty() ? "" : ",") + std::to_string(k);
  c.source = fmt::format("{} (iterations {})", set.ranks.front().source, its);
  // Per stage: every feature; all stages together: a constant and the prediction (the stages'
  // own shapes live in the prediction only).
  const OpLine per_stage = options.fit_features ? OpLine::kFeatures : OpLine::kScale;
  const OpLine all_stages = options.fit_features ? OpLine::kPredictionOnly : OpLine::kScale;
  for (const auto& [key, pts] : points) {
    OpCorrection o = FitOpLine(pts, per_stage);
    o.stage = key.first;
    o.op = key.second;
    c.ops.push_back(o);
  }
  for (const auto& [op, pts] : any_stage) {
    OpCorrection o = FitOpLine(pts, all_stages);
    o.op = op;
    c.ops.push_back(o);
  }
  if (options.fit_link && wires.size() >= 4) {
    // Robust line (wire times have a long tail of waits the trace cannot separate): the slope
    // between the medians of the smaller and the larger half by bytes, the latency the median of
    // what the slope leaves.
    std::sort(wires.begin(), wires.end());
    auto median = [](std::vector<double> v) {
      std::nth_element(v.begin(), v.begin() + v.size() / 2, v.end());
      return v[v.size() / 2];
    };
    const size_t half = wires.size() / 2;
    std::vector<double> lb, lw, hb, hw;
    for (size_t i = 0; i < wires.size(); ++i) {
      (i < half ? lb : hb).push_back(wires[i].first);
      (i < half ? lw : hw).push_back(wires[i].second);
    }
    const double db = median(hb) - median(lb);
    double slope = db > 0 ? (median(hw) - median(lw)) / db : 0;  // ns per byte
    if (slope < 0) slope = 0;
    std::vector<double> rest;
    for (const auto& [b, w] : wires) rest.push_back(w - slope * b);
    const double alpha = std::max(0.0, median(rest));
    c.link = {true, alpha * 1e-3, slope > 0 ? 1.0 / slope : 1e6,
              static_cast<int64_t>(wires.size())};
  }
  if (!options.peak_bytes.empty()) {
    const std::vector<int64_t> its(wanted.begin(), wanted.end());
    SLUICE_ASSIGN_OR_RETURN(c.memory, FitMemory(plans, its, options.peak_bytes));
  }
  if (options.fit_iteration) {
    // What the simulator still leaves out per iteration, with the corrections above.
    const std::vector<int64_t> measured = MeasuredIterationTimes(a);
    std::vector<double> residual;
    for (int64_t k : wanted) {
      if (k >= static_cast<int64_t>(measured.size()) || measured[k] <= 0) continue;
      ExecutionPlan plan = plans[k];
      ApplyCalibration(c, &plan);
      SimOptions o;
      o.record_timeline = false;
      o.record_memory = false;
      Simulator sim(plan, o);
      StatusOr<SimResult> r = sim.Run();
      if (!r.ok()) return r.status().WithPrefix(fmt::format("the plan of iteration {}", k));
      if (r->outcome == SimOutcome::kDeadlock) {
        return FailedPreconditionError(
            fmt::format("the plan of iteration {} deadlocks in the simulator", k));
      }
      residual.push_back(static_cast<double>(measured[k] - r->iteration_time.nanos()));
    }
    if (!residual.empty()) {
      std::sort(residual.begin(), residual.end());
      const size_t m = residual.size();
      const double median = m % 2 ? residual[m / 2] : 0.5 * (residual[m / 2 - 1] + residual[m / 2]);
      c.iteration = {median * 1e-3, static_cast<int64_t>(m)};
    }
  }
  return c;
}

void ApplyCalibration(const Calibration& c, ExecutionPlan* plan) {
  std::map<std::pair<int64_t, std::string>, const OpCorrection*> table;
  for (const OpCorrection& o : c.ops) table[{o.stage, o.op}] = &o;
  for (RankProgram& program : plan->ranks) {
    for (Instruction& in : program.instructions) {
      if (!IsCalibratedOp(in.op)) continue;
      const std::string op(OpKindName(in.op));
      auto it = table.find({StageKey(in, program), op});
      if (it == table.end()) it = table.find({-1, op});
      if (it == table.end()) continue;
      in.duration =
          Duration::Nanos(std::llround(it->second->Predict(FeaturesOf(*plan, program, in))));
    }
  }
  if (c.iteration.offset_us != 0) {
    for (RankProgram& program : plan->ranks) {
      for (Instruction& in : program.instructions) {
        if (in.op != OpKind::kOptimizerStep) continue;
        in.duration = Duration::Nanos(
            std::max<int64_t>(0, in.duration.nanos() + std::llround(c.iteration.offset_us * 1e3)));
      }
    }
  }
  for (const MemoryCorrection& m : c.memory) ApplyMemoryCorrection(m, plan);
  if (c.link.fitted) {
    for (LinkSpec* link : {&plan->cluster.intra_node, &plan->cluster.inter_node}) {
      link->latency = Duration::Micros(c.link.latency_us);
      link->bandwidth = c.link.bandwidth_gb_per_s * 1e9;
    }
  }
}

bool IsCalibratedOp(OpKind op) {
  return IsCompute(op) || op == OpKind::kOptimizerStep || op == OpKind::kLoadInput;
}

}  // namespace sluice::trace
