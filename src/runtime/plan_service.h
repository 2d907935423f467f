// PlanService: rank 0's planning thread. It plans the global batches with the Planner (or reads
// the --plan files) up to TrainOptions::lookahead iterations ahead of the iteration the ranks
// run, and publishes each serialized PlanPackage through the c10d store under PlanKey(i), with
// its hash under HashKey(i) first, so that a rank that sees the plan also finds the hash to
// verify it against. --iterations bounds the batches considered, skipped ones included. Batches
// the planner cannot fit are skipped: the first is noted with its reason, the rest are counted
// and summarised in one note at the end. When no batch could be planned the end travels as an
// error package (every rank fails, naming the reason); planning errors and the end of the data
// travel as packages of their kind. Every rank reads, verifies and
// acknowledges (ReadKey) the packages in Trainer::Fetch (trainer.cc).
//
// With TrainOptions::hetero_planner the service plans each batch with it and publishes one
// package per replica group under PlanKey(i, g): the group's plan and the whole batch's samples
// (hetero_train.h).
//
// With the planner's optimizer on (`--optimize-budget-ms`), the service records what it did to
// each iteration's plan (TakeOptimization) and keeps running totals (OptimizerTotals), which rank
// 0 prints per iteration and in the final summary. --plan files are never optimized.
//
// Thread safety: Started and TakeNotes may be called from the main thread while the planning
// thread runs; the destructor stops and joins it.
#pragma once

#include <condition_variable>
#include <cstdint>
#include <memory>
#include <mutex>
#include <optional>
#include <span>
#include <string>
#include <thread>
#include <unordered_map>
#include <vector>

#include "base/status.h"
#include "data/sample.h"
#include "planner/planner.h"
#include "runtime/launcher.h"
#include "runtime/plan_package.h"
#include "runtime/trainer.h"

namespace sluice::runtime {

class StoreClient;

// Store keys of iteration `i`'s package, its hash and its read counter; `group` >= 0: the
// package of that replica group of a heterogeneous job (hetero_train.h).
std::string PlanKey(int64_t i, int64_t group = -1);
std::string HashKey(int64_t i, int64_t group = -1);
std::string ReadKey(int64_t i, int64_t group = -1);
// The hash every rank compares: FNV-1a 64 of the package bytes, as 16 hex digits.
std::string HashText(std::span<const uint8_t> bytes);

// What the optimizer did to one iteration's plan (planner/planner.h, PlanOptimization).
struct IterationOptimization {
  double before_ms = 0;  // simulated iteration time of the lowered plan
  double after_ms = 0;   // of the plan published (<= before_ms)
  double wall_ms = 0;    // time the optimizer took
  int64_t changes = 0;   // kept passes (0: the plan is the lowered one)
  bool budget_hit = false;
};

// The simulation of one iteration's plan after TrainOptions::adjust_plan.
struct IterationPrediction {
  double iteration_ms = 0;
  std::vector<int64_t> peak_bytes;  // [rank] simulated peak memory
  // Max over ranks: the all-to-all stream's busy time and its exposed part (MoE, ep > 1).
  double all_to_all_ms = 0, exposed_all_to_all_ms = 0;
};

// Sums over every plan the optimizer ran on.
struct OptimizerTotals {
  int64_t plans = 0, changed = 0, budget_hit = 0;
  double before_ms = 0, after_ms = 0, wall_ms = 0;
};

class PlanService {
 public:
  // REQUIRES: `o` outlives the service.
  PlanService(const TrainOptions& o, const DistEnv& env);
  ~PlanService();
  PlanService(const PlanService&) = delete;
  PlanService& operator=(const PlanService&) = delete;

  // Connects to the store and starts the planning thread.
  Status Start();
  // The main thread began iteration `i`.
  void Started(int64_t i);
  // Notes about skipped batches, taken by the caller for printing.
  std::vector<std::string> TakeNotes();
  // What the optimizer did to iteration `i`'s plan, removed from the service; nullopt when it
  // did not run on it (optimizer off, --plan files, or not planned yet).
  std::optional<IterationOptimization> TakeOptimization(int64_t i);
  OptimizerTotals optimizer_totals();
  // The prediction for iteration `i`'s plan, removed from the service; nullopt without
  // TrainOptions::adjust_plan (or when the simulation failed: a note says why).
  std::optional<IterationPrediction> TakePrediction(int64_t i);

 private:
  void Loop();
  PlanPackage Next(int64_t i, const Planner* planner);
  // TrainOptions::adjust_plan and rewrite_plan on `plan`, then its simulation into
  // predictions_.
  void Predict(int64_t i, ExecutionPlan* plan);
  Status ReadPlanFileInto(const std::string& path, PlanPackage* p);

  const TrainOptions& o_;
  const DistEnv env_;
  std::unique_ptr<StoreClient> store_;
  std::unordered_map<int64_t, Sample> plan_samples_;
  std::mutex mu_;
  std::condition_variable cv_;
  int64_t started_ = -1;            // guarded by mu_
  bool stop_ = false;               // guarded by mu_
  std::vector<std::string> notes_;  // guarded by mu_
  std::unordered_map<int64_t, IterationOptimization> optimizations_;  // guarded by mu_
  OptimizerTotals totals_;                                            // guarded by mu_
  std::unordered_map<int64_t, IterationPrediction> predictions_;      // guarded by mu_
  // The planning thread's own counts.
  int64_t considered_ = 0, skipped_ = 0, planned_ = 0;
  std::string first_skip_;  // "batch 3: out-of-memory: ..."
  std::vector<ExecutionPlan> group_plans_;  // heterogeneous: the plans of groups 1, 2, ... of
                                            // the batch Next returned (group 0's is in it)
  std::thread thread_;
};

}  // namespace sluice::runtime
