// Multi-process tests of the runtime (CTest label `torch`): `sluice train` runs real plans on
// real processes (c10d + Gloo on CPU), and its losses and gradients must equal the
// single-process reference (RunReference: same samples and weights, no pipeline, no padding)
// within 1e-5 relative, for GPT and T5, every schedule, pp 2 and 3, dp 1 and 2, cp 2 (GPT),
// heterogeneous replica groups (pp 2 + pp 1, pp 2 + cp 2), on the planner's variable-length
// micro-batches. MoE and expert parallelism: runtime_moe_test.cc; rejected plans and failures:
// runtime_failure_test.cc (the same executable, helpers in runtime_test_util.h).
//
// Each test runs the sluice binary (SLUICE_BINARY, set by CMake) on a port the kernel just
// handed out (so `ctest -j` runs tests side by side) under a hard deadline.
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
#include <set>
#include <sstream>
#include <thread>

#include "base/json_util.h"
#include "model/chunk_cut.h"
#include "model/model_spec.h"
#include "passes/moe_overlap.h"
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

struct Case {
  std::string name;
  std::string model;
  int64_t dp, pp, vpp;
  std::string schedule;
  std::string method = "dynapipe";
  std::string recompute;     // "" = the method chooses
  std::string memory_limit;  // "" = 40 MB for T5, 55 MB for GPT
  int64_t cp = 1;            // context parallelism: dp * pp * cp processes
  std::string layer_cut;     // "" = the even cut; "balanced": --layer-cut balanced; else
                             // --parallel's layer_cut=...
  std::string order;         // "" = the default device order (tp-cp-dp-pp)
};

void PrintTo(const Case& c, std::ostream* os) { *os << c.name; }

std::vector<Case> Cases() {
  std::vector<Case> cases;
  const std::vector<std::string> flat = {"gpipe", "1f1b", "zb-h1", "adaptive"};
  for (const int64_t dp : {1, 2}) {
    for (const int64_t pp : {2, 3}) {
      const std::string gpt = pp == 2 ? "gpt-tiny" : "gpt-tiny-6";
      for (const std::string& s : flat) {
        cases.push_back({fmt::format("gpt_{}_pp{}_dp{}", s, pp, dp), gpt, dp, pp, 1, s});
      }
      cases.push_back(
          {fmt::format("gpt_interleaved_pp{}_dp{}", pp, dp), gpt, dp, pp, 2, "interleaved"});
      // T5 3 + 3 at pp 3: chunk 1 holds the encoder's last layer and the decoder's first.
      const std::string t5 = pp == 2 ? "t5-tiny" : "t5-tiny-3";
      for (const std::string& s : flat) {
        cases.push_back({fmt::format("t5_{}_pp{}_dp{}", s, pp, dp), t5, dp, pp, 1, s});
      }
      cases.push_back(
          {fmt::format("t5_interleaved_pp{}_dp{}", pp, dp), t5, dp, pp, 2, "interleaved"});
      if (pp == 3) {
        cases.push_back({fmt::format("t5_adaptive_vpp2_pp3_dp{}", dp), t5, dp, 3, 2, "adaptive"});
      }
    }
  }
  // pp = 1: one rank per replica, and two chunks on one rank handing over through a slot.
  cases.push_back({"gpt_1f1b_pp1_dp2", "gpt-tiny", 2, 1, 1, "1f1b"});
  cases.push_back({"gpt_interleaved_pp1_vpp2_dp1", "gpt-tiny", 1, 1, 2, "interleaved"});
  // GPipe keeps every micro-batch's activations: at 40 MB no early batch of these fits.
  cases.push_back({"t5_gpipe_pp1_dp1", "t5-tiny", 1, 1, 1, "gpipe", "dynapipe", "", "56"});
  // Recompute levels forced, and packed varlen rows.
  cases.push_back({"gpt_1f1b_pp2_dp1_full", "gpt-tiny", 1, 2, 1, "1f1b", "dynapipe", "full"});
  cases.push_back({"gpt_zb-h1_pp2_dp1_full", "gpt-tiny", 1, 2, 1, "zb-h1", "dynapipe", "full"});
  cases.push_back(
      {"t5_1f1b_pp2_dp1_selective", "t5-tiny", 1, 2, 1, "1f1b", "dynapipe", "selective"});
  // Packed rows: attending across the row (packing) and per sample (multipack, varlen).
  cases.push_back({"gpt_1f1b_pp2_dp2_packing", "gpt-tiny", 2, 2, 1, "1f1b", "packing"});
  cases.push_back({"gpt_1f1b_pp2_dp1_multipack", "gpt-tiny", 1, 2, 1, "1f1b", "multipack"});
  cases.push_back({"t5_gpipe_pp2_dp1_packing", "t5-tiny", 1, 2, 1, "gpipe", "packing", "", "56"});
  // Context parallelism (context_parallel.h): cp 2 alone, with pp 2 and with dp 2 (4 processes),
  // a split backward with selective recompute, and varlen packed rows (per-sample causal masks
  // across the load-balanced chunks).
  cases.push_back({"gpt_1f1b_pp1_dp1_cp2", "gpt-tiny", 1, 1, 1, "1f1b", "dynapipe", "", "", 2});
  cases.push_back({"gpt_1f1b_pp2_dp1_cp2", "gpt-tiny", 1, 2, 1, "1f1b", "dynapipe", "", "", 2});
  cases.push_back({"gpt_1f1b_pp1_dp2_cp2", "gpt-tiny", 2, 1, 1, "1f1b", "dynapipe", "", "40", 2});
  cases.push_back({"gpt_zb-h1_pp2_dp1_cp2_selective", "gpt-tiny", 1, 2, 1, "zb-h1", "dynapipe",
                   "selective", "", 2});
  cases.push_back(
      {"gpt_1f1b_pp1_dp1_cp2_multipack", "gpt-tiny", 1, 1, 1, "1f1b", "multipack", "", "40", 2});
  // Encoder-decoder varlen rows (encoder and decoder packed separately, cross attention within
  // the sample): one process, a pipeline, and Hydraulis' one-row micro-batches over dp 2.
  cases.push_back({"t5_1f1b_pp1_dp1_multipack", "t5-tiny", 1, 1, 1, "1f1b", "multipack"});
  cases.push_back({"t5_1f1b_pp2_dp1_multipack", "t5-tiny", 1, 2, 1, "1f1b", "multipack"});
  cases.push_back({"t5_1f1b_pp2_dp2_hydraulis", "t5-tiny", 2, 2, 1, "1f1b", "hydraulis"});
  // Uneven layer cuts (ParallelConfig::layer_cut): 4 layers on 3 stages (no even cut), 6 as
  // 1 + 2 + 3 under a split backward, and T5 3 + 3 with the encoder ending inside the middle
  // chunk or inside the first (the chunk holding the embedding also embeds the decoder inputs).
  cases.push_back(
      {"gpt_1f1b_pp3_dp1_cut2_1_1", "gpt-tiny", 1, 3, 1, "1f1b", "dynapipe", "", "", 1, "2+1+1"});
  cases.push_back({"gpt_zb-h1_pp3_dp2_cut1_2_3", "gpt-tiny-6", 2, 3, 1, "zb-h1", "dynapipe", "", "",
                   1, "1+2+3"});
  cases.push_back(
      {"t5_1f1b_pp3_dp1_cut1_4_1", "t5-tiny-3", 1, 3, 1, "1f1b", "dynapipe", "", "", 1, "1+4+1"});
  cases.push_back(
      {"t5_zb-h1_pp3_dp1_cut4_1_1", "t5-tiny-3", 1, 3, 1, "zb-h1", "dynapipe", "", "", 1, "4+1+1"});
  // The cut the planner chooses for the run (--layer-cut balanced), on every rank alike.
  cases.push_back({"gpt_1f1b_pp2_dp2_cut_balanced", "gpt-tiny", 2, 2, 1, "1f1b", "dynapipe", "", "",
                   1, "balanced"});
  // The other device order: RANK r runs plan rank r (under the default, RANK 1 runs replica
  // 1's stage 0), so every process runs another program than in gpt_1f1b_pp2_dp2.
  cases.push_back({"gpt_1f1b_pp2_dp2_order_tp_cp_pp_dp", "gpt-tiny", 2, 2, 1, "1f1b", "dynapipe",
                   "", "", 1, "", "tp-cp-pp-dp"});
  return cases;
}

std::vector<std::string> TrainArgs(const Case& c, const std::string& dir, int64_t iterations) {
  const bool explicit_cut = !c.layer_cut.empty() && c.layer_cut != "balanced";
  const std::string parallel =
      fmt::format("dp={},pp={},vpp={},cp={}{}{}", c.dp, c.pp, c.vpp, c.cp,
                  explicit_cut ? ",layer_cut=" + c.layer_cut : "",
                  c.order.empty() ? "" : ",order=" + c.order);
  const std::string limit = !c.memory_limit.empty()       ? c.memory_limit
                            : c.model.rfind("t5", 0) == 0 ? "40"
                                                          : "55";
  // clang-format off
  std::vector<std::string> a = {
      "train", "--nproc", std::to_string(c.dp * c.pp * c.cp), "--model", ModelArg(c.model, dir),
      "--parallel", parallel, "--schedule", c.schedule, "--method", c.method,
      "--data", "mixture-4task", "--tokens-per-batch", std::to_string(600 * c.dp),
      "--max-seqlen", "96", "--memory-limit", limit, "--iterations", std::to_string(iterations),
      "--seed", std::to_string(kSeed), "--lr", "0.001", "--threads", "1", "--timeout", "60",
      "--dump-dir", dir, "--metrics", dir + "/metrics.jsonl"};
  // clang-format on
  if (!c.recompute.empty()) {
    a.push_back("--recompute");
    a.push_back(c.recompute);
  }
  if (c.layer_cut == "balanced") {
    a.push_back("--layer-cut");
    a.push_back("balanced");
  }
  return a;
}

class PipelineTest : public ::testing::TestWithParam<Case> {};

TEST_P(PipelineTest, LossesAndGradientsMatchTheSingleProcessReference) {
  const Case& c = GetParam();
  const std::string dir = MakeDir(c.name);
  constexpr int64_t kIterations = 2;
  // --iterations counts the batches considered: under GPipe's memory one of the first few
  // batches does not fit (it is skipped), so GPipe cases consider one more batch and the first
  // two trained iterations are compared.
  const int64_t considered = c.schedule == "gpipe" ? kIterations + 1 : kIterations;
  const Outcome run = RunSluice(TrainArgs(c, dir, considered), dir);
  ASSERT_EQ(run.status, 0) << run.output;

  // The plans really were variable-length, multi-micro-batch plans of the requested schedule.
  std::vector<ReferenceBatch> batches;
  std::set<std::pair<int64_t, int64_t>> shapes;
  int64_t split_backwards = 0, packed_rows = 0, varlen_packed_rows = 0, recomputed = 0;
  for (int64_t i = 0; i < kIterations; ++i) {
    StatusOr<std::string> bytes = ReadFileToString(dir + "/" + PackageDumpName(i));
    ASSERT_TRUE(bytes.ok()) << bytes.status().message();
    StatusOr<PlanPackage> p = DecodePackage(
        std::span<const uint8_t>(reinterpret_cast<const uint8_t*>(bytes->data()), bytes->size()),
        "dump");
    ASSERT_TRUE(p.ok()) << p.status().message();
    ASSERT_EQ(p->kind, PackageKind::kPlan);
    EXPECT_EQ(p->plan.parallel.vpp, c.vpp);
    EXPECT_EQ(p->plan.parallel.cp, c.cp);
    if (c.layer_cut == "balanced") {
      // The cut the run printed ("layer cut: 3+1 (balanced), ...") is the plans'.
      const size_t at = run.output.find("layer cut: ");
      ASSERT_NE(at, std::string::npos) << run.output;
      const size_t from = at + std::string("layer cut: ").size();
      EXPECT_EQ(DescribeLayerCut(p->plan.parallel.layer_cut),
                run.output.substr(from, run.output.find(' ', from) - from));
    } else {
      EXPECT_EQ(DescribeLayerCut(p->plan.parallel.layer_cut),
                c.layer_cut.empty() ? "even" : c.layer_cut);
    }
    std::map<int64_t, Sample> by_id;
    for (const Sample& s : p->samples) by_id[s.id] = s;
    ReferenceBatch placed;  // rows of the reference: one sample, or a row attended as a whole
    for (const PlanReplica& rep : p->plan.replicas) {
      // The planner may run an interleaved replica in flexible rounds (docs/schedules.md).
      if (!(c.schedule == "interleaved" && rep.schedule == "interleaved-flex")) {
        EXPECT_EQ(rep.schedule, c.schedule);
      }
      EXPECT_GE(rep.micro_batches.size(), 2u) << "iteration " << i;
      for (const PlanMicroBatch& mb : rep.micro_batches) {
        shapes.insert({mb.shape.mbs, mb.shape.seqlen});
        recomputed += mb.recompute != Recompute::kNone ? 1 : 0;
        for (const auto& row : mb.rows) {
          packed_rows += row.size() > 1 ? 1 : 0;
          varlen_packed_rows += mb.varlen && row.size() > 1 ? 1 : 0;
          if (mb.varlen || row.size() == 1) {
            for (const int64_t id : row) placed.push_back({by_id.at(id)});
          } else {
            placed.emplace_back();
            for (const int64_t id : row) placed.back().push_back(by_id.at(id));
          }
        }
      }
    }
    for (const RankProgram& prog : p->plan.ranks) {
      for (const Instruction& in : prog.instructions) {
        split_backwards += in.op == OpKind::kBackwardInput ? 1 : 0;
      }
    }
    batches.push_back(std::move(placed));
  }
  EXPECT_GE(shapes.size(), 2u) << "micro-batch shapes did not vary";
  if (c.schedule == "zb-h1") EXPECT_GT(split_backwards, 0);
  if (c.method == "packing" || c.method == "multipack") EXPECT_GT(packed_rows, 0);
  if (c.method == "multipack" || c.method == "hydraulis") EXPECT_GT(varlen_packed_rows, 0);
  if (!c.recompute.empty()) EXPECT_GT(recomputed, 0);

  StatusOr<ReferenceResult> ref =
      RunReference(TestModel(c.model), kSeed, kLr, batches, /*grad_batch=*/0);
  ASSERT_TRUE(ref.ok()) << ref.status().message();

  const std::vector<double> losses = ReadLosses(dir + "/metrics.jsonl");
  ASSERT_GE(losses.size(), static_cast<size_t>(kIterations)) << run.output;
  for (int64_t i = 0; i < kIterations; ++i) {
    EXPECT_NEAR(losses[i], ref->losses[i], kTolerance * std::abs(ref->losses[i]))
        << "iteration " << i;
  }

  double worst = 0;
  double worst_abs = 0;
  ExpectGradientsMatch(dir, c.dp * c.pp * c.cp, ref->grads, &worst, &worst_abs);
  if (::testing::Test::HasFatalFailure()) return;

  // The reported peak tensor bytes of the rank that peaked cover at least its model states:
  // fp32 weights, gradients and the two AdamW moments, 16 bytes per parameter.
  std::ifstream metrics(dir + "/metrics.jsonl");
  for (std::string line; std::getline(metrics, line);) {
    if (line.empty()) continue;
    const nlohmann::json m = nlohmann::json::parse(line);
    ASSERT_TRUE(m.contains("peak_tensor_bytes")) << line;
    const int64_t rank = m.at("peak_tensor_rank").get<int64_t>();
    StatusOr<std::vector<NamedValues>> got = ReadNamedValues(dir + "/" + GradDumpName(0, rank));
    ASSERT_TRUE(got.ok()) << got.status().message();
    int64_t params = 0;
    for (const NamedValues& v : *got) params += static_cast<int64_t>(v.values.size());
    EXPECT_GE(m.at("peak_tensor_bytes").get<int64_t>(), 16 * params) << line;
  }
  std::printf(
      "largest relative error: loss %.2e, gradient %.2e (max |diff| %.2e; %zu "
      "parameters, %zu shapes)\n",
      std::max(std::abs(losses[0] / ref->losses[0] - 1), std::abs(losses[1] / ref->losses[1] - 1)),
      worst, worst_abs, ref->grads.size(), shapes.size());
  fs::remove_all(dir);
}

INSTANTIATE_TEST_SUITE_P(Schedules, PipelineTest, ::testing::ValuesIn(Cases()),
                         [](const auto& info) {
                           std::string n = info.param.name;
                           std::replace(n.begin(), n.end(), '-', '_');
                           return n;
                         });

// ---- Heterogeneous replicas (hetero_train.h) against the single-process reference ----

struct HeteroCase {
  std::string name;
  std::string replicas;  // --replicas
  int64_t processes;
  std::string max_seqlen;  // above the narrower group's longest sequence
};

void PrintTo(const HeteroCase& c, std::ostream* os) { *os << c.name; }

class HeteroTest : public ::testing::TestWithParam<HeteroCase> {};

// Two replica groups cut differently (a pp 2 replica beside a pp 1 one, or beside a cp 2 one).
// At 45 MB the pp 1 replica holds sequences up to 185 tokens, the pp 2 one up to 262 and the cp 2
// one up to 368; the batches (--max-seqlen 256, 320) hold sequences only the wider group holds,
// and they must go there. Every sample lands in exactly one group; the losses and every
// process's gradients equal the single-process reference of the whole batch.
TEST_P(HeteroTest, LossesAndGradientsMatchTheSingleProcessReference) {
  const HeteroCase& c = GetParam();
  const std::string dir = MakeDir(c.name);
  constexpr int64_t kIterations = 2;
  const Outcome run = RunSluice({"train",
                                 "--nproc",
                                 std::to_string(c.processes),
                                 "--model",
                                 "gpt-tiny",
                                 "--replicas",
                                 c.replicas,
                                 "--data",
                                 "mixture-4task",
                                 "--tokens-per-batch",
                                 "1200",
                                 "--max-seqlen",
                                 c.max_seqlen,
                                 "--memory-limit",
                                 "45",
                                 "--iterations",
                                 std::to_string(kIterations),
                                 "--seed",
                                 std::to_string(kSeed),
                                 "--lr",
                                 "0.001",
                                 "--threads",
                                 "1",
                                 "--timeout",
                                 "60",
                                 "--dump-dir",
                                 dir,
                                 "--metrics",
                                 dir + "/metrics.jsonl"},
                                dir);
  ASSERT_EQ(run.status, 0) << run.output;
  // "longest sequence per group: A / B"
  const size_t at = run.output.find("longest sequence per group: ");
  ASSERT_NE(at, std::string::npos) << run.output;
  std::istringstream caps(run.output.substr(at + 28));
  int64_t cap0 = 0, cap1 = 0;
  char slash = 0;
  caps >> cap0 >> slash >> cap1;
  ASSERT_GT(cap0, 0);
  ASSERT_GT(cap1, 0);
  const int64_t wide = cap0 > cap1 ? 0 : 1, narrow_cap = std::min(cap0, cap1);

  std::vector<ReferenceBatch> batches;
  int64_t routed_long = 0;
  for (int64_t i = 0; i < kIterations; ++i) {
    ReferenceBatch placed;
    std::map<int64_t, int64_t> group_of;  // sample id -> group
    std::vector<Sample> samples;
    for (int64_t g = 0; g < 2; ++g) {
      StatusOr<std::string> bytes = ReadFileToString(dir + "/" + GroupPackageDumpName(i, g));
      ASSERT_TRUE(bytes.ok()) << bytes.status().message();
      StatusOr<PlanPackage> p = DecodePackage(
          std::span<const uint8_t>(reinterpret_cast<const uint8_t*>(bytes->data()), bytes->size()),
          "dump");
      ASSERT_TRUE(p.ok()) << p.status().message();
      ASSERT_EQ(p->kind, PackageKind::kPlan);
      ASSERT_TRUE(p->plan.dropped.empty());
      if (g == 0) samples = p->samples;
      EXPECT_EQ(p->samples, samples) << "every group's package carries the whole batch";
      std::map<int64_t, Sample> by_id;
      for (const Sample& s : p->samples) by_id[s.id] = s;
      for (const PlanReplica& rep : p->plan.replicas) {
        EXPECT_GE(rep.micro_batches.size(), 1u);
        for (const PlanMicroBatch& mb : rep.micro_batches) {
          for (const auto& row : mb.rows) {
            if (mb.varlen || row.size() == 1) {
              for (const int64_t id : row) placed.push_back({by_id.at(id)});
            } else {
              placed.emplace_back();
              for (const int64_t id : row) placed.back().push_back(by_id.at(id));
            }
            for (const int64_t id : row) {
              EXPECT_TRUE(group_of.emplace(id, g).second) << "sample " << id << " placed twice";
            }
          }
        }
      }
    }
    ASSERT_EQ(group_of.size(), samples.size()) << "every sample lands once";
    std::set<int64_t> groups_used;
    for (const Sample& s : samples) {
      groups_used.insert(group_of.at(s.id));
      if (s.tokens() > narrow_cap) {  // only the wider group holds it
        EXPECT_EQ(group_of.at(s.id), wide) << "sample " << s.id << " of " << s.tokens();
        ++routed_long;
      }
    }
    EXPECT_EQ(groups_used.size(), 2u) << "both groups train";
    batches.push_back(std::move(placed));
  }
  EXPECT_GT(routed_long, 0) << "no sequence needed the wider group: the routing was not tested";

  StatusOr<ReferenceResult> ref =
      RunReference(TestModel("gpt-tiny"), kSeed, kLr, batches, /*grad_batch=*/0);
  ASSERT_TRUE(ref.ok()) << ref.status().message();
  const std::vector<double> losses = ReadLosses(dir + "/metrics.jsonl");
  ASSERT_GE(losses.size(), static_cast<size_t>(kIterations)) << run.output;
  double loss_error = 0;
  for (int64_t i = 0; i < kIterations; ++i) {
    EXPECT_NEAR(losses[i], ref->losses[i], kTolerance * std::abs(ref->losses[i]))
        << "iteration " << i;
    loss_error = std::max(loss_error, std::abs(losses[i] / ref->losses[i] - 1));
  }
  double worst = 0, worst_abs = 0, loss_abs = 0;
  for (int64_t i = 0; i < kIterations; ++i) {
    loss_abs = std::max(loss_abs, std::abs(losses[i] - ref->losses[i]));
  }
  ExpectGradientsMatch(dir, c.processes, ref->grads, &worst, &worst_abs);
  std::printf(
      "largest relative error: loss %.2e, gradient %.2e (max |diff|: loss %.2e, gradient "
      "%.2e); %ld sequences longer than %ld tokens routed to group %ld\n",
      loss_error, worst, loss_abs, worst_abs, static_cast<long>(routed_long),
      static_cast<long>(narrow_cap), static_cast<long>(wide + 1));
  if (!::testing::Test::HasFailure()) fs::remove_all(dir);
}

INSTANTIATE_TEST_SUITE_P(
    Replicas, HeteroTest,
    ::testing::Values(HeteroCase{"pp2_and_pp1", "dp=1,pp=2;dp=1,pp=1", 3, "256"},
                      HeteroCase{"pp2_and_cp2", "dp=1,pp=2;dp=1,cp=2", 4, "320"}),
    [](const auto& info) { return info.param.name; });

}  // namespace
}  // namespace sluice::runtime
