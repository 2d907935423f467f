// The run summaries of `sluice compare` (compare_summary.h) and the run figures compare.h
// declares: TallyOf, RunRanksBefore and the outcome names.
#include "compare/compare_summary.h"

#include <algorithm>
#include <string_view>
#include <utility>

namespace sluice {

// The summary of a run, its batches' ideal times and breakdowns, under the achievable rate R.
void SummarizeRun(MethodRun* run, double rate, int64_t devices, const RunAccounts& accounts) {
  const std::vector<BatchAccount>& acc = accounts.account;
  const std::vector<double>& useful = accounts.useful;
  int64_t tokens = 0, padded = 0;
  double time = 0, ideal = 0, length_aware = 0, bubble = 0, comm = 0, plan = 0, a2a = 0,
         exposed_a2a = 0;
  BatchAccount total;
  run->ok_batches = 0;
  for (size_t i = 0; i < run->batches.size(); ++i) {
    BatchRecord& b = run->batches[i];
    if (b.outcome != BatchOutcome::kOk) continue;
    b.ideal_ms = rate > 0 ? 1e3 * useful[i] / (static_cast<double>(devices) * rate) : 0;
    b.length_aware_ms = 1e3 * accounts.length_aware[i] / static_cast<double>(devices);
    b.breakdown = Finalize(acc[i], rate);
    total.Add(acc[i]);
    ++run->ok_batches;
    tokens += b.real_tokens;
    padded += b.padded_tokens;
    time += b.iteration_ms;
    ideal += b.ideal_ms;
    length_aware += b.length_aware_ms;
    bubble += b.bubble * b.iteration_ms;
    comm += b.comm * b.iteration_ms;
    plan += b.planning_ms;
    a2a += b.all_to_all_ms;
    exposed_a2a += b.exposed_all_to_all_ms;
    run->peak_memory_mb = std::max(run->peak_memory_mb, b.peak_memory_mb);
  }
  run->untrained_tokens = 0;
  for (const BatchRecord& b : run->batches) {
    if (b.outcome != BatchOutcome::kOk) run->untrained_tokens += b.tokens;
  }
  if (run->ok_batches == 0) return;
  // Throughput counts every batch (run_tally.h); the other figures the batches that ran.
  const RunTally tally = TallyOf(*run);
  run->tokens_per_s = tally.TokensPerSecond();
  run->ran_tokens_per_s = tally.RanTokensPerSecond();
  run->charged_ms = 1e3 * tally.charged_seconds();
  run->ideal_tokens_per_s = ideal > 0 ? 1e3 * static_cast<double>(tokens) / ideal : 0;
  run->fraction_of_ideal = time > 0 ? ideal / (time + run->charged_ms) : 0;
  run->fraction_of_length_aware = time > 0 ? length_aware / (time + run->charged_ms) : 0;
  run->padding =
      padded > 0 ? static_cast<double>(padded - tokens) / static_cast<double>(padded) : 0;
  run->bubble = time > 0 ? bubble / time : 0;
  run->comm = time > 0 ? comm / time : 0;
  run->planning_ms = plan / static_cast<double>(run->ok_batches);
  run->all_to_all_ms = a2a / static_cast<double>(run->ok_batches);
  run->exposed_all_to_all_ms = exposed_a2a / static_cast<double>(run->ok_batches);
  run->breakdown = Finalize(total, rate);
}

bool SameSharedLayout(const ParallelConfig& a, const ParallelConfig& b) {
  return a.dp == b.dp && a.pp == b.pp && a.tp == b.tp && a.cp == b.cp && a.ep == b.ep &&
         a.zero == b.zero;
}

// The search's counts and choice (or why there is none) into a run about to be made.
void FillFromSearch(const MethodSearch& search, bool cancelled, MethodRun* run) {
  run->candidates = static_cast<int64_t>(search.ranked.size());
  for (const CandidateScore& s : search.ranked) {
    if (s.complete()) ++run->feasible;
    if (s.simulated) ++run->simulated;
  }
  if (search.best.has_value()) {
    run->config = search.best->candidate;
  } else if (cancelled) {
    run->state = RunState::kNotRun;
    run->reason = "interrupted during the search";
  } else {
    run->state = search.unsupported ? RunState::kUnsupported : RunState::kOutOfMemory;
    run->reason = search.reason;
  }
}

// A method whose space holds another method's chosen configuration, and whose own choice (scored
// on a few batches) ranks after that one over the whole run (RanksBefore, run_tally.h: a run that
// failed a batch never wins over one that ran all), takes that run over: it is a configuration
// its own search could have returned, judged on every batch.
void AdoptRuns(const std::vector<MethodSpec>& methods, CompareRuns* runs) {
  const CompareRuns before = *runs;
  for (size_t i = 0; i < methods.size(); ++i) {
    const MethodSpec& m = methods[i];
    if (m.kind != MethodKind::kHomogeneous) continue;  // no configuration to adopt into
    const MethodRun& mine = before.runs[i];
    RunTally best = mine.config.has_value() ? TallyOf(mine) : RunTally{};
    for (size_t j = 0; j < before.runs.size(); ++j) {
      const MethodRun& other = before.runs[j];
      if (j == i || !other.config.has_value() || !other.adopted_from.empty()) continue;
      if (other.batches.size() != mine.batches.size() && mine.config.has_value()) continue;
      const Candidate& c = *other.config;
      const bool in_space =
          std::find(m.batching.begin(), m.batching.end(), c.batching) != m.batching.end() &&
          std::find(m.schedules.begin(), m.schedules.end(), c.schedule) != m.schedules.end();
      const RunTally theirs = TallyOf(other);
      if (!in_space || theirs.ran() == 0 || !RanksBefore(theirs, best)) continue;
      best = theirs;
      MethodRun adopted = other;
      adopted.method = m.name;
      adopted.candidates = mine.candidates;
      adopted.feasible = mine.feasible;
      adopted.simulated = mine.simulated;
      adopted.adopted_from = other.method;
      runs->runs[i] = std::move(adopted);
      runs->accounts[i] = before.accounts[j];
    }
  }
}

RunTally TallyOf(const MethodRun& run) {
  RunTally tally;
  for (const BatchRecord& b : run.batches) {
    if (b.outcome == BatchOutcome::kOk) {
      tally.AddRan(b.real_tokens, b.iteration_ms / 1e3);
    } else {
      tally.AddFailed();
    }
  }
  return tally;
}

bool RunRanksBefore(const MethodRun& a, const MethodRun& b) {
  return RanksBefore(TallyOf(a), TallyOf(b));
}

std::string_view BatchOutcomeName(BatchOutcome outcome) {
  switch (outcome) {
    case BatchOutcome::kOk:
      return "ok";
    case BatchOutcome::kOutOfMemory:
      return "out-of-memory";
    case BatchOutcome::kSimOutOfMemory:
      return "sim-out-of-memory";
    case BatchOutcome::kDeadlock:
      return "deadlock";
  }
  return "?";
}

std::string_view RunStateName(RunState state) {
  switch (state) {
    case RunState::kOk:
      return "ok";
    case RunState::kOutOfMemory:
      return "out-of-memory";
    case RunState::kUnsupported:
      return "unsupported";
    case RunState::kNotRun:
      return "not-run";
  }
  return "?";
}

}  // namespace sluice
