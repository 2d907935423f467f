#include "cli/cli_common.h"

namespace sluice::cli {

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

void SetHandler(CLI::App* sub, RunState* state, std::function<Status()> handler) {
  sub->callback([state, handler = std::move(handler)] { state->status = handler(); });
}

CLI::Option* AddModelFlag(CLI::App* app, std::string* model) {
  return app->add_option("--model", *model, "Model: a preset (gpt-6.7b, t5-11b, gpt-tiny, ...) "
                                            "or a JSON ModelSpec file")
      ->type_name("NAME|FILE");
}

CLI::Option* AddClusterFlag(CLI::App* app, std::string* cluster) {
  return app->add_option("--cluster", *cluster,
                         "Devices: PRESET:N (a100-40g:8, h100-80g:64) or a JSON ClusterSpec file")
      ->type_name("PRESET:N|FILE");
}

CLI::Option* AddParallelFlag(CLI::App* app, std::string* parallel) {
  return app->add_option("--parallel", *parallel,
                         "Parallelism: K=V,... with dp, pp, tp, ep, vpp, zero, memory_limit_mb "
                         "(unspecified = 1, zero = 0), or a JSON file")
      ->type_name("K=V,...|FILE");
}

CLI::Option* AddDataFlag(CLI::App* app, std::string* data) {
  return app->add_option("--data", *data,
                         "Lengths: a .txt/.jsonl/.csv file or a preset (see `sluice data presets`)")
      ->type_name("FILE|PRESET");
}

CLI::Option* AddSeedFlag(CLI::App* app, uint64_t* seed) {
  return app->add_option("--seed", *seed, "Seed of all randomness")->capture_default_str();
}

CLI::Option* AddMaxSeqlenFlag(CLI::App* app, int64_t* max_seqlen) {
  return app->add_option("--max-seqlen", *max_seqlen, "Longest sequence (tokens) a batch may hold")
      ->check(CLI::PositiveNumber)
      ->capture_default_str();
}

CLI::Option* AddTokensPerBatchFlag(CLI::App* app, int64_t* tokens) {
  return app->add_option("--tokens-per-batch", *tokens, "Global batch token budget")
      ->check(CLI::PositiveNumber)
      ->capture_default_str();
}

}  // namespace sluice::cli
