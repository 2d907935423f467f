#include "cli/cli_common.h"

namespace sluice::cli {

void RegisterDataCommands(CLI::App* app, RunState* state) {}

}  // namespace sluice::cli
