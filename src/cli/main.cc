// `sluice`: plans, simulates and runs training on variable-length data. One subcommand per
// cli/cmd_*.cc file; see `sluice --help`.
#include <CLI/CLI.hpp>
#include <fmt/core.h>

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
#ifdef SLUICE_WITH_TORCH
  sluice::cli::RegisterTrainCommands(&app, &state);  // cmd_train.cc, only with libtorch
  sluice::cli::RegisterProfileCommands(&app, &state);  // cmd_profile.cc, only with libtorch
#endif
  try {
    app.parse(argc, argv);
  } catch (const CLI::ParseError& e) {
    const int rc = app.exit(e);
    return rc == 0 ? sluice::cli::kExitOk : sluice::cli::kExitBadInput;
  }
  if (!state.status.ok()) {
    fmt::print(stderr, "sluice: error: {}\n", state.status.message());
  }
  return sluice::cli::ExitCodeFor(state.status);
}
