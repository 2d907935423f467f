// `sluice data stats` and `sluice data presets`.
#include <fmt/core.h>

#include "cli/cli_common.h"
#include "data/data_source.h"
#include "data/reader.h"
#include "data/stats.h"

namespace sluice::cli {
namespace {

struct DataStatsFlags {
  std::string data;          // positional or --data
  std::string format = "auto";
  std::string input_field = "input_len";
  std::string target_field = "target_len";
  std::string task_field = "task";
  int64_t samples = 0;
  uint64_t seed = 0;
  bool no_histogram = false;
  bool no_tasks = false;
};

Status RunDataStats(const DataStatsFlags& f) {
  DataOptions options;
  options.seed = f.seed;
  options.num_samples = f.samples;
  SLUICE_ASSIGN_OR_RETURN(options.reader.format, ParseLengthFormat(f.format));
  options.reader.input_field = f.input_field;
  options.reader.target_field = f.target_field;
  options.reader.task_field = f.task_field;
  const std::string name = f.data.empty() ? std::string(kDefaultDataPreset) : f.data;
  SLUICE_ASSIGN_OR_RETURN(Dataset dataset, LoadData(name, options));
  StatsFormatOptions fmt_options;
  fmt_options.histograms = !f.no_histogram;
  fmt_options.per_task = !f.no_tasks;
  fmt::print("{}", FormatStats(ComputeStats(dataset), fmt_options));
  return Status::Ok();
}

}  // namespace

void RegisterDataCommands(CLI::App* app, RunState* state) {
  CLI::App* data = app->add_subcommand("data", "Inspect sample-length datasets");
  data->require_subcommand(1);

  auto flags = std::make_shared<DataStatsFlags>();
  CLI::App* stats = data->add_subcommand(
      "stats", "Count, tokens, length percentiles (overall and per task) and histograms");
  stats->add_option("dataset", flags->data,
                    "A .txt/.jsonl/.csv length file or a preset (default: mixture-4task)")
      ->type_name("FILE|PRESET");
  AddDataFlag(stats, &flags->data)->excludes(stats->get_option("dataset"));
  stats->add_option("--format", flags->format, "File format: auto (by extension), text, jsonl, csv")
      ->capture_default_str();
  stats->add_option("--input-field", flags->input_field, "JSON field / CSV column of input lengths")
      ->capture_default_str();
  stats->add_option("--target-field", flags->target_field,
                    "JSON field / CSV column of target lengths ('' = none)")
      ->capture_default_str();
  stats->add_option("--task-field", flags->task_field, "JSON field / CSV column of task names ('' = none)")
      ->capture_default_str();
  stats->add_option("--samples", flags->samples,
                    "How many samples: generators produce this many, files are cut to their first "
                    "N (0 = default: 20000 generated, whole file)")
      ->check(IntegerCheck(0, kMaxSamples, kSamplesAllowed))
      ->capture_default_str();
  AddSeedFlag(stats, &flags->seed);
  stats->add_flag("--no-histogram", flags->no_histogram, "Omit the length histograms");
  stats->add_flag("--no-tasks", flags->no_tasks, "Omit the per-task table");
  SetHandler(stats, state, [flags] { return RunDataStats(*flags); });

  CLI::App* presets = data->add_subcommand("presets", "List the shipped datasets and generators");
  SetHandler(presets, state, [] {
    fmt::print("{}", FormatDataPresets());
    return Status::Ok();
  });
}

}  // namespace sluice::cli
