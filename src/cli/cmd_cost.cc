// `sluice cost show` and `sluice cost fit`.
#include <fmt/core.h>
#include <fmt/ranges.h>

#include <algorithm>
#include <memory>
#include <optional>
#include <vector>

#include "base/paths.h"
#include "cli/cli_common.h"
#include "cost/context_parallel.h"
#include "cost/cost_factory.h"
#include "cost/cost_fit.h"
#include "cost/cost_model.h"
#include "cost/profile_table.h"
#include "model/cluster_spec.h"
#include "model/model_spec.h"
#include "model/parallel_config.h"

namespace sluice::cli {
namespace {

// A count with its unit: "6.65 billion", "1.97 million", "4096".
std::string CountText(double n) {
  if (n >= 1e9) return fmt::format("{:.2f} billion", n / 1e9);
  if (n >= 1e6) return fmt::format("{:.2f} million", n / 1e6);
  return fmt::format("{:.0f}", n);
}

struct CostShowFlags {
  std::string model = "gpt-6.7b";
  std::string cluster = "a100-40g:8";
  std::string parallel;
  std::string cost = "auto";
  bool flash_attention = false;
  int64_t tp = 0;  // 0 = from --parallel (default 1)
  int64_t mbs = 1;
  int64_t seqlen = 0;  // 0 = the table over lengths
  int64_t dec_seqlen = 0;
  std::string recompute = "all";
};

struct CostFitFlags {
  std::vector<std::string> tables;
  std::string cluster = "a100-40g:8";
  double fixed_sharpness = 0;
};

std::string Ms(const LayerCost& c, Duration d) {
  return c.feasible ? fmt::format("{:.3f}", d.millis()) : "-";
}
std::string Mb(const LayerCost& c, Bytes b) {
  return c.feasible ? fmt::format("{:.1f}", b.mb()) : "-";
}

StatusOr<std::vector<Recompute>> RecomputeLevels(const std::string& name) {
  if (name == "all") return std::vector<Recompute>{Recompute::kNone, Recompute::kSelective,
                                                   Recompute::kFull};
  auto rc = ParseRecompute(name);
  if (!rc.ok()) {
    return InvalidArgumentError(fmt::format(
        "--recompute: '{}' is not a recompute level (allowed: none, selective, full, all)", name));
  }
  return std::vector<Recompute>{*rc};
}

void PrintPointTable(const CostModel& cost, const LayerShape& shape, int64_t tp,
                     const CpRing& ring, const std::vector<Recompute>& levels) {
  const ModelSpec& m = cost.model();
  std::vector<LayerKind> kinds = {LayerKind::kEncoder};
  if (m.is_encoder_decoder()) kinds.push_back(LayerKind::kDecoder);
  kinds.push_back(LayerKind::kEmbedding);
  kinds.push_back(LayerKind::kOutputHead);
  fmt::print("{:<12} {:<10} {:>10} {:>10} {:>10} {:>10} {:>12} {:>12}\n", "layer", "recompute",
             "fwd ms", "bwd ms", "bwd-in ms", "bwd-w ms", "stored MB", "peak MB");
  for (LayerKind kind : kinds) {
    for (Recompute rc : levels) {
      const bool has_rc = kind == LayerKind::kEncoder || kind == LayerKind::kDecoder;
      if (!has_rc && rc != levels.front()) continue;
      const LayerCost c = ContextParallelLayer(cost, kind, shape, tp, rc, ring);
      fmt::print("{:<12} {:<10} {:>10} {:>10} {:>10} {:>10} {:>12} {:>12}{}\n",
                 LayerKindName(kind), has_rc ? RecomputeName(rc) : "-", Ms(c, c.forward),
                 Ms(c, c.backward), Ms(c, c.backward_input), Ms(c, c.backward_weight),
                 Mb(c, c.stored_activation), Mb(c, c.peak_activation),
                 c.feasible ? "" : "  infeasible (outside the measured range or out of memory)");
    }
  }
}

void PrintLengthTable(const CostModel& cost, int64_t mbs, int64_t tp, const CpRing& ring,
                      const std::vector<Recompute>& levels) {
  const ModelSpec& m = cost.model();
  fmt::print("{:>8} {:<10} {:>10} {:>10} {:>12} {:>12} {:>14}\n", "seqlen", "recompute",
             "fwd ms", "bwd ms", "stored MB", "peak MB", "tokens/s/layer");
  for (int64_t len = 256; len <= std::min<int64_t>(m.max_position, 8192); len *= 2) {
    LayerShape shape{mbs, len, m.is_encoder_decoder() ? std::max<int64_t>(16, len / 4) : 0};
    for (Recompute rc : levels) {
      const LayerCost c = ContextParallelLayer(cost, LayerKind::kEncoder, shape, tp, rc, ring);
      const double tps =
          c.feasible ? static_cast<double>(mbs * len) / (c.forward + c.backward).seconds() : 0;
      fmt::print("{:>8} {:<10} {:>10} {:>10} {:>12} {:>12} {:>14}\n", len, RecomputeName(rc),
                 Ms(c, c.forward), Ms(c, c.backward), Mb(c, c.stored_activation),
                 Mb(c, c.peak_activation), c.feasible ? fmt::format("{:.0f}", tps) : "infeasible");
    }
  }
}

Status RunCostShow(const CostShowFlags& f) {
  SLUICE_ASSIGN_OR_RETURN(ModelSpec model, ResolveModel(f.model));
  SLUICE_ASSIGN_OR_RETURN(ClusterSpec cluster, ResolveCluster(f.cluster));
  ParallelConfig par;
  if (!f.parallel.empty()) {
    SLUICE_ASSIGN_OR_RETURN(par, ResolveParallel(f.parallel));
  }
  if (f.tp > 0) {
    if (!f.parallel.empty() && par.tp != 1 && par.tp != f.tp) {
      return InvalidArgumentError(fmt::format(
          "--tp {} contradicts tp={} in --parallel; give tp in one place", f.tp, par.tp));
    }
    par.tp = f.tp;
  }
  SLUICE_RETURN_IF_ERROR(CheckParallelFits(par, model, &cluster, "--parallel"));
  SLUICE_ASSIGN_OR_RETURN(std::vector<Recompute> levels, RecomputeLevels(f.recompute));
  if (f.dec_seqlen > 0 && !model.is_encoder_decoder()) {
    return InvalidArgumentError(fmt::format(
        "--dec-seqlen: model '{}' is decoder-only; a decoder length applies to encoder-decoder "
        "models only", model.name));
  }
  CostModelOptions options;
  options.kind = f.cost;
  options.flash_attention = f.flash_attention;
  SLUICE_ASSIGN_OR_RETURN(std::unique_ptr<CostModel> cost, MakeCostModel(model, cluster, options));

  fmt::print("model:      {} ({}, {} layers{}, hidden {}, heads {})\n", model.name,
             ModelKindName(model.kind), model.layers,
             model.is_encoder_decoder() ? fmt::format(" + {} decoder", model.decoder_layers) : "",
             model.hidden, model.heads);
  fmt::print("cost model: {}\n", cost->Describe());
  fmt::print("device:     {} ({:.0f} TFLOP/s, {:.0f} MB), tp {}{}\n\n", cluster.device.name,
             cluster.device.peak_flops / 1e12, cluster.device.memory.mb(), par.tp,
             par.cp > 1 ? fmt::format(", cp {} (per device of the cp group: ring attention, "
                                      "cost/context_parallel.h)",
                                      par.cp)
                        : "");
  const CpRing ring{par.cp, CpRingLink(cluster, par)};
  if (f.seqlen > 0) {
    const int64_t dec = model.is_encoder_decoder()
                            ? (f.dec_seqlen > 0 ? f.dec_seqlen : f.seqlen)
                            : 0;
    fmt::print("per layer, per tp rank, at micro-batch {} x seqlen {}{}:\n", f.mbs, f.seqlen,
               model.is_encoder_decoder() ? fmt::format(" x dec seqlen {}", dec) : "");
    PrintPointTable(*cost, LayerShape{f.mbs, f.seqlen, dec}, par.tp, ring, levels);
  } else {
    fmt::print("cost-model table: one {} layer, micro-batch {}{}, per tp rank:\n",
               model.is_encoder_decoder() ? "encoder" : "transformer", f.mbs,
               model.is_encoder_decoder() ? ", decoder length = seqlen / 4" : "");
    PrintLengthTable(*cost, f.mbs, par.tp, ring, levels);
  }

  // Model states of one device holding the whole model (pp = 1), under the dp and ZeRO given.
  StageLayers all{model.layers, model.decoder_layers, true, true};
  const ModelStateMemory states = cost->ModelStates(all, par);
  fmt::print("\nmodel states of the whole model on one device (tp {}, dp {}, ZeRO-{}): "
             "{} parameters per device; weights {:.0f} MB, gradients {:.0f} MB, optimizer {:.0f} "
             "MB, total {:.0f} MB\n",
             par.tp, par.dp, par.zero, CountText(static_cast<double>(states.params)),
             states.weights.mb(), states.gradients.mb(), states.optimizer.mb(),
             states.total().mb());
  if (par.pp > 1) {
    fmt::print("(with pp = {} each stage holds about 1/{} of the layers)\n", par.pp, par.pp);
  }
  return Status::Ok();
}

Status RunCostFit(const CostFitFlags& f) {
  SLUICE_ASSIGN_OR_RETURN(ClusterSpec cluster, ResolveCluster(f.cluster));
  std::vector<std::string> paths = f.tables;
  if (paths.empty()) {
    for (const char* rel : kShippedProfileTables) {
      SLUICE_ASSIGN_OR_RETURN(std::string path, DataFile(rel));
      paths.push_back(path);
    }
  }
  FitOptions options;
  options.fixed_sharpness = f.fixed_sharpness;
  for (const std::string& path : paths) {
    SLUICE_ASSIGN_OR_RETURN(LayerCostTable table, ReadLayerCostTable(path));
    auto model = ModelPreset(table.model.name);
    if (!model.ok()) {
      return InvalidArgumentError(fmt::format(
          "{}: field 'model.name': '{}' is not a model preset, so its full shape (layers, "
          "vocab) is unknown; fit tables of: {}",
          path, table.model.name, fmt::join(ModelPresetNames(), ", ")));
    }
    SLUICE_ASSIGN_OR_RETURN(FitReport report,
                            FitAnalyticToTable(table, *model, cluster.device, options));
    fmt::print("{}\n", FormatFitReport(report));
  }
  return Status::Ok();
}

}  // namespace

void RegisterCostCommands(CLI::App* app, RunState* state) {
  CLI::App* cost = app->add_subcommand("cost", "Query and fit the per-layer cost models");
  cost->require_subcommand(1);

  auto show = std::make_shared<CostShowFlags>();
  CLI::App* s = cost->add_subcommand(
      "show", "Per-layer forward/backward time and activation memory, and model-state memory");
  AddModelFlag(s, &show->model)->capture_default_str();
  AddClusterFlag(s, &show->cluster)->capture_default_str();
  AddParallelFlag(s, &show->parallel);
  s->add_option("--cost", show->cost,
                "Cost model: auto, analytic, profiled:PATH or analytic:PATH")
      ->capture_default_str();
  s->add_flag("--flash-attention", show->flash_attention,
              "Analytic model: fused attention (no s^2 activation memory)");
  s->add_option("--tp", show->tp, "Tensor-parallel degree (shorthand for --parallel tp=N)")
      ->check(IntegerCheck(1, kNoMaxInteger));
  s->add_option("--mbs", show->mbs, "Micro-batch size (sequences)")
      ->check(IntegerCheck(1, kNoMaxInteger))
      ->capture_default_str();
  s->add_option("--seqlen", show->seqlen,
                "Sequence length (tokens); omitted = a table over lengths 256..8192")
      ->check(IntegerCheck(1, kNoMaxInteger));
  s->add_option("--dec-seqlen", show->dec_seqlen,
                "Decoder length for encoder-decoder models (default: --seqlen)")
      ->check(IntegerCheck(1, kNoMaxInteger));
  s->add_option("--recompute", show->recompute, "none, selective, full or all")
      ->capture_default_str();
  SetHandler(s, state, [show] { return RunCostShow(*show); });

  auto fit = std::make_shared<CostFitFlags>();
  CLI::App* f = cost->add_subcommand(
      "fit", "Fit the analytic model to profile tables and print its error per group");
  f->add_option("--table", fit->tables,
                "layer-cost-table/1 file(s) (default: the shipped A100 GPT-6.7B and T5-11B tables)")
      ->type_name("FILE");
  AddClusterFlag(f, &fit->cluster)->capture_default_str();
  f->add_option("--fixed-sharpness", fit->fixed_sharpness,
                "Hold the smooth-max exponent p at this value (0 = fit it)")
      ->check(NumberCheck(0, false, kNoMax, "a number >= 0, 0 = fit it"));
  SetHandler(f, state, [fit] { return RunCostFit(*fit); });
}

}  // namespace sluice::cli
