#include "cost/cost_factory.h"

#include <fmt/core.h>

#include <string_view>
#include <utility>

#include "base/paths.h"
#include "cost/analytic_cost_model.h"
#include "cost/cost_fit.h"
#include "cost/profile_table.h"
#include "cost/profiled_cost_model.h"

namespace sluice {
namespace {

// The device and intra-node link the shipped tables were measured on (AWS p4d.24xlarge).
constexpr std::string_view kShippedDevice = "a100-40g";

AnalyticOptions BaseOptions(const ClusterSpec& cluster, const CostModelOptions& options) {
  AnalyticOptions a;
  a.work.flash_attention = options.flash_attention;
  a.tp_link = cluster.intra_node;
  return a;
}

// A model the table profiles: `model` itself, else the preset the table names.
StatusOr<ModelSpec> FitModel(const LayerCostTable& table, const ModelSpec& model) {
  Status own = CheckTableMatchesModel(table, model);
  if (own.ok()) return model;
  StatusOr<ModelSpec> preset = ModelPreset(table.model.name);
  if (preset.ok() && CheckTableMatchesModel(table, *preset).ok()) return preset;
  return own;
}

// Analytic model with factors fitted to `table` (measured on `table_device` over `table_link`).
StatusOr<std::unique_ptr<CostModel>> FittedAnalytic(
    const LayerCostTable& table, const DeviceSpec& table_device, const LinkSpec& table_link,
    const ModelSpec& model, const ClusterSpec& cluster, const CostModelOptions& options) {
  SLUICE_ASSIGN_OR_RETURN(ModelSpec fit_model, FitModel(table, model));
  FitOptions fit;
  fit.base = BaseOptions(cluster, options);
  fit.base.tp_link = table_link;
  SLUICE_ASSIGN_OR_RETURN(FitReport report,
                          FitAnalyticToTable(table, fit_model, table_device, fit));
  AnalyticOptions a = BaseOptions(cluster, options);
  a.factors = std::move(report.factors);
  a.factors_source = fmt::format("fitted to {} (mean error {:.1f}% on its {} points)", table.path,
                                 100 * report.mean_rel_error, report.points);
  SLUICE_ASSIGN_OR_RETURN(std::unique_ptr<AnalyticCostModel> m,
                          AnalyticCostModel::Create(model, cluster.device, std::move(a)));
  return std::unique_ptr<CostModel>(std::move(m));
}

StatusOr<std::unique_ptr<CostModel>> DefaultAnalytic(const ModelSpec& model,
                                                     const ClusterSpec& cluster,
                                                     const CostModelOptions& options) {
  StatusOr<std::string> path = DataFile(kShippedProfileTables[0]);
  if (path.ok()) {
    SLUICE_ASSIGN_OR_RETURN(LayerCostTable table, ReadLayerCostTable(*path));
    StatusOr<ClusterSpec> a100 = ClusterPreset(kShippedDevice, 8);
    if (a100.ok()) {
      return FittedAnalytic(table, a100->device, a100->intra_node, model, cluster, options);
    }
  }
  AnalyticOptions a = BaseOptions(cluster, options);
  a.factors_source = fmt::format("built-in defaults ({} not found)", kShippedProfileTables[0]);
  SLUICE_ASSIGN_OR_RETURN(std::unique_ptr<AnalyticCostModel> m,
                          AnalyticCostModel::Create(model, cluster.device, std::move(a)));
  return std::unique_ptr<CostModel>(std::move(m));
}

StatusOr<std::unique_ptr<CostModel>> Profiled(LayerCostTable table, const ModelSpec& model,
                                              const ClusterSpec& cluster,
                                              const CostModelOptions& options) {
  ProfiledOptions p;
  p.device = cluster.device;
  p.analytic = BaseOptions(cluster, options);
  SLUICE_ASSIGN_OR_RETURN(std::unique_ptr<ProfiledCostModel> m,
                          ProfiledCostModel::Create(std::move(table), model, std::move(p)));
  return std::unique_ptr<CostModel>(std::move(m));
}

}  // namespace

StatusOr<std::unique_ptr<CostModel>> MakeCostModel(const ModelSpec& model,
                                                   const ClusterSpec& cluster,
                                                   const CostModelOptions& options) {
  const std::string_view kind = options.kind;
  constexpr std::string_view kProfiled = "profiled:";
  constexpr std::string_view kAnalytic = "analytic:";
  if (kind == "auto") {
    if (cluster.device.name == kShippedDevice) {
      for (const char* relative : kShippedProfileTables) {
        StatusOr<std::string> path = DataFile(relative);
        if (!path.ok()) continue;
        SLUICE_ASSIGN_OR_RETURN(LayerCostTable table, ReadLayerCostTable(*path));
        if (table.model.name != model.name || !CheckTableMatchesModel(table, model).ok()) {
          continue;
        }
        return Profiled(std::move(table), model, cluster, options);
      }
    }
    return DefaultAnalytic(model, cluster, options);
  }
  if (kind == "analytic") return DefaultAnalytic(model, cluster, options);
  if (kind.starts_with(kProfiled) && kind.size() > kProfiled.size()) {
    SLUICE_ASSIGN_OR_RETURN(LayerCostTable table,
                            ReadLayerCostTable(std::string(kind.substr(kProfiled.size()))));
    return Profiled(std::move(table), model, cluster, options);
  }
  if (kind.starts_with(kAnalytic) && kind.size() > kAnalytic.size()) {
    SLUICE_ASSIGN_OR_RETURN(LayerCostTable table,
                            ReadLayerCostTable(std::string(kind.substr(kAnalytic.size()))));
    return FittedAnalytic(table, cluster.device, cluster.intra_node, model, cluster, options);
  }
  return InvalidArgumentError(fmt::format(
      "cost model '{}': must be 'auto', 'analytic', 'analytic:PATH' or 'profiled:PATH'", kind));
}

}  // namespace sluice
