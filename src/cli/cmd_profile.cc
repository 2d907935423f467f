// `sluice profile`: measures the runtime's own layers on this machine over a (micro-batch size x
// sequence length x recompute) grid and writes a layer-cost-table/1 file (runtime/profiler.h);
// with --all-to-all N it first starts N local ranks that measure the expert-parallel all-to-all
// and writes the fitted link as a cluster file (runtime/link_profiler.h).
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

#include "base/files.h"
#include "base/json_util.h"
#include "base/progress.h"
#include "cli/cli_common.h"
#include "cost/cost_model.h"
#include "cost/profile_table.h"
#include "cost/profiled_cost_model.h"
#include "model/cluster_spec.h"
#include "model/model_spec.h"
#include "runtime/host_allocator.h"
#include "runtime/launcher.h"
#include "runtime/link_profiler.h"
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
  int64_t all_to_all = 0;  // local ranks of the all-to-all measurement; 0 = none
  std::string cluster_out;
  std::string host_allocator = "cache";  // --host-allocator (runtime/host_allocator.h)
};

std::string CommandLine(const ProfileFlags& f) {
  std::string s = fmt::format("--model {} --mbs {} --seqlen {}", f.model, fmt::join(f.mbs, ","),
                              fmt::join(f.seqlen, ","));
  if (!f.dec_seqlen.empty()) s += fmt::format(" --dec-seqlen {}", fmt::join(f.dec_seqlen, ","));
  s += fmt::format(" --recompute {} --repeats {} --warmup {} --threads {} --seed {}",
                   fmt::join(f.recompute, ","), f.repeats, f.warmup, f.threads, f.seed);
  if (f.max_activation_mb > 0) s += fmt::format(" --max-activation-mb {}", f.max_activation_mb);
  if (f.all_to_all > 0) s += fmt::format(" --all-to-all {}", f.all_to_all);
  s += fmt::format(" --host-allocator {}", f.host_allocator);
  return s;
}

// One line per (stage, recompute, key): forward/backward ms and stored MB per micro-batch size.
void PrintSummary(const LayerCostTable& table) {
  for (const TableConfig& c : table.configs) {
    for (int stage = 0; stage < kNumTableStages; ++stage) {
      const CostSeries& fwd = c.forward_ms[stage];
      // The head does not recompute: every entry carries the first entry's rows.
      const bool repeated_head =
          stage == static_cast<int>(TableStage::kPostprocess) && &c != &table.configs.front();
      if (fwd.empty() || repeated_head) continue;
      fmt::print("{} ({}):\n", TableStageName(static_cast<TableStage>(stage)),
                 RecomputeName(c.recompute));
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
  if (!table.moe_parts.has_value()) return;
  // The MoE layer's parts: forward/backward per part, their sum against the whole layer's row
  // (recompute none: attention, norms and residuals are the rest), the per-piece slice overhead.
  const MoePartsTable& parts = *table.moe_parts;
  const TableConfig* none = table.Find(1, Recompute::kNone);
  const auto me = static_cast<size_t>(TableStage::kMoeEncoder);
  const auto ex = static_cast<size_t>(MoePart::kExperts);
  const auto sl = static_cast<size_t>(MoePart::kExpertsSliced);
  fmt::print(
      "moe layer parts (forward/backward ms, all experts on this rank; experts_sliced: {} "
      "capacity slices):\n",
      parts.slices);
  const CostSeries& first = parts.forward_ms[0];
  for (size_t r = 0; r < first.size(); ++r) {
    for (size_t i = 0; i < first[r].mbs.size(); ++i) {
      std::vector<std::string> cells;
      double sum = 0;
      auto at = [&](const CostSeries& series, size_t k) { return series[r].value[k]; };
      for (int k = 0; k < kNumMoeParts; ++k) {
        const double f = at(parts.forward_ms[k], i), b = at(parts.backward_ms[k], i);
        cells.push_back(
            fmt::format("{} {:.3f}/{:.3f}", MoePartName(static_cast<MoePart>(k)), f, b));
        if (k != static_cast<int>(MoePart::kExpertsSliced)) sum += f + b;
      }
      std::string whole;
      if (none != nullptr && r < none->forward_ms[me].size() &&
          i < none->forward_ms[me][r].value.size()) {
        const double layer = none->forward_ms[me][r].value[i] + none->backward_ms[me][r].value[i];
        whole = fmt::format("; parts {:.3f} ms = {:.0f}% of the layer's {:.3f}", sum,
                            100.0 * sum / layer, layer);
      }
      const double piece = ((at(parts.forward_ms[sl], i) - at(parts.forward_ms[ex], i)) +
                            (at(parts.backward_ms[sl], i) - at(parts.backward_ms[ex], i))) /
                           (2.0 * static_cast<double>(parts.slices));
      fmt::print("  seqlen {:>5} mbs {}: {}{}; slice overhead {:.3f} ms per piece\n",
                 first[r].seqlen, first[r].mbs[i], fmt::join(cells, " | "), whole, piece);
    }
  }
  if (const std::optional<Duration> o = MoeSliceOverhead(table)) {
    fmt::print(
        "slice overhead: {:.3f} ms per sliced compute piece (median over the points, at "
        "least 0); plans priced with this table carry it for the MoE overlap rewrites\n",
        o->millis());
  }
}

// A rank of the --all-to-all job: measures, and rank 0 writes the cluster file.
Status RunAllToAllRank(const ProfileFlags& f, const runtime::DistEnv& env) {
  runtime::AllToAllProfileOptions o;
  o.repeats = f.repeats;
  o.warmup = f.warmup;
  SLUICE_ASSIGN_OR_RETURN(runtime::AllToAllProfile p, runtime::ProfileAllToAll(env, o));
  if (env.rank != 0) return Status::Ok();
  SLUICE_ASSIGN_OR_RETURN(ClusterSpec cluster, ClusterPreset("cpu", p.ranks));
  cluster.name = fmt::format("cpu:{} (all-to-all measured by sluice profile)", p.ranks);
  cluster.intra_node = p.PlanLink();
  SLUICE_RETURN_IF_ERROR(ValidateClusterSpec(cluster, f.cluster_out));
  SLUICE_RETURN_IF_ERROR(WriteStringToFile(f.cluster_out, ClusterSpecToJson(cluster).dump(1) + "\n")
                             .WithPrefix("--cluster-out"));
  fmt::print("all-to-all over {} local ranks (Gloo alltoall_base, fp32), median of {} after {} "
             "warm-up, slowest rank:\n",
             p.ranks, f.repeats, f.warmup);
  for (const runtime::AllToAllPoint& pt : p.points) {
    fmt::print("  {:>9} bytes per peer: {:.3f} ms\n", pt.bytes_per_peer, pt.time.millis());
  }
  fmt::print("fit (n - 1) x latency + bytes to the others / bandwidth: latency {:.1f} us, "
             "bandwidth {:.3f} GB/s of fp32 = {:.3f} GB/s of the plan's fp16 bytes (mean error "
             "{:.1f}%)\n",
             p.latency.micros(), p.bandwidth_fp32 / 1e9, p.PlanLink().bandwidth / 1e9,
             100 * p.mean_fit_error);
  fmt::print("wrote {}; use it with --cluster {}\n", f.cluster_out, f.cluster_out);
  return Status::Ok();
}

Status RunProfile(const ProfileFlags& f) {
  // Measured under the allocator policy the training runs use (their costs are what it prices).
  SLUICE_ASSIGN_OR_RETURN(const runtime::HostAllocator allocator,
                          runtime::ParseHostAllocator(f.host_allocator, "--host-allocator"));
  const std::string allocator_note = runtime::ConfigureHostAllocator(allocator);
  // Output path first: a bad one, or the model file itself, should not cost the measurements.
  SLUICE_RETURN_IF_ERROR(CheckOutputFile("--out", f.out));
  SLUICE_RETURN_IF_ERROR(CheckNotAnInput("--out", f.out, {{"--model", f.model}}));
  if (f.all_to_all != 0 && (f.all_to_all < 2 || f.all_to_all > 8)) {
    return InvalidArgumentError(fmt::format(
        "--all-to-all: {} ranks (allowed: 2 to 8 local ranks, one node; 0 = no all-to-all)",
        f.all_to_all));
  }
  if (f.all_to_all == 0 && !f.cluster_out.empty()) {
    return InvalidArgumentError("--cluster-out: needs --all-to-all N (the link it writes)");
  }
  runtime::DistEnv env;  // the torchrun variables matter only to --all-to-all's ranks
  if (f.all_to_all > 0) {
    SLUICE_ASSIGN_OR_RETURN(env, runtime::ReadDistEnv());
    if (f.cluster_out.empty()) {
      return InvalidArgumentError(
          "--all-to-all: give --cluster-out FILE, where the measured link is written");
    }
    SLUICE_RETURN_IF_ERROR(CheckOutputFile("--cluster-out", f.cluster_out));
    if (SameFile(f.cluster_out, f.out)) {
      return InvalidArgumentError(fmt::format(
          "--cluster-out '{}' and --out '{}' are the same file: the table would overwrite the "
          "measured link; allowed: two different files",
          f.cluster_out, f.out));
    }
    SLUICE_RETURN_IF_ERROR(CheckNotAnInput("--cluster-out", f.cluster_out, {{"--model", f.model}}));
    if (env.launched) return RunAllToAllRank(f, env);
    if (env.world_size > 1) {
      return InvalidArgumentError(fmt::format(
          "--all-to-all {}: this process already is rank {} of {} (RANK/WORLD_SIZE are set); "
          "sluice profile starts its own ranks",
          f.all_to_all, env.rank, env.world_size));
    }
  }
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

  if (f.all_to_all > 0) {
    // Before any torch state exists in this process (LaunchLocal forks).
    SLUICE_ASSIGN_OR_RETURN(std::vector<std::string> argv, runtime::SelfCommandLine());
    runtime::LaunchOptions lo;
    lo.nproc = f.all_to_all;
    lo.master_addr = env.master_addr;
    lo.master_port = env.master_port;
    SLUICE_RETURN_IF_ERROR(runtime::LaunchLocal(argv, lo).WithPrefix("--all-to-all"));
    std::fflush(stdout);
  }
  fmt::print("profiling {} on {}; host allocator {}\n", model.name, runtime::DescribeCpu(o.threads),
             allocator_note);
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
  p->add_option("--host-allocator", f->host_allocator,
                "How freed CPU tensors are kept: cache (glibc's mmap and trim thresholds at 1 "
                "GiB, so each repeat reuses memory instead of mapping it again; sluice train's "
                "default) or system (glibc's own policy); profile as you train")
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
  p->add_option("--all-to-all", f->all_to_all,
                "Also measure the expert-parallel all-to-all between N local ranks (Gloo; 2 to "
                "8) and write the fitted link to --cluster-out; 0 = do not")
      ->type_name("N")
      ->check(IntegerCheck(0, 8, "0 (no all-to-all) or 2 to 8 local ranks"))
      ->capture_default_str();
  p->add_option("--cluster-out", f->cluster_out,
                "With --all-to-all: where to write the cluster file (the cpu preset with the "
                "measured link) that --cluster accepts")
      ->type_name("FILE")
      ->check(PathCheck());
  SetHandler(p, state, [f] { return RunProfile(*f); });
}

}  // namespace sluice::cli
