// RunTally: the one rule by which sluice counts and ranks a run of global batches under one
// configuration — in the configuration search (config_search.h), in `sluice compare`'s runs and
// its adoption of another method's configuration, and in its summaries (docs/compare.md,
// "Failed batches").
//
// A failed batch (no plan within memory, or a simulation that ran out of memory or deadlocked) is
// a failure of the configuration, never left out:
//   - Throughput counts every batch: tokens/s = tokens of the batches that ran / (time of the
//     batches that ran + the time charged for the failed ones), where each failed batch trains
//     none of its tokens and is charged the mean iteration time of the batches that ran (the
//     iteration a real job would lose before failing; a restart costs more). With k of n batches
//     run this equals (k / n) x the throughput of the batches that ran.
//   - Ranking: a run that ran every batch ranks above every run that failed one, whatever their
//     throughputs; among runs that are both complete (or both not), the higher tokens/s wins.
//
// Thread safety: value type.
#pragma once

#include <cstdint>

namespace sluice {

struct RunTally {
  int64_t batches = 0;  // batches attempted
  int64_t failed = 0;   // of them, batches that failed
  int64_t tokens = 0;   // real tokens of the batches that ran
  double seconds = 0;   // summed iteration time of the batches that ran

  // Adds a batch that ran: its real tokens and its iteration time in seconds.
  void AddRan(int64_t real_tokens, double iteration_seconds);
  // Adds a batch that failed.
  void AddFailed();

  int64_t ran() const { return batches - failed; }
  bool complete() const { return failed == 0 && batches > 0; }
  // Time charged for the failed batches: failed x the mean iteration time of the batches that ran
  // (0 when none ran).
  double charged_seconds() const;
  // The headline: tokens / (seconds + charged_seconds()); 0 when no batch ran.
  double TokensPerSecond() const;
  // Tokens / seconds over the batches that ran only (not a headline: it hides failures).
  double RanTokensPerSecond() const;

  friend bool operator==(const RunTally&, const RunTally&) = default;
};

// True when `a` ranks before `b` (see above): complete before incomplete, then the higher
// TokensPerSecond. Ties are false both ways.
bool RanksBefore(const RunTally& a, const RunTally& b);

}  // namespace sluice
