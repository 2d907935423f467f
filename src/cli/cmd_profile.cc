// `sluice profile`: measures the runtime's own layers on this machine over a (micro-batch size x
// sequence length x recompute) grid and writes a layer-cost-table/1 file (runtime/profiler.h).
// Compiled only with the libtorch runtime (SLUICE_WITH_TORCH).
#include <fmt/core.h>
#include <fmt/ranges.h>

#include <algorithm>
#include <chrono>
#include <filesystem>
#include <memory>
#include <string>
#include <thread>
#include <vector>

#include "base/json_util.h"
#include "base/progress.h"
#include "cli/cli_common.h"
#include "cost/cost_model.h"
#include "cost/profile_table.h"
#include "cost/profiled_cost_model.h"
#include "model/model_spec.h"
#include "runtime/profiler.h"

namespace sluice::cli {
namespace {

// "1,2,4": a list flag's default as it is typed.
template <typename T>
std::string JoinComma(const std::vector<T>& values) {
  std::string out;
  for (const T& v : values) out += (out.empty() ? "" : ",") + fmt::format("{}", v);
  return out;
}

struct ProfileFlags {
  std::string model = "gpt-tiny";
  std::vector<int64_t> mbs = {1, 2, 4};
  std::vector<int64_t> seqlen = {64, 128, 256};
  std::vector<int64_t> dec_seqlen;
  std::vector<std::string> recompute = {"none"};
  int64_t repeats = 5;
  int64_t warmup = 2;
  int64_t threads = 0;  // 0 = the cores of this machine
  uint64_t seed = 0;
  double max_activation_mb = 0;
  std::string out;
};

std::string CommandLine(const ProfileFlags& f) {
  std::string s = fmt::format("--model {} --mbs {} --seqlen {}", f.model, fmt::join(f.mbs, ","),
                              fmt::join(f.seqlen, ","));
  if (!f.dec_seqlen.empty()) s += fmt::format(" --dec-seqlen {}", fmt::join(f.dec_seqlen, ","));
  s += fmt::format(" --recompute {} --repeats {} --warmup {} --threads {} --seed {}",
                   fmt::join(f.recompute, ","), f.repeats, f.warmup, f.threads, f.seed);
  if (f.max_activation_mb > 0) s += fmt::format(" --max-activation-mb {}", f.max_activation_mb);
  return s;
}

// One line per (stage, recompute, key): forward/backward ms and stored MB per micro-batch size.
void PrintSummary(const LayerCostTable& table) {
  const char* names[] = {"encoder", "decoder", "postprocess"};
  for (const TableConfig& c : table.configs) {
    for (int stage = 0; stage < kNumTableStages; ++stage) {
      const CostSeries& fwd = c.forward_ms[stage];
      // The head does not recompute: every entry carries the first entry's rows.
      const bool repeated_head =
          stage == static_cast<int>(TableStage::kPostprocess) && &c != &table.configs.front();
      if (fwd.empty() || repeated_head) continue;
      fmt::print("{} ({}):\n", names[stage], RecomputeName(c.recompute));
      for (size_t r = 0; r < fwd.size(); ++r) {
        const CostRow& row = fwd[r];
        const CostRow& bwd = c.backward_ms[stage][r];
        std::string key = row.dec_seqlen > 0
                              ? fmt::format("seqlen {:>5} dec {:>5}", row.seqlen, row.dec_seqlen)
                              : fmt::format("seqlen {:>5}", row.seqlen);
        std::vector<std::string> cells;
        for (size_t i = 0; i < row.mbs.size(); ++i) {
          std::string cell =
              fmt::format("mbs {}: {:.3f}/{:.3f} ms", row.mbs[i], row.value[i], bwd.value[i]);
          const CostSeries& stored = c.stored_activation_mb[stage];
          if (!stored.empty() && r < stored.size() && i < stored[r].value.size()) {
            cell += fmt::format(" {:.2f} MB", stored[r].value[i]);
          }
          cells.push_back(std::move(cell));
        }
        fmt::print("  {}  {}\n", key, fmt::join(cells, " | "));
      }
    }
  }
}

Status RunProfile(const ProfileFlags& f) {
  // Output path first: a bad one, or the model file itself, should not cost the measurements.
  SLUICE_RETURN_IF_ERROR(CheckOutputFile("--out", f.out));
  SLUICE_RETURN_IF_ERROR(CheckNotAnInput("--out", f.out, {{"--model", f.model}}));
  SLUICE_ASSIGN_OR_RETURN(ModelSpec model, ResolveModel(f.model));
  runtime::ProfileOptions o;
  o.mbs = f.mbs;
  o.seqlens = f.seqlen;
  o.dec_seqlens = f.dec_seqlen;
  o.recompute.clear();
  for (const std::string& name : f.recompute) {
    StatusOr<Recompute> rc = ParseRecompute(name);
    if (!rc.ok()) {
      return InvalidArgumentError(fmt::format(
          "--recompute: '{}' is not a recompute level (allowed: none, selective, full)", name));
    }
    o.recompute.push_back(*rc);
  }
  o.repeats = f.repeats;
  o.warmup = f.warmup;
  if (f.threads < 0) {
    return InvalidArgumentError(
        fmt::format("--threads: {} is negative (allowed: 1 to 1024, or 0 for this machine's cores)",
                    f.threads));
  }
  o.threads = f.threads > 0
                  ? f.threads
                  : std::max<int64_t>(1, static_cast<int64_t>(std::thread::hardware_concurrency()));
  o.seed = f.seed;
  if (f.max_activation_mb < 0) {
    return InvalidArgumentError(
        fmt::format("--max-activation-mb: {} is negative (allowed: > 0, or 0 for no limit)",
                    f.max_activation_mb));
  }
  if (f.max_activation_mb > 0) o.activation_limit = Bytes::MB(f.max_activation_mb);
  o.command = CommandLine(f);
  SLUICE_RETURN_IF_ERROR(runtime::ValidateProfileOptions(model, o));

  fmt::print("profiling {} on {}\n", model.name, runtime::DescribeCpu(o.threads));
  std::fflush(stdout);  // before the progress bar (stderr)
  const auto start = std::chrono::steady_clock::now();
  StatusOr<LayerCostTable> table = [&] {
    Progress progress("profile", runtime::ProfileWorkUnits(model, o));
    StatusOr<LayerCostTable> t = runtime::ProfileModel(model, o, &progress);
    progress.Finish();
    return t;
  }();
  SLUICE_RETURN_IF_ERROR(table.status());
  const double seconds =
      std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();

  SLUICE_RETURN_IF_ERROR(
      WriteStringToFile(f.out, LayerCostTableToJson(*table).dump(1) + "\n").WithPrefix("--out"));
  // What was written must be what the planner reads: read it back and build the cost model.
  SLUICE_ASSIGN_OR_RETURN(LayerCostTable back, ReadLayerCostTable(f.out));
  auto cost = ProfiledCostModel::Create(std::move(back), model);
  if (!cost.ok()) {
    return InternalError(
        fmt::format("{}: the written table does not load: {}", f.out, cost.status().message()));
  }
  PrintSummary(*table);
  fmt::print("wrote {} ({} recompute level{}, {:.1f} s); use it with --cost profiled:{}\n", f.out,
             table->configs.size(), table->configs.size() == 1 ? "" : "s", seconds, f.out);
  return Status::Ok();
}

}  // namespace

void RegisterProfileCommands(CLI::App* app, RunState* state) {
  auto f = std::make_shared<ProfileFlags>();
  CLI::App* p = app->add_subcommand(
      "profile",
      "Measure the runtime's per-layer time and activation memory on this machine and write a "
      "layer-cost-table/1 file");
  AddModelFlag(p, &f->model)->capture_default_str();
  // Lists are one argument, comma-separated ("--mbs 1,2,4"); the help shows them as typed,
  // without CLI11's "[...] ..." (option_text replaces the value name and default).
  p->add_option("--mbs", f->mbs, "Micro-batch sizes, comma-separated")
      ->delimiter(',')
      ->option_text("N,...=" + JoinComma(f->mbs));
  p->add_option("--seqlen", f->seqlen, "Sequence lengths (encoder lengths), comma-separated")
      ->delimiter(',')
      ->option_text("N,...=" + JoinComma(f->seqlen));
  p->add_option("--dec-seqlen", f->dec_seqlen,
                "Encoder-decoder models: decoder lengths, comma-separated (default: --seqlen)")
      ->delimiter(',')
      ->option_text("N,...");
  p->add_option("--recompute", f->recompute,
                "Recompute levels, comma-separated: none, selective, full")
      ->delimiter(',')
      ->option_text("LEVEL,...=" + JoinComma(f->recompute));
  p->add_option("--repeats", f->repeats, "Timed runs per point (the median is written)")
      ->capture_default_str();
  p->add_option("--warmup", f->warmup, "Untimed runs per point before the timed ones")
      ->capture_default_str();
  p->add_option("--threads", f->threads,
                "libtorch intra-op threads while measuring (0 = this machine's cores, what one "
                "`sluice train` rank uses); for a table of N local ranks give cores / N, what "
                "each rank of `sluice train --nproc N` uses")
      ->capture_default_str();
  AddSeedFlag(p, &f->seed);
  p->add_option("--max-activation-mb", f->max_activation_mb,
                "Leave out (as out of memory) points whose layer holds more activation MB than "
                "this; 0 = no limit")
      ->check(NumberCheck(0, false, 1e9, "a size in MB in [0, 1e9], 0 = no limit"))
      ->capture_default_str();
  p->add_option("--out", f->out, "Where to write the layer-cost-table/1 JSON file")
      ->required()
      ->type_name("FILE")
      ->check(PathCheck());
  SetHandler(p, state, [f] { return RunProfile(*f); });
}

}  // namespace sluice::cli
