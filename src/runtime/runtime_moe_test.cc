// Multi-process tests of MoE layers and expert parallelism (CTest label `torch`, part of
// runtime_test): `sluice train` at ep 1, 2 and 4 with dp and pp, recompute and the MoE overlap
// rewrites, against the micro-batch reference (losses, aux losses, gradients, drops), and plans
// with slices the runtime refuses, naming the instruction.
#include <arpa/inet.h>
#include <fcntl.h>
#include <fmt/core.h>
#include <gtest/gtest.h>
#include <netinet/in.h>
#include <signal.h>
#include <sys/socket.h>
#include <sys/wait.h>
#include <unistd.h>

#include <algorithm>
#include <chrono>
#include <cmath>
#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <map>
#include <nlohmann/json.hpp>
#include <optional>
#include <set>
#include <sstream>
#include <thread>

#include "base/json_util.h"
#include "model/model_spec.h"
#include "passes/moe_overlap.h"
#include "plan/moe_segments.h"
#include "plan/plan_json.h"
#include "plan/validate.h"
#include "runtime/dump.h"
#include "runtime/hetero_train.h"
#include "runtime/plan_package.h"
#include "runtime/reference.h"
#include "runtime/runtime_test_util.h"
#include "runtime/trainer.h"

namespace sluice::runtime {
namespace {

namespace fs = std::filesystem;
using Clock = std::chrono::steady_clock;

// ---- MoE: expert parallelism against the micro-batch reference ----

struct MoeCase {
  std::string name;
  std::string model;
  int64_t dp, pp, ep;
  uint64_t seed;
  std::string schedule = "1f1b";
  int64_t tokens_per_replica = 600;
  std::string memory_limit = "55";  // MB
  std::string recompute = "none";
  std::string moe_overlap;  // --moe-overlap (empty: the plans as lowered, whole ops)
  // Non-empty: plan with this budget (sluice plan --out), then run the plan files under
  // memory_limit (a rewrite that holds more than the planner's micro-batches fills, megatron).
  std::string plan_memory_limit;
  int64_t iterations = 2;
  // Plan for a cluster whose link is slow (SlowLinkCluster): all-to-alls dear enough that the
  // forward partition's DP cuts the forwards into token slices.
  bool slow_link = false;
};

// A CPU cluster of `devices` with a 0.02 GB/s, 50 us link, written to `dir`; returns its path.
std::string SlowLinkCluster(const std::string& dir, int64_t devices) {
  const std::string path = fmt::format("{}/slow-link-{}.json", dir, devices);
  SLUICE_CHECK(WriteStringToFile(
                   path, fmt::format(R"({{"name": "cpu-slow-link",
 "device": {{"name": "cpu-1t", "peak_tflops": 0.17, "memory_gib": 4, "hbm_gb_per_s": 12.9}},
 "nodes": 1, "devices_per_node": {},
 "intra_node": {{"bandwidth_gb_per_s": 0.02, "latency_us": 50}}}})",
                                     devices))
                   .ok());
  return path;
}

void PrintTo(const MoeCase& c, std::ostream* os) { *os << c.name; }

// The replicas of an ep group need the same number of micro-batches; the planner splits or
// merges micro-batches until they have it (batching/expert_groups.h). Most seeds below were
// chosen, before it did, so that the first two batches give equal counts as batched; in the
// `equalized` cases the planner merged (seed 1: both batches, a short sample joins another in
// one micro-batch) or split micro-batches (seed 2 at pp 2, zb-h1), whose lowering failed before.
std::vector<MoeCase> MoeCases() {
  return {
      {"gpt_moe_dp2_ep2_equalized", "gpt-tiny-moe", 2, 1, 2, 1},
      {"gpt_moe_dp2_ep2_pp2_zbh1_equalized", "gpt-tiny-moe", 2, 2, 2, 2, "zb-h1"},
      {"gpt_moe_dp2_ep2", "gpt-tiny-moe", 2, 1, 2, 4},
      // ep = 1: every rank holds all 4 experts (their gradients go with the dense buckets).
      {"gpt_moe_dp2_ep1", "gpt-tiny-moe", 2, 1, 1, 4, "1f1b", 600, "80"},
      {"gpt_moe_dp2_ep2_pp2_1f1b", "gpt-tiny-moe", 2, 2, 2, 4},
      {"gpt_moe_dp2_ep2_pp2_zbh1", "gpt-tiny-moe", 2, 2, 2, 4, "zb-h1"},
      {"gpt_moe_dp4_ep2", "gpt-tiny-moe", 4, 1, 2, 5},
      // ep = 4 on 4 processes: one expert per rank, every token's choices cross three peers.
      {"gpt_moe_dp4_ep4", "gpt-tiny-moe", 4, 1, 4, 1},
      // Recompute "full": the backward replays the forward from the all-to-alls' recorded rows.
      {"gpt_moe_dp2_ep2_full", "gpt-tiny-moe", 2, 1, 2, 4, "1f1b", 600, "55", "full"},
      {"gpt_moe_dp2_ep2_pp2_zbh1_full", "gpt-tiny-moe", 2, 2, 2, 4, "zb-h1", 600, "55", "full"},
      {"t5_moe_dp2_ep2", "t5-tiny-moe", 2, 1, 2, 1},
      // Segmented MoE ops (--moe-overlap, executor.cc "Segmented MoE ops"): each op runs in a
      // fiber stopped at its all-to-alls, posted all-to-alls waited for where the plan says.
      {"gpt_moe_dp2_ep2_seg_none", "gpt-tiny-moe", 2, 1, 2, 4, "1f1b", 600, "55", "none", "none"},
      {"gpt_moe_dp2_ep2_seg_dw", "gpt-tiny-moe", 2, 1, 2, 4, "1f1b", 600, "55", "none", "dw"},
      // Interleaving a backward with the next forward holds both micro-batches: planned within
      // 55 MB, run within 100 MB.
      {"gpt_moe_dp2_ep2_seg_megatron", "gpt-tiny-moe", 2, 1, 2, 4, "1f1b", 600, "100", "none",
       "megatron", "55"},
      {"gpt_moe_dp2_ep2_pp2_seg_dw", "gpt-tiny-moe", 2, 2, 2, 4, "1f1b", 600, "55", "none", "dw"},
      {"gpt_moe_dp2_ep2_full_seg_dw", "gpt-tiny-moe", 2, 1, 2, 4, "1f1b", 600, "55", "full", "dw"},
      {"t5_moe_dp2_ep2_seg_dw", "t5-tiny-moe", 2, 1, 2, 1, "1f1b", 600, "55", "none", "dw"},
      // Tutel's capacity slices: each MoE block's dispatch, experts and combine in 4 slices
      // (one autograd node per block runs the backward's slices in the plan's order).
      {"gpt_moe_dp2_ep2_seg_tutel", "gpt-tiny-moe", 2, 1, 2, 4, "1f1b", 600, "55", "none", "tutel"},
      {"gpt_moe_dp2_ep2_pp2_seg_tutel", "gpt-tiny-moe", 2, 2, 2, 4, "1f1b", 600, "55", "none",
       "tutel"},
      {"gpt_moe_dp2_ep2_full_seg_tutel", "gpt-tiny-moe", 2, 1, 2, 4, "1f1b", 600, "55", "full",
       "tutel"},
      {"gpt_moe_dp4_ep4_seg_tutel", "gpt-tiny-moe", 4, 1, 4, 1, "1f1b", 600, "55", "none", "tutel"},
      {"t5_moe_dp2_ep2_seg_tutel", "t5-tiny-moe", 2, 1, 2, 1, "1f1b", 600, "55", "none", "tutel"},
      // Lancet's forward partition: forwards cut into token slices of their rows, expert
      // capacity threaded from slice to slice, an all-to-allv per slice (docs/moe.md, "Token
      // slices"). Top-1 (Switch, Lancet's setting), where the partitioned layer routes and drops
      // exactly as the whole one, so the micro-batch reference (unpartitioned) must match.
      {"gpt_moe_top1_dp2_ep2_seg_partition", "gpt-tiny-moe-top1", 2, 1, 2, 4, "1f1b", 600, "100",
       "none", "partition", "", 2, true},
      {"gpt_moe_top1_dp2_ep2_seg_lancet", "gpt-tiny-moe-top1", 2, 1, 2, 4, "1f1b", 600, "100",
       "none", "lancet", "", 2, true},
      {"gpt_moe_top1_dp2_ep2_pp2_seg_lancet", "gpt-tiny-moe-top1", 2, 2, 2, 4, "1f1b", 600, "100",
       "none", "lancet", "", 2, true},
      {"gpt_moe_top1_dp2_ep2_pp2_zbh1_seg_partition", "gpt-tiny-moe-top1", 2, 2, 2, 4, "zb-h1", 600,
       "100", "none", "partition", "", 2, true},
      {"gpt_moe_top1_dp4_ep4_seg_partition", "gpt-tiny-moe-top1", 4, 1, 4, 1, "1f1b", 600, "100",
       "none", "partition", "", 2, true},
      // Top-2 dropping by token position (MoeDropPolicy::kPosition): threaded slice by slice,
      // exact for any top_k.
      {"gpt_moe_position_dp2_ep2_seg_lancet", "gpt-tiny-moe-position", 2, 1, 2, 4, "1f1b", 600,
       "100", "none", "lancet", "", 2, true},
      {"t5_moe_dp2_ep2_seg_lancet", "t5-tiny-moe", 2, 1, 2, 1, "1f1b", 600, "70", "none", "lancet",
       "", 2, true},
      // Lancet's passes under Megatron's B/F interleaving: a rank's first forward cut into token
      // slices, each later one interleaved whole with the backward before it (both micro-batches
      // held: planned within 70 MB, three rows per micro-batch, run within 130 MB).
      {"gpt_moe_top1_dp2_ep2_seg_lancet_megatron", "gpt-tiny-moe-top1", 2, 1, 2, 4, "1f1b", 600,
       "130", "none", "lancet-megatron", "70", 2, true},
  };
}

class MoeTest : public ::testing::TestWithParam<MoeCase> {};

TEST_P(MoeTest, LossesGradientsAndDropsMatchTheMicroBatchReference) {
  const MoeCase& c = GetParam();
  const std::string dir = MakeDir(c.name);
  const int64_t kIterations = c.iterations;
  std::vector<std::string> args = {"train", "--nproc", std::to_string(c.dp * c.pp)};
  const std::vector<std::pair<std::string, std::string>> flags = {
      {"--model", ModelArg(c.model, dir)},
      {"--parallel", fmt::format("dp={},pp={},ep={}", c.dp, c.pp, c.ep)},
      {"--schedule", c.schedule},
      {"--method", "padding"},
      {"--recompute", c.recompute},
      {"--data", "mixture-4task"},
      {"--tokens-per-batch", std::to_string(c.tokens_per_replica * c.dp)},
      {"--max-seqlen", "96"},
      {"--memory-limit", c.memory_limit},
      {"--iterations", std::to_string(kIterations)},
      {"--seed", std::to_string(c.seed)},
      {"--lr", "0.001"},
      {"--threads", "1"},
      {"--timeout", "60"},
      {"--dump-dir", dir},
      {"--metrics", dir + "/metrics.jsonl"},
  };
  for (const auto& [flag, value] : flags) {
    args.push_back(flag);
    args.push_back(value);
  }
  const std::string cluster =
      c.slow_link ? SlowLinkCluster(dir, c.dp * c.pp) : fmt::format("cpu:{}", c.dp * c.pp);
  if (c.slow_link) {
    args.push_back("--cluster");
    args.push_back(cluster);
  }
  if (!c.moe_overlap.empty()) {
    args.push_back("--moe-overlap");
    args.push_back(c.moe_overlap);
  }
  if (!c.plan_memory_limit.empty()) {
    std::vector<std::string> plan = {"plan",         "--cluster", cluster, "--out",
                                     dir + "/plan.json", "--show",    "0"};
    for (const auto& [flag, value] : flags) {
      if (flag == "--lr" || flag == "--threads" || flag == "--timeout" || flag == "--dump-dir" ||
          flag == "--metrics") {
        continue;
      }
      plan.push_back(flag);
      plan.push_back(flag == "--memory-limit" ? c.plan_memory_limit : value);
    }
    const Outcome planned = RunSluice(plan, dir, 60);
    ASSERT_EQ(planned.status, 0) << planned.output;
    args.push_back("--plan");
    for (int64_t i = 0; i < kIterations; ++i) {
      const std::string path = fmt::format("{}/plan-{}.json", dir, i);
      StatusOr<std::string> text = ReadFileToString(path);
      ASSERT_TRUE(text.ok()) << text.status().message();
      nlohmann::json j = nlohmann::json::parse(*text);
      j["parallel"]["memory_limit_mb"] = std::stod(c.memory_limit);
      ASSERT_TRUE(WriteStringToFile(path, j.dump()).ok());
      args.push_back(path);
    }
  }
  const Outcome run = RunSluice(args, dir);
  ASSERT_EQ(run.status, 0) << run.output;
  EXPECT_EQ(run.output.find("--moe-overlap not applied"), std::string::npos) << run.output;

  std::vector<MicroBatchReferenceBatch> batches;
  int64_t all_to_alls = 0, split_backwards = 0, recomputed = 0;
  int64_t pieces = 0, weight_pieces = 0, sliced = 0, token_sliced = 0, posted = 0, waits = 0;
  int64_t interleaved = 0;  // forward pieces run between two pieces of one backward
  for (int64_t i = 0; i < kIterations; ++i) {
    StatusOr<std::string> bytes = ReadFileToString(dir + "/" + PackageDumpName(i));
    ASSERT_TRUE(bytes.ok()) << bytes.status().message();
    StatusOr<PlanPackage> p = DecodePackage(
        std::span<const uint8_t>(reinterpret_cast<const uint8_t*>(bytes->data()), bytes->size()),
        "dump");
    ASSERT_TRUE(p.ok()) << p.status().message();
    ASSERT_EQ(p->kind, PackageKind::kPlan);
    EXPECT_EQ(p->plan.parallel.ep, c.ep);
    MicroBatchReferenceBatch b;
    b.samples = p->samples;
    for (const PlanReplica& rep : p->plan.replicas) {
      EXPECT_GE(rep.micro_batches.size(), 2u) << "iteration " << i;
      b.micro_batches.insert(b.micro_batches.end(), rep.micro_batches.begin(),
                             rep.micro_batches.end());
      for (const PlanMicroBatch& mb : rep.micro_batches) {
        recomputed += mb.recompute == Recompute::kFull ? 1 : 0;
      }
    }
    for (const RankProgram& prog : p->plan.ranks) {
      std::optional<int64_t> open_backward;  // micro-batch of a backward begun, not ended
      for (const Instruction& in : prog.instructions) {
        if (in.segment >= 0 && (in.op == OpKind::kBackward || in.op == OpKind::kBackwardInput)) {
          // Its last piece is its last segment's (a first stage's backward has no outputs).
          open_backward = in.segment + 1 < NumSegments(p->plan, in.stage)
                              ? std::optional<int64_t>(in.microbatch)
                              : std::nullopt;
        }
        if (open_backward.has_value() && in.segment >= 0 && in.op == OpKind::kForward) {
          ++interleaved;
        }
        all_to_alls += IsAllToAll(in.op) ? 1 : 0;
        split_backwards += in.op == OpKind::kBackwardInput ? 1 : 0;
        pieces += in.segment >= 0 ? 1 : 0;
        weight_pieces += in.segment >= 0 && in.op == OpKind::kBackwardWeight ? 1 : 0;
        sliced += IsCompute(in.op) && in.chunks > 0 ? 1 : 0;
        token_sliced += IsTokenSlice(in) ? 1 : 0;
        posted += IsAllToAll(in.op) && in.tag >= 0 ? 1 : 0;
        waits += in.op == OpKind::kAllToAllWait ? 1 : 0;
      }
    }
    batches.push_back(std::move(b));
  }
  if (c.ep > 1) EXPECT_GT(all_to_alls, 0);
  if (c.recompute == "full") EXPECT_GT(recomputed, 0);
  if (c.schedule == "zb-h1") EXPECT_GT(split_backwards, 0);
  if (!c.moe_overlap.empty()) {
    EXPECT_GT(pieces, 0) << "the plans ran whole ops";
    EXPECT_EQ(posted, waits);
    if (c.moe_overlap != "none") {
      EXPECT_GT(posted, 0) << "no all-to-all was posted: nothing overlapped";
    }
    const bool partition = c.moe_overlap == "partition" || c.moe_overlap == "lancet" ||
                           c.moe_overlap == "lancet-megatron";
    if (c.moe_overlap == "megatron" || c.moe_overlap == "lancet-megatron") {
      EXPECT_GT(interleaved, 0) << "no forward ran inside a backward";
    } else {
      EXPECT_EQ(interleaved, 0);
    }
    if (c.moe_overlap == "tutel") {
      EXPECT_GT(sliced, 0) << "no capacity slice ran";
      EXPECT_EQ(token_sliced, 0);
    } else if (partition) {
      EXPECT_GT(token_sliced, 0) << "no token slice ran";
    } else {
      EXPECT_EQ(sliced, 0);
    }
    if (c.moe_overlap != "none" && c.moe_overlap != "tutel" && c.moe_overlap != "partition") {
      EXPECT_GT(weight_pieces, 0);
    }
  } else {
    EXPECT_EQ(pieces, 0);
  }

  StatusOr<ReferenceResult> ref =
      RunMicroBatchReference(TestModel(c.model), c.seed, kLr, batches, /*grad_batch=*/0);
  ASSERT_TRUE(ref.ok()) << ref.status().message();

  std::vector<nlohmann::json> lines;
  {
    std::ifstream in(dir + "/metrics.jsonl");
    for (std::string line; std::getline(in, line);) {
      if (!line.empty()) lines.push_back(nlohmann::json::parse(line));
    }
  }
  ASSERT_GE(lines.size(), static_cast<size_t>(kIterations)) << run.output;
  int64_t dropped = 0;
  for (int64_t i = 0; i < kIterations; ++i) {
    const nlohmann::json& m = lines[i];
    EXPECT_NEAR(m.at("loss").get<double>(), ref->losses[i], kTolerance * ref->losses[i])
        << "iteration " << i;
    EXPECT_NEAR(m.at("moe_aux_loss").get<double>(), ref->aux_losses[i],
                kTolerance * ref->aux_losses[i])
        << "iteration " << i;
    EXPECT_EQ(m.at("moe_assignments").get<int64_t>(), ref->assignments[i]) << "iteration " << i;
    EXPECT_EQ(m.at("moe_dropped").get<int64_t>(), ref->dropped[i]) << "iteration " << i;
    dropped += ref->dropped[i];
  }
  EXPECT_GT(dropped, 0) << "no token was dropped: the capacity path is untested";

  double worst = 0;
  ExpectGradientsMatch(dir, c.dp * c.pp, ref->grads, &worst);
  if (::testing::Test::HasFatalFailure()) return;
  std::printf(
      "largest relative error: loss %.2e, aux loss %.2e, gradient %.2e; dropped %lld of "
      "%lld assignments (iteration 0); %lld all-to-all instructions\n",
      std::abs(lines[0].at("loss").get<double>() / ref->losses[0] - 1),
      std::abs(lines[0].at("moe_aux_loss").get<double>() / ref->aux_losses[0] - 1), worst,
      static_cast<long long>(ref->dropped[0]), static_cast<long long>(ref->assignments[0]),
      static_cast<long long>(all_to_alls));
  fs::remove_all(dir);
}

INSTANTIATE_TEST_SUITE_P(ExpertParallel, MoeTest, ::testing::ValuesIn(MoeCases()),
                         [](const auto& info) { return info.param.name; });

// Plan files with slices the runtime does not run reach the executor, which refuses them naming
// the instruction: capacity slices of a split backward (zero-bubble I). And valid orders the
// tutel and partition rewrites do not write run: every slice blocking (no waits), so results
// are already in when a slice piece waits for them.
struct SlicedPlanCase {
  std::string name, parallel, schedule;
  int64_t nproc;
  passes::MoeOverlap overlap;
  std::string message;    // empty: the plan runs
  bool blocking = false;  // every posted all-to-all made blocking, its wait removed
  bool slow_link = false;  // planned for SlowLinkCluster (the partition DP then cuts forwards)
};

class SlicedPlanTest : public ::testing::TestWithParam<SlicedPlanCase> {};

TEST_P(SlicedPlanTest, RunsOrIsRefusedNamingTheInstruction) {
  const SlicedPlanCase& c = GetParam();
  const std::string dir = MakeDir("sliced-" + c.name);
  const std::vector<std::string> common = {"--model",
                                           "gpt-tiny-moe",
                                           "--parallel",
                                           c.parallel,
                                           "--method",
                                           "padding",
                                           "--recompute",
                                           "none",
                                           "--data",
                                           "mixture-4task",
                                           "--tokens-per-batch",
                                           "1200",
                                           "--max-seqlen",
                                           "96",
                                           "--schedule",
                                           c.schedule,
                                           "--seed",
                                           "4",
                                           "--iterations",
                                           "1",
                                           "--memory-limit"};
  std::vector<std::string> plan = {
      "plan", "--cluster",
      c.slow_link ? SlowLinkCluster(dir, c.nproc) : fmt::format("cpu:{}", c.nproc), "--out",
      dir + "/p.json"};
  plan.insert(plan.end(), common.begin(), common.end());
  plan.push_back(c.slow_link ? "100" : "55");
  const Outcome planned = RunSluice(plan, dir, 60);
  ASSERT_EQ(planned.status, 0) << planned.output;
  StatusOr<ExecutionPlan> p = ReadPlanFile(dir + "/p.json");
  ASSERT_TRUE(p.ok()) << p.status().message();
  p->parallel.memory_limit = Bytes::MB(100);  // room for the rewrite
  passes::MoeOverlapOptions options;
  options.overlap_grad_reduction = false;
  StatusOr<passes::PassRecord> r = passes::MoeOverlapPass(c.overlap, options).Run(&*p);
  ASSERT_TRUE(r.ok()) << r.status().message();
  ASSERT_TRUE(r->rejected.empty()) << r->rejected;
  int64_t sliced = 0;
  for (const RankProgram& prog : p->ranks) {
    for (const Instruction& in : prog.instructions) sliced += in.chunks > 0 ? 1 : 0;
  }
  ASSERT_GT(sliced, 0) << "the rewrite cut nothing into slices";
  if (c.blocking) {
    for (RankProgram& prog : p->ranks) {
      std::vector<Instruction> kept;
      for (Instruction& in : prog.instructions) {
        if (in.op == OpKind::kAllToAllWait) continue;
        if (IsAllToAll(in.op)) in.tag = -1;
        kept.push_back(in);
      }
      prog.instructions = std::move(kept);
    }
    const Status valid = ValidatePlan(*p);
    ASSERT_TRUE(valid.ok()) << valid.message();
  }
  ASSERT_TRUE(WritePlanFile(*p, dir + "/sliced.json").ok());
  std::vector<std::string> train = {"train",     "--nproc", std::to_string(c.nproc),
                                    "--threads", "1",       "--timeout",
                                    "60",        "--plan",  dir + "/sliced.json"};
  train.insert(train.end(), common.begin(), common.end());
  train.push_back("100");  // the plan's
  const Outcome run = RunSluice(train, dir, 120);
  if (c.message.empty()) {
    EXPECT_EQ(run.status, 0) << run.output;
    EXPECT_NE(run.output.find("trained 1 iterations"), std::string::npos) << run.output;
  } else {
    EXPECT_NE(run.status, 0);
    EXPECT_NE(run.output.find(c.message), std::string::npos) << run.output;
  }
  if (!::testing::Test::HasFailure()) fs::remove_all(dir);
}

INSTANTIATE_TEST_SUITE_P(
    MoeSlices, SlicedPlanTest,
    ::testing::Values(SlicedPlanCase{"partition_blocking", "dp=2,ep=2", "1f1b", 2,
                                     passes::MoeOverlap::kPartition, "", true, true},
                      SlicedPlanCase{"tutel_zbh1", "dp=2,pp=2,ep=2", "zb-h1", 4,
                                     passes::MoeOverlap::kTutel,
                                     "of a backward-input: the runtime runs sliced experts in "
                                     "forward and backward ops only"},
                      SlicedPlanCase{"tutel_blocking", "dp=2,ep=2", "1f1b", 2,
                                     passes::MoeOverlap::kTutel, "", true}),
    [](const auto& info) { return info.param.name; });

}  // namespace
}  // namespace sluice::runtime
