// Shared pieces of the `sluice` subcommands: the flag vocabulary of ARCHITECTURE.md ("CLI
// vocabulary") and the mapping from a Status to an exit code.
//
// Exit codes: 0 success, 1 a run that failed, 2 bad usage or bad input. Every subcommand's
// handler returns a Status; InvalidArgument and NotFound mean bad input (2), anything else a
// failed run (1). Messages go to stderr as "sluice: error: <message>".
#pragma once

#include <CLI/CLI.hpp>

#include <cstdint>
#include <functional>
#include <string>

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

// Subcommand registration, one function per cli/cmd_*.cc file.
void RegisterDataCommands(CLI::App* app, RunState* state);
void RegisterCostCommands(CLI::App* app, RunState* state);
void RegisterBatchCommands(CLI::App* app, RunState* state);
void RegisterPlanCommands(CLI::App* app, RunState* state);
void RegisterCompareCommands(CLI::App* app, RunState* state);
void RegisterSimulateCommands(CLI::App* app, RunState* state);
// Only in builds with libtorch (SLUICE_WITH_TORCH).
void RegisterTrainCommands(CLI::App* app, RunState* state);
void RegisterProfileCommands(CLI::App* app, RunState* state);  // cmd_profile.cc

}  // namespace sluice::cli
