// Multi-process tests of what the runtime refuses and how it fails (CTest label `torch`, part of
// runtime_test): a plan for another model or with huge slot ids is rejected naming the field,
// training nothing is an error and a plan with rows longer than --max-seqlen is rejected; a
// killed, stopped or hung rank (or store server) makes the others exit non-zero naming it, a
// second job on a running job's port fails fast, the --nproc launcher stops the rest when one
// rank fails, and fault specs parse.
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

// One gpt-tiny batch planned at pp 2 (the flags `train` must repeat to run it).
std::vector<std::string> TinyPlanFlags() {
  return {"--parallel",         "pp=2", "--data",       "mixture-4task",
          "--tokens-per-batch", "600",  "--max-seqlen", "96",
          "--memory-limit",     "55",   "--iterations", "1"};
}

// Writes the plan of TinyPlanFlags() for gpt-tiny to `out`.
void PlanTinyGpt(const std::vector<std::string>& flags, const std::string& out,
                 const std::string& dir) {
  std::vector<std::string> plan = {"plan", "--model", "gpt-tiny", "--out", out};
  plan.insert(plan.end(), flags.begin(), flags.end());
  const Outcome planned = RunSluice(plan, dir, 60);
  ASSERT_EQ(planned.status, 0) << planned.output;
}

TEST(PlanCheckTest, PlanForAnotherModelIsRejectedNamingTheField) {
  const std::string dir = MakeDir("mismatch");
  const std::vector<std::string> common = TinyPlanFlags();
  ASSERT_NO_FATAL_FAILURE(PlanTinyGpt(common, dir + "/p.json", dir));

  std::vector<std::string> train = {"train",         "--nproc", "2",
                                    "--timeout",     "30",      "--plan",
                                    dir + "/p.json", "--model", ModelArg("gpt-tiny-6", dir)};
  train.insert(train.end(), common.begin(), common.end());
  const Outcome deeper = RunSluice(train, dir, 90);
  EXPECT_EQ(deeper.status, 2) << deeper.output;
  EXPECT_NE(deeper.output.find(dir + "/p.json: field 'model.layers': the plan has 4, this run "
                                     "has 6"),
            std::string::npos)
      << deeper.output;

  train[8] = "t5-tiny";
  const Outcome t5 = RunSluice(train, dir, 90);
  EXPECT_EQ(t5.status, 2) << t5.output;
  EXPECT_NE(t5.output.find("p.json: field 'model."), std::string::npos) << t5.output;

  // The same plan on its own model runs.
  train[8] = "gpt-tiny";
  const Outcome same = RunSluice(train, dir, 90);
  EXPECT_EQ(same.status, 0) << same.output;
  fs::remove_all(dir);
}

// A plan whose slot ids are huge (a 5 KB file naming slot 2^31 - 1) is rejected before any rank
// sizes its buffers by buffer_slots: slot ids are dense (plan/validate.h). It used to pass
// `plan check` and abort `train` with std::bad_alloc.
TEST(PlanCheckTest, PlanWithHugeSlotIdsIsRejectedBeforeAnythingAllocates) {
  const std::string dir = MakeDir("slots");
  const std::vector<std::string> common = TinyPlanFlags();
  ASSERT_NO_FATAL_FAILURE(PlanTinyGpt(common, dir + "/p.json", dir));
  StatusOr<ExecutionPlan> read = ReadPlanFile(dir + "/p.json");
  ASSERT_TRUE(read.ok()) << read.status().message();
  const int64_t offset = (int64_t{1} << 31) - 64;
  for (RankProgram& prog : read->ranks) {
    for (Instruction& in : prog.instructions) {
      for (int64_t& slot : in.inputs) slot += offset;
      for (int64_t& slot : in.outputs) slot += offset;
    }
    prog.buffer_slots += offset;
  }
  ASSERT_TRUE(WritePlanFile(*read, dir + "/huge.json").ok());
  std::vector<std::string> train = {"train",  "--nproc",          "2",       "--timeout", "30",
                                    "--plan", dir + "/huge.json", "--model", "gpt-tiny"};
  train.insert(train.end(), common.begin(), common.end());
  const Outcome o = RunSluice(train, dir, 90);
  EXPECT_EQ(o.status, 2) << o.output;
  EXPECT_NE(o.output.find("slot ids must be dense"), std::string::npos) << o.output;
  fs::remove_all(dir);
}

// Starts dp=1, pp=3 ranks the way torchrun does (one process each, env set, no launcher) with
// a fault injected into `victim`, and checks every other rank exits non-zero naming it.
void ExpectOthersExitNamingVictim(const std::string& kind, int64_t victim, int timeout_s) {
  const std::string dir = MakeDir("fault_" + kind);
  const int port = FreePort();
  const std::vector<std::string> args = {"train",
                                         "--model",
                                         ModelArg("gpt-tiny-6", dir),
                                         "--parallel",
                                         "pp=3",
                                         "--data",
                                         "mixture-4task",
                                         "--tokens-per-batch",
                                         "600",
                                         "--max-seqlen",
                                         "96",
                                         "--memory-limit",
                                         "55",
                                         "--iterations",
                                         "4",
                                         "--threads",
                                         "1",
                                         "--timeout",
                                         std::to_string(timeout_s),
                                         "--fault",
                                         fmt::format("{}:1:{}", victim, kind)};
  std::vector<Process> ranks;
  for (int r = 0; r < 3; ++r) {
    ranks.push_back(Spawn(args,
                          {{"RANK", std::to_string(r)},
                           {"WORLD_SIZE", "3"},
                           {"MASTER_ADDR", "127.0.0.1"},
                           {"MASTER_PORT", std::to_string(port)}},
                          fmt::format("{}/rank{}.log", dir, r)));
  }
  const double deadline = 3.0 * timeout_s + 60;
  for (int r = 0; r < 3; ++r) {
    if (r == victim) continue;
    const Outcome o = Wait(ranks[r], deadline);
    EXPECT_NE(o.status, 0) << "rank " << r << ":\n" << o.output;
    EXPECT_NE(o.status, -1) << "rank " << r << " did not exit by itself:\n" << o.output;
    EXPECT_NE(o.output.find(fmt::format("rank {}", victim)), std::string::npos)
        << "rank " << r << ":\n"
        << o.output;
  }
  const Outcome v = Wait(ranks[victim], kind == "stop" || kind == "hang" ? 0.1 : deadline);
  EXPECT_NE(v.status, 0);
  fs::remove_all(dir);
}

TEST(FailureTest, KilledRankMakesTheOthersExitNamingIt) {
  ExpectOthersExitNamingVictim("kill", 1, 10);
}
TEST(FailureTest, KilledStoreServerMakesTheOthersExitNamingIt) {
  ExpectOthersExitNamingVictim("kill", 0, 10);
}
TEST(FailureTest, StoppedRankMakesTheOthersExitNamingIt) {
  ExpectOthersExitNamingVictim("stop", 2, 5);
}
TEST(FailureTest, HungRankMakesTheOthersExitNamingIt) {
  ExpectOthersExitNamingVictim("hang", 1, 5);
}

// The store's server stopped (SIGSTOP on rank 0): every store operation is bounded, so the
// others exit naming rank 0 (they used to block forever in TCPStore::add).
TEST(FailureTest, StoppedStoreServerMakesTheOthersExitNamingIt) {
  ExpectOthersExitNamingVictim("stop", 0, 5);
}

// A rank that never starts: the present ones exit within the timeout naming it.
TEST(FailureTest, MissingRankIsNamedWithinTheTimeout) {
  const std::string dir = MakeDir("missing");
  const std::vector<std::string> args = {"train",
                                         "--timeout",
                                         "3",
                                         "--iterations",
                                         "1",
                                         "--data",
                                         "mixture-4task",
                                         "--max-seqlen",
                                         "96",
                                         "--tokens-per-batch",
                                         "600",
                                         "--memory-limit",
                                         "55"};
  for (const int present : {0, 1}) {
    const Process p = Spawn(args,
                            {{"RANK", std::to_string(present)},
                             {"WORLD_SIZE", "2"},
                             {"MASTER_PORT", std::to_string(FreePort())}},
                            fmt::format("{}/rank{}.log", dir, present));
    const Outcome o = Wait(p, 60);
    EXPECT_EQ(o.status, 1) << o.output;
    EXPECT_LE(o.seconds, 3 + 5) << o.output;
    EXPECT_NE(o.output.find(present == 0 ? "rank 1 did not join" : "rank 0, which serves it"),
              std::string::npos)
        << o.output;
  }
  fs::remove_all(dir);
}

// A second job on a running job's MASTER_PORT fails fast and the first finishes untouched.
TEST(FailureTest, SecondJobOnTheSamePortFailsFastAndLeavesTheFirst) {
  const std::string dir = MakeDir("second_job");
  const std::string port = std::to_string(FreePort());
  const std::vector<std::string> common = {"train",
                                           "--nproc",
                                           "2",
                                           "--data",
                                           "mixture-4task",
                                           "--max-seqlen",
                                           "96",
                                           "--tokens-per-batch",
                                           "600",
                                           "--memory-limit",
                                           "55",
                                           "--threads",
                                           "1",
                                           "--timeout",
                                           "20"};
  std::vector<std::string> first = common;
  first.insert(first.end(), {"--iterations", "60"});
  const Process a = Spawn(first, {{"MASTER_PORT", port}}, dir + "/a.log");
  const Clock::time_point start = Clock::now();
  bool running = false;
  while (!running && Clock::now() - start < std::chrono::seconds(60)) {
    std::this_thread::sleep_for(std::chrono::milliseconds(50));
    StatusOr<std::string> log = ReadFileToString(dir + "/a.log");
    running = log.ok() && log->find("iter    0") != std::string::npos;
  }
  ASSERT_TRUE(running) << *ReadFileToString(dir + "/a.log");
  std::vector<std::string> second = common;
  second.insert(second.end(), {"--iterations", "2"});
  const Outcome b = Wait(Spawn(second, {{"MASTER_PORT", port}}, dir + "/b.log"), 60);
  EXPECT_NE(b.status, 0) << b.output;
  EXPECT_LE(b.seconds, 15) << b.output;
  EXPECT_TRUE(b.output.find("Address already in use") != std::string::npos ||
              b.output.find("serves run id") != std::string::npos)
      << b.output;
  const Outcome ao = Wait(a, 240);
  EXPECT_EQ(ao.status, 0) << ao.output;
  EXPECT_NE(ao.output.find("trained 60 iterations"), std::string::npos) << ao.output;
  fs::remove_all(dir);
}

// `--iterations` bounds the batches considered; training nothing is an error, not exit 0
// with one "skipped" line per batch of the epoch.
TEST(TrainCheckTest, TrainingNothingIsAnError) {
  const std::string dir = MakeDir("nothing");
  const Outcome o = RunSluice(
      {"train", "--nproc", "2", "--iterations", "2", "--memory-limit", "26", "--timeout", "30"},
      dir, 120);
  EXPECT_EQ(o.status, 2) << o.output;
  EXPECT_NE(o.output.find("nothing to train: all 2 batches considered (--iterations 2) were "
                          "skipped"),
            std::string::npos)
      << o.output;
  size_t lines = 0;
  for (size_t at = o.output.find("skipped:"); at != std::string::npos;
       at = o.output.find("skipped:", at + 1)) {
    ++lines;
  }
  EXPECT_LE(lines, 1u) << o.output;
  fs::remove_all(dir);
}

// A plan made with a larger --max-seqlen than the run's would train clipped samples.
TEST(TrainCheckTest, PlanWithRowsLongerThanMaxSeqlenIsRejected) {
  const std::string dir = MakeDir("seqlen");
  const std::vector<std::string> common = TinyPlanFlags();
  ASSERT_NO_FATAL_FAILURE(PlanTinyGpt(common, dir + "/p.json", dir));
  std::vector<std::string> train = {"train",  "--nproc",       "2",       "--timeout", "30",
                                    "--plan", dir + "/p.json", "--model", "gpt-tiny"};
  train.insert(train.end(), common.begin(), common.end());
  *std::find(train.begin(), train.end(), "96") = "24";  // --max-seqlen 24
  const Outcome o = RunSluice(train, dir, 90);
  EXPECT_EQ(o.status, 2) << o.output;
  EXPECT_NE(o.output.find("clips samples at --max-seqlen 24: the plan was made with a larger "
                          "--max-seqlen (at least"),
            std::string::npos)
      << o.output;
  fs::remove_all(dir);
}

TEST(FailureTest, LauncherStopsTheOtherRanksWhenOneFails) {
  const std::string dir = MakeDir("launcher");
  const Outcome o = RunSluice({"train",
                               "--nproc",
                               "3",
                               "--model",
                               ModelArg("gpt-tiny-6", dir),
                               "--parallel",
                               "pp=3",
                               "--data",
                               "mixture-4task",
                               "--tokens-per-batch",
                               "600",
                               "--max-seqlen",
                               "96",
                               "--memory-limit",
                               "55",
                               "--iterations",
                               "4",
                               "--threads",
                               "1",
                               "--timeout",
                               "30",
                               "--fault",
                               "2:1:exit"},
                              dir, 120);
  EXPECT_EQ(o.status, 1) << o.output;
  EXPECT_NE(o.output.find("rank 2 (pid"), std::string::npos) << o.output;
  EXPECT_NE(o.output.find("exited with status 3"), std::string::npos) << o.output;
  fs::remove_all(dir);
}

TEST(FaultSpecTest, Parses) {
  StatusOr<FaultSpec> f = ParseFault("2:5:kill");
  ASSERT_TRUE(f.ok());
  EXPECT_EQ(f->rank, 2);
  EXPECT_EQ(f->iteration, 5);
  EXPECT_EQ(f->kind, FaultSpec::Kind::kKill);
  for (const char* bad : {"", "2:5", "x:1:kill", "1:1:explode", "-1:1:kill", "1:1:"}) {
    EXPECT_FALSE(ParseFault(bad).ok()) << bad;
  }
}

}  // namespace
}  // namespace sluice::runtime
