// Helpers of the runtime's multi-process tests (runtime_test_util.h).
#include "runtime/runtime_test_util.h"

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
#include "runtime/trainer.h"

namespace sluice::runtime {
namespace {

namespace fs = std::filesystem;
using Clock = std::chrono::steady_clock;

}  // namespace

std::string Binary() {
  const char* b = std::getenv("SLUICE_BINARY");
  return b != nullptr ? b : "sluice";
}

// A port that was free a moment ago (the kernel's choice for port 0).
int FreePort() {
  const int fd = socket(AF_INET, SOCK_STREAM, 0);
  sockaddr_in addr{};
  addr.sin_family = AF_INET;
  addr.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
  addr.sin_port = 0;
  SLUICE_CHECK(bind(fd, reinterpret_cast<sockaddr*>(&addr), sizeof(addr)) == 0);
  socklen_t len = sizeof(addr);
  SLUICE_CHECK(getsockname(fd, reinterpret_cast<sockaddr*>(&addr), &len) == 0);
  close(fd);
  return ntohs(addr.sin_port);
}

std::string MakeDir(const std::string& name) {
  const fs::path dir =
      fs::path(::testing::TempDir()) / ("sluice_rt_" + name + "_" + std::to_string(getpid()));
  fs::remove_all(dir);
  fs::create_directories(dir);
  return dir.string();
}

// Starts the sluice binary with `args` and extra environment, output to `log`.
Process Spawn(const std::vector<std::string>& args, const std::map<std::string, std::string>& env,
              const std::string& log) {
  Process p;
  p.log = log;
  p.pid = fork();
  SLUICE_CHECK(p.pid >= 0);
  if (p.pid == 0) {
    setpgid(0, 0);
    for (const char* v : {"RANK", "WORLD_SIZE", "LOCAL_RANK", "LOCAL_WORLD_SIZE", "MASTER_ADDR",
                          "MASTER_PORT", "SLUICE_LAUNCHED"}) {
      unsetenv(v);
    }
    for (const auto& [k, v] : env) setenv(k.c_str(), v.c_str(), 1);
    const int fd = open(log.c_str(), O_WRONLY | O_CREAT | O_TRUNC, 0644);
    dup2(fd, 1);
    dup2(fd, 2);
    std::vector<std::string> all = {Binary()};
    all.insert(all.end(), args.begin(), args.end());
    std::vector<char*> argv;
    for (std::string& a : all) argv.push_back(a.data());
    argv.push_back(nullptr);
    execv(argv[0], argv.data());
    _exit(127);
  }
  return p;
}

// Waits for `p` up to `deadline_s`; kills its process group when it overruns.
Outcome Wait(const Process& p, double deadline_s) {
  Outcome o;
  const Clock::time_point start = Clock::now();
  for (;;) {
    int status = 0;
    const pid_t r = waitpid(p.pid, &status, WNOHANG);
    if (r == p.pid) {
      o.status = WIFEXITED(status) ? WEXITSTATUS(status) : 128 + WTERMSIG(status);
      break;
    }
    if (std::chrono::duration<double>(Clock::now() - start).count() > deadline_s) {
      kill(-p.pid, SIGKILL);
      kill(p.pid, SIGKILL);
      waitpid(p.pid, &status, 0);
      o.status = -1;
      break;
    }
    std::this_thread::sleep_for(std::chrono::milliseconds(20));
  }
  o.seconds = std::chrono::duration<double>(Clock::now() - start).count();
  o.output = *ReadFileToString(p.log);
  return o;
}

Outcome RunSluice(const std::vector<std::string>& args, const std::string& dir, double deadline_s) {
  const Process p = Spawn(args, {{"MASTER_PORT", std::to_string(FreePort())}}, dir + "/sluice.log");
  return Wait(p, deadline_s);
}

ModelSpec Preset(const std::string& name) { return *ModelPreset(name); }

// The test models: the tiny presets, and variants whose layers divide by 3 and 6.
ModelSpec TestModel(const std::string& name) {
  if (name == "gpt-tiny-6") {
    ModelSpec m = Preset("gpt-tiny");
    m.name = name;
    m.layers = 6;
    return m;
  }
  if (name == "gpt-tiny-moe-top1") {  // gpt-tiny-moe with Switch top-1 routing, factor 1.0
    ModelSpec m = Preset("gpt-tiny-moe");
    m.name = name;
    m.moe->top_k = 1;
    m.moe->capacity_factor = 1.0;
    return m;
  }
  if (name == "gpt-tiny-moe-position") {  // gpt-tiny-moe (top-2) dropping by token position
    ModelSpec m = Preset("gpt-tiny-moe");
    m.name = name;
    m.moe->drop_policy = MoeDropPolicy::kPosition;
    return m;
  }
  if (name == "t5-tiny-moe") {  // MoE in every encoder and decoder layer, Switch top-1
    ModelSpec m = Preset("t5-tiny");
    m.name = name;
    m.moe = MoeSpec{.experts = 4, .top_k = 1, .capacity_factor = 1.0, .layer_interval = 1};
    return m;
  }
  if (name == "t5-tiny-3") {
    ModelSpec m = Preset("t5-tiny");
    m.name = name;
    m.layers = 3;
    m.decoder_layers = 3;
    return m;
  }
  return Preset(name);
}

// The --model argument: a preset name, or a JSON file written into `dir`.
std::string ModelArg(const std::string& name, const std::string& dir) {
  if (name == "gpt-tiny" || name == "t5-tiny" || name == "gpt-tiny-moe") return name;
  const std::string path = dir + "/" + name + ".json";
  SLUICE_CHECK(WriteStringToFile(path, ModelSpecToJson(TestModel(name)).dump()).ok());
  return path;
}

std::vector<double> ReadLosses(const std::string& path) {
  std::vector<double> out;
  std::ifstream in(path);
  std::string line;
  while (std::getline(in, line)) {
    if (!line.empty()) out.push_back(nlohmann::json::parse(line).at("loss").get<double>());
  }
  return out;
}

// max |a - b| / max |b| over a tensor (0 when both are 0).
double RelativeError(const std::vector<float>& a, const std::vector<float>& b) {
  double diff = 0, scale = 0;
  for (size_t i = 0; i < a.size(); ++i) {
    diff = std::max(diff, std::abs(static_cast<double>(a[i]) - b[i]));
    scale = std::max(scale, std::abs(static_cast<double>(b[i])));
  }
  return scale > 0 ? diff / scale : diff;
}

// Every rank's gradient dump of iteration 0 in `dir` against the reference's: each parameter
// within kTolerance (relative), known, and every reference parameter on some rank. `worst` gets
// the largest relative error, `worst_abs` (when given) the largest absolute difference.
void ExpectGradientsMatch(const std::string& dir, int64_t ranks,
                          const std::vector<NamedValues>& reference, double* worst,
                          double* worst_abs) {
  std::map<std::string, const NamedValues*> expected;
  for (const NamedValues& v : reference) expected[v.name] = &v;
  std::set<std::string> seen;
  for (int64_t r = 0; r < ranks; ++r) {
    StatusOr<std::vector<NamedValues>> got = ReadNamedValues(dir + "/" + GradDumpName(0, r));
    ASSERT_TRUE(got.ok()) << got.status().message();
    for (const NamedValues& v : *got) {
      ASSERT_TRUE(expected.count(v.name)) << "rank " << r << " has unknown parameter " << v.name;
      const NamedValues& e = *expected[v.name];
      ASSERT_EQ(v.values.size(), e.values.size()) << v.name;
      const double err = RelativeError(v.values, e.values);
      *worst = std::max(*worst, err);
      for (size_t i = 0; worst_abs != nullptr && i < v.values.size(); ++i) {
        *worst_abs = std::max(*worst_abs, std::abs(static_cast<double>(v.values[i]) -
                                                   static_cast<double>(e.values[i])));
      }
      EXPECT_LE(err, kTolerance) << "rank " << r << ", gradient of " << v.name;
      seen.insert(v.name);
    }
  }
  EXPECT_EQ(seen.size(), expected.size()) << "some parameters are on no rank";
}

}  // namespace sluice::runtime
