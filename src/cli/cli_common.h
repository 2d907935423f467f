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
#include <vector>

#include "base/status.h"
#include "data/data_source.h"
#include "plan/execution_plan.h"

namespace sluice::cli {

inline constexpr int kExitOk = 0;
inline constexpr int kExitFailed = 1;
inline constexpr int kExitBadInput = 2;

int ExitCodeFor(const Status& status);

// Holds the Status of whichever subcommand ran; main() turns it into the exit code.
struct RunState {
  Status status;
};

// Makes `sub` run `handler` when chosen, storing its Status in `state` (through RunGuarded).
void SetHandler(CLI::App* sub, RunState* state, std::function<Status()> handler);
// Runs `handler`, turning an exception that escapes it into one Status naming `command` ("plan
// csv"): std::bad_alloc -> "out of memory" (exit 1), any other std::exception (c10::Error
// included) -> its first line (exit 1). No exception crosses a command's edge.
Status RunGuarded(std::string_view command, const std::function<Status()>& handler);
// "plan csv" for the subcommand `sub` (its parents' names, without the program's).
std::string CommandName(const CLI::App* sub);

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
inline constexpr int64_t kNoMaxInteger = std::numeric_limits<int64_t>::max();
// What --samples allows (data/data_source.h kMaxSamples).
inline constexpr const char* kSamplesAllowed = "an integer in [0, 100000000] (0 = the default)";
CLI::Validator NumberCheck(double min, bool min_exclusive, double max, std::string allowed);
// An integer flag's check: decimal digits only (no '1e3', no '2.5', which CLI11 would otherwise
// round or saturate: '--seed 1e23' became 2^64 - 1), within [min, max]. Messages: "'1e23' is not
// an integer; allowed: ...", "'0' is not allowed; allowed: ..." and, past 64 bits, "N is out of
// range; allowed: MIN..MAX". `allowed` defaults to "an integer >= MIN" or "an integer in [MIN,
// MAX]".
CLI::Validator IntegerCheck(int64_t min, int64_t max, std::string allowed = "");
// Rejects nan, inf and (unless `allow_negative`) negative numbers for a floating-point flag that
// has no narrower check: "'nan' is not allowed; allowed: a finite number >= 0".
CLI::Validator FiniteCheck(bool allow_negative = false);
// A path flag's check: an empty value ('--out ""') is an error naming the flag, not "no output".
CLI::Validator PathCheck();

// An output file named by `flag`: OK when it can be created (its folder exists and is writable,
// and it is not a folder), else InvalidArgument naming the flag, the path and the reason.
// Checked before a run, so a bad path does not cost the run.
Status CheckOutputFile(std::string_view flag, const std::string& path);
// An input a command reads, for CheckNotAnInput: the flag (or argument) and the path given.
struct NamedInput {
  std::string flag;
  std::string path;
};
// InvalidArgument naming both flags when the output file `path` (of `flag`) is one of `inputs`
// (same device and inode, so "p.json" and "./p.json" or a hard link are caught): writing it would
// destroy what the command reads. Inputs that are not existing files (presets) never match.
Status CheckNotAnInput(std::string_view flag, const std::string& path,
                       const std::vector<NamedInput>& inputs);
// An output folder named by `flag`: created with its parents when missing; InvalidArgument
// naming the flag when it cannot be created or written.
Status PrepareOutputDir(std::string_view flag, const std::string& dir);

// The plan file at `path` (ReadPlanFile). When it does not exist but `plan --out PATH` wrote
// PATH-<batch>.<ext> (several batches), the error says so and names the first such file.
StatusOr<ExecutionPlan> ReadPlanFileOrSay(const std::string& path);

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
void RegisterOptimizeCommands(CLI::App* app, RunState* state);  // cmd_optimize.cc
void RegisterHeteroCommands(CLI::App* app, RunState* state);    // cmd_hetero.cc
// Only in builds with libtorch (SLUICE_WITH_TORCH).
void RegisterTrainCommands(CLI::App* app, RunState* state);
void RegisterProfileCommands(CLI::App* app, RunState* state);  // cmd_profile.cc

}  // namespace sluice::cli
