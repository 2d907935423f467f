// The run summaries of `sluice compare` (compare.cc's phases): a run's accounts, its summary
// under the achievable rate, the search's counts carried into a run, and the adoption of another
// method's better run. Internal to src/compare/.
#pragma once

#include <cstdint>
#include <vector>

#include "compare/compare.h"
#include "compare/compare_run.h"

namespace sluice {

// What a run's batches need once R is known: their accounts and the useful FLOPs they placed.
struct RunAccounts {
  std::vector<BatchAccount> account;
  std::vector<double> useful;
  std::vector<double> length_aware;  // device-seconds of the placed samples at R(L)
};

// The runs of one comparison (own or controlled), one per method, with their accounts.
struct CompareRuns {
  std::vector<MethodRun> runs;
  std::vector<RunAccounts> accounts;
};

// The summary of a run, its batches' ideal times and breakdowns, under the achievable rate R.
void SummarizeRun(MethodRun* run, double rate, int64_t devices, const RunAccounts& accounts);

// Whether two parallel configurations have the same layout (dp, pp, tp, cp, ep and ZeRO stage;
// memory settings and vpp aside): the controlled comparison's shared configuration.
bool SameSharedLayout(const ParallelConfig& a, const ParallelConfig& b);

// The search's counts and choice (or why there is none) into a run about to be made.
void FillFromSearch(const MethodSearch& search, bool cancelled, MethodRun* run);

// A method whose space holds another method's chosen configuration, and whose own choice (scored
// on a few batches) ranks after that one over the whole run (RanksBefore, run_tally.h: a run that
// failed a batch never wins over one that ran all), takes that run over: it is a configuration
// its own search could have returned, judged on every batch.
void AdoptRuns(const std::vector<MethodSpec>& methods, CompareRuns* runs);

}  // namespace sluice
