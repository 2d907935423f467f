#include "cli/cli_common.h"

#include <fmt/core.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <charconv>
#include <cmath>
#include <csignal>
#include <cstdio>
#include <cstring>
#include <filesystem>

#include "plan/plan_json.h"

namespace sluice::cli {
namespace {

// Set by SIGINT; a signal handler can only reach a variable of static storage.
volatile std::sig_atomic_t g_interrupted = 0;

extern "C" void OnInterrupt(int) {
  g_interrupted = 1;
  std::signal(SIGINT, SIG_DFL);  // a second Ctrl-C ends the process at once
}

}  // namespace

CLI::Validator NumberCheck(double min, bool min_exclusive, double max, std::string allowed) {
  return CLI::Validator(
      [=](std::string& input) -> std::string {
        double v = 0;
        const char* end = input.data() + input.size();
        auto [ptr, ec] = std::from_chars(input.data(), end, v);
        const bool ok = ec == std::errc() && ptr == end && std::isfinite(v) &&
                        (min_exclusive ? v > min : v >= min) && v <= max;
        return ok ? std::string()
                  : fmt::format("'{}' is not allowed; allowed: {}", input, allowed);
      },
      "");
}

Status CheckOutputFile(std::string_view flag, const std::string& path) {
  namespace fs = std::filesystem;
  std::error_code ec;
  if (path.empty()) return InvalidArgumentError(fmt::format("{}: the path is empty", flag));
  if (fs::is_directory(path, ec)) {
    return InvalidArgumentError(
        fmt::format("{} '{}': is a folder; allowed: a file path in a writable folder", flag, path));
  }
  const fs::path parent = fs::path(path).parent_path();
  const std::string dir = parent.empty() ? "." : parent.string();
  if (!fs::is_directory(dir, ec)) {
    return InvalidArgumentError(fmt::format("{} '{}': the folder '{}' does not exist", flag, path,
                                            dir));
  }
  // Opening is the only reliable test (permissions, read-only or special file systems, root);
  // append mode leaves an existing file as it is, and a file made here is removed again.
  const bool existed = fs::exists(path, ec);
  std::FILE* probe = std::fopen(path.c_str(), "ab");
  if (probe == nullptr) {
    return InvalidArgumentError(
        fmt::format("{} '{}': cannot write there ({})", flag, path, std::strerror(errno)));
  }
  std::fclose(probe);
  if (!existed) fs::remove(path, ec);
  return Status::Ok();
}

Status PrepareOutputDir(std::string_view flag, const std::string& dir) {
  namespace fs = std::filesystem;
  std::error_code ec;
  if (dir.empty()) return InvalidArgumentError(fmt::format("{}: the folder name is empty", flag));
  fs::create_directories(dir, ec);
  if (ec || !fs::is_directory(dir)) {
    return InvalidArgumentError(fmt::format("{} '{}': cannot create the folder ({})", flag, dir,
                                            ec ? ec.message() : "a file of that name exists"));
  }
  const std::string probe_path =
      (fs::path(dir) / fmt::format(".sluice-write-test-{}", ::getpid())).string();
  std::FILE* probe = std::fopen(probe_path.c_str(), "wb");
  if (probe == nullptr) {
    return InvalidArgumentError(
        fmt::format("{} '{}': cannot write into the folder ({})", flag, dir, std::strerror(errno)));
  }
  std::fclose(probe);
  fs::remove(probe_path, ec);
  return Status::Ok();
}

InterruptGuard::InterruptGuard() {
  g_interrupted = 0;
  previous_ = std::signal(SIGINT, OnInterrupt);
}

InterruptGuard::~InterruptGuard() {
  std::signal(SIGINT, previous_ == SIG_ERR ? SIG_DFL : previous_);
}

bool Interrupted() { return g_interrupted != 0; }

int ExitCodeFor(const Status& status) {
  switch (status.code()) {
    case StatusCode::kOk:
      return kExitOk;
    case StatusCode::kInvalidArgument:
    case StatusCode::kNotFound:
      return kExitBadInput;
    default:
      return kExitFailed;
  }
}

void SetHandler(CLI::App* sub, RunState* state, std::function<Status()> handler) {
  sub->callback([state, handler = std::move(handler)] { state->status = handler(); });
}

CLI::Option* AddModelFlag(CLI::App* app, std::string* model) {
  return app->add_option("--model", *model, "Model: a preset (gpt-6.7b, t5-11b, gpt-tiny, ...) "
                                            "or a JSON ModelSpec file")
      ->type_name("NAME|FILE");
}

CLI::Option* AddClusterFlag(CLI::App* app, std::string* cluster) {
  return app->add_option("--cluster", *cluster,
                         "Devices: PRESET:N (a100-40g:8, h100-80g:64, cpu:2; a100-40g, a100-80g, h100-80g "
                         "or cpu alone = 8 devices) or a JSON ClusterSpec file")
      ->type_name("PRESET:N|FILE");
}

CLI::Option* AddParallelFlag(CLI::App* app, std::string* parallel) {
  return app->add_option("--parallel", *parallel,
                         "Parallelism: K=V,... with dp, pp, tp, ep, vpp, zero, memory_limit_mb "
                         "(a key left out of the value is 1, zero 0), or a JSON file")
      ->type_name("K=V,...|FILE");
}

CLI::Option* AddDataFlag(CLI::App* app, std::string* data) {
  return app->add_option("--data", *data,
                         "Lengths: a .txt/.jsonl/.csv file or a preset (see `sluice data presets`)")
      ->type_name("FILE|PRESET");
}

CLI::Option* AddSeedFlag(CLI::App* app, uint64_t* seed) {
  return app->add_option("--seed", *seed, "Seed of all randomness")
      ->check(NumberCheck(0, false, kNoMax, "an integer >= 0"))
      ->capture_default_str();
}

CLI::Option* AddMemoryReserveFlag(CLI::App* app, double* reserve_mb) {
  return app
      ->add_option("--memory-reserve", *reserve_mb,
                   "MB (10^6 bytes) held back from the device's memory for the CUDA context, NCCL "
                   "buffers and fragmentation when no --memory-limit is given (default: 2 GiB + "
                   "5% of the device's memory, e.g. 4,295 MB of an A100-40GB's 42,950 MB)")
      ->type_name("MB")
      ->check(NumberCheck(0, false, 1e9, "a size in MB in [0, 1e9]"));
}

CLI::Option* AddMaxSeqlenFlag(CLI::App* app, int64_t* max_seqlen) {
  return app->add_option("--max-seqlen", *max_seqlen, "Longest sequence (tokens) a batch may hold")
      ->check(NumberCheck(1, false, kNoMax, "an integer >= 1"))
      ->capture_default_str();
}

CLI::Option* AddTokensPerBatchFlag(CLI::App* app, int64_t* tokens) {
  return app->add_option("--tokens-per-batch", *tokens,
                         "Global batch token budget: input + target tokens of the samples "
                         "(padding not counted)")
      ->check(NumberCheck(1, false, kNoMax, "an integer >= 1"))
      ->capture_default_str();
}

StatusOr<ExecutionPlan> ReadPlanFileOrSay(const std::string& path) {
  std::error_code ec;
  if (!std::filesystem::exists(path, ec)) {
    // `plan --out PATH` with several batches writes PATH-<batch>.<ext> (cmd_plan.cc, OutPath).
    const size_t dot = path.rfind('.');
    const size_t slash = path.rfind('/');
    const bool has_ext = dot != std::string::npos && (slash == std::string::npos || dot > slash);
    const std::string stem = has_ext ? path.substr(0, dot) : path;
    const std::string ext = has_ext ? path.substr(dot) : "";
    const std::filesystem::path stem_path(stem);
    std::filesystem::path dir = stem_path.parent_path();
    if (dir.empty()) dir = ".";
    const std::string prefix = stem_path.filename().string() + "-";
    std::string first;
    int64_t first_index = -1, count = 0;
    for (const auto& entry : std::filesystem::directory_iterator(dir, ec)) {
      const std::string name = entry.path().filename().string();
      if (!name.starts_with(prefix) || !name.ends_with(ext) ||
          name.size() <= prefix.size() + ext.size()) {
        continue;
      }
      const std::string digits =
          name.substr(prefix.size(), name.size() - prefix.size() - ext.size());
      if (!std::all_of(digits.begin(), digits.end(), [](char c) { return c >= '0' && c <= '9'; }) ||
          digits.size() > 9) {
        continue;
      }
      ++count;
      const int64_t index = std::stoll(digits);
      if (first_index < 0 || index < first_index) {
        first_index = index;
        first = (dir / name).string();
        if (stem_path.parent_path().empty()) first = name;
      }
    }
    if (count > 0) {
      return NotFoundError(fmt::format(
          "{}: no such file; `sluice plan --out {}` with several batches writes one file per "
          "batch, {}-<batch>{} ({} here, e.g. {}): give one of those, or plan with "
          "--iterations 1",
          path, path, stem, ext, count, first));
    }
  }
  return ReadPlanFile(path);
}

}  // namespace sluice::cli
