// Launching: the torchrun environment a rank reads, and the `--nproc N` launcher that starts N
// local ranks itself.
//
// A rank learns its place from the variables torchrun sets: RANK, WORLD_SIZE, LOCAL_RANK,
// MASTER_ADDR and MASTER_PORT (so any launcher that starts torchrun jobs starts sluice jobs).
// With none of RANK/WORLD_SIZE set the process is rank 0 of 1. The run id that scopes the job's
// store keys (and that the store checks every connection against) is SLUICE_RUN_ID (set by the
// launcher and by --run-id), else torchrun's TORCHELASTIC_RUN_ID, else "sluice". GLOO_SOCKET_IFNAME
// names the interface the Gloo devices bind (as in PyTorch). The rendezvous port is only ever
// the one given (MASTER_PORT, default 29500, torchrun's default); nothing probes for free ports.
//
// LaunchLocal forks and execs this same program N times with the variables set (and
// SLUICE_LAUNCHED=1, so the children know they are ranks), waits for all of them, and when one
// exits non-zero or is killed by a signal it gives the others a grace period to exit on their own
// (their messages name the rank that caused it), then stops them (SIGTERM, then SIGKILL after
// another grace period) and reports which rank failed and how, preferring a rank killed by a
// signal. Children die with the launcher (PR_SET_PDEATHSIG).
//
// Thread safety: ReadDistEnv reads the environment; LaunchLocal forks and must be called before
// any threads or libtorch state exist in the process.
#pragma once

#include <chrono>
#include <cstdint>
#include <string>
#include <vector>

#include "base/status.h"

namespace sluice::runtime {

inline constexpr int kDefaultMasterPort = 29500;
inline constexpr const char* kLaunchedEnv = "SLUICE_LAUNCHED";
inline constexpr const char* kRunIdEnv = "SLUICE_RUN_ID";
inline constexpr const char* kDefaultRunId = "sluice";

struct DistEnv {
  int64_t rank = 0;
  int64_t world_size = 1;
  int64_t local_rank = 0;
  int64_t local_world_size = 1;
  std::string master_addr = "127.0.0.1";
  int master_port = kDefaultMasterPort;
  bool launched = false;  // SLUICE_LAUNCHED=1: started by LaunchLocal
  std::string run_id = kDefaultRunId;  // scopes every store key
  std::string gloo_iface;              // GLOO_SOCKET_IFNAME or --iface: the Gloo devices' interface
  std::string bind_addr;               // --bind: this rank's address for the Gloo devices

  friend bool operator==(const DistEnv&, const DistEnv&) = default;
};

// Reads the variables; a malformed or out-of-range value is an error naming it (RANK must be in
// [0, WORLD_SIZE), MASTER_PORT in [1, 65535]).
StatusOr<DistEnv> ReadDistEnv();

struct LaunchOptions {
  int64_t nproc = 1;
  std::string master_addr = "127.0.0.1";
  int master_port = kDefaultMasterPort;
  // Passed to the ranks as SLUICE_RUN_ID ("" = a fresh one per launch: "<pid>-<time>").
  std::string run_id;
  // After the first failure: how long the other ranks get to exit on their own before SIGTERM,
  // and then before SIGKILL.
  std::chrono::milliseconds grace = std::chrono::seconds(5);
};

// This process's command line (/proc/self/cmdline), program first.
StatusOr<std::vector<std::string>> SelfCommandLine();

// Runs `argv` (argv[0] is ignored: the children exec /proc/self/exe) as ranks 0..nproc-1 and
// waits. A rank that stops (SIGSTOP) is killed at once when another fails. OK when every rank
// exits 0; otherwise FailedPrecondition naming the first rank that
// failed ("rank 2 (pid 1234) was killed by signal 9 (Killed)") after the others were stopped.
Status LaunchLocal(const std::vector<std::string>& argv, const LaunchOptions& options);

}  // namespace sluice::runtime
