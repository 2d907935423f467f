#include "cli/compare_report.h"

#include <fmt/core.h>

#include <algorithm>
#include <map>
#include <utility>

#include "base/numbers.h"
#include "plan/instruction.h"
#include "sim/sim_report.h"

namespace sluice::cli {
namespace {

// 1234567.8 -> "1,234,568".
std::string Thousands(double v) { return FormatCount(static_cast<int64_t>(v + 0.5)); }

std::string Pct(double f) { return fmt::format("{:.1f}%", 100.0 * f); }

std::string StateText(const MethodRun& m) {
  if (m.state == RunState::kOutOfMemory) return "OOM";
  return std::string(RunStateName(m.state));
}

const char* kBreakdownNames[] = {"useful",       "padding",   "recompute", "kernel eff.",
                                 "exposed comm", "imbalance", "bubble"};

std::vector<double> BreakdownParts(const Breakdown& b) {
  return {b.useful, b.padding, b.recompute, b.kernel, b.comm, b.imbalance, b.bubble};
}

// The losses of a breakdown, largest first: "bubble 12%, kernel eff. 8%".
std::string LargestLosses(const Breakdown& b, size_t n) {
  std::vector<std::pair<double, std::string>> losses;
  const std::vector<double> parts = BreakdownParts(b);
  for (size_t i = 1; i < parts.size(); ++i) losses.emplace_back(parts[i], kBreakdownNames[i]);
  std::sort(losses.begin(), losses.end(), [](const auto& x, const auto& y) {
    return x.first != y.first ? x.first > y.first : x.second < y.second;
  });
  std::string out;
  for (size_t i = 0; i < n && i < losses.size(); ++i) {
    if (losses[i].first < 0.005) break;
    out += fmt::format("{}{} {:.0f}%", out.empty() ? "" : ", ", losses[i].second,
                       100.0 * losses[i].first);
  }
  return out;
}

int64_t Failed(const MethodRun& m) {
  return static_cast<int64_t>(m.batches.size()) - m.ok_batches;
}

// The headline throughput, marked when batches failed: "9,348 (12/20 ran)".
std::string TokensText(const MethodRun& m) {
  if (Failed(m) == 0) return Thousands(m.tokens_per_s);
  return fmt::format("{} ({}/{} ran)", Thousands(m.tokens_per_s), m.ok_batches, m.batches.size());
}

// How failed batches count, under a table that has some ("" when none failed).
std::string FailedNote(const std::vector<MethodRun>& runs) {
  int64_t failed = 0;
  for (const MethodRun& m : runs) {
    if (m.ok_batches > 0) failed += Failed(m);
  }
  if (failed == 0) return "";
  return "tokens/s counts every batch: a failed batch (out of memory or deadlock) trains none of "
         "its tokens and is charged the mean iteration time of the batches that ran; a run that "
         "failed a batch ranks below every run that ran all of them and is never adopted over "
         "one. The other columns cover the batches that ran.";
}

// `text` broken into lines of at most `width` characters at spaces, each ending in '\n'.
std::string Wrap(const std::string& text, size_t width) {
  std::string out, line;
  size_t pos = 0;
  while (pos < text.size()) {
    size_t end = text.find(' ', pos);
    if (end == std::string::npos) end = text.size();
    const std::string word = text.substr(pos, end - pos);
    if (!line.empty() && line.size() + 1 + word.size() > width) {
      out += line + "\n";
      line.clear();
    }
    line += (line.empty() ? "" : " ") + word;
    pos = end + 1;
  }
  if (!line.empty()) out += line + "\n";
  return out;
}

std::string ConfigText(const MethodRun& m) {
  if (m.hetero.has_value()) return fmt::format("heterogeneous: {}", DescribeHetero(*m.hetero));
  if (!m.strategies.empty()) {
    std::string list;
    for (size_t i = 0; i < m.strategies.size(); ++i) {
      list += fmt::format("{}[{}] {}", i ? "; " : "", i, m.strategies[i]);
    }
    // The heterogeneous plans the screen skipped, of those it could have (compare_dynamic.h).
    int64_t screened = 0, hetero = 0;
    for (const BatchRecord& b : m.batches) screened += static_cast<int64_t>(b.screened.size());
    for (const std::string& s : m.strategies) hetero += s.starts_with("heterogeneous") ? 1 : 0;
    const std::string screen =
        hetero == 0 ? ""
        : m.screen_margin.has_value()
            ? fmt::format(", screen {}: {} of {} heterogeneous plans skipped", *m.screen_margin,
                          screened, hetero * static_cast<int64_t>(m.batches.size()))
            : ", screen off";
    return fmt::format("per batch among {} strategies, {} switches{}: {}", m.strategies.size(),
                       m.switches, screen, list);
  }
  if (!m.config.has_value()) return "-";
  if (m.adopted_from.empty()) return m.config->Describe();
  return fmt::format("{} (= {}'s choice)", m.config->Describe(), m.adopted_from);
}

// " x cp N" for context-parallel configurations and " x ep N" for expert-parallel ones.
std::string CpText(const ParallelConfig& p) {
  return (p.cp > 1 ? fmt::format(" x cp {}", p.cp) : "") +
         (p.ep > 1 ? fmt::format(" x ep {}", p.ep) : "");
}

report::Table RunsTable(const CompareResult& c, const std::vector<MethodRun>& runs,
                        const std::string& title) {
  report::Table t;
  t.title = title;
  t.header = {"method",
              "tokens/s",
              fmt::format("vs {}", c.scenario.reference),
              "of ideal",
              "of length-aware",
              "padding",
              "bubble",
              "exposed comm",
              fmt::format("peak MB of {}", Thousands(c.memory_limit_mb)),
              "plan ms/batch",
              "batches",
              "configuration"};
  // Expert parallelism: the all-to-all columns, when some run has all-to-alls.
  const bool a2a = std::any_of(runs.begin(), runs.end(),
                               [](const MethodRun& m) { return m.all_to_all_ms > 0; });
  if (a2a) {
    t.header.insert(t.header.begin() + 8, {"all-to-all ms", "exposed a2a ms"});
  }
  for (const MethodRun& m : runs) {
    std::vector<std::string> row;
    if (m.ok_batches == 0) {
      row = {m.method, StateText(m), "-", "-", "-", "-", "-", "-", "-", "-",
             fmt::format("0/{}", m.batches.size()), m.reason};
      if (a2a) row.insert(row.begin() + 8, {"-", "-"});
      t.rows.push_back(std::move(row));
      continue;
    }
    std::string config = ConfigText(m);
    if (m.moe_overlap_rejected > 0) {
      config += fmt::format(" (MoE overlap not applied to {} batches: {})",
                            m.moe_overlap_rejected, m.moe_overlap_reason);
    }
    row = {m.method, TokensText(m),
           m.ratio_to_reference > 0 ? fmt::format("{:.2f}x", m.ratio_to_reference) : "-",
           fmt::format("{:.2f}", m.fraction_of_ideal),
           fmt::format("{:.2f}", m.fraction_of_length_aware), Pct(m.padding), Pct(m.bubble),
           Pct(m.comm), Thousands(m.peak_memory_mb), fmt::format("{:.2f}", m.planning_ms),
           fmt::format("{}/{}", m.ok_batches, m.batches.size()), std::move(config)};
    if (a2a) {
      row.insert(row.begin() + 8, {fmt::format("{:.2f}", m.all_to_all_ms),
                                   fmt::format("{:.2f}", m.exposed_all_to_all_ms)});
    }
    t.rows.push_back(std::move(row));
  }
  t.numeric = {false, true, true, true, true, true, true, true, true, true, true, false};
  if (a2a) t.numeric.insert(t.numeric.begin() + 8, {true, true});
  t.wrap.assign(t.header.size(), false);
  t.wrap.back() = true;  // the configuration (or the reason) wraps so that the table fits
  return t;
}

report::Table BreakdownTable(const std::vector<MethodRun>& runs) {
  report::Table t;
  t.title = "Where the device time goes (share of devices x iteration time)";
  t.header = {"method"};
  for (const char* name : kBreakdownNames) t.header.push_back(name);
  for (const MethodRun& m : runs) {
    if (m.ok_batches == 0) continue;
    std::vector<std::string> row = {m.method};
    for (double p : BreakdownParts(m.breakdown)) row.push_back(Pct(p));
    t.rows.push_back(std::move(row));
  }
  t.numeric.assign(t.header.size(), true);
  t.numeric[0] = false;
  return t;
}

std::string TextTable(const report::Table& t) {
  std::vector<size_t> width(t.header.size(), 0);
  for (size_t i = 0; i < t.header.size(); ++i) width[i] = t.header[i].size();
  for (const auto& row : t.rows) {
    for (size_t i = 0; i < row.size() && i < width.size(); ++i) {
      // The last column (configuration or reason) is not padded.
      if (i + 1 < width.size()) width[i] = std::max(width[i], row[i].size());
    }
  }
  auto line = [&](const std::vector<std::string>& cells) {
    std::string s;
    for (size_t i = 0; i < cells.size() && i < width.size(); ++i) {
      const bool right = i < t.numeric.size() && t.numeric[i];
      if (i + 1 == width.size()) {
        s += cells[i];
      } else {
        s += right ? fmt::format("{:>{}}  ", cells[i], width[i])
                   : fmt::format("{:<{}}  ", cells[i], width[i]);
      }
    }
    while (!s.empty() && s.back() == ' ') s.pop_back();
    return s + "\n";
  };
  std::string out = t.title + ":\n" + line(t.header);
  for (const auto& row : t.rows) out += line(row);
  return out;
}

// One row per (rank, compute | communication) of the first 8 ranks.
report::Timeline ExampleTimeline(const MethodRun& m) {
  report::Timeline t;
  const ExampleRun& ex = *m.example;
  t.title = fmt::format("{}: batch {} ({})", m.method, m.batches.empty() ? 0 : m.batches[0].batch,
                        ConfigText(m));
  t.unit = "ms";
  const int64_t ranks = std::min<int64_t>(8, static_cast<int64_t>(ex.plan.ranks.size()));
  std::vector<report::TimelineRow> compute(ranks), comm(ranks), a2a(ranks);
  for (int64_t r = 0; r < ranks; ++r) {
    compute[r].label = fmt::format("rank {} compute", r);
    comm[r].label = fmt::format("rank {} comm", r);
    a2a[r].label = fmt::format("rank {} all-to-all", r);
  }
  for (const SimInterval& iv : ex.sim.timeline) {
    if (iv.rank < 0 || iv.rank >= ranks) continue;
    const auto& program = ex.plan.ranks[iv.rank].instructions;
    if (iv.instruction < 0 || iv.instruction >= static_cast<int64_t>(program.size())) continue;
    const Instruction& ins = program[iv.instruction];
    report::TimelineBar bar;
    bar.start = iv.start.millis();
    bar.end = iv.end.millis();
    bar.label = InstructionText(ins);
    bar.category = TimelineCategory(ins.op);
    bar.tooltip = fmt::format("{} on {}: {:.2f}-{:.2f} ms", bar.label, StreamKindName(iv.stream),
                              bar.start, bar.end);
    (iv.stream == StreamKind::kCompute    ? compute
     : iv.stream == StreamKind::kAllToAll ? a2a
                                          : comm)[iv.rank]
        .bars.push_back(std::move(bar));
  }
  for (int64_t r = 0; r < ranks; ++r) {
    t.rows.push_back(std::move(compute[r]));
    if (!comm[r].bars.empty()) t.rows.push_back(std::move(comm[r]));
    if (!a2a[r].bars.empty()) t.rows.push_back(std::move(a2a[r]));
  }
  return t;
}

}  // namespace

std::string FormatCompareTables(const CompareResult& c) {
  std::string out;
  if (c.partial) out += "PARTIAL RESULTS: the run was interrupted; figures cover what finished.\n";
  out += fmt::format(
      "ideal bound: {} tokens/s ({} devices at {:.1f} TFLOP/s of useful work each: {})\n\n",
      Thousands(c.ideal_tokens_per_s), c.devices, c.rate.flops_per_s / 1e12, c.rate.where);
  out += fmt::format(
      "length-aware bound: {} tokens/s (each sample at the best rate a micro-batch of its length "
      "reaches)\n\n",
      Thousands(c.length_aware_tokens_per_s));
  out += TextTable(RunsTable(c, c.own, "Each method under its own best configuration"));
  if (const std::string note = FailedNote(c.own); !note.empty()) out += Wrap(note, 100);
  out += "\n";
  if (c.controlled_config.has_value()) {
    const ParallelConfig& p = *c.controlled_config;
    out += TextTable(
        RunsTable(c, c.controlled,
                  fmt::format("Controlled: every method on dp {} x pp {} x tp {}{}, ZeRO-{}", p.dp,
                              p.pp, p.tp, CpText(p), p.zero)));
    if (const std::string note = FailedNote(c.controlled); !note.empty()) out += Wrap(note, 100);
    out += "\n";
  }
  out += TextTable(BreakdownTable(c.own));
  return out;
}

report::HtmlReport BuildCompareReport(const CompareResult& c) {
  report::HtmlReport r;
  r.title = fmt::format("sluice compare: {}", c.scenario.name);
  if (c.partial) r.subtitle = "PARTIAL RESULTS: the run was interrupted.";
  // The description's "label:   value" lines, one fact each; then warnings and the search.
  for (size_t pos = 0; pos < c.description.size();) {
    size_t end = c.description.find('\n', pos);
    if (end == std::string::npos) end = c.description.size();
    const std::string line = c.description.substr(pos, end - pos);
    pos = end + 1;
    const size_t colon = line.find(':');
    if (colon == std::string::npos) {
      if (!line.empty()) r.facts.emplace_back("", line);
      continue;
    }
    const size_t value = line.find_first_not_of(' ', colon + 1);
    r.facts.emplace_back(line.substr(0, colon),
                         value == std::string::npos ? "" : line.substr(value));
  }
  for (const std::string& w : c.warnings) r.facts.emplace_back("warning", w);
  std::string scored;
  for (int64_t b : c.score_batches) scored += fmt::format("{}{}", scored.empty() ? "" : ", ", b);
  r.facts.emplace_back("search", fmt::format("{} candidates, each scored on global batches {}",
                                             c.candidates_scored, scored));

  report::Section summary;
  summary.heading = "Throughput";
  summary.text = fmt::format(
      "Real (unpadded) tokens per second in simulation over {} global batches. The ideal bound "
      "({} tokens/s) is every device doing useful work at {:.1f} TFLOP/s, the best rate the cost "
      "model reaches ({}), with no padding, bubbles or communication. The length-aware bound "
      "({} tokens/s) runs each sample at the best rate a micro-batch of sequences of its length "
      "reaches on the cluster (any tp and cp); the tables give the fraction of both.",
      c.batches, Thousands(c.ideal_tokens_per_s), c.rate.flops_per_s / 1e12, c.rate.where,
      Thousands(c.length_aware_tokens_per_s));
  if (const std::string note = FailedNote(c.own); !note.empty()) {
    summary.text += "\n\nSome runs failed batches (a paler, dashed bar says k/n batches ran). " + note;
  }
  report::BarChart bars;
  bars.title = "Throughput per method (own best configuration)";
  bars.value_label = "tokens/s";
  for (const MethodRun& m : c.own) {
    report::Bar b;
    b.label = m.method;
    b.value = m.tokens_per_s;
    b.missing = m.ok_batches == 0;
    b.note = b.missing                  ? StateText(m)
             : m.ratio_to_reference > 0 ? fmt::format("{:.2f}x, {:.2f} of ideal",
                                                      m.ratio_to_reference, m.fraction_of_ideal)
                                        : fmt::format("{:.2f} of ideal", m.fraction_of_ideal);
    if (!b.missing && Failed(m) > 0) {
      b.note += fmt::format(", {}/{} batches ran", m.ok_batches, m.batches.size());
      b.partial = true;
    }
    bars.bars.push_back(std::move(b));
  }
  bars.bars.push_back({"ideal bound", c.ideal_tokens_per_s, "1.00 of ideal", false});
  if (c.length_aware_tokens_per_s > 0 && c.ideal_tokens_per_s > 0) {
    bars.bars.push_back(
        {"length-aware bound", c.length_aware_tokens_per_s,
         fmt::format("{:.2f} of ideal", c.length_aware_tokens_per_s / c.ideal_tokens_per_s),
         false});
  }
  summary.blocks.push_back(bars);
  summary.blocks.push_back(RunsTable(c, c.own, "Own best configuration"));
  if (c.controlled_config.has_value()) {
    const ParallelConfig& p = *c.controlled_config;
    summary.blocks.push_back(RunsTable(
        c, c.controlled,
        fmt::format("Controlled: dp {} x pp {} x tp {}{}, ZeRO-{}", p.dp, p.pp, p.tp, CpText(p),
                    p.zero)));
  }
  r.sections.push_back(std::move(summary));

  report::Section dist;
  dist.heading = "Per-batch throughput";
  dist.text =
      "Each global batch's real tokens / simulated iteration time, per method. A failed batch has "
      "no iteration time and is not drawn: n under each box counts the batches that ran.";
  report::Distribution d;
  d.title = "Per-batch throughput";
  d.value_label = "tokens/s";
  for (const MethodRun& m : c.own) {
    std::vector<double> values;
    for (const BatchRecord& b : m.batches) {
      if (b.outcome == BatchOutcome::kOk && b.iteration_ms > 0) {
        values.push_back(1e3 * static_cast<double>(b.real_tokens) / b.iteration_ms);
      }
    }
    if (!values.empty()) d.groups.emplace_back(m.method, std::move(values));
  }
  dist.blocks.push_back(d);
  dist.blocks.push_back(BreakdownTable(c.own));
  r.sections.push_back(std::move(dist));

  report::Section timelines;
  timelines.heading = "Example timelines";
  timelines.text =
      "The first global batch of each method under its own configuration, as "
      "simulated (first 8 ranks; compute, communication and all-to-all streams).";
  for (const MethodRun& m : c.own) {
    if (m.example.has_value()) timelines.blocks.push_back(ExampleTimeline(m));
  }
  r.sections.push_back(std::move(timelines));

  if (!c.skipped_configs.empty()) {
    report::Section skipped;
    skipped.heading = "Configurations not searched";
    report::Table t;
    t.title = "Left out before the search";
    t.header = {"configuration and reason"};
    for (const std::string& s : c.skipped_configs) t.rows.push_back({s});
    skipped.blocks.push_back(t);
    r.sections.push_back(std::move(skipped));
  }
  return r;
}

namespace {

// The share of the dataset's tokens that no batch trains, and why: "3.0% clipped", "0.4%
// dropped", "3.4% clipped + dropped", "0%".
std::string LostTokensText(const DataLoss& loss) {
  if (loss.tokens <= 0 || loss.lost_tokens() <= 0) return "0%";
  const bool clipped = loss.clipped_tokens > 0;
  const bool dropped = loss.dropped_long_tokens + loss.dropped_budget_tokens > 0;
  const double pct = 100.0 * loss.lost_tokens() / loss.tokens;
  return fmt::format("{} {}",
                     pct >= 0.1    ? fmt::format("{:.1f}%", pct)
                     : pct >= 0.01 ? fmt::format("{:.2f}%", pct)
                                   : std::string("< 0.01%"),
                     clipped && dropped ? "clipped + dropped"
                     : clipped          ? "clipped"
                                        : "dropped");
}

}  // namespace

std::string FormatScenarioSummary(std::span<const CompareResult> results) {
  if (results.empty()) return "";
  std::vector<std::string> methods;
  for (const CompareResult& c : results) {
    for (const MethodRun& m : c.own) {
      if (std::find(methods.begin(), methods.end(), m.method) == methods.end()) {
        methods.push_back(m.method);
      }
    }
  }
  std::string out = "| scenario | tokens lost | reference tok/s |";
  for (const std::string& m : methods) out += fmt::format(" {} |", m);
  out +=
      " controlled | sluice of ideal | sluice's configuration | sluice's largest losses |\n"
      "|---|---:|---:|";
  for (size_t i = 0; i < methods.size(); ++i) out += "---:|";
  out += "---:|---:|---|---|\n";
  for (const CompareResult& c : results) {
    // The row's focus: the method named "sluice", else the fastest (named in its cells).
    const MethodRun* ref = nullptr;
    const MethodRun* focus = nullptr;
    const MethodRun* fastest = nullptr;  // first by the rule of run_tally.h
    for (const MethodRun& m : c.own) {
      if (m.method == c.scenario.reference) ref = &m;
      if (m.method == "sluice" && m.ok_batches > 0) focus = &m;
      if (m.ok_batches > 0 && (fastest == nullptr || RunRanksBefore(m, *fastest))) {
        fastest = &m;
      }
    }
    const std::string prefix =
        focus == nullptr && fastest != nullptr ? fmt::format("{}: ", fastest->method) : "";
    if (focus == nullptr) focus = fastest;
    out += fmt::format("| {}{} | {} | {} |", c.scenario.name, c.partial ? " (partial)" : "",
                       LostTokensText(c.data_loss),
                       ref != nullptr && ref->ok_batches > 0 ? TokensText(*ref) : "OOM");
    for (const std::string& name : methods) {
      const MethodRun* m = nullptr;
      for (const MethodRun& x : c.own) {
        if (x.method == name) m = &x;
      }
      if (m == nullptr) {
        out += " |";
      } else if (m->ok_batches == 0) {
        out += fmt::format(" {} |", StateText(*m));
      } else if (m->ratio_to_reference > 0) {
        out += fmt::format(" {:.2f}x{} |", m->ratio_to_reference,
                           Failed(*m) > 0
                               ? fmt::format(" ({}/{} ran)", m->ok_batches, m->batches.size())
                               : "");
      } else {
        out += fmt::format(" {} tok/s |", TokensText(*m));
      }
    }
    if (focus == nullptr) {
      out += " - | - | - | - |\n";
      continue;
    }
    // The focus method against the reference under the shared configuration.
    std::string controlled = "-";
    for (const MethodRun& m : c.controlled) {
      if (m.method == focus->method && m.ratio_to_reference > 0) {
        controlled = fmt::format("{:.2f}x", m.ratio_to_reference);
      }
    }
    out += fmt::format(" {} |", controlled);
    out += fmt::format(" {}{:.2f} | {} | {} |\n", prefix, focus->fraction_of_ideal,
                       ConfigText(*focus), LargestLosses(focus->breakdown, 3));
  }
  return out;
}

}  // namespace sluice::cli
