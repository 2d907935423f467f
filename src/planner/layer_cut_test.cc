// The layer cut search: the min-max partition against brute force, the search's rules with a
// synthetic scorer, and the planner's balanced cut on T5 and GPT batches (valid, simulated, and
// no longer than the even cut).
#include "planner/layer_cut.h"

#include <gtest/gtest.h>

#include <algorithm>
#include <functional>
#include <limits>

#include "base/rng.h"
#include "batching/test_util.h"
#include "model/chunk_cut.h"
#include "plan/validate.h"
#include "sim/simulator.h"

namespace sluice {
namespace {

using testing::MakeTestSetup;
using testing::RandomTokenBatch;
using testing::TestParallel;

// Each chunk's weight under `w` (its layers, the embedding on the first, the head on the last).
std::vector<double> ChunkWeights(const LayerWeights& w, const std::vector<int64_t>& cut) {
  std::vector<double> out;
  size_t at = 0;
  for (size_t k = 0; k < cut.size(); ++k) {
    double t = 0;
    for (int64_t i = 0; i < cut[k]; ++i) t += w.layer[at++];
    if (k == 0) t += w.embedding;
    if (k + 1 == cut.size()) t += w.output_head;
    out.push_back(t);
  }
  return out;
}

// The heaviest chunk of `cut` under `w`.
double Heaviest(const LayerWeights& w, const std::vector<int64_t>& cut) {
  const std::vector<double> chunks = ChunkWeights(w, cut);
  return *std::max_element(chunks.begin(), chunks.end());
}

// Every composition of n into k parts >= 1.
void Compositions(int64_t n, int64_t k, std::vector<int64_t>* prefix,
                  const std::function<void(const std::vector<int64_t>&)>& f) {
  if (k == 1) {
    prefix->push_back(n);
    f(*prefix);
    prefix->pop_back();
    return;
  }
  for (int64_t first = 1; first <= n - (k - 1); ++first) {
    prefix->push_back(first);
    Compositions(n - first, k - 1, prefix, f);
    prefix->pop_back();
  }
}

TEST(MinMaxLayerCutTest, MatchesBruteForce) {
  Rng rng(7);
  for (int trial = 0; trial < 200; ++trial) {
    const int64_t n = rng.UniformInt(2, 11);
    const int64_t chunks = rng.UniformInt(1, n);
    LayerWeights w;
    for (int64_t i = 0; i < n; ++i) w.layer.push_back(0.5 + rng.Uniform01() * 2);
    w.embedding = rng.Uniform01();
    w.output_head = rng.Uniform01() * 3;
    const std::vector<int64_t> cut = MinMaxLayerCut(w, chunks);
    ASSERT_EQ(static_cast<int64_t>(cut.size()), chunks);
    int64_t sum = 0;
    for (const int64_t c : cut) {
      EXPECT_GE(c, 1);
      sum += c;
    }
    EXPECT_EQ(sum, n);
    double best = std::numeric_limits<double>::infinity();
    std::vector<int64_t> prefix;
    Compositions(n, chunks, &prefix,
                 [&](const std::vector<int64_t>& c) { best = std::min(best, Heaviest(w, c)); });
    EXPECT_NEAR(Heaviest(w, cut), best, 1e-9) << "trial " << trial;
  }
}

TEST(MinMaxLayerCutTest, AHeavyHeadTakesLayersOffTheLastChunk) {
  LayerWeights w;
  w.layer.assign(32, 1.0);
  w.output_head = 2.0;
  const std::vector<int64_t> cut = MinMaxLayerCut(w, 4);
  EXPECT_NEAR(Heaviest(w, cut), 9.0, 1e-9);  // 34 over 4 chunks: at least 8.5, whole layers
  EXPECT_LE(cut.back(), 7);                  // the even cut's last chunk would weigh 10
}

LayerCutSearchOptions Budget(int64_t evaluations) {
  LayerCutSearchOptions o;
  o.max_evaluations = evaluations;
  return o;
}

// A scorer whose time is the heaviest chunk of hidden weights (with each chunk's time when
// `busy`); cuts whose first chunk holds more than `max_first` layers "run out of memory".
LayerCutScorer SyntheticScorer(const LayerWeights& w, int64_t max_first, int64_t* calls,
                               bool busy = true) {
  return [w, max_first, calls, busy](const std::vector<int64_t>& cut) -> StatusOr<LayerCutScore> {
    ++*calls;
    LayerCutScore s;
    if (cut.front() > max_first) {
      s.failed_batches = 1;
      return s;
    }
    s.time = Duration::Micros(static_cast<double>(Heaviest(w, cut) * 1000));
    if (busy) s.chunk_busy = ChunkWeights(w, cut);
    return s;
  };
}

TEST(ChooseLayerCutTest, KeepsTheEvenCutWhenNothingIsShorter) {
  auto setup = MakeTestSetup("gpt-6.7b", TestParallel(2, 4));
  LayerWeights flat;
  flat.layer.assign(32, 1.0);
  int64_t calls = 0;
  StatusOr<LayerCutChoice> c =
      ChooseLayerCut(*setup->cost, setup->parallel, {}, SyntheticScorer(flat, 32, &calls));
  ASSERT_TRUE(c.ok()) << c.status().ToString();
  EXPECT_TRUE(c->searched);
  EXPECT_TRUE(c->even_exists);
  EXPECT_TRUE(c->cut.empty());  // the even cut is optimal under flat weights
  EXPECT_EQ(c->chosen.time, c->even.time);
  EXPECT_EQ(c->evaluated, calls);
  EXPECT_LE(c->evaluated, LayerCutSearchOptions{}.max_evaluations);
}

TEST(ChooseLayerCutTest, MovesLayersOffAHeavyStageAndAvoidsFailures) {
  auto setup = MakeTestSetup("gpt-6.7b", TestParallel(2, 4));
  // Hidden truth: the last 8 layers cost twice as much.
  LayerWeights truth;
  truth.layer.assign(32, 1.0);
  for (int64_t i = 24; i < 32; ++i) truth.layer[i] = 2.0;
  int64_t calls = 0;
  StatusOr<LayerCutChoice> c = ChooseLayerCut(*setup->cost, setup->parallel, {},
                                              SyntheticScorer(truth, 11, &calls), Budget(200));
  ASSERT_TRUE(c.ok()) << c.status().ToString();
  ASSERT_FALSE(c->cut.empty());
  EXPECT_LE(c->cut.front(), 11);
  EXPECT_EQ(c->chosen.failed_batches, 0);
  EXPECT_LT(c->chosen.time, c->even.time);
  // The local search reaches the optimum here (brute force over 4 chunks of 32 layers).
  double best = std::numeric_limits<double>::infinity();
  std::vector<int64_t> prefix;
  Compositions(32, 4, &prefix, [&](const std::vector<int64_t>& cut) {
    if (cut.front() <= 11) best = std::min(best, Heaviest(truth, cut));
  });
  EXPECT_NEAR(Heaviest(truth, c->cut), best, 1e-9);
  EXPECT_EQ(c->evaluated, calls);
  // Without the chunks' times only the one-layer moves remain: shorter, not necessarily best.
  calls = 0;
  StatusOr<LayerCutChoice> blind =
      ChooseLayerCut(*setup->cost, setup->parallel, {},
                     SyntheticScorer(truth, 11, &calls, /*busy=*/false), Budget(200));
  ASSERT_TRUE(blind.ok());
  EXPECT_LT(blind->chosen.time, blind->even.time);
  EXPECT_EQ(blind->chosen.failed_batches, 0);
}

TEST(ChooseLayerCutTest, RespectsTheEvaluationBudget) {
  auto setup = MakeTestSetup("gpt-6.7b", TestParallel(2, 8));
  LayerWeights truth;
  for (int64_t i = 0; i < 32; ++i) truth.layer.push_back(1.0 + 0.1 * static_cast<double>(i));
  int64_t calls = 0;
  StatusOr<LayerCutChoice> c = ChooseLayerCut(*setup->cost, setup->parallel, {},
                                              SyntheticScorer(truth, 32, &calls), Budget(5));
  ASSERT_TRUE(c.ok());
  EXPECT_LE(calls, 5);
  EXPECT_EQ(c->evaluated, calls);
}

TEST(PolishLayerCutTest, MovesToALocalOptimumWithinItsBudget) {
  LayerWeights truth;
  truth.layer.assign(16, 1.0);
  truth.output_head = 3.0;
  int64_t calls = 0;
  const LayerCutScorer score = SyntheticScorer(truth, 16, &calls);
  const std::vector<int64_t> start = {4, 4, 4, 4};  // the last chunk weighs 7
  StatusOr<LayerCutScore> start_score = score(start);
  ASSERT_TRUE(start_score.ok());
  calls = 0;
  LayerCutScore best;
  int64_t evaluated = 0;
  StatusOr<std::vector<int64_t>> cut =
      PolishLayerCut(start, *start_score, score, Budget(100), &best, &evaluated);
  ASSERT_TRUE(cut.ok()) << cut.status().ToString();
  EXPECT_EQ(evaluated, calls);
  EXPECT_LT(best.time, start_score->time);
  EXPECT_EQ(best.time, score(*cut)->time);
  // No one-layer move from the result is shorter.
  for (size_t b = 0; b + 1 < cut->size(); ++b) {
    for (const int64_t dir : {+1, -1}) {
      std::vector<int64_t> next = *cut;
      next[b] += dir;
      next[b + 1] -= dir;
      if (next[b] < 1 || next[b + 1] < 1) continue;
      EXPECT_GE(score(next)->time, best.time);
    }
  }
  // The budget bounds the cuts scored; the start is not re-scored.
  calls = 0;
  StatusOr<std::vector<int64_t>> bounded =
      PolishLayerCut(start, *start_score, score, Budget(2), &best, &evaluated);
  ASSERT_TRUE(bounded.ok());
  EXPECT_LE(evaluated, 2);
  EXPECT_EQ(calls, evaluated);
}

TEST(ChooseLayerCutTest, InterleavedAndOneChunkKeepTheEvenCut) {
  for (const auto& [pp, vpp] : {std::pair<int64_t, int64_t>{2, 2}, {1, 1}}) {
    auto setup = MakeTestSetup("gpt-6.7b", TestParallel(8 / pp, pp, 1, 36000, 2, vpp));
    LayerWeights flat;
    flat.layer.assign(32, 1.0);
    int64_t calls = 0;
    StatusOr<LayerCutChoice> c =
        ChooseLayerCut(*setup->cost, setup->parallel, {}, SyntheticScorer(flat, 32, &calls));
    ASSERT_TRUE(c.ok());
    EXPECT_FALSE(c->searched);
    EXPECT_TRUE(c->cut.empty());
    EXPECT_EQ(calls, 1);
  }
}

// T5 samples with long inputs and short targets (flan-like: the encoder does most of the work).
std::vector<Sample> LongInputs(uint64_t seed, int64_t tokens) {
  Rng rng(seed);
  std::vector<Sample> out;
  int64_t sum = 0;
  while (sum < tokens) {
    Sample s;
    s.id = static_cast<int64_t>(out.size());
    s.input_len = rng.UniformInt(200, 1000);
    s.target_len = rng.UniformInt(4, 40);
    sum += s.tokens();
    out.push_back(s);
  }
  return out;
}

TEST(WeighLayersTest, DecoderLayersOfShortTargetsWeighLessThanEncoderLayers) {
  auto setup = MakeTestSetup("t5-11b", TestParallel(2, 4));
  const LayerWeights w = WeighLayers(*setup->cost, setup->parallel, LongInputs(3, 32768));
  ASSERT_EQ(w.layer.size(), 48u);
  EXPECT_GT(w.layer.front(), 0);
  EXPECT_GT(w.embedding, 0);
  EXPECT_GT(w.output_head, 0);
  EXPECT_LT(w.layer.back(), w.layer.front());
  EXPECT_EQ(w.layer[0], w.layer[23]);
  EXPECT_EQ(w.layer[24], w.layer[47]);
  // Nothing priced (no samples): every layer weighs 1.
  const LayerWeights none = WeighLayers(*setup->cost, setup->parallel, {});
  EXPECT_EQ(none.layer, std::vector<double>(48, 1.0));
  EXPECT_EQ(none.output_head, 0);
}

// Plans `batches` on `par` and returns the summed estimated makespans (every batch must plan).
Duration PlanAll(const testing::TestSetup& setup, const ParallelConfig& par,
                 const PlannerOptions& options, std::span<const GlobalBatch> batches) {
  StatusOr<Planner> planner = Planner::Create(*setup.cost, par, setup.cluster, options);
  EXPECT_TRUE(planner.ok()) << planner.status().ToString();
  Duration total;
  for (const GlobalBatch& b : batches) {
    StatusOr<PlanResult> r = planner->Plan(b.samples);
    EXPECT_TRUE(r.ok());
    EXPECT_EQ(r->outcome, PlanOutcome::kOk) << r->infeasible_reason;
    EXPECT_TRUE(ValidatePlan(r->plan).ok());
    EXPECT_EQ(r->plan.parallel.layer_cut, par.layer_cut);
    StatusOr<SimResult> sim = Simulate(r->plan, SimOptions{});
    EXPECT_TRUE(sim.ok());
    EXPECT_EQ(sim->outcome, SimOutcome::kOk);
    total += r->makespan;
  }
  return total;
}

TEST(PlannerLayerCutTest, BalancesT5EncoderAndDecoderStages) {
  auto setup = MakeTestSetup("t5-11b", TestParallel(2, 4));
  PlannerOptions options;
  options.batching.max_seqlen = 1024;
  std::vector<GlobalBatch> batches(2);
  std::vector<Sample> samples;
  for (size_t i = 0; i < batches.size(); ++i) {
    batches[i].samples = LongInputs(10 + i, 32768);
    samples.insert(samples.end(), batches[i].samples.begin(), batches[i].samples.end());
  }
  StatusOr<LayerCutChoice> c = ChooseLayerCut(
      *setup->cost, setup->parallel, samples,
      PlannerLayerCutScorer(*setup->cost, setup->cluster, setup->parallel, options, batches));
  ASSERT_TRUE(c.ok()) << c.status().ToString();
  ASSERT_FALSE(c->cut.empty());
  std::printf("even %.4f s, chosen %s %.4f s, seed %s, %lld cuts\n", c->even.time.seconds(),
              DescribeLayerCut(c->cut).c_str(), c->chosen.time.seconds(),
              DescribeLayerCut(c->seed).c_str(), static_cast<long long>(c->evaluated));
  EXPECT_EQ(c->chosen.failed_batches, 0);
  EXPECT_LE(c->evaluated, LayerCutSearchOptions{}.max_evaluations);
  ParallelConfig balanced = setup->parallel;
  balanced.layer_cut = c->cut;
  const Duration even = PlanAll(*setup, setup->parallel, options, batches);
  const Duration shorter = PlanAll(*setup, balanced, options, batches);
  std::printf("planned: even %.4f s, balanced %.4f s\n", even.seconds(), shorter.seconds());
  EXPECT_LT(shorter.seconds(), even.seconds() * 0.97);
  // And in simulation (the check `sluice plan --layer-cut balanced` keeps a cut by).
  StatusOr<LayerCutScore> sim_even =
      SimulateLayerCut(*setup->cost, setup->cluster, setup->parallel, options, batches,
                       EvenLayerCut(setup->cost->model(), 4), SimOptions{});
  StatusOr<LayerCutScore> sim_cut = SimulateLayerCut(*setup->cost, setup->cluster, setup->parallel,
                                                     options, batches, c->cut, SimOptions{});
  ASSERT_TRUE(sim_even.ok() && sim_cut.ok());
  EXPECT_EQ(sim_even->failed_batches, 0);
  EXPECT_EQ(sim_cut->failed_batches, 0);
  EXPECT_LT(sim_cut->time, sim_even->time);
  // A cut whose stage cannot hold its model states fails every batch.
  StatusOr<LayerCutScore> too_deep = SimulateLayerCut(
      *setup->cost, setup->cluster, setup->parallel, options, batches, {45, 1, 1, 1}, SimOptions{});
  ASSERT_TRUE(too_deep.ok());
  EXPECT_EQ(too_deep->failed_batches, 2);
}

TEST(PlannerLayerCutTest, GptCutsPlanValidateAndSimulate) {
  auto setup = MakeTestSetup("gpt-6.7b", TestParallel(2, 4));
  PlannerOptions options;
  options.batching.max_seqlen = 2048;
  std::vector<GlobalBatch> batches(1);
  batches[0].samples = RandomTokenBatch(4, 65536, 2048, false);
  StatusOr<LayerCutChoice> c = ChooseLayerCut(
      *setup->cost, setup->parallel, batches[0].samples,
      PlannerLayerCutScorer(*setup->cost, setup->cluster, setup->parallel, options, batches));
  ASSERT_TRUE(c.ok()) << c.status().ToString();
  EXPECT_EQ(c->even.failed_batches, 0);
  EXPECT_LE(c->chosen.time, c->even.time);
  // An uneven cut that moves a layer off the last stage plans, validates and simulates.
  ParallelConfig par = setup->parallel;
  par.layer_cut = {9, 8, 8, 7};
  PlanAll(*setup, par, options, batches);
}

}  // namespace
}  // namespace sluice
