#include "planner/run_tally.h"

namespace sluice {

void RunTally::AddRan(int64_t real_tokens, double iteration_seconds) {
  ++batches;
  tokens += real_tokens;
  seconds += iteration_seconds;
}

void RunTally::AddFailed() {
  ++batches;
  ++failed;
}

double RunTally::charged_seconds() const {
  return ran() > 0 ? static_cast<double>(failed) * seconds / static_cast<double>(ran()) : 0;
}

double RunTally::TokensPerSecond() const {
  const double time = seconds + charged_seconds();
  return time > 0 ? static_cast<double>(tokens) / time : 0;
}

double RunTally::RanTokensPerSecond() const {
  return seconds > 0 ? static_cast<double>(tokens) / seconds : 0;
}

bool RanksBefore(const RunTally& a, const RunTally& b) {
  if (a.complete() != b.complete()) return a.complete();
  return a.TokensPerSecond() > b.TokensPerSecond();
}

}  // namespace sluice
