// The plan optimizer and the passes over a planner sweep (the property tests of issue 17):
// every pass keeps every plan valid, and the optimizer never returns a plan whose simulated
// iteration is longer than its input's; it is deterministic for a seed. The micro-batch order
// move (relower.h) is covered the same way: relowering in the plan's own order gives the plan
// back, any other order gives a valid plan or a clear refusal, the order search never lengthens
// the estimate, and the optimizer keeps a reorder only when the simulation is shorter.
//
// 3 configurations x 3 schedules x 3 methods x 2 seeded batches of gpt-6.7b on a100-40g.
#include "planner/optimizer.h"

#include <fmt/core.h>
#include <gmock/gmock.h>
#include <gtest/gtest.h>

#include <algorithm>
#include <chrono>
#include <map>
#include <optional>
#include <string>
#include <vector>

#include "base/rng.h"
#include "batching/test_util.h"
#include "passes/gradient_bucketing.h"
#include "passes/recompute.h"
#include "passes/reorder.h"
#include "plan/validate.h"
#include "planner/optimizer_candidates.h"
#include "planner/planner.h"
#include "planner/recompute_pricer.h"
#include "planner/relower.h"

namespace sluice {
namespace {

using ::testing::HasSubstr;

struct SweepCase {
  std::string name;
  std::vector<Sample> batch;
  ExecutionPlan plan;
  std::shared_ptr<const passes::RecomputePricer> pricer;  // the planner's (recompute_pricer.h)
  std::shared_ptr<const Relowerer> relowerer;             // built from `plan` (relower.h)
};

// Every accepted plan of the sweep (built once).
const std::vector<SweepCase>& Sweep() {
  static const auto* cases = [] {
    auto* out = new std::vector<SweepCase>;
    struct Config {
      const char* name;
      int64_t dp, pp, zero;
    };
    const std::vector<Config> configs = {
        {"dp2-pp4", 2, 4, 1}, {"pp8", 1, 8, 1}, {"dp4-pp2-zero2", 4, 2, 2}};
    const std::vector<std::pair<ScheduleKind, int64_t>> schedules = {
        {ScheduleKind::k1F1B, 1}, {ScheduleKind::kZbH1, 1}, {ScheduleKind::kInterleaved, 2}};
    for (const Config& c : configs) {
      for (auto [kind, vpp] : schedules) {
        const ParallelConfig par = testing::TestParallel(c.dp, c.pp, 1, 36000, c.zero, vpp);
        // Kept alive for the pricers: they hold the evaluator, which holds the cost model.
        static auto* setups = new std::vector<std::unique_ptr<testing::TestSetup>>;
        static auto* evals = new std::vector<std::shared_ptr<const StageCostEvaluator>>;
        setups->push_back(testing::MakeTestSetup("gpt-6.7b", par));
        const auto& setup = setups->back();
        auto eval = MakePlannerEvaluator(*setup->cost, par, setup->cluster, kind);
        SLUICE_CHECK_MSG(eval.ok(), eval.status().ToString());
        evals->push_back(*eval);
        for (uint64_t seed : {1, 2}) {
          const std::vector<Sample> batch = testing::RandomTokenBatch(seed, 32768, 2048, false);
          for (const char* method : {"dynapipe", "packing", "token-budget"}) {
            PlannerOptions options;
            options.method = method;
            options.schedule = kind;
            options.batching.seed = seed;
            options.batching.max_seqlen = 2048;
            StatusOr<Planner> planner = Planner::Create(*eval, setup->cluster, options);
            SLUICE_CHECK_MSG(planner.ok(), planner.status().ToString());
            StatusOr<PlanResult> r = planner->Plan(batch);
            SLUICE_CHECK_MSG(r.ok(), r.status().ToString());
            if (r->outcome != PlanOutcome::kOk) continue;
            StatusOr<Relowerer> rl = Relowerer::Create(r->plan, **eval, setup->cluster, batch);
            SLUICE_CHECK_MSG(rl.ok(), rl.status().ToString());
            out->push_back({fmt::format("{} {}{} {} seed {}", c.name, ScheduleKindName(kind),
                                        vpp > 1 ? " vpp 2" : "", method, seed),
                            batch, std::move(r->plan),
                            std::make_shared<EvaluatorPricer>(**eval, setup->cluster, batch),
                            std::make_shared<const Relowerer>(std::move(rl).value())});
          }
        }
      }
    }
    return out;
  }();
  return *cases;
}

// Each replica's micro-batch indices 0 .. m - 1, shuffled (seeded) when `shuffle`.
std::vector<std::vector<int64_t>> Orders(const Relowerer& rl, Rng* rng, bool shuffle) {
  std::vector<std::vector<int64_t>> orders(static_cast<size_t>(rl.dp()));
  for (int64_t d = 0; d < rl.dp(); ++d) {
    for (int64_t i = 0; i < rl.size(d); ++i) orders[d].push_back(i);
    for (int64_t i = rl.size(d) - 1; shuffle && i > 0; --i) {
      std::swap(orders[d][i], orders[d][rng->UniformInt(0, i)]);
    }
  }
  return orders;
}

// `rl` lowered with `orders`: the plan, which passes checks 1-6 (memory is the optimizer's check:
// it refuses a plan over the limit), or nullopt after a refusal that says why (the schedule does
// not fit the budget). Counts either in *lowered or *refused.
std::optional<ExecutionPlan> LowerOrRefusal(const Relowerer& rl,
                                            const std::vector<std::vector<int64_t>>& orders,
                                            const std::string& name, int64_t* lowered,
                                            int64_t* refused) {
  StatusOr<ExecutionPlan> p = rl.Lower(orders);
  if (!p.ok()) {
    EXPECT_EQ(p.status().code(), StatusCode::kFailedPrecondition) << name;
    EXPECT_THAT(p.status().message(), HasSubstr("in this order")) << name;
    ++*refused;
    return std::nullopt;
  }
  ++*lowered;
  ValidateOptions without_memory;
  without_memory.check_memory = false;
  const Status valid = ValidatePlan(*p, without_memory);
  EXPECT_TRUE(valid.ok()) << name << ": " << valid.ToString();
  return std::move(p).value();
}

TEST(PassSweepTest, EveryPassKeepsEveryPlanValid) {
  ASSERT_GE(Sweep().size(), 40u);
  int64_t runs = 0, changed = 0, refused = 0;
  for (const SweepCase& c : Sweep()) {
    Rng rng(7);
    std::vector<std::shared_ptr<passes::PlanPass>> list = {
        std::make_shared<passes::BucketGradientsPass>(Bytes::MB(4)),
        std::make_shared<passes::BucketGradientsPass>(Bytes::MB(400))};
    for (int64_t rank = 0; rank < static_cast<int64_t>(c.plan.ranks.size()); ++rank) {
      const RankProgram& p = c.plan.ranks[rank];
      const int64_t n = static_cast<int64_t>(passes::ComputePositions(p).size());
      for (int k = 0; k < 3; ++k) {
        const int64_t from = rng.UniformInt(0, n - 1);
        const int64_t to = std::clamp<int64_t>(from + rng.UniformInt(-2, 2), 0, n - 1);
        list.push_back(std::make_shared<passes::MoveComputePass>(rank, from, to));
      }
      for (int k = 0; k < 2; ++k) {
        const int64_t mbs = static_cast<int64_t>(c.plan.replicas[p.dp_index].micro_batches.size());
        const int64_t mb = rng.UniformInt(0, mbs - 1);
        const int64_t stage = p.pp_index + c.plan.pp() * rng.UniformInt(0, c.plan.vpp() - 1);
        const Recompute level = k == 0 ? Recompute::kNone : Recompute::kFull;
        list.push_back(
            std::make_shared<passes::RecomputePass>(c.pricer, p.dp_index, mb, stage, level));
      }
      std::vector<int64_t> starts;
      for (size_t i = 1; i < p.instructions.size(); ++i) {
        if (IsCommStart(p.instructions[i].op)) starts.push_back(static_cast<int64_t>(i));
      }
      for (int k = 0; k < 3 && !starts.empty(); ++k) {
        const int64_t i = starts[rng.UniformInt(0, static_cast<int64_t>(starts.size()) - 1)];
        list.push_back(std::make_shared<passes::HoistStartPass>(
            rank, i, std::min<int64_t>(i, rng.UniformInt(1, 3))));
      }
    }
    for (const auto& pass : list) {
      ExecutionPlan p = c.plan;
      StatusOr<passes::PassRecord> r = pass->Run(&p);
      ASSERT_TRUE(r.ok()) << c.name << " " << pass->Describe() << ": " << r.status().ToString();
      const Status valid = ValidatePlan(p);
      ASSERT_TRUE(valid.ok()) << c.name << " " << pass->Describe() << ": " << valid.ToString();
      EXPECT_EQ(r->changed, !(p == c.plan)) << c.name << " " << pass->Describe();
      ++runs;
      changed += r->changed ? 1 : 0;
      refused += r->rejected.empty() ? 0 : 1;
    }
  }
  fmt::print("pass sweep: {} plans, {} pass runs, {} changed the plan, {} refused\n",
             Sweep().size(), runs, changed, refused);
  EXPECT_GT(changed, runs / 10);
  EXPECT_GT(refused, 0);
}

// Relowering in the plan's own orders gives the planner's plan back, byte for byte.
TEST(RelowerTest, OwnOrderGivesThePlanBack) {
  for (const SweepCase& c : Sweep()) {
    std::vector<std::vector<int64_t>> orders(static_cast<size_t>(c.plan.dp()));
    StatusOr<ExecutionPlan> again = c.relowerer->Lower(orders);
    ASSERT_TRUE(again.ok()) << c.name << ": " << again.status().ToString();
    EXPECT_TRUE(*again == c.plan) << c.name;
  }
}

// Any order gives a plan that passes checks 1-6 (memory is the optimizer's check: it refuses a
// plan over the limit), or a refusal that says why (the schedule does not fit the budget).
TEST(RelowerTest, AnyOrderGivesAValidPlanOrARefusal) {
  int64_t lowered = 0, refused = 0, fit = 0;
  for (const SweepCase& c : Sweep()) {
    Rng rng(11);
    for (int k = 0; k < 3; ++k) {
      const std::vector<std::vector<int64_t>> orders = Orders(*c.relowerer, &rng, true);
      const std::optional<ExecutionPlan> p =
          LowerOrRefusal(*c.relowerer, orders, c.name, &lowered, &refused);
      if (!p.has_value()) continue;
      fit += ValidatePlan(*p).ok() ? 1 : 0;
      // The plan records the new order.
      for (int64_t d = 0; d < c.plan.dp(); ++d) {
        for (int64_t i = 0; i < c.relowerer->size(d); ++i) {
          EXPECT_EQ(p->replicas[d].micro_batches[i].rows,
                    c.plan.replicas[d].micro_batches[orders[d][i]].rows);
        }
      }
    }
  }
  fmt::print("random orders: {} lowered ({} within memory), {} refused\n", lowered, fit, refused);
  EXPECT_GT(lowered, 0);
  // Not a permutation: an error naming the replica.
  std::vector<std::vector<int64_t>> bad(static_cast<size_t>(Sweep().front().plan.dp()));
  bad[0] = {0, 0};
  EXPECT_THAT(Sweep().front().relowerer->Lower(bad).status().message(),
              HasSubstr("not a permutation"));
}

// The resumable search ends where one run ends: in pieces of 7 estimates, through the exhaustive
// enumeration as well, and it stops as soon as its best is shorter than `stop_below`.
TEST(RelowerTest, OrderSearchInPiecesEndsWhereOneRunEnds) {
  int64_t compared = 0, stopped_early = 0;
  for (size_t k = 0; k < Sweep().size(); k += 2) {
    const SweepCase& c = Sweep()[k];
    for (int64_t d = 0; d < c.relowerer->dp(); ++d) {
      const int64_t m = c.relowerer->size(d);
      std::vector<int64_t> start(static_cast<size_t>(m));
      for (int64_t i = 0; i < m; ++i) start[i] = m - 1 - i;
      for (const int64_t exhaustive : {int64_t{0}, int64_t{6}}) {
        const int64_t bound = 400;
        StatusOr<OrderSearch> whole = SearchReplicaOrder(*c.relowerer, d, start, bound, exhaustive);
        ASSERT_TRUE(whole.ok()) << c.name << ": " << whole.status().ToString();
        StatusOr<ReplicaOrderSearch> s =
            ReplicaOrderSearch::Start(*c.relowerer, d, start, exhaustive);
        ASSERT_TRUE(s.ok());
        EXPECT_EQ(s->estimates(), 1);
        EXPECT_EQ(s->makespan(), whole->start_makespan) << c.name;
        for (int64_t to = 8; !s->converged() && s->estimates() < bound; to += 7) {
          const int64_t before = s->estimates();
          ASSERT_TRUE(s->Run(std::min(to, bound)).ok());
          // The enumeration runs to its end at once; the local search to its bound.
          if (s->estimates() == before) EXPECT_TRUE(s->converged()) << c.name;
          EXPECT_FALSE(s->deadline_hit());
        }
        const OrderSearch pieces = s->result();
        EXPECT_EQ(pieces.order, whole->order) << c.name << " d=" << d;
        EXPECT_EQ(pieces.makespan, whole->makespan) << c.name << " d=" << d;
        EXPECT_EQ(pieces.estimates, whole->estimates) << c.name << " d=" << d;
        EXPECT_EQ(pieces.moves, whole->moves) << c.name << " d=" << d;
        ++compared;
        // stop_below: the first best shorter than the start ends the run.
        if (whole->makespan < whole->start_makespan) {
          StatusOr<ReplicaOrderSearch> t =
              ReplicaOrderSearch::Start(*c.relowerer, d, start, exhaustive);
          ASSERT_TRUE(t.ok());
          ASSERT_TRUE(t->Run(bound, std::nullopt, whole->start_makespan).ok());
          EXPECT_LT(t->makespan(), whole->start_makespan) << c.name;
          EXPECT_LE(t->estimates(), whole->estimates) << c.name;
          stopped_early += t->estimates() < whole->estimates ? 1 : 0;
        }
      }
    }
  }
  EXPECT_GT(compared, 40);
  EXPECT_GT(stopped_early, 0);
  // A passed deadline stops the local search before its next estimate.
  const SweepCase& c = Sweep().front();
  std::vector<int64_t> start(static_cast<size_t>(c.relowerer->size(0)));
  for (int64_t i = 0; i < static_cast<int64_t>(start.size()); ++i) start[i] = i;
  StatusOr<ReplicaOrderSearch> late = ReplicaOrderSearch::Start(*c.relowerer, 0, start);
  ASSERT_TRUE(late.ok());
  ASSERT_TRUE(late->Run(100, std::chrono::steady_clock::now()).ok());
  EXPECT_TRUE(late->deadline_hit());
  EXPECT_EQ(late->estimates(), 1);
  EXPECT_THAT(ReplicaOrderSearch::Start(*c.relowerer, c.relowerer->dp(), start).status().message(),
              HasSubstr("replica"));
  EXPECT_THAT(ReplicaOrderSearch::Start(*c.relowerer, 0, std::vector<int64_t>{}).status().message(),
              HasSubstr("not a permutation"));
  EXPECT_THAT(ReplicaOrderSearch::Start(*c.relowerer, 0, start, 11).status().message(),
              HasSubstr("exhaustive_up_to"));
}

// The levels the recompute placement chose travel with their micro-batch: in any order (the
// plan's own included) every (micro-batch, stage) runs at the level and cost it had, and the plan
// passes checks 1-6; in the plan's own orders a 1F1B plan (whose action order does not depend on
// the costs) comes back byte for byte. (Other schedules are generated again from the placed
// costs, and the estimator may find an order over its budget that the plan's memory rule fits:
// the lowering then refuses it, saying why.)
TEST(RelowerTest, PlacedLevelsTravelWithTheirMicroBatch) {
  int64_t placed_plans = 0, pairs = 0, same = 0, lowered = 0, refused = 0;
  for (const SweepCase& c : Sweep()) {
    ExecutionPlan placed = c.plan;
    StatusOr<passes::PassRecord> record = passes::RecomputePlacementPass(c.pricer).Run(&placed);
    ASSERT_TRUE(record.ok()) << c.name << ": " << record.status().ToString();
    if (!record->changed) continue;
    ++placed_plans;
    const int64_t dp = c.plan.dp();
    Rng rng(5);
    const std::vector<std::vector<int64_t>> identity = Orders(*c.relowerer, &rng, false);
    StatusOr<Relowerer> rl = c.relowerer->WithLevelsOf(placed, identity);
    ASSERT_TRUE(rl.ok()) << c.name << ": " << rl.status().ToString();
    EXPECT_EQ(rl->level_changes(), static_cast<int64_t>(record->changes.size())) << c.name;
    pairs += rl->level_changes();
    const std::vector<std::vector<int64_t>> shuffled = Orders(*c.relowerer, &rng, true);
    for (const std::vector<std::vector<int64_t>>* orders : {&identity, &shuffled}) {
      const std::optional<ExecutionPlan> p =
          LowerOrRefusal(*rl, *orders, c.name, &lowered, &refused);
      if (!p.has_value()) continue;
      if (orders == &identity && c.plan.replicas[0].schedule == "1f1b") {
        EXPECT_TRUE(*p == placed) << c.name;
        ++same;
      }
      for (int64_t d = 0; d < dp; ++d) {
        for (int64_t i = 0; i < c.relowerer->size(d); ++i) {
          const int64_t from = (*orders)[d][i];
          EXPECT_EQ(p->replicas[d].micro_batches[i].stages,
                    placed.replicas[d].micro_batches[from].stages)
              << c.name;
          for (int64_t s = 0; s < c.plan.num_stages(); ++s) {
            EXPECT_EQ(passes::RecomputeAt(*p, d, i, s), passes::RecomputeAt(placed, d, from, s))
                << c.name << " replica " << d << " micro-batch " << i << " stage " << s;
          }
        }
      }
    }
  }
  fmt::print(
      "placed levels: {} placed plans, {} (micro-batch, stage) pairs moved; {} lowered ({} "
      "1F1B plans given back), {} refused\n",
      placed_plans, pairs, lowered, same, refused);
  EXPECT_GT(placed_plans, 0);
  EXPECT_GT(same, 0);
  EXPECT_GT(lowered, refused);
  // A plan that is not the relowering's: an error naming the replica.
  const SweepCase& c = Sweep().front();
  EXPECT_EQ(c.relowerer->WithLevelsOf(c.plan, std::vector<std::vector<int64_t>>{}).status().code(),
            StatusCode::kInvalidArgument);
  std::vector<std::vector<int64_t>> reversed(static_cast<size_t>(c.plan.dp()));
  for (int64_t d = 0; d < c.plan.dp(); ++d) {
    for (int64_t i = c.relowerer->size(d) - 1; i >= 0; --i) reversed[d].push_back(i);
  }
  EXPECT_THAT(c.relowerer->WithLevelsOf(c.plan, reversed).status().message(),
              HasSubstr("is not micro-batch"));
}

// Makespan (the order search's measure; 1F1B's schedule built once) is Estimate's makespan, or
// Infinite where Estimate's schedule does not fit or run, for every kind of schedule in the sweep.
TEST(RelowerTest, MakespanIsTheEstimates) {
  int64_t checked = 0;
  for (const SweepCase& c : Sweep()) {
    Rng rng(9);
    ScheduleCosts a, b;
    for (int64_t d = 0; d < c.relowerer->dp(); ++d) {
      std::vector<int64_t> order(static_cast<size_t>(c.relowerer->size(d)));
      for (int64_t i = 0; i < c.relowerer->size(d); ++i) order[i] = i;
      for (int k = 0; k < 4; ++k) {
        StatusOr<ScheduleResult> full = c.relowerer->Estimate(d, order, &a);
        StatusOr<Duration> fast = c.relowerer->Makespan(d, order, &b);
        ASSERT_TRUE(full.ok() && fast.ok()) << c.name;
        const bool runs = full->outcome == PlanOutcome::kOk && full->estimate.completed;
        EXPECT_EQ(*fast, runs ? full->estimate.makespan : Duration::Infinite()) << c.name;
        ++checked;
        for (int64_t i = static_cast<int64_t>(order.size()) - 1; i > 0; --i) {
          std::swap(order[i], order[rng.UniformInt(0, i)]);
        }
      }
    }
  }
  EXPECT_GT(checked, 200);
}

// The order search never lengthens the estimate, is deterministic, and with every order tried
// (small replicas) is at least as short as the local search.
TEST(RelowerTest, OrderSearchNeverLongerAndExhaustiveIsBest) {
  int64_t shorter = 0, exhaustive = 0, kicks_shorter = 0, kicks_compared = 0;
  for (const SweepCase& c : Sweep()) {
    for (int64_t d = 0; d < c.relowerer->dp(); ++d) {
      const int64_t m = c.relowerer->size(d);
      std::vector<int64_t> start(static_cast<size_t>(m));
      for (int64_t i = 0; i < m; ++i) start[i] = i;
      StatusOr<OrderSearch> a = SearchReplicaOrder(*c.relowerer, d, start, 200);
      ASSERT_TRUE(a.ok()) << c.name << ": " << a.status().ToString();
      EXPECT_LE(a->makespan, a->start_makespan) << c.name;
      EXPECT_LE(a->estimates, 200) << c.name;
      std::vector<int64_t> sorted = a->order;
      std::sort(sorted.begin(), sorted.end());
      EXPECT_EQ(sorted, start) << c.name;
      StatusOr<OrderSearch> b = SearchReplicaOrder(*c.relowerer, d, start, 200);
      ASSERT_TRUE(b.ok());
      EXPECT_EQ(a->order, b->order) << c.name;
      shorter += a->makespan < a->start_makespan ? 1 : 0;
      // Kicks start from the descent's local optimum and keep only what is shorter: never
      // longer than the descent alone, given the estimates to finish it.
      StatusOr<OrderSearch> kicked = SearchReplicaOrder(*c.relowerer, d, start, 3000);
      StatusOr<OrderSearch> descent =
          SearchReplicaOrder(*c.relowerer, d, start, 3000, 0, std::nullopt, /*kicks=*/false);
      ASSERT_TRUE(kicked.ok() && descent.ok()) << c.name;
      if (descent->estimates < 3000) {  // the descent finished (large replicas may not)
        EXPECT_LE(kicked->makespan, descent->makespan) << c.name;
        kicks_shorter += kicked->makespan < descent->makespan ? 1 : 0;
        ++kicks_compared;
      }
      if (m <= 6) {
        StatusOr<OrderSearch> all = SearchReplicaOrder(*c.relowerer, d, start, 0, 6);
        ASSERT_TRUE(all.ok());
        EXPECT_LE(all->makespan, a->makespan) << c.name;
        ++exhaustive;
      }
    }
  }
  fmt::print(
      "order search: {} replicas shorter by the estimate, {} searched exhaustively, {} of {} "
      "shorter with kicks than by the descent alone\n",
      shorter, exhaustive, kicks_shorter, kicks_compared);
  EXPECT_GT(shorter, 0);
  EXPECT_GT(kicks_compared, 50);
  EXPECT_GT(kicks_shorter, 0);
  EXPECT_THAT(SearchReplicaOrder(*Sweep().front().relowerer, 0, std::vector<int64_t>{}, 10)
                  .status()
                  .message(),
              HasSubstr("not a permutation"));
}

TEST(OptimizerSweepTest, NeverLongerAlwaysValidAndDeterministic) {
  int64_t improved = 0, reordered = 0, at_placed_levels = 0;
  double gain_sum = 0;
  for (const SweepCase& c : Sweep()) {
    OptimizerOptions o;
    o.max_steps = 25;
    o.budget = Duration::Seconds(100);  // the step bound decides: reproducible
    o.seed = 3;
    o.sim.samples = c.batch;
    o.pricer = c.pricer;
    o.relowerer = c.relowerer;
    o.order_estimates = 300;
    StatusOr<OptimizeResult> r = OptimizePlan(c.plan, o);
    ASSERT_TRUE(r.ok()) << c.name << ": " << r.status().ToString();
    EXPECT_FALSE(r->budget_hit);
    EXPECT_LE(r->after, r->before) << c.name;
    const Status valid = ValidatePlan(r->plan);
    ASSERT_TRUE(valid.ok()) << c.name << ": " << valid.ToString();
    // The figure it reports is the simulator's for the plan it returns.
    SimOptions sim = o.sim;
    StatusOr<SimResult> again = Simulate(r->plan, sim);
    ASSERT_TRUE(again.ok());
    EXPECT_EQ(again->iteration_time, r->after) << c.name;
    EXPECT_EQ(r->changed(), !(r->plan == c.plan)) << c.name;
    for (const passes::PassRecord& p : r->applied) {
      reordered += p.pass == "reorder-microbatches" ? 1 : 0;
    }
    // The second order search (at the placed levels) ran after a kept placement only, and a
    // reorder it kept records the levels it carried.
    for (const CandidateKindStats& k : r->kinds) {
      if (k.kind != "reorder-microbatches (placed levels)" || k.accepted == 0) continue;
      ++at_placed_levels;
      ASSERT_FALSE(r->applied.empty());
      const passes::PassRecord& first = r->applied.front();
      EXPECT_EQ(first.pass, "reorder-microbatches") << c.name;
      bool levels = false;
      for (const std::string& line : first.changes) {
        levels = levels || line.find("(placed before the reorder)") != std::string::npos;
      }
      EXPECT_TRUE(levels) << c.name;
    }
    if (r->after < r->before) {
      ++improved;
      gain_sum += 1.0 - r->after.seconds() / r->before.seconds();
    }
    StatusOr<OptimizeResult> twice = OptimizePlan(c.plan, o);
    ASSERT_TRUE(twice.ok());
    EXPECT_EQ(twice->plan, r->plan) << c.name;
    // dPRO's uniform draw: the same guarantees.
    o.draw = CandidateDraw::kUniform;
    StatusOr<OptimizeResult> uniform = OptimizePlan(c.plan, o);
    ASSERT_TRUE(uniform.ok()) << c.name;
    EXPECT_LE(uniform->after, uniform->before) << c.name;
    ASSERT_TRUE(ValidatePlan(uniform->plan).ok()) << c.name;
    StatusOr<OptimizeResult> uniform_twice = OptimizePlan(c.plan, o);
    ASSERT_TRUE(uniform_twice.ok());
    EXPECT_EQ(uniform_twice->plan, uniform->plan) << c.name;
  }
  fmt::print(
      "optimizer sweep: {} plans, {} shorter ({} reordered, {} at the placed levels), mean gain "
      "of those {:.2f}%\n",
      Sweep().size(), improved, reordered, at_placed_levels,
      improved > 0 ? 100.0 * gain_sum / improved : 0.0);
  EXPECT_GT(improved, 0);
  EXPECT_GT(reordered, 0);
  EXPECT_GT(at_placed_levels, 0);
}

// Budgets that end anywhere in the search (before the first candidate, in a simulation, in a
// step): whatever the clock did, the plan returned is valid, never longer, and its figure is the
// simulator's; a budget shorter than the search says it was hit.
TEST(OptimizerTest, AnyBudgetEndGivesAValidPlanNeverLonger) {
  int64_t hit = 0, runs = 0;
  for (size_t i = 0; i < Sweep().size(); i += 3) {
    const SweepCase& c = Sweep()[i];
    for (const int64_t micros : {1, 200, 700, 2000, 6000}) {
      OptimizerOptions o;
      o.budget = Duration::Micros(micros);
      o.sim.samples = c.batch;
      o.pricer = c.pricer;
      o.relowerer = c.relowerer;
      StatusOr<OptimizeResult> r = OptimizePlan(c.plan, o);
      ASSERT_TRUE(r.ok()) << c.name << " " << micros << " us: " << r.status().ToString();
      ++runs;
      hit += r->budget_hit ? 1 : 0;
      EXPECT_LE(r->after, r->before) << c.name;
      const Status valid = ValidatePlan(r->plan);
      ASSERT_TRUE(valid.ok()) << c.name << " " << micros << " us: " << valid.ToString();
      StatusOr<SimResult> again = Simulate(r->plan, o.sim);
      ASSERT_TRUE(again.ok());
      EXPECT_EQ(again->iteration_time, r->after) << c.name << " " << micros << " us";
      EXPECT_EQ(r->changed(), !(r->plan == c.plan)) << c.name;
    }
  }
  fmt::print("budgets ending in the search: {} of {} runs hit the budget\n", hit, runs);
  EXPECT_GT(hit, 0);
}

TEST(OptimizerTest, RejectsBadOptionsAndInvalidPlans) {
  const SweepCase& c = Sweep().front();
  OptimizerOptions o;
  o.max_steps = -1;
  EXPECT_THAT(OptimizePlan(c.plan, o).status().message(), HasSubstr("max_steps"));
  o = {};
  o.beta = 0;
  EXPECT_THAT(OptimizePlan(c.plan, o).status().message(), HasSubstr("beta"));
  o = {};
  o.order_estimates = -1;
  EXPECT_THAT(OptimizePlan(c.plan, o).status().message(), HasSubstr("order_estimates"));
  o = {};
  o.order_exhaustive_up_to = 11;
  EXPECT_THAT(OptimizePlan(c.plan, o).status().message(), HasSubstr("order_exhaustive_up_to"));
  o = {};
  o.placed_order_share = 1.5;
  EXPECT_THAT(OptimizePlan(c.plan, o).status().message(), HasSubstr("placed_order_share"));
  o = {};
  o.budget = Duration::Zero();
  EXPECT_THAT(OptimizePlan(c.plan, o).status().message(), HasSubstr("budget"));
  ExecutionPlan broken = c.plan;
  broken.ranks[0].instructions.pop_back();  // no OptimizerStep
  EXPECT_FALSE(OptimizePlan(broken, {}).ok());
  // No steps: the input comes back unchanged.
  o = {};
  o.max_steps = 0;
  StatusOr<OptimizeResult> r = OptimizePlan(c.plan, o);
  ASSERT_TRUE(r.ok());
  EXPECT_EQ(r->plan, c.plan);
  EXPECT_EQ(r->before, r->after);
  EXPECT_FALSE(r->changed());
}

// The by-kind draw counts, it does not time: two searches whose kinds saved the same and were
// tried as often draw the same candidates, whatever their steps took (a seed gives one plan on
// any machine; CI once drew differently from this machine when the weights were per ms). A kind
// that saved more per simulation is drawn more, and one that saved nothing is not starved.
TEST(OptimizerTest, ByKindDrawDependsOnCountsNotOnTheClock) {
  auto stats = [](std::string kind, int64_t tried, int64_t simulated, int64_t gain_us,
                  int64_t wall_us) {
    CandidateKindStats k;
    k.kind = std::move(kind);
    k.tried = tried;
    k.simulated = simulated;
    k.gain = Duration::Micros(gain_us);
    k.wall = Duration::Micros(wall_us);
    return k;
  };
  OptimizeResult fast, slow;
  fast.kinds = {stats("move-compute", 40, 30, 2000, 900), stats("bucket", 2, 2, 9000, 60),
                stats("hoist-start", 10, 4, 0, 150)};
  slow.kinds = {stats("move-compute", 40, 30, 2000, 4100), stats("bucket", 2, 2, 9000, 70),
                stats("hoist-start", 10, 4, 0, 990)};
  std::vector<std::string> kinds;
  for (int i = 0; i < 300; ++i) kinds.push_back("move-compute");
  for (int i = 0; i < 2; ++i) kinds.push_back("bucket");
  for (int i = 0; i < 20; ++i) kinds.push_back("hoist-start");
  const Duration current = Duration::Millis(1000);
  Rng a(7), b(7);
  std::map<std::string, int64_t> drawn;
  for (int i = 0; i < 2000; ++i) {
    const size_t x = DrawCandidate(CandidateDraw::kByKind, kinds, fast, current, 16, &a);
    const size_t y = DrawCandidate(CandidateDraw::kByKind, kinds, slow, current, 16, &b);
    ASSERT_EQ(x, y) << "draw " << i;
    ASSERT_LT(x, kinds.size());
    ++drawn[kinds[x]];
  }
  // Weights (gain + 1 ms) / (1 + simulated + refused / 16): bucket 10/3 = 3.3, move-compute
  // 3/31.6 = 0.095, hoist-start 1/5.4 = 0.19.
  EXPECT_GT(drawn["bucket"], 1700);
  EXPECT_GT(drawn["hoist-start"], drawn["move-compute"]);
  EXPECT_GT(drawn["move-compute"], 0);
  // dPRO's uniform draw: by candidate, so the many compute moves dominate.
  Rng u(7);
  int64_t moves = 0;
  for (int i = 0; i < 2000; ++i) {
    moves += kinds[DrawCandidate(CandidateDraw::kUniform, kinds, fast, current, 16, &u)] ==
             "move-compute";
  }
  EXPECT_GT(moves, 1700);
}

// The planner runs the optimizer when asked, and its plan is the optimizer's.
TEST(OptimizerTest, PlannerOption) {
  const ParallelConfig par = testing::TestParallel(1, 4, 1, 36000, 1, 1);
  auto setup = testing::MakeTestSetup("gpt-6.7b", par);
  PlannerOptions options;
  options.schedule = ScheduleKind::kZbH1;
  const std::vector<Sample> batch = testing::RandomTokenBatch(5, 32768, 2048, false);
  StatusOr<Planner> plain = Planner::Create(*setup->cost, par, setup->cluster, options);
  ASSERT_TRUE(plain.ok());
  options.optimize = true;
  options.optimizer.budget = Duration::Seconds(100);
  options.optimizer.max_steps = 20;
  StatusOr<Planner> opt = Planner::Create(*setup->cost, par, setup->cluster, options);
  ASSERT_TRUE(opt.ok());
  StatusOr<PlanResult> a = plain->Plan(batch);
  StatusOr<PlanResult> b = opt->Plan(batch);
  ASSERT_TRUE(a.ok() && b.ok());
  ASSERT_EQ(a->outcome, PlanOutcome::kOk);
  EXPECT_FALSE(a->optimized.has_value());
  ASSERT_TRUE(b->optimized.has_value());
  EXPECT_LE(b->optimized->after, b->optimized->before);
  EXPECT_EQ(b->optimized->passes.empty(), b->plan == a->plan);
  EXPECT_TRUE(ValidatePlan(b->plan).ok());
}

}  // namespace
}  // namespace sluice
