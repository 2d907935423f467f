#include "cli/cli_common.h"

namespace sluice::cli {

void RegisterCostCommands(CLI::App* app, RunState* state) {}

}  // namespace sluice::cli
