#include "planner/scenario.h"

#include <fmt/core.h>

#include <algorithm>
#include <utility>

#include "cost/cost_factory.h"
#include "data/data_source.h"
#include "model/chunk_cut.h"

namespace sluice {
namespace {

Status Prefixed(const Status& s, const std::string& where) {
  if (s.ok()) return s;
  return Status(s.code(), fmt::format("{}: {}", where, s.message()));
}

// The memory limit of `spec` (given as memory_limit_mb or in the parallel configuration, not
// both), checked against one device of `cluster`.
StatusOr<std::optional<Bytes>> ResolveMemoryLimit(const ScenarioSpec& spec,
                                                  const ClusterSpec& cluster,
                                                  const FieldNamer& field_name) {
  const bool in_parallel = spec.parallel.has_value() && spec.parallel->memory_limit.has_value();
  if (spec.memory_limit_mb <= 0) {
    // A limit in the parallel configuration is checked with it (CheckParallelFits).
    return in_parallel ? spec.parallel->memory_limit : std::nullopt;
  }
  if (in_parallel) {
    return InvalidArgumentError(fmt::format(
        "{}: the memory limit is also given as memory_limit_mb in {}; give it in one place",
        field_name("memory_limit_mb"), field_name("parallel")));
  }
  const Bytes limit = Bytes::MB(spec.memory_limit_mb);
  if (limit > cluster.device.memory) {
    return InvalidArgumentError(fmt::format(
        "{}: {:.0f} MB exceeds the memory of one {} device ({:.0f} MB; allowed: 1..{:.0f})",
        field_name("memory_limit_mb"), spec.memory_limit_mb, cluster.device.name,
        cluster.device.memory.mb(), cluster.device.memory.mb()));
  }
  return std::optional<Bytes>(limit);
}

// The memory reserve of `spec` (memory_reserve_mb or the parallel configuration's, not both), and
// only without a memory limit (`has_limit`); checked against one device of `cluster`.
StatusOr<std::optional<Bytes>> ResolveMemoryReserve(const ScenarioSpec& spec,
                                                    const ClusterSpec& cluster, bool has_limit,
                                                    const FieldNamer& field_name) {
  const bool in_parallel = spec.parallel.has_value() && spec.parallel->memory_reserve.has_value();
  if (spec.memory_reserve_mb < 0) {
    // A reserve in the parallel configuration is checked with it (CheckParallelFits).
    return in_parallel ? spec.parallel->memory_reserve : std::nullopt;
  }
  if (in_parallel) {
    return InvalidArgumentError(fmt::format(
        "{}: the memory reserve is also given as memory_reserve_mb in {}; give it in one place",
        field_name("memory_reserve_mb"), field_name("parallel")));
  }
  if (has_limit) {
    return InvalidArgumentError(fmt::format(
        "{}: applies only without {} (an explicit limit is the budget as given); give one of them",
        field_name("memory_reserve_mb"), field_name("memory_limit_mb")));
  }
  const Bytes reserve = Bytes::MB(spec.memory_reserve_mb);
  if (reserve >= cluster.device.memory) {
    return InvalidArgumentError(fmt::format(
        "{}: {:.0f} MB leaves nothing of the {:.0f} MB of one {} device (allowed: 0..{:.0f})",
        field_name("memory_reserve_mb"), spec.memory_reserve_mb, cluster.device.memory.mb(),
        cluster.device.name, cluster.device.memory.mb() - 1));
  }
  return std::optional<Bytes>(reserve);
}

}  // namespace

FieldNamer FileFieldNamer(std::string source) {
  return [source = std::move(source)](std::string_view field) {
    if (source.empty()) return fmt::format("field '{}'", field);
    return fmt::format("{}: field '{}'", source, field);
  };
}

StatusOr<Scenario> ResolveScenario(const ScenarioSpec& spec, const FieldNamer& field_name) {
  Scenario sc;
  auto model = ResolveModel(spec.model);
  if (!model.ok()) return Prefixed(model.status(), field_name("model"));
  sc.model = std::move(model).value();
  auto cluster = ResolveCluster(spec.cluster);
  if (!cluster.ok()) return Prefixed(cluster.status(), field_name("cluster"));
  sc.cluster = std::move(cluster).value();
  SLUICE_ASSIGN_OR_RETURN(sc.memory_limit, ResolveMemoryLimit(spec, sc.cluster, field_name));
  SLUICE_ASSIGN_OR_RETURN(
      sc.memory_reserve,
      ResolveMemoryReserve(spec, sc.cluster, sc.memory_limit.has_value(), field_name));
  if (spec.parallel.has_value()) {
    sc.parallel = spec.parallel;
    sc.parallel->memory_limit = sc.memory_limit;
    sc.parallel->memory_reserve = sc.memory_reserve;
    SLUICE_RETURN_IF_ERROR(
        CheckParallelFits(*sc.parallel, sc.model, &sc.cluster, field_name("parallel")));
  }
  if (spec.max_seqlen > sc.model.max_position) {
    return InvalidArgumentError(
        fmt::format("{}: {} exceeds the max position {} of model '{}' (allowed: 1..{})",
                    field_name("max_seqlen"), spec.max_seqlen, sc.model.max_position, sc.model.name,
                    sc.model.max_position));
  }
  if (spec.iterations < 0) {
    return InvalidArgumentError(fmt::format("{}: {} is not a positive integer or 0 (all)",
                                            field_name("iterations"), spec.iterations));
  }
  sc.max_seqlen = spec.max_seqlen;
  sc.tokens_per_batch = spec.tokens_per_batch;
  sc.iterations = spec.iterations;
  auto long_samples = ParseLongSamplePolicy(spec.long_samples);
  if (!long_samples.ok()) return Prefixed(long_samples.status(), field_name("long"));
  sc.long_samples = *long_samples;

  CostModelOptions cost_options;
  cost_options.kind = spec.cost;
  cost_options.flash_attention = spec.flash_attention;
  auto cost = MakeCostModel(sc.model, sc.cluster, cost_options);
  if (!cost.ok()) return Prefixed(cost.status(), field_name("cost"));
  sc.cost = std::move(cost).value();

  DataOptions data_options;
  data_options.seed = spec.seed;
  data_options.num_samples = spec.samples;
  auto dataset = LoadData(spec.data, data_options);
  if (!dataset.ok()) return Prefixed(dataset.status(), field_name("data"));
  sc.dataset = std::move(dataset).value();
  BatcherOptions batcher_options;
  batcher_options.tokens_per_batch = spec.tokens_per_batch;
  batcher_options.max_seqlen = spec.max_seqlen;
  batcher_options.long_samples = sc.long_samples;
  // A decoder-only model sees prompt and response as one sequence.
  batcher_options.limit =
      sc.model.is_encoder_decoder() ? SeqlenLimit::kEachSide : SeqlenLimit::kTotal;
  batcher_options.seed = spec.seed;
  SLUICE_ASSIGN_OR_RETURN(GlobalBatcher batcher,
                          GlobalBatcher::Create(sc.dataset, batcher_options));
  sc.batcher.emplace(std::move(batcher));
  return sc;
}

std::string Scenario::Describe(const ScenarioDescribeOptions& options) const {
  std::string s;
  s += fmt::format("model:    {} ({}, {} layers{})\n", model.name, ModelKindName(model.kind),
                   model.layers,
                   model.is_encoder_decoder() ? fmt::format(" + {}", model.decoder_layers) : "");
  // Where the limit comes from: given, or the device's memory less the reserve.
  const std::string reserve =
      memory_limit.has_value() ? ""
                               : fmt::format(" (the device's {:.0f} MB less a {:.0f} MB reserve)",
                                             cluster.device.memory.mb(), MemoryReserve().mb());
  if (options.parallel && parallel.has_value()) {
    const ParallelConfig& p = *parallel;
    s += fmt::format(
        "cluster:  {} ({} devices), dp {} x pp {} x tp {}{}, ZeRO-{}, memory limit {:.0f} MB{}\n",
        cluster.name, cluster.num_devices(), p.dp, p.pp, p.tp,
        (p.cp > 1 ? fmt::format(" x cp {}", p.cp) : "") +
            (p.vpp > 1 ? fmt::format(" x vpp {}", p.vpp) : "") +
            (p.layer_cut.empty() ? ""
                                 : fmt::format(" (layers {})", DescribeLayerCut(p.layer_cut))) +
            (SearchesOrder(cluster, p) ? fmt::format(", order {}", RankOrderName(p.order)) : ""),
        p.zero, MemoryLimit().mb(), reserve);
  } else {
    s += fmt::format("cluster:  {} ({} devices), memory limit {:.0f} MB per device{}\n",
                     cluster.name, cluster.num_devices(), MemoryLimit().mb(), reserve);
  }
  s += fmt::format("cost:     {}\n", cost->Describe());
  s += fmt::format("data:     {} ({} samples), {} tokens per global batch, max seqlen {}",
                   dataset.source(), dataset.size(), tokens_per_batch, max_seqlen);
  if (options.batches_taken.has_value()) {
    s += fmt::format(" ({}), {} batches{}", LongSamplePolicyName(long_samples),
                     *options.batches_taken, iterations == 0 ? " (all)" : "");
  } else {
    s += iterations == 0 ? ", all batches" : fmt::format(", {} batches", iterations);
  }
  s += fmt::format("\nlost:     {}", Loss().Describe());
  return s;
}

Status Scenario::NoBatchError(const FieldNamer& field_name) const {
  const std::string why = Loss().WhyNoBatch();
  return InvalidArgumentError(fmt::format("{}: '{}' yields no global batch of {} tokens{}{}",
                                          field_name("data"), dataset.source(), tokens_per_batch,
                                          why.empty() ? "" : ": ", why));
}

SmallInputCheck::SmallInputCheck(int64_t iterations, int64_t min_batch_samples,
                                 std::string batch_what, int64_t min_run_samples,
                                 std::string run_what)
    : iterations_(iterations),
      min_batch_samples_(min_batch_samples),
      batch_what_(std::move(batch_what)),
      min_run_samples_(min_run_samples),
      run_what_(std::move(run_what)) {}

void SmallInputCheck::Add(const GlobalBatch& batch) {
  const int64_t n = static_cast<int64_t>(batch.samples.size());
  smallest_ = batches_ == 0 ? n : std::min(smallest_, n);
  ++batches_;
  samples_ += n;
  if (n < min_batch_samples_) ++small_batches_;
}

std::vector<std::string> SmallInputCheck::Warnings() const {
  std::vector<std::string> out;
  if (batches_ == 0) return out;
  if (iterations_ > 0 && batches_ < iterations_) {
    out.push_back(fmt::format(
        "the data yields only {} global batch{}, fewer than the {} asked for: figures over so few "
        "batches say little",
        batches_, batches_ == 1 ? "" : "es", iterations_));
  }
  if (min_run_samples_ > 0 && samples_ < min_run_samples_) {
    out.push_back(fmt::format(
        "the run's global batches hold only {} sample{} in all, fewer than {}: too small an input "
        "to compare configurations or methods",
        samples_, samples_ == 1 ? "" : "s", run_what_));
  }
  if (small_batches_ > 0) {
    out.push_back(fmt::format(
        "{} of {} global batches hold fewer samples than {} (the smallest holds {}): some replica "
        "or pipeline stage has no work, so the figures say little about this configuration",
        small_batches_, batches_, batch_what_, smallest_));
  }
  return out;
}

}  // namespace sluice
