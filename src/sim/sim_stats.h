// Figures of a simulation that do not need the event engine (internal to src/sim/): real tokens and
// useful model FLOPs of a plan, the per-rank memory sweep and exposed-time unions.
//
// Thread safety: pure functions.
#pragma once

#include <cstdint>
#include <span>
#include <utility>
#include <vector>

#include "base/status.h"
#include "base/units.h"
#include "data/sample.h"
#include "plan/execution_plan.h"
#include "sim/simulator.h"

namespace sluice::sim_internal {

struct TokenCount {
  int64_t real = 0;        // unpadded tokens (input + target) of the placed samples
  int64_t padded = 0;      // tokens the micro-batch shapes allocate
  double model_flops = 0;  // useful FLOPs (forward + backward, no recompute) of the real tokens
};

// Counts the plan's tokens and useful FLOPs. With `samples` non-empty every row's samples are
// looked up by id (NotFound naming the first missing id); a row holds at most its padded length
// of each side. With `samples` empty the padded shapes stand in for the real lengths.
StatusOr<TokenCount> CountTokens(const ExecutionPlan& plan, std::span<const Sample> samples);

// One change of a rank's memory at `time`, caused by instruction `instruction`.
struct MemoryDelta {
  int64_t time = 0;  // ns
  int64_t bytes = 0;
  int32_t instruction = -1;
};

struct MemorySweep {
  Bytes peak;                     // highest level, `base` included
  int64_t peak_instruction = -1;  // the delta that first reached it
  int64_t first_over_time = -1;   // first time the level exceeded the limit, -1: never
  int64_t first_over_instruction = -1;
  std::vector<MemoryPoint> points;  // level after all deltas of each distinct time (if recorded)
};

// Applies `deltas` on top of `base`, in time order (stably sorted first when they are not).
MemorySweep SweepMemory(std::vector<MemoryDelta>& deltas, Bytes base, Bytes limit, bool record);

// Total length of the union of `spans` ([start, end) pairs, any order; sorted in place) inside
// [from, to).
Duration UnionWithin(std::vector<std::pair<Duration, Duration>>& spans, Duration from, Duration to);

}  // namespace sluice::sim_internal
