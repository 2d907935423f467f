// Shared pieces of the `sluice` subcommands: the flag vocabulary of ARCHITECTURE.md ("CLI
// vocabulary"), the mapping from a Status to an exit code, number and output-path checks, and
// Ctrl-C handling.
//
// Exit codes: 0 success, 1 a run that failed, 2 bad usage or bad input. Every subcommand's
// handler returns a Status; InvalidArgument and NotFound mean bad input (2), anything else a
// failed run (1). Messages go to stderr as "sluice: error: <message>".
#pragma once

#include <CLI/CLI.hpp>

#include <cstdint>
#include <functional>
#include <limits>
#include <string>
#include <string_view>

#include "base/status.h"

namespace sluice::cli {

inline constexpr int kExitOk = 0;
inline constexpr int kExitFailed = 1;
inline constexpr int kExitBadInput = 2;

int ExitCodeFor(const Status& status);

// Holds the Status of whichever subcommand ran; main() turns it into the exit code.
struct RunState {
  Status status;
};

// Makes `sub` run `handler` when chosen, storing its Status in `state`.
void SetHandler(CLI::App* sub, RunState* state, std::function<Status()> handler);

// The shared flags, with the names and help of the vocabulary. Each returns the option so a
// subcommand can mark it required or change its default text.
CLI::Option* AddModelFlag(CLI::App* app, std::string* model);
CLI::Option* AddClusterFlag(CLI::App* app, std::string* cluster);
CLI::Option* AddParallelFlag(CLI::App* app, std::string* parallel);
CLI::Option* AddDataFlag(CLI::App* app, std::string* data);
CLI::Option* AddSeedFlag(CLI::App* app, uint64_t* seed);
CLI::Option* AddMaxSeqlenFlag(CLI::App* app, int64_t* max_seqlen);
CLI::Option* AddTokensPerBatchFlag(CLI::App* app, int64_t* tokens);
// --memory-reserve MB: held back from the device's memory when no --memory-limit is given;
// `*reserve_mb` stays < 0 when the flag is not given (the default reserve).
CLI::Option* AddMemoryReserveFlag(CLI::App* app, double* reserve_mb);

// A flag's number check that, unlike CLI::PositiveNumber and CLI::Range, rejects nan and inf and
// says what is allowed: "--tokens-per-batch: '0' is not allowed; allowed: an integer >= 1".
// `min_exclusive`: the value must be > min (else >= min); it must be <= max.
inline constexpr double kNoMax = std::numeric_limits<double>::max();  // no upper bound
CLI::Validator NumberCheck(double min, bool min_exclusive, double max, std::string allowed);

// An output file named by `flag`: OK when it can be created (its folder exists and is writable,
// and it is not a folder), else InvalidArgument naming the flag, the path and the reason.
// Checked before a run, so a bad path does not cost the run.
Status CheckOutputFile(std::string_view flag, const std::string& path);
// An output folder named by `flag`: created with its parents when missing; InvalidArgument
// naming the flag when it cannot be created or written.
Status PrepareOutputDir(std::string_view flag, const std::string& dir);

// Ctrl-C handling for a command that stops cleanly: while a guard lives, SIGINT sets a flag that
// Interrupted() returns (a second Ctrl-C ends the process at once). One guard at a time.
class InterruptGuard {
 public:
  InterruptGuard();
  ~InterruptGuard();
  InterruptGuard(const InterruptGuard&) = delete;
  InterruptGuard& operator=(const InterruptGuard&) = delete;

 private:
  void (*previous_)(int);
};
bool Interrupted();

// Subcommand registration, one function per cli/cmd_*.cc file.
void RegisterDataCommands(CLI::App* app, RunState* state);
void RegisterCostCommands(CLI::App* app, RunState* state);
void RegisterBatchCommands(CLI::App* app, RunState* state);
void RegisterPlanCommands(CLI::App* app, RunState* state);
void RegisterCompareCommands(CLI::App* app, RunState* state);
void RegisterSimulateCommands(CLI::App* app, RunState* state);
void RegisterTraceCommands(CLI::App* app, RunState* state);  // cmd_trace.cc
// Only in builds with libtorch (SLUICE_WITH_TORCH).
void RegisterTrainCommands(CLI::App* app, RunState* state);
void RegisterProfileCommands(CLI::App* app, RunState* state);  // cmd_profile.cc

}  // namespace sluice::cli
