// Shared fixtures for the plan tests (test-only; linked into plan_test).
//
// A PlanFixture is one lowered iteration: a seeded random global batch of a small test model
// (decoder-only "test-gpt", 16 layers, or encoder-decoder "test-t5", 8 + 8 layers: both fit one
// a100-40g and split into up to 16 virtual stages), cut into random micro-batches of 1-4 rows
// per replica (so costs differ per micro-batch), priced by the analytic cost model, scheduled by
// the real generators (schedule/generators.h) and lowered by LowerPlan. One sample of the batch
// is left out of every micro-batch and listed as dropped.
//
// Failures to build a fixture abort the test binary with the Status message (they are bugs in
// the code under test or the fixture, not outcomes). Thread safety: none needed.
#pragma once

#include <cstdint>
#include <memory>
#include <string>
#include <vector>

#include "batching/micro_batch.h"
#include "batching/test_util.h"
#include "data/sample.h"
#include "plan/execution_plan.h"
#include "plan/lower.h"
#include "schedule/action.h"
#include "schedule/generators.h"

namespace sluice::testing {

struct PlanCase {
  bool encoder_decoder = false;  // test-t5 instead of test-gpt
  int64_t dp = 1;
  int64_t pp = 2;
  int64_t vpp = 1;
  int64_t zero = 1;
  ScheduleKind kind = ScheduleKind::k1F1B;
  int64_t microbatches = 6;  // per replica
  uint64_t seed = 0;
  bool fixed_shapes = false;   // micro-batch i has 1 + i % 3 rows of 64 * (1 + i % 4) tokens
  double memory_limit_mb = 0;  // 0: the device's memory
  LowerOptions lower;
  // MoE: every 2nd layer of the model has 4 experts, top-2, capacity factor 1.25; ep experts
  // groups (ep > 1 needs moe).
  bool moe = false;
  int64_t ep = 1;
  int64_t cp = 1;  // context-parallel ranks per position (decoder-only)
};

struct PlanFixture {
  std::unique_ptr<TestSetup> setup;
  std::vector<Sample> batch;
  BatchPlan batch_plan;
  std::vector<Schedule> schedules;
  bool fits = true;  // every generator said its schedule fits the memory budget (outcome kOk)
  // Set when a generator stopped without a schedule (out of memory); `plan` is then empty.
  std::string no_schedule;
  ExecutionPlan plan;
};

// The test models (see the header comment); valid ModelSpecs.
ModelSpec TestGptModel();
ModelSpec TestT5Model();

// Builds the fixture for `c`; aborts on failure. A generator that finds no schedule is not a
// failure: the fixture says why in `no_schedule`.
std::unique_ptr<PlanFixture> MakePlanFixture(const PlanCase& c);

// "gpt dp1 pp2 vpp1 zero1 1f1b m6 seed0", for test messages.
std::string Describe(const PlanCase& c);

// Compares `actual` with tests/golden/plans/<file>, or writes it there when the environment sets
// SLUICE_UPDATE_GOLDEN=1. Returns "" on a match, else a description of the difference.
std::string CheckGolden(const std::string& file, const std::string& actual);

// Index of the first instruction of `rank` satisfying `pred`, or -1.
template <typename Pred>
int64_t FindInstruction(const ExecutionPlan& plan, int64_t rank, Pred pred) {
  const auto& list = plan.ranks[rank].instructions;
  for (size_t i = 0; i < list.size(); ++i) {
    if (pred(list[i])) return static_cast<int64_t>(i);
  }
  return -1;
}

}  // namespace sluice::testing
