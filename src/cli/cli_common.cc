#include "cli/cli_common.h"

#include <fcntl.h>
#include <fmt/core.h>
#include <sys/stat.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <charconv>
#include <cmath>
#include <csignal>
#include <cstdio>
#include <cstring>
#include <filesystem>
#include <new>

#include "base/files.h"

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

CLI::Validator IntegerCheck(int64_t min, int64_t max, std::string allowed_text) {
  if (allowed_text.empty()) {
    allowed_text = max == std::numeric_limits<int64_t>::max()
                       ? fmt::format("an integer >= {}", min)
                       : fmt::format("an integer in [{}, {}]", min, max);
  }
  return CLI::Validator(
      [=](std::string& input) -> std::string {
        const std::string allowed = "allowed: " + allowed_text;
        const char* begin = input.data();
        const char* end = begin + input.size();
        if (begin != end && *begin == '+') ++begin;
        int64_t v = 0;
        auto [ptr, ec] = std::from_chars(begin, end, v);
        if (begin == end || ptr != end ||
            (ec != std::errc() && ec != std::errc::result_out_of_range)) {
          return fmt::format("'{}' is not an integer; {}", input, allowed);
        }
        if (ec == std::errc::result_out_of_range) {
          return fmt::format("{} is out of range; allowed: {}..{}", input, min, max);
        }
        if (v < min || v > max) return fmt::format("'{}' is not allowed; {}", input, allowed);
        return std::string();
      },
      "");
}

CLI::Validator FiniteCheck(bool allow_negative) {
  return CLI::Validator(
      [=](std::string& input) -> std::string {
        double v = 0;
        const char* end = input.data() + input.size();
        auto [ptr, ec] = std::from_chars(input.data(), end, v);
        const bool ok =
            ec == std::errc() && ptr == end && std::isfinite(v) && (allow_negative || v >= 0);
        return ok ? std::string()
                  : fmt::format("'{}' is not allowed; allowed: a finite number{}", input,
                                allow_negative ? "" : " >= 0");
      },
      "");
}

CLI::Validator PathCheck() {
  return CLI::Validator(
      [](std::string& input) -> std::string {
        return input.empty() ? "the path is empty; allowed: a path" : std::string();
      },
      "");
}

Status CheckOutputFile(std::string_view flag, const std::string& path) {
  namespace fs = std::filesystem;
  std::error_code ec;
  if (path.empty()) {
    return InvalidArgumentError(fmt::format("{}: the path is empty; allowed: a path", flag));
  }
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
  // Opening is the only reliable test (permissions, read-only or special file systems, root).
  // A device or pipe is written in place: open it. A file is written as a temporary file beside
  // it and renamed (base/files.h): make one there and remove it again.
  struct stat st;
  if (::stat(path.c_str(), &st) == 0 && !S_ISREG(st.st_mode)) {
    const int fd = ::open(path.c_str(), O_WRONLY | O_NONBLOCK | O_CLOEXEC);
    if (fd < 0) {
      return InvalidArgumentError(
          fmt::format("{} '{}': cannot write there ({})", flag, path, std::strerror(errno)));
    }
    ::close(fd);
    return Status::Ok();
  }
  std::string probe = path + ".tmp-XXXXXX";
  const int fd = ::mkstemp(probe.data());
  if (fd < 0) {
    return InvalidArgumentError(
        fmt::format("{} '{}': cannot write there ({})", flag, path, std::strerror(errno)));
  }
  ::close(fd);
  ::unlink(probe.c_str());
  return Status::Ok();
}

Status CheckNotAnInput(std::string_view flag, const std::string& path,
                       const std::vector<NamedInput>& inputs) {
  for (const NamedInput& in : inputs) {
    // An input that does not exist is reported by its reader ("cannot open"), not here.
    std::error_code ec;
    if (std::filesystem::exists(in.path, ec) && SameFile(path, in.path)) {
      return InvalidArgumentError(fmt::format(
          "{} '{}' and {} '{}' are the same file: writing the output would destroy the input; "
          "allowed: an output path that is not an input",
          flag, path, in.flag, in.path));
    }
  }
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

std::string CommandName(const CLI::App* sub) {
  std::string name;
  for (const CLI::App* a = sub; a != nullptr && a->get_parent() != nullptr; a = a->get_parent()) {
    name = name.empty() ? a->get_name() : a->get_name() + " " + name;
  }
  return name.empty() ? "sluice" : name;
}

Status RunGuarded(std::string_view command, const std::function<Status()>& handler) {
  try {
    return handler();
  } catch (const std::bad_alloc&) {
    return FailedPreconditionError(fmt::format(
        "{}: out of memory: the inputs ask for more memory than this machine gives (a smaller "
        "--samples, --iterations, model or plan needs less)",
        command));
  } catch (const std::exception& e) {
    // c10::Error and others carry a C++ stack trace after the first line: keep the first.
    std::string what = e.what();
    const size_t nl = what.find('\n');
    if (nl != std::string::npos) what = what.substr(0, nl);
    // libtorch's allocators throw c10::Error, not std::bad_alloc.
    if (what.find("can't allocate memory") != std::string::npos ||
        what.find("not enough memory") != std::string::npos ||
        what.find("out of memory") != std::string::npos) {
      return FailedPreconditionError(fmt::format(
          "{}: out of memory: the inputs ask for more memory than this machine gives ({})",
          command, what));
    }
    return InternalError(fmt::format("{}: failed with an unexpected error: {}", command, what));
  }
}

void SetHandler(CLI::App* sub, RunState* state, std::function<Status()> handler) {
  sub->callback([sub, state, handler = std::move(handler)] {
    state->status = RunGuarded(CommandName(sub), handler);
  });
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
                         "Parallelism: K=V,... with dp, pp, tp, cp, ep, vpp, zero, memory_limit_mb, "
                         "layer_cut (e.g. 9+8+8+7) and order (tp-cp-dp-pp, the default, or "
                         "tp-cp-pp-dp) (a key left out of the value is 1, zero 0), or a JSON file")
      ->type_name("K=V,...|FILE");
}

CLI::Option* AddDataFlag(CLI::App* app, std::string* data) {
  return app->add_option("--data", *data,
                         "Lengths: a .txt/.jsonl/.csv file or a preset (see `sluice data presets`)")
      ->type_name("FILE|PRESET");
}

CLI::Option* AddSeedFlag(CLI::App* app, uint64_t* seed) {
  return app->add_option("--seed", *seed, "Seed of all randomness")
      ->check(IntegerCheck(0, std::numeric_limits<int64_t>::max()))
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
      ->check(IntegerCheck(1, std::numeric_limits<int64_t>::max()))
      ->capture_default_str();
}

CLI::Option* AddTokensPerBatchFlag(CLI::App* app, int64_t* tokens) {
  return app->add_option("--tokens-per-batch", *tokens,
                         "Global batch token budget: input + target tokens of the samples "
                         "(padding not counted)")
      ->check(IntegerCheck(1, std::numeric_limits<int64_t>::max()))
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
