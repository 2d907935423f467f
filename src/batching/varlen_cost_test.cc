// Varlen (packed, per-sample attention) micro-batches cost what the cost model says at every tp:
// uniform rows of k sequences of length L cost the padded k x L micro-batch on every shipped
// profile table and the analytic model (k encoder-decoder pairs the padded k x L x D one), mixed
// lengths cost their (tokens, squared tokens) moments, T5 multipack and Hydraulis plan valid
// varlen batches, and on uniform-length data Hydraulis' varlen packing and sorted padding predict the
// same iteration time (there is no padding to remove).
#include <fmt/core.h>
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <filesystem>
#include <memory>
#include <string>
#include <vector>

#include "base/paths.h"
#include "batching/method.h"
#include "batching/micro_batch.h"
#include "batching/stage_cost.h"
#include "batching/test_util.h"
#include "cost/analytic_cost_model.h"
#include "cost/cost_factory.h"
#include "cost/profile_table.h"
#include "cost/profiled_cost_model.h"
#include "model/cluster_spec.h"
#include "model/model_spec.h"

namespace sluice {
namespace {

using testing::LoadTestCostModel;
using testing::TestCost;
using testing::TestDataPath;
using testing::TestParallel;

constexpr Recompute kLevels[] = {Recompute::kNone, Recompute::kSelective, Recompute::kFull};

// Every data/profiles/*.json, through the data directory lookup (or the shared checkout's copy).
std::vector<std::string> ShippedTablePaths() {
  namespace fs = std::filesystem;
  fs::path dir = fs::path(DataDir()) / "profiles";
  if (!fs::is_directory(dir)) dir = fs::path(TestDataPath(kShippedProfileTables[0])).parent_path();
  std::vector<std::string> out;
  for (const fs::directory_entry& e : fs::directory_iterator(dir)) {
    if (e.is_regular_file() && e.path().extension() == ".json") out.push_back(e.path().string());
  }
  std::sort(out.begin(), out.end());
  return out;
}

// a100-40g devices with 80 GiB: the prices do not depend on memory, and every tp of the tables
// (t5-11b's model states at pp 4, tp 1 included) then fits.
ClusterSpec RoomyCluster() {
  ClusterSpec c = *ClusterPreset("a100-40g", 32);
  c.device.memory = Bytes::GiB(80);
  return c;
}

double Time(const ChunkCost& c) { return (c.forward + c.backward()).millis(); }

// Within `rel` of `want` (both >= 0).
::testing::AssertionResult Near(double got, double want, double rel) {
  if (std::abs(got - want) <= rel * std::abs(want)) return ::testing::AssertionSuccess();
  return ::testing::AssertionFailure()
         << got << " vs " << want << " (" << 100 * (got / want - 1) << "%)";
}

// The varlen price of k sequences of `len` against the padded k x len micro-batch, per stage and
// in total, at `rc`. Both are priced or neither is. Returns whether they were priced.
// Encoder-decoder models: k samples of (len, dec) against the padded k x len x dec one.
bool ExpectUniformVarlenIsPadded(const StageCostEvaluator& e, int64_t k, int64_t len, Recompute rc,
                                 const std::string& where, int64_t dec = 0) {
  const std::vector<int64_t> lengths(static_cast<size_t>(k), len);
  const std::vector<int64_t> dec_lengths(static_cast<size_t>(dec > 0 ? k : 0), dec);
  std::vector<ChunkCost> varlen, padded;
  const bool v_ok = dec > 0 ? e.EvaluateVarlenStages(lengths, dec_lengths, rc, &varlen)
                            : e.EvaluateVarlenStages(lengths, rc, &varlen);
  const bool p_ok = e.EvaluateStages({k, len, dec}, rc, &padded);
  EXPECT_EQ(v_ok, p_ok) << where;
  if (!v_ok || !p_ok) return false;
  double v_total = 0, p_total = 0;
  for (size_t s = 0; s < padded.size(); ++s) {
    EXPECT_TRUE(Near(Time(varlen[s]), Time(padded[s]), 0.02)) << where << " stage " << s;
    EXPECT_TRUE(Near(varlen[s].stored.mb(), padded[s].stored.mb(), 0.02))
        << where << " stage " << s;
    EXPECT_TRUE(Near(varlen[s].peak.mb(), padded[s].peak.mb(), 0.02)) << where << " stage " << s;
    v_total += Time(varlen[s]);
    p_total += Time(padded[s]);
  }
  EXPECT_TRUE(Near(v_total, p_total, 0.02)) << where << " total";
  const CostSummary vs = dec > 0 ? e.SummarizeVarlen(lengths, dec_lengths, rc, 1)
                                 : e.SummarizeVarlen(lengths, rc, 1);
  const CostSummary ps = e.Summarize({k, len, dec}, rc, 1);
  EXPECT_EQ(vs.feasible, ps.feasible) << where;
  EXPECT_TRUE(Near(vs.bottleneck.millis(), ps.bottleneck.millis(), 0.02)) << where;
  return true;
}

TEST(VarlenCostTest, UniformRowsCostThePaddedPriceOnEveryShippedTable) {
  const std::vector<std::string> paths = ShippedTablePaths();
  ASSERT_GE(paths.size(), std::size(kShippedProfileTables));
  const ClusterSpec cluster = RoomyCluster();
  for (const std::string& path : paths) {
    StatusOr<LayerCostTable> table = ReadLayerCostTable(path);
    ASSERT_TRUE(table.ok()) << table.status().ToString();
    StatusOr<ModelSpec> model = ModelPreset(table->model.name);
    ASSERT_TRUE(model.ok()) << path << ": " << model.status().ToString();
    const LayerCostTable copy = *table;
    auto cost = ProfiledCostModel::Create(std::move(*table), *model);
    ASSERT_TRUE(cost.ok()) << cost.status().ToString();
    int64_t compared = 0;
    for (const TableConfig& config : copy.configs) {
      // pp 4: a stage with the embedding, middle stages and one with the output head.
      const ParallelConfig par = TestParallel(1, 4, config.tp, 0, 1);
      StatusOr<StageCostEvaluator> e = StageCostEvaluator::Create(**cost, par, cluster);
      ASSERT_TRUE(e.ok()) << path << " tp " << config.tp << ": " << e.status().ToString();
      ASSERT_TRUE(e->varlen_supported()) << path << " tp " << config.tp;
      if (model->is_encoder_decoder()) {  // the decoder rows' (encoder, decoder) points
        for (const CostRow& row : config.forward_ms[static_cast<int>(TableStage::kDecoder)]) {
          for (int64_t k : row.mbs) {
            const std::string where =
                fmt::format("{} tp {} {} {}x{}x{}", path, config.tp,
                            RecomputeName(config.recompute), k, row.seqlen, row.dec_seqlen);
            compared += ExpectUniformVarlenIsPadded(*e, k, row.seqlen, config.recompute, where,
                                                    row.dec_seqlen);
          }
        }
        continue;
      }
      // The table's own points: every (length, micro-batch size) its layer rows measured.
      for (const CostRow& row : config.forward_ms[static_cast<int>(TableStage::kEncoder)]) {
        if (row.seqlen > model->max_position) continue;
        for (int64_t k : row.mbs) {
          const std::string where = fmt::format("{} tp {} {} {}x{}", path, config.tp,
                                                RecomputeName(config.recompute), k, row.seqlen);
          compared += ExpectUniformVarlenIsPadded(*e, k, row.seqlen, config.recompute, where);
        }
      }
    }
    EXPECT_GT(compared, model->is_encoder_decoder() ? 50 : 500) << path;
  }
}

TEST(VarlenCostTest, UniformRowsCostThePaddedPriceOnTheAnalyticModel) {
  const ClusterSpec cluster = RoomyCluster();
  for (const char* name : {"gpt-6.7b", "llama-7b"}) {
    const std::unique_ptr<CostModel> cost = LoadTestCostModel(name, TestCost::kAnalytic);
    int64_t compared = 0;
    for (int64_t tp : {1, 2, 4, 8}) {
      if (!cost->SupportsTp(tp)) continue;
      StatusOr<StageCostEvaluator> e =
          StageCostEvaluator::Create(*cost, TestParallel(1, 4, tp, 0, 1), cluster);
      ASSERT_TRUE(e.ok()) << name << " tp " << tp << ": " << e.status().ToString();
      ASSERT_TRUE(e->varlen_supported());
      for (Recompute rc : kLevels) {
        for (int64_t len = 16; len <= cost->model().max_position; len *= 2) {
          for (int64_t k = 1; k * len <= 65536; k *= 2) {
            const std::string where =
                fmt::format("{} analytic tp {} {} {}x{}", name, tp, RecomputeName(rc), k, len);
            compared += ExpectUniformVarlenIsPadded(*e, k, len, rc, where);
          }
        }
      }
    }
    EXPECT_GT(compared, 200) << name;
  }
}

TEST(VarlenCostTest, MixedLengthsCostTheirMoments) {
  auto setup = testing::MakeTestSetup("gpt-6.7b", TestParallel(1, 4, 4));
  const StageCostEvaluator& e = setup->evaluator();
  for (Recompute rc : kLevels) {
    // Close to uniform: close to the padded price (the blend is continuous).
    std::vector<int64_t> near_uniform(15, 512);
    near_uniform.push_back(520);
    const CostSummary nu = e.SummarizeVarlen(near_uniform, rc, 1);
    const CostSummary pu = e.Summarize({16, 512, 0}, rc, 1);
    ASSERT_TRUE(nu.feasible && pu.feasible);
    EXPECT_TRUE(Near(nu.bottleneck.millis(), pu.bottleneck.millis(), 0.01));
    EXPECT_GE(nu.bottleneck, pu.bottleneck);  // more tokens, more attention work
    // A long sequence with short ones: dearer than the long one alone, cheaper than padding all
    // of them to it, and never cheaper for one more sequence.
    std::vector<int64_t> mix = {2000};
    Duration previous = e.SummarizeVarlen(mix, rc, 1).bottleneck;
    for (int i = 0; i < 7; ++i) {
      mix.push_back(100);
      const CostSummary v = e.SummarizeVarlen(mix, rc, 1);
      ASSERT_TRUE(v.feasible);
      EXPECT_GE(v.bottleneck, previous);
      previous = v.bottleneck;
    }
    const CostSummary padded = e.Summarize({8, 2000, 0}, rc, 1);
    EXPECT_LT(previous, padded.bottleneck);
    // Only the moments count: the order of the sequences does not.
    std::vector<int64_t> reversed(mix.rbegin(), mix.rend());
    EXPECT_EQ(e.SummarizeVarlen(reversed, rc, 1), e.SummarizeVarlen(mix, rc, 1));
  }
  // A full 8192-token row holding one long sequence (m* = 1.33 rows of 6,150 tokens): priced
  // between the shapes with the same tokens, 1 x 8192 and 2 x 4096, both measured at tp 1, never
  // at a larger shape (2 x 6144 ran out of memory when the table was profiled).
  auto tp1 = testing::MakeTestSetup("gpt-6.7b", TestParallel(1, 4, 1));
  const int64_t long_row[] = {7000, 1192};
  for (Recompute rc : kLevels) {
    const CostSummary v = tp1->evaluator().SummarizeVarlen(long_row, rc, 1);
    const CostSummary one = tp1->evaluator().Summarize({1, 8192, 0}, rc, 1);
    const CostSummary two = tp1->evaluator().Summarize({2, 4096, 0}, rc, 1);
    ASSERT_GT(v.bottleneck, Duration::Zero()) << RecomputeName(rc);
    EXPECT_LT(v.bottleneck, one.bottleneck);
    EXPECT_GT(v.bottleneck, two.bottleneck);
  }
  // No sequences, an empty one or one beyond the model's positions: no price.
  std::vector<ChunkCost> out;
  EXPECT_FALSE(e.EvaluateVarlenStages({}, Recompute::kNone, &out));
  const int64_t empty[] = {512, 0};
  EXPECT_FALSE(e.EvaluateVarlenStages(empty, Recompute::kNone, &out));
  const int64_t too_long[] = {e.model().max_position + 1};
  EXPECT_FALSE(e.EvaluateVarlenStages(too_long, Recompute::kNone, &out));
}

TEST(VarlenCostTest, EncoderDecoderPairsCostTheirMoments) {
  // The analytic model: its price grows with the work (a measured table need not, between its
  // points; the shipped T5 table is compared at its own points above).
  auto setup = testing::MakeTestSetup("t5-11b", TestParallel(1, 4, 4), TestCost::kAnalytic);
  const StageCostEvaluator& e = setup->evaluator();
  ASSERT_TRUE(e.varlen_supported());
  for (Recompute rc : kLevels) {
    // Uniform pairs: the padded shape.
    EXPECT_TRUE(ExpectUniformVarlenIsPadded(e, 8, 512, rc, "t5 8x512x128", 128));
    // One long pair with short ones: dearer than the long one alone, cheaper than padding all
    // of them to it, never cheaper for one more pair; the order does not count.
    std::vector<int64_t> enc = {1000}, dec = {200};
    Duration previous = e.SummarizeVarlen(enc, dec, rc, 1).bottleneck;
    ASSERT_GT(previous, Duration::Zero()) << RecomputeName(rc);
    for (int i = 0; i < 7; ++i) {
      enc.push_back(100);
      dec.push_back(20);
      const CostSummary v = e.SummarizeVarlen(enc, dec, rc, 1);
      ASSERT_TRUE(v.feasible) << RecomputeName(rc);
      EXPECT_GE(v.bottleneck, previous);
      previous = v.bottleneck;
    }
    // (Its memory need not fit: the time is what is compared.)
    const CostSummary padded = e.Summarize({8, 1000, 200}, rc, 1);
    EXPECT_LT(previous, padded.bottleneck);
    const std::vector<int64_t> renc(enc.rbegin(), enc.rend()), rdec(dec.rbegin(), dec.rend());
    EXPECT_EQ(e.SummarizeVarlen(renc, rdec, rc, 1), e.SummarizeVarlen(enc, dec, rc, 1));
    // Swapping which sample holds which target changes only the cross-attention work.
    std::vector<int64_t> swapped = dec;
    std::swap(swapped[0], swapped[1]);
    EXPECT_NE(e.SummarizeVarlen(enc, swapped, rc, 1), e.SummarizeVarlen(enc, dec, rc, 1));
  }
  // The decoder-only entry points, mismatched lists, empty or overlong lengths: no price.
  std::vector<ChunkCost> out;
  const int64_t enc[] = {300, 200}, dec[] = {40, 30}, one[] = {40};
  EXPECT_TRUE(e.EvaluateVarlenStages(enc, dec, Recompute::kNone, &out));
  EXPECT_FALSE(e.EvaluateVarlenStages(enc, Recompute::kNone, &out));
  EXPECT_FALSE(e.EvaluateVarlenStages(enc, one, Recompute::kNone, &out));
  // A sample without a target adds encoder work only; all without: one decoder token.
  const int64_t no_target[] = {40, 0}, first_only[] = {300}, forty[] = {40};
  std::vector<ChunkCost> with_empty, alone;
  EXPECT_TRUE(e.EvaluateVarlenStages(enc, no_target, Recompute::kNone, &with_empty));
  EXPECT_TRUE(e.EvaluateVarlenStages(first_only, forty, Recompute::kNone, &alone));
  EXPECT_GT(with_empty[0].forward, alone[0].forward);
  const int64_t none[] = {0, 0};
  EXPECT_TRUE(e.EvaluateVarlenStages(enc, none, Recompute::kNone, &out));
  const int64_t negative[] = {40, -1};
  EXPECT_FALSE(e.EvaluateVarlenStages(enc, negative, Recompute::kNone, &out));
  const int64_t too_long[] = {e.model().max_position + 1, 10};
  EXPECT_FALSE(e.EvaluateVarlenStages(too_long, dec, Recompute::kNone, &out));
  // A decoder-only evaluator refuses the encoder-decoder entry points.
  auto gpt = testing::MakeTestSetup("gpt-6.7b", TestParallel(1, 4, 4));
  EXPECT_FALSE(gpt->evaluator().EvaluateVarlenStages(enc, dec, Recompute::kNone, &out));
}

// Multipack and Hydraulis give T5 varlen micro-batches: every sample once, memory within the
// limit, and on a long-tailed batch a predicted time below packing's (full-row attention).
TEST(VarlenCostTest, T5VarlenMethodsPlanValidBatches) {
  auto setup = testing::MakeTestSetup("t5-11b", TestParallel(2, 2, 4));
  const StageCostEvaluator& e = setup->evaluator();
  BatchingOptions options;
  options.max_seqlen = 1024;
  double packing_ms = 0;
  for (const char* method : {"packing", "multipack", "hydraulis"}) {
    double total_ms = 0;
    for (uint64_t seed : {1u, 2u}) {
      const std::vector<Sample> batch = testing::RandomTokenBatch(seed, 32768, 1024, true);
      StatusOr<BatchPlan> plan = RunMethod(method, batch, e, options);
      ASSERT_TRUE(plan.ok()) << method << ": " << plan.status().ToString();
      ASSERT_EQ(plan->outcome, PlanOutcome::kOk) << method << ": " << plan->infeasible_reason;
      EXPECT_TRUE(ValidateBatchPlan(*plan, batch, e).ok()) << method;
      Duration worst;
      for (const std::vector<MicroBatch>& replica : plan->replicas) {
        worst = std::max(worst, PredictReplicaTime(replica, e.pp()));
        for (const MicroBatch& mb : replica) {
          EXPECT_EQ(mb.varlen, std::string(method) != "packing") << method;
        }
      }
      total_ms += worst.millis();
    }
    if (std::string(method) == "packing") {
      packing_ms = total_ms;
    } else {
      EXPECT_LT(total_ms, packing_ms) << method;
    }
  }
}

// The reproducer of the "honest numbers" issue: `sluice batch --data uniform512.jsonl
// --parallel dp=2,tp=T,zero=2 --method sorted|hydraulis --recompute none --iterations 5`.
// Every sample is 512 tokens, so there is no padding to remove and the two methods can only
// differ by how many sequences they put in a micro-batch.
TEST(VarlenCostTest, SortedAndHydraulisAgreeOnUniformLengths) {
  const std::unique_ptr<CostModel> cost = LoadTestCostModel("gpt-6.7b", TestCost::kProfiled);
  std::vector<std::vector<Sample>> batches;
  for (int64_t b = 0; b < 5; ++b) {  // 5 global batches of 65,536 tokens
    std::vector<Sample> batch;
    for (int64_t i = 0; i < 128; ++i) batch.push_back(Sample{b * 128 + i, 512, 0, 0});
    batches.push_back(std::move(batch));
  }
  BatchingOptions options;
  options.max_seqlen = 2048;
  options.recompute = Recompute::kNone;
  for (int64_t tp : {1, 2, 4, 8}) {
    ClusterSpec cluster = *ClusterPreset("a100-40g", 16);
    // dp 2 x tp 1 needs more than 40 GB of model states: the same device with 80 GiB.
    if (tp == 1) cluster.device.memory = Bytes::GiB(80);
    StatusOr<StageCostEvaluator> e =
        StageCostEvaluator::Create(*cost, TestParallel(2, 1, tp, 0, 2), cluster);
    ASSERT_TRUE(e.ok()) << "tp " << tp << ": " << e.status().ToString();
    double predicted[2] = {0, 0};
    const char* methods[2] = {"sorted", "hydraulis"};
    for (int m = 0; m < 2; ++m) {
      for (const std::vector<Sample>& batch : batches) {
        StatusOr<BatchPlan> plan = RunMethod(methods[m], batch, *e, options);
        ASSERT_TRUE(plan.ok()) << plan.status().ToString();
        ASSERT_EQ(plan->outcome, PlanOutcome::kOk) << methods[m] << " tp " << tp;
        Duration worst;
        for (const std::vector<MicroBatch>& replica : plan->replicas) {
          worst = std::max(worst, PredictReplicaTime(replica, e->pp()));
        }
        predicted[m] += worst.millis() / static_cast<double>(batches.size());
      }
    }
    EXPECT_TRUE(Near(predicted[1], predicted[0], 0.02))
        << "tp " << tp << ": hydraulis " << predicted[1] << " ms, sorted " << predicted[0] << " ms";
  }
}

}  // namespace
}  // namespace sluice
