#include "runtime/launcher.h"

#include <fmt/core.h>
#include <signal.h>
#include <sys/prctl.h>
#include <sys/wait.h>
#include <unistd.h>

#include <charconv>
#include <cstdlib>
#include <cstring>
#include <fstream>
#include <iterator>
#include <thread>

namespace sluice::runtime {
namespace {

// The integer value of environment variable `name`, or `fallback` when unset.
StatusOr<int64_t> EnvInt(const char* name, int64_t fallback, int64_t min, int64_t max) {
  const char* v = std::getenv(name);
  if (v == nullptr || *v == '\0') return fallback;
  int64_t out = 0;
  const char* end = v + std::strlen(v);
  auto [ptr, ec] = std::from_chars(v, end, out);
  if (ec != std::errc() || ptr != end || out < min || out > max) {
    return InvalidArgumentError(fmt::format(
        "environment variable {}='{}': must be an integer in [{}, {}]", name, v, min, max));
  }
  return out;
}

std::string DescribeExit(int status) {
  if (WIFEXITED(status)) return fmt::format("exited with status {}", WEXITSTATUS(status));
  if (WIFSIGNALED(status)) {
    const int sig = WTERMSIG(status);
    return fmt::format("was killed by signal {} ({})", sig, strsignal(sig));
  }
  return fmt::format("ended with wait status {}", status);
}

}  // namespace

StatusOr<DistEnv> ReadDistEnv() {
  DistEnv env;
  const bool has_rank = std::getenv("RANK") != nullptr;
  const bool has_world = std::getenv("WORLD_SIZE") != nullptr;
  if (has_rank != has_world) {
    return InvalidArgumentError(
        "environment: RANK and WORLD_SIZE must be set together (torchrun sets both)");
  }
  SLUICE_ASSIGN_OR_RETURN(env.world_size, EnvInt("WORLD_SIZE", 1, 1, 1 << 20));
  SLUICE_ASSIGN_OR_RETURN(env.rank, EnvInt("RANK", 0, 0, env.world_size - 1));
  SLUICE_ASSIGN_OR_RETURN(env.local_world_size,
                          EnvInt("LOCAL_WORLD_SIZE", env.world_size, 1, 1 << 20));
  SLUICE_ASSIGN_OR_RETURN(env.local_rank, EnvInt("LOCAL_RANK", env.rank, 0, 1 << 20));
  SLUICE_ASSIGN_OR_RETURN(const int64_t port,
                          EnvInt("MASTER_PORT", kDefaultMasterPort, 1, 65535));
  env.master_port = static_cast<int>(port);
  if (const char* addr = std::getenv("MASTER_ADDR"); addr != nullptr && *addr != '\0') {
    env.master_addr = addr;
  }
  for (const char* name : {kRunIdEnv, "TORCHELASTIC_RUN_ID"}) {
    if (const char* v = std::getenv(name); v != nullptr && *v != '\0') {
      env.run_id = v;
      break;
    }
  }
  if (const char* v = std::getenv("GLOO_SOCKET_IFNAME"); v != nullptr && *v != '\0') {
    env.gloo_iface = v;
  }
  const char* launched = std::getenv(kLaunchedEnv);
  env.launched = launched != nullptr && std::strcmp(launched, "1") == 0;
  return env;
}

StatusOr<std::vector<std::string>> SelfCommandLine() {
  std::ifstream in("/proc/self/cmdline", std::ios::binary);
  if (!in) return IoError("cannot read /proc/self/cmdline");
  const std::string all((std::istreambuf_iterator<char>(in)), std::istreambuf_iterator<char>());
  std::vector<std::string> argv;
  size_t start = 0;
  while (start < all.size()) {
    size_t end = all.find('\0', start);
    if (end == std::string::npos) end = all.size();
    argv.push_back(all.substr(start, end - start));
    start = end + 1;
  }
  return argv;
}

Status LaunchLocal(const std::vector<std::string>& argv, const LaunchOptions& options) {
  if (options.nproc < 1) return InvalidArgumentError("--nproc: must be at least 1");
  const std::string run_id =
      !options.run_id.empty()
          ? options.run_id
          : fmt::format("{}-{}", getpid(),
                        std::chrono::system_clock::now().time_since_epoch().count());
  std::vector<pid_t> pids;
  for (int64_t r = 0; r < options.nproc; ++r) {
    const pid_t pid = fork();
    if (pid < 0) {
      for (const pid_t p : pids) kill(p, SIGKILL);
      return IoError(fmt::format("fork for rank {} failed: {}", r, std::strerror(errno)));
    }
    if (pid == 0) {
      prctl(PR_SET_PDEATHSIG, SIGKILL);
      setenv("RANK", std::to_string(r).c_str(), 1);
      setenv("LOCAL_RANK", std::to_string(r).c_str(), 1);
      setenv("WORLD_SIZE", std::to_string(options.nproc).c_str(), 1);
      setenv("LOCAL_WORLD_SIZE", std::to_string(options.nproc).c_str(), 1);
      setenv("MASTER_ADDR", options.master_addr.c_str(), 1);
      setenv("MASTER_PORT", std::to_string(options.master_port).c_str(), 1);
      setenv(kLaunchedEnv, "1", 1);
      setenv(kRunIdEnv, run_id.c_str(), 1);
      std::vector<char*> args;
      for (const std::string& a : argv) args.push_back(const_cast<char*>(a.c_str()));
      args.push_back(nullptr);
      execv("/proc/self/exe", args.data());
      std::fprintf(stderr, "sluice: rank %ld: exec failed: %s\n", static_cast<long>(r),
                   std::strerror(errno));
      _exit(127);
    }
    pids.push_back(pid);
  }
  // After the first failure the others get `grace` to notice and exit by themselves (their
  // messages name the rank that caused it), then SIGTERM, then SIGKILL after another grace.
  using Clock = std::chrono::steady_clock;
  std::vector<bool> running(pids.size(), true);
  std::vector<bool> stopped(pids.size(), false);  // stopped by a signal (SIGSTOP)
  int64_t alive = static_cast<int64_t>(pids.size());
  std::string failure;
  bool signaled = false;   // the reported rank was killed by a signal (not by us)
  bool bad_input = false;  // the reported rank exited with 2 (bad usage or input)
  int stage = 0;           // 0 running, 1 waiting for the rest, 2 terminated, 3 killed
  Clock::time_point next_at{};
  while (alive > 0) {
    int status = 0;
    const pid_t pid = waitpid(-1, &status, WNOHANG | WUNTRACED | WCONTINUED);
    if (pid > 0) {
      for (size_t r = 0; r < pids.size(); ++r) {
        if (pids[r] != pid || !running[r]) continue;
        if (WIFSTOPPED(status) || WIFCONTINUED(status)) {
          stopped[r] = WIFSTOPPED(status);
          // A stopped rank cannot exit by itself: once the job fails it is killed at once.
          if (stopped[r] && stage > 0) kill(pid, SIGKILL);
          break;
        }
        running[r] = false;
        --alive;
        const bool ok = WIFEXITED(status) && WEXITSTATUS(status) == 0;
        // A rank killed by a signal before we stopped anyone is the likeliest cause.
        const bool killed_by_signal = WIFSIGNALED(status) && stage < 2;
        if (!ok && (failure.empty() || (killed_by_signal && !signaled))) {
          failure = fmt::format("rank {} (pid {}) {}", r, pid, DescribeExit(status));
          signaled = killed_by_signal;
          bad_input = WIFEXITED(status) && WEXITSTATUS(status) == 2;
          if (stage == 0) {
            std::fprintf(stderr, "sluice: %s; stopping the other ranks\n", failure.c_str());
            stage = 1;
            next_at = Clock::now() + options.grace;
            for (size_t q = 0; q < pids.size(); ++q) {
              if (running[q] && stopped[q]) {
                std::fprintf(stderr, "sluice: rank %zu (pid %d) is stopped (SIGSTOP); killing it\n",
                             q, pids[q]);
                kill(pids[q], SIGKILL);
              }
            }
          }
        }
      }
      continue;
    }
    if (pid < 0 && errno != EINTR) break;
    const Clock::time_point now = Clock::now();
    if ((stage == 1 || stage == 2) && now >= next_at) {
      for (size_t r = 0; r < pids.size(); ++r) {
        if (!running[r]) continue;
        kill(pids[r], stage == 1 ? SIGTERM : SIGKILL);
        if (stage == 1) kill(pids[r], SIGCONT);  // a stopped rank handles SIGTERM only when running
      }
      ++stage;
      next_at = now + options.grace;
    }
    std::this_thread::sleep_for(std::chrono::milliseconds(20));
  }
  if (!failure.empty()) {
    return bad_input ? InvalidArgumentError(failure) : FailedPreconditionError(failure);
  }
  return Status::Ok();
}

}  // namespace sluice::runtime
