#include "batching/stage_cost.h"

#include <gtest/gtest.h>

#include <span>
#include <utility>
#include <vector>

#include "batching/micro_batch.h"
#include "batching/test_util.h"

namespace sluice {
namespace {

using testing::MakeTestSetup;
using testing::TestCost;
using testing::TestParallel;
using testing::TryMakeTestSetup;

TEST(StageCostEvaluatorTest, DecoderOnlyLayout) {
  auto setup = MakeTestSetup("gpt-6.7b", TestParallel(2, 8));
  const StageCostEvaluator& e = setup->evaluator();
  ASSERT_EQ(e.stage_layers().size(), 8u);
  for (int64_t s = 0; s < 8; ++s) {
    const StageLayers& l = e.stage_layers()[s];
    EXPECT_EQ(l.encoder_layers, 4) << s;
    EXPECT_EQ(l.decoder_layers, 0) << s;
    EXPECT_EQ(l.embedding, s == 0) << s;
    EXPECT_EQ(l.output_head, s == 7) << s;
    const ModelStateMemory states = setup->cost->ModelStates(l, setup->parallel);
    EXPECT_EQ(e.stage_states()[s], states);
    EXPECT_EQ(e.ActivationBudget(s), Bytes::MB(36000) - states.total());
  }
  // The stage holding the tied head's copy of the embedding has more state than the middle.
  EXPECT_GT(e.stage_states()[7].total(), e.stage_states()[3].total());
}

TEST(StageCostEvaluatorTest, InterleavedAndSingleStageLayouts) {
  auto inter = MakeTestSetup("gpt-6.7b", TestParallel(1, 2, 4, 36000, 1, 4));
  ASSERT_EQ(inter->evaluator().stage_layers().size(), 2u);
  EXPECT_EQ(inter->evaluator().stage_layers()[0],
            (StageLayers{.encoder_layers = 16, .embedding = true}));
  EXPECT_EQ(inter->evaluator().stage_layers()[1],
            (StageLayers{.encoder_layers = 16, .output_head = true}));
  auto single = MakeTestSetup("t5-11b", TestParallel(1, 1, 8));
  EXPECT_EQ(single->evaluator().stage_layers()[0], (StageLayers{24, 24, true, true, true}));
}

TEST(StageCostEvaluatorTest, EncoderDecoderLayout) {
  auto setup = MakeTestSetup("t5-11b", TestParallel(1, 4, 4));
  const std::vector<StageLayers>& l = setup->evaluator().stage_layers();
  ASSERT_EQ(l.size(), 4u);
  EXPECT_EQ(l[0], (StageLayers{12, 0, true, false}));
  EXPECT_EQ(l[1], (StageLayers{12, 0, false, false, true}));  // embeds the decoder inputs
  EXPECT_EQ(l[2], (StageLayers{0, 12, false, false}));
  EXPECT_EQ(l[3], (StageLayers{0, 12, false, true}));
}

TEST(StageCostEvaluatorTest, CreateErrors) {
  // 32 layers do not split into 5 chunks.
  auto bad = TryMakeTestSetup("gpt-6.7b", TestParallel(1, 5));
  ASSERT_FALSE(bad.ok());
  EXPECT_EQ(bad.status().code(), StatusCode::kInvalidArgument);
  // The whole model's states do not fit 10 GB on one device.
  auto small = TryMakeTestSetup("gpt-6.7b", TestParallel(1, 1, 1, 10000));
  ASSERT_FALSE(small.ok());
  EXPECT_EQ(small.status().code(), StatusCode::kFailedPrecondition);
  EXPECT_NE(small.status().message().find("model states"), std::string::npos);
  // tp = 3 is not in the tables (and does not divide the heads).
  EXPECT_FALSE(TryMakeTestSetup("gpt-6.7b", TestParallel(1, 1, 3)).ok());
}

TEST(StageCostEvaluatorTest, LengthsAndPadding) {
  auto gpt = MakeTestSetup("gpt-6.7b", TestParallel(1, 8));
  auto t5 = MakeTestSetup("t5-11b", TestParallel(1, 4, 4));
  const Sample s{.id = 0, .input_len = 100, .target_len = 21};
  EXPECT_EQ(gpt->evaluator().SeqLen(s), 121);
  EXPECT_EQ(gpt->evaluator().DecLen(s), 0);
  EXPECT_EQ(t5->evaluator().SeqLen(s), 100);
  EXPECT_EQ(t5->evaluator().DecLen(s), 21);
  EXPECT_EQ(gpt->evaluator().Pad(121), 128);
  EXPECT_EQ(gpt->evaluator().Pad(128), 128);
  EXPECT_EQ(gpt->evaluator().Pad(1), 8);
  auto pad64 = MakeTestSetup("gpt-6.7b", TestParallel(1, 8), TestCost::kProfiled,
                             StageCostOptions{.pad_multiple = 64});
  EXPECT_EQ(pad64->evaluator().Pad(65), 128);
}

TEST(StageCostEvaluatorTest, InFlight) {
  auto setup = MakeTestSetup("gpt-6.7b", TestParallel(1, 4));
  const StageCostEvaluator& e = setup->evaluator();
  EXPECT_EQ(e.InFlight(0, 100), 4);
  EXPECT_EQ(e.InFlight(3, 100), 1);
  EXPECT_EQ(e.InFlight(0, 2), 2);
  EXPECT_EQ(e.InFlight(1, 0), 1);
  auto gpipe = MakeTestSetup("gpt-6.7b", TestParallel(1, 4), TestCost::kProfiled,
                             StageCostOptions{.in_flight = InFlightPolicy::kGPipe});
  EXPECT_EQ(gpipe->evaluator().InFlight(3, 17), 17);
}

TEST(StageCostEvaluatorTest, StagesSumTheirLayers) {
  auto setup = MakeTestSetup("gpt-6.7b", TestParallel(1, 8));
  const StageCostEvaluator& e = setup->evaluator();
  const LayerShape shape{4, 512, 0};
  std::vector<ChunkCost> stages;
  ASSERT_TRUE(e.EvaluateStages(shape, Recompute::kSelective, &stages));
  ASSERT_EQ(stages.size(), 8u);
  const LayerCost layer = setup->cost->Layer(LayerKind::kEncoder, shape, 1, Recompute::kSelective);
  const LayerCost emb = setup->cost->Layer(LayerKind::kEmbedding, shape, 1, Recompute::kSelective);
  const LayerCost head =
      setup->cost->Layer(LayerKind::kOutputHead, shape, 1, Recompute::kSelective);
  EXPECT_EQ(stages[3].forward, layer.forward * 4);
  EXPECT_EQ(stages[3].backward(), layer.backward * 4);
  EXPECT_EQ(stages[3].backward_weight + stages[3].backward_input, stages[3].backward());
  EXPECT_EQ(stages[3].stored, layer.stored_activation * 4);
  EXPECT_EQ(stages[3].peak, layer.stored_activation * 3 + layer.peak_activation);
  EXPECT_EQ(stages[0].forward, layer.forward * 4 + emb.forward);
  EXPECT_EQ(stages[0].stored, layer.stored_activation * 4 + emb.stored_activation);
  EXPECT_EQ(stages[7].forward, layer.forward * 4 + head.forward);
  EXPECT_EQ(stages[7].peak, std::max(layer.stored_activation * 3 + layer.peak_activation,
                                     layer.stored_activation * 4 + head.peak_activation));
}

TEST(StageCostEvaluatorTest, SummaryMatchesStages) {
  for (const char* model : {"gpt-6.7b", "t5-11b"}) {
    auto setup = MakeTestSetup(model, TestParallel(1, 4, model[0] == 't' ? 4 : 1));
    const StageCostEvaluator& e = setup->evaluator();
    const bool t5 = e.model().is_encoder_decoder();
    for (Recompute rc : {Recompute::kNone, Recompute::kSelective, Recompute::kFull}) {
      for (int64_t mbs : {1, 2, 8}) {
        const LayerShape shape{mbs, 256, t5 ? 64 : 0};
        std::vector<ChunkCost> stages;
        ASSERT_TRUE(e.EvaluateStages(shape, rc, &stages)) << model;
        const CostSummary s = e.Summarize(shape, rc, 4);
        Duration bottleneck, total;
        Bytes stored, peak;
        double load = 0;
        for (int64_t st = 0; st < 4; ++st) {
          const Duration t = stages[st].forward + stages[st].backward();
          bottleneck = std::max(bottleneck, t);
          total += t;
          stored = std::max(stored, stages[st].stored);
          peak = std::max(peak, stages[st].peak);
          // Buffers: the boundary tensor sent on (fp16; T5 on 4 stages ends its encoder on stage
          // 1, so boundary 0 carries the encoder state only), tokens / labels loaded (int64), and
          // room for transient_boundary_buffers (2) of the largest boundary tensor received or
          // sent.
          auto out = [&](int64_t b) -> int64_t {
            return b < 3 ? 2 * mbs * (256 + (t5 && b >= 1 ? 64 : 0)) * e.model().hidden : 0;
          };
          const int64_t loads = st == 0   ? 8 * mbs * (256 + (t5 ? 64 : 0))
                                : st == 3 ? 8 * mbs * (t5 ? 64 : 256)
                                          : 0;
          const Bytes held = Bytes::Of(out(st) + loads);
          EXPECT_EQ(e.HeldBuffers(shape, st), held);
          const Bytes transient = Bytes::Of(e.options().transient_boundary_buffers *
                                            std::max(out(st), st > 0 ? out(st - 1) : 0));
          EXPECT_EQ(e.TransientBuffers(shape, st), transient);
          load = std::max(load, static_cast<double>(((stages[st].stored + held) * (4 - st - 1) +
                                                     stages[st].peak + held + transient)
                                                        .count()) /
                                    static_cast<double>(e.ActivationBudget(st).count()));
        }
        EXPECT_EQ(s.bottleneck, bottleneck);
        EXPECT_EQ(s.total, total);
        EXPECT_EQ(s.max_stored, stored);
        EXPECT_EQ(s.max_peak, peak);
        EXPECT_DOUBLE_EQ(s.memory_load, load);
        EXPECT_EQ(s.feasible, load <= 1.0);
      }
    }
  }
}

TEST(StageCostEvaluatorTest, MemoryGrowsAndBecomesInfeasible) {
  auto setup = MakeTestSetup("gpt-6.7b", TestParallel(1, 8));
  const StageCostEvaluator& e = setup->evaluator();
  double last = 0;
  for (int64_t mbs = 1; mbs <= 8; mbs *= 2) {
    const CostSummary s = e.Summarize({mbs, 2048, 0}, Recompute::kNone, 8);
    EXPECT_GT(s.memory_load, last);
    last = s.memory_load;
  }
  // 8 x 2048 without recomputation exceeds the budget of stage 0 with 8 in flight.
  EXPECT_FALSE(e.Summarize({8, 2048, 0}, Recompute::kNone, 8).feasible);
  EXPECT_TRUE(e.Summarize({1, 2048, 0}, Recompute::kFull, 8).feasible);
  // Beyond the model's positions or the table's micro-batch sizes: no answer.
  EXPECT_FALSE(e.Summarize({1, 8200, 0}, Recompute::kFull, 8).feasible);
  std::vector<ChunkCost> stages;
  EXPECT_FALSE(e.EvaluateStages({4096, 2048, 0}, Recompute::kFull, &stages));
  EXPECT_EQ(stages.size(), 8u);
}

TEST(StageCostEvaluatorTest, AnalyticModelWorksToo) {
  auto setup = MakeTestSetup("llama-7b", TestParallel(2, 4), TestCost::kAnalytic);
  const CostSummary s = setup->evaluator().Summarize({2, 1024, 0}, Recompute::kSelective, 4);
  EXPECT_TRUE(s.feasible);
  EXPECT_GT(s.bottleneck, Duration::Zero());
  EXPECT_LE(s.bottleneck, s.total);
  EXPECT_TRUE(setup->evaluator().varlen_supported());
}

TEST(StageCostEvaluatorTest, VarlenCostsFollowThePaddedCost) {
  auto setup = MakeTestSetup("gpt-6.7b", TestParallel(1, 4));
  const StageCostEvaluator& e = setup->evaluator();
  ASSERT_TRUE(e.varlen_supported());
  for (Recompute rc : {Recompute::kNone, Recompute::kSelective, Recompute::kFull}) {
    const StageCostEvaluator::Quadratic q = e.BottleneckQuadratic(rc);
    EXPECT_GE(q.a, 0);
    EXPECT_GT(q.b, 0);
    EXPECT_GE(q.c, 0);
    // One sequence is priced at the padded 1 x len shape itself (varlen_cost_test.cc checks
    // k x len over the tables' points).
    for (int64_t len : {256, 1000, 2048}) {
      const int64_t one[] = {len};
      std::vector<ChunkCost> varlen, padded;
      ASSERT_TRUE(e.EvaluateVarlenStages(one, rc, &varlen));
      ASSERT_TRUE(e.EvaluateStages({1, len, 0}, rc, &padded));
      EXPECT_EQ(varlen, padded) << RecomputeName(rc) << " len " << len;
    }
  }
  // Packing short sequences per-sample is cheaper than padding them all to the longest.
  const std::vector<int64_t> lengths = {2000, 100, 100, 100, 100, 100, 100, 100};
  const CostSummary v = e.SummarizeVarlen(lengths, Recompute::kSelective, 1);
  const CostSummary p = e.Summarize({8, 2000, 0}, Recompute::kSelective, 1);
  ASSERT_TRUE(v.feasible);
  EXPECT_FALSE(e.SummarizeVarlen(lengths, Recompute::kNone, 4).feasible);  // too much memory
  EXPECT_LT(v.bottleneck, p.bottleneck);
  EXPECT_LT(v.max_stored, p.max_stored);
  // Outside the fitted lengths: no answer.
  const int64_t too_long[] = {9000};
  EXPECT_FALSE(e.SummarizeVarlen(too_long, Recompute::kFull, 4).feasible);
}

TEST(StageCostEvaluatorTest, EncoderDecoderVarlenHasPricesButNoFit) {
  auto setup = MakeTestSetup("t5-11b", TestParallel(1, 2, 8));
  EXPECT_TRUE(setup->evaluator().varlen_supported());
  const int64_t one[] = {128}, target[] = {16};
  std::vector<ChunkCost> out;
  // Encoder-decoder samples need their targets.
  EXPECT_FALSE(setup->evaluator().EvaluateVarlenStages(one, Recompute::kNone, &out));
  EXPECT_TRUE(setup->evaluator().EvaluateVarlenStages(one, target, Recompute::kNone, &out));
  EXPECT_EQ(setup->evaluator().BottleneckQuadratic(Recompute::kNone).b, 0);
}

TEST(StageCostEvaluatorTest, BoundaryBytes) {
  auto gpt = MakeTestSetup("gpt-6.7b", TestParallel(1, 4));
  EXPECT_EQ(gpt->evaluator().BoundaryBytes({2, 512, 0}, 0), Bytes::Of(2 * 2 * 512 * 4096));
  EXPECT_EQ(gpt->evaluator().BoundaryBytes({2, 512, 0}, 3), Bytes::Zero());
  auto t5 = MakeTestSetup("t5-11b", TestParallel(1, 4, 4));
  const LayerShape shape{2, 512, 64};
  EXPECT_EQ(t5->evaluator().BoundaryBytes(shape, 0), Bytes::Of(2 * 2 * 512 * 1024));
  EXPECT_EQ(t5->evaluator().BoundaryBytes(shape, 1), Bytes::Of(2 * 2 * (512 + 64) * 1024));
  EXPECT_EQ(t5->evaluator().BoundaryBytes(shape, 2), Bytes::Of(2 * 2 * (512 + 64) * 1024));
  EXPECT_EQ(t5->evaluator().BoundaryBytes(shape, 3), Bytes::Zero());
  // pp = 3 cuts [24 encoder; 24 decoder] into runs of 16: stage 1 ends the encoder and starts
  // the decoder, so its boundary already carries the decoder hidden state.
  auto t5_3 = MakeTestSetup("t5-11b", TestParallel(1, 3, 8));
  const std::vector<StageLayers>& layers = t5_3->evaluator().stage_layers();
  ASSERT_EQ(layers.size(), 3u);
  EXPECT_EQ(layers[0].encoder_layers, 16);
  EXPECT_EQ(layers[1].encoder_layers, 8);
  EXPECT_EQ(layers[1].decoder_layers, 8);
  EXPECT_TRUE(layers[1].decoder_embedding);
  EXPECT_EQ(layers[2].decoder_layers, 16);
  EXPECT_EQ(t5_3->evaluator().BoundaryBytes(shape, 0), Bytes::Of(2 * 2 * 512 * 1024));
  EXPECT_EQ(t5_3->evaluator().BoundaryBytes(shape, 1), Bytes::Of(2 * 2 * (512 + 64) * 1024));
  EXPECT_EQ(t5_3->evaluator().BoundaryBytes(shape, 2), Bytes::Zero());
}

// Chunks (virtual stages) sum to their device stage; boundaries are per chunk.
TEST(StageCostEvaluatorTest, EvaluateChunksSumToStages) {
  auto gpt = MakeTestSetup("gpt-6.7b", TestParallel(1, 2, 4, 36000, 1, 4));
  const StageCostEvaluator& e = gpt->evaluator();
  const LayerShape shape{2, 512, 0};
  std::vector<ChunkCost> chunks, stages;
  ASSERT_TRUE(e.EvaluateChunks(shape, Recompute::kNone, &chunks));
  ASSERT_TRUE(e.EvaluateStages(shape, Recompute::kNone, &stages));
  ASSERT_EQ(chunks.size(), 8u);
  for (int64_t d = 0; d < 2; ++d) {
    ChunkCost sum;
    for (int64_t c = d; c < 8; c += 2) {
      sum.forward += chunks[c].forward;
      sum.backward_input += chunks[c].backward_input;
      sum.backward_weight += chunks[c].backward_weight;
      sum.stored += chunks[c].stored;
      EXPECT_LE(chunks[c].peak, stages[d].peak);
    }
    EXPECT_EQ(sum.forward, stages[d].forward) << d;
    EXPECT_EQ(sum.backward_input, stages[d].backward_input) << d;
    EXPECT_EQ(sum.backward_weight, stages[d].backward_weight) << d;
    EXPECT_EQ(sum.stored, stages[d].stored) << d;
  }
  // The embedding makes chunk 0 dearer than chunk 2 (same device, same layer count).
  EXPECT_GT(chunks[0].forward, chunks[2].forward);
  EXPECT_EQ(e.ChunkBoundaryBytes(shape, 0), Bytes::Of(2 * 2 * 512 * 4096));
  EXPECT_EQ(e.ChunkBoundaryBytes(shape, 7), Bytes::Zero());
  auto t5 = MakeTestSetup("t5-11b", TestParallel(1, 4, 4));
  const LayerShape t5_shape{2, 512, 64};
  EXPECT_EQ(t5->evaluator().ChunkBoundaryBytes(t5_shape, 0), Bytes::Of(2 * 2 * 512 * 1024));
  EXPECT_EQ(t5->evaluator().ChunkBoundaryBytes(t5_shape, 1),
            Bytes::Of(2 * 2 * (512 + 64) * 1024));
}

MicroBatch MemoryOnly(int64_t pp, Bytes stored, Bytes peak) {
  MicroBatch mb;
  mb.stages.assign(static_cast<size_t>(pp), ChunkCost{.stored = stored, .peak = peak});
  return mb;
}

TEST(CheckSequenceMemoryTest, WindowsOfInFlightMicroBatches) {
  auto setup = MakeTestSetup("gpt-6.7b", TestParallel(1, 4));
  const StageCostEvaluator& e = setup->evaluator();
  Bytes budget = e.ActivationBudget(0);
  for (int64_t s = 1; s < 4; ++s) budget = std::min(budget, e.ActivationBudget(s));
  // Stage 0 holds 4 in flight: 3 stored + 1 running at its peak.
  const Bytes stored = Bytes::Of(budget.count() / 5);
  const Bytes peak = budget - stored * 3;
  std::vector<MicroBatch> ok(6, MemoryOnly(4, stored, peak));
  EXPECT_EQ(CheckSequenceMemory(e, ok), "");
  // A micro-batch that fits alone (little stored, a high peak) does not fit next to three big
  // stored ones.
  const Bytes low = Bytes::Of(stored.count() / 4);
  const MicroBatch spiky = MemoryOnly(4, low, budget - low * 3);
  std::vector<MicroBatch> alone(4, spiky);
  EXPECT_EQ(CheckSequenceMemory(e, alone), "");
  std::vector<MicroBatch> mixed = ok;
  mixed[3] = spiky;
  const std::string msg = CheckSequenceMemory(e, mixed);
  EXPECT_NE(msg.find("stage 0"), std::string::npos) << msg;
  EXPECT_NE(msg.find("3 running"), std::string::npos) << msg;
  // Far enough apart (more than 4 positions) it fits again.
  std::vector<MicroBatch> apart(8, MemoryOnly(4, low, low));
  apart[0] = ok[0];
  apart[7] = spiky;
  EXPECT_EQ(CheckSequenceMemory(e, apart), "");
  // Malformed per-stage vectors are reported.
  std::vector<MicroBatch> bad(1, MemoryOnly(3, stored, peak));
  EXPECT_NE(CheckSequenceMemory(e, bad), "");
  // SequenceFitsMemory is CheckSequenceMemory's verdict without the message.
  for (const std::vector<MicroBatch>* mbs : {&ok, &alone, &mixed, &apart, &bad}) {
    EXPECT_EQ(SequenceFitsMemory(e, *mbs), CheckSequenceMemory(e, *mbs).empty());
  }
  EXPECT_FALSE(SequenceFitsMemory(e, mixed));
  EXPECT_FALSE(SequenceFitsMemory(e, bad));
  EXPECT_TRUE(SequenceFitsMemory(e, apart));
}

// The memo of per-kind lookups (stage_cost.h) answers as a fresh evaluator does, also after more
// distinct shapes than it has slots (answers replaced) and at cp > 1.
TEST(StageCostEvaluatorTest, MemoisedLookupsAnswerAsAFreshEvaluator) {
  for (int64_t cp : {1, 2}) {
    ParallelConfig par = TestParallel(1, 2, 2);
    par.cp = cp;
    auto setup = MakeTestSetup("gpt-6.7b", par);
    const StageCostEvaluator& used = setup->evaluator();
    const auto price = [](const StageCostEvaluator& e, std::span<const int64_t> lengths,
                          Recompute rc) {
      std::vector<ChunkCost> stages;
      const bool ok = e.EvaluateVarlenStages(lengths, rc, &stages);
      return std::make_pair(ok ? stages : std::vector<ChunkCost>{},
                            e.SummarizeVarlen(lengths, rc, 2));
    };
    // Probes: varlen micro-batches of 1-8 sequences, priced before and after the flood.
    std::vector<std::vector<int64_t>> probes;
    for (int64_t k = 1; k <= 8; ++k) {
      std::vector<int64_t> lengths;
      for (int64_t i = 0; i < k; ++i) lengths.push_back(100 + 211 * i + 37 * k);
      probes.push_back(lengths);
    }
    const std::vector<Recompute> levels = {Recompute::kNone, Recompute::kSelective,
                                           Recompute::kFull};
    std::vector<std::pair<std::vector<ChunkCost>, CostSummary>> before;
    for (const auto& p : probes) {
      for (Recompute rc : levels) before.push_back(price(used, p, rc));
    }
    // More distinct shapes than the memo has slots, padded and varlen, feasible or not.
    for (int64_t i = 0; i < 2 * StageCostEvaluator::kKindCacheEntries; ++i) {
      const int64_t lengths[] = {1 + i % 4000, 1 + (i * 7) % 3000};
      used.SummarizeVarlen(lengths, levels[i % 3], 2);
      used.Summarize({1 + i % 5, 1 + i % 9000, 0}, levels[i % 3], 2);
    }
    StatusOr<StageCostEvaluator> fresh =
        StageCostEvaluator::Create(*setup->cost, setup->parallel, setup->cluster);
    ASSERT_TRUE(fresh.ok()) << fresh.status().ToString();
    size_t k = 0;
    for (const auto& p : probes) {
      for (Recompute rc : levels) {
        EXPECT_EQ(price(used, p, rc), before[k]) << "cp " << cp << " probe " << k;
        EXPECT_EQ(price(*fresh, p, rc), before[k]) << "cp " << cp << " probe " << k;
        ++k;
      }
    }
    EXPECT_TRUE(before.front().second.feasible);
  }
}

}  // namespace
}  // namespace sluice
