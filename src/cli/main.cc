// `sluice`: plans, simulates and runs training on variable-length data. One subcommand per
// cli/cmd_*.cc file; see `sluice --help`.
#include <CLI/CLI.hpp>
#include <fmt/core.h>

#include <csignal>
#include <exception>
#include <new>
#include <string>

#include "cli/cli_common.h"

int main(int argc, char** argv) {
  CLI::App app{"sluice: plan, simulate and run transformer training on variable-length data"};
  app.require_subcommand(1);
  app.set_version_flag("--version", "sluice 0.1.0");
  sluice::cli::RunState state;
  sluice::cli::RegisterDataCommands(&app, &state);
  sluice::cli::RegisterCostCommands(&app, &state);
  sluice::cli::RegisterBatchCommands(&app, &state);
  sluice::cli::RegisterPlanCommands(&app, &state);
  sluice::cli::RegisterCompareCommands(&app, &state);
  sluice::cli::RegisterSimulateCommands(&app, &state);
  sluice::cli::RegisterTraceCommands(&app, &state);
  sluice::cli::RegisterOptimizeCommands(&app, &state);
  sluice::cli::RegisterHeteroCommands(&app, &state);
#ifdef SLUICE_WITH_TORCH
  sluice::cli::RegisterTrainCommands(&app, &state);  // cmd_train.cc, only with libtorch
  sluice::cli::RegisterProfileCommands(&app, &state);  // cmd_profile.cc, only with libtorch
#endif
  // A file-size limit (ulimit -f) makes a write fail with EFBIG, reported and leaving the previous
  // file (base/files.h), instead of SIGXFSZ killing the process half way through it.
  std::signal(SIGXFSZ, SIG_IGN);
  try {
    app.parse(argc, argv);
  } catch (const CLI::ParseError& e) {
    const int rc = app.exit(e);
    return rc == 0 ? sluice::cli::kExitOk : sluice::cli::kExitBadInput;
  } catch (const std::exception& e) {
    // Handlers run through RunGuarded; this catches what escapes elsewhere (flag parsing).
    std::string what = e.what();
    what = what.substr(0, what.find('\n'));
    fmt::print(stderr, "sluice: error: {}\n",
               dynamic_cast<const std::bad_alloc*>(&e) != nullptr
                   ? "out of memory: the inputs ask for more memory than this machine gives"
                   : "unexpected error: " + what);
    return sluice::cli::kExitFailed;
  }
  if (!state.status.ok()) {
    fmt::print(stderr, "sluice: error: {}\n", state.status.message());
  }
  return sluice::cli::ExitCodeFor(state.status);
}
