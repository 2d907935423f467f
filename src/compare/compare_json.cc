#include "compare/compare_json.h"

#include <fmt/core.h>

#include <array>
#include <limits>

#include "base/json_util.h"

namespace sluice {
namespace {

constexpr double kBig = std::numeric_limits<double>::max();

nlohmann::json BreakdownToJson(const Breakdown& b) {
  return {{"useful", b.useful}, {"padding", b.padding}, {"recompute", b.recompute},
          {"kernel", b.kernel}, {"comm", b.comm},       {"imbalance", b.imbalance},
          {"bubble", b.bubble}};
}

Status BreakdownFromJson(JsonObjectReader& parent, std::string_view key, Breakdown* b) {
  const nlohmann::json* j = parent.Child(key);
  if (j == nullptr) return parent.Error(key, "is required");
  JsonObjectReader r(*j, parent.source(), parent.FieldPath(key));
  SLUICE_RETURN_IF_ERROR(r.status());
  SLUICE_RETURN_IF_ERROR(r.Double("useful", &b->useful, 0, 1));
  SLUICE_RETURN_IF_ERROR(r.Double("padding", &b->padding, 0, 1));
  SLUICE_RETURN_IF_ERROR(r.Double("recompute", &b->recompute, 0, 1));
  SLUICE_RETURN_IF_ERROR(r.Double("kernel", &b->kernel, 0, 1));
  SLUICE_RETURN_IF_ERROR(r.Double("comm", &b->comm, 0, 1));
  SLUICE_RETURN_IF_ERROR(r.Double("imbalance", &b->imbalance, 0, 1));
  SLUICE_RETURN_IF_ERROR(r.Double("bubble", &b->bubble, 0, 1));
  return r.Finish();
}

// Reads the string `key` as one of `values` by its name (`name_of`); the error lists the names.
template <typename E, size_t N>
Status ReadEnum(JsonObjectReader& r, std::string_view key, const std::array<E, N>& values,
                std::string_view (*name_of)(E), E* out) {
  std::array<std::string_view, N> names;
  for (size_t i = 0; i < N; ++i) names[i] = name_of(values[i]);
  std::string name;
  SLUICE_RETURN_IF_ERROR(r.Enum(key, &name, names));
  for (size_t i = 0; i < N; ++i) {
    if (names[i] == name) *out = values[i];
  }
  return Status::Ok();
}

nlohmann::json BatchToJson(const BatchRecord& b) {
  nlohmann::json j = {{"batch", b.batch},
          {"outcome", std::string(BatchOutcomeName(b.outcome))},
          {"reason", b.reason},
          {"tokens", b.tokens},
          {"real_tokens", b.real_tokens},
          {"padded_tokens", b.padded_tokens},
          {"micro_batches", b.micro_batches},
          {"iteration_ms", b.iteration_ms},
          {"ideal_ms", b.ideal_ms},
          {"length_aware_ms", b.length_aware_ms},
          {"planning_ms", b.planning_ms},
          {"bubble", b.bubble},
          {"comm", b.comm},
          {"peak_memory_mb", b.peak_memory_mb},
          {"breakdown", BreakdownToJson(b.breakdown)}};
  if (b.cp_splits > 0) j["cp_splits"] = b.cp_splits;
  if (b.strategy >= 0) {
    j["strategy"] = b.strategy;
    j["switch_ms"] = b.switch_ms;
    if (!b.screened.empty()) j["screened"] = b.screened;
  }
  // Written only for runs with all-to-alls (expert parallelism): other results keep their bytes.
  if (b.all_to_all_ms > 0) {
    j["all_to_all_ms"] = b.all_to_all_ms;
    j["exposed_all_to_all_ms"] = b.exposed_all_to_all_ms;
  }
  return j;
}

Status BatchFromJson(const nlohmann::json& j, std::string_view source, const std::string& path,
                     BatchRecord* b) {
  JsonObjectReader r(j, std::string(source), path);
  SLUICE_RETURN_IF_ERROR(r.status());
  static constexpr std::array<BatchOutcome, 4> kOutcomes = {
      BatchOutcome::kOk, BatchOutcome::kOutOfMemory, BatchOutcome::kSimOutOfMemory,
      BatchOutcome::kDeadlock};
  SLUICE_RETURN_IF_ERROR(r.Int("batch", &b->batch, 0, INT64_MAX));
  SLUICE_RETURN_IF_ERROR(ReadEnum(r, "outcome", kOutcomes, BatchOutcomeName, &b->outcome));
  SLUICE_RETURN_IF_ERROR(r.String("reason", &b->reason));
  SLUICE_RETURN_IF_ERROR(r.Int("tokens", &b->tokens, 0, INT64_MAX));
  SLUICE_RETURN_IF_ERROR(r.Int("real_tokens", &b->real_tokens, 0, INT64_MAX));
  SLUICE_RETURN_IF_ERROR(r.Int("padded_tokens", &b->padded_tokens, 0, INT64_MAX));
  SLUICE_RETURN_IF_ERROR(r.Int("micro_batches", &b->micro_batches, 0, INT64_MAX));
  SLUICE_RETURN_IF_ERROR(r.OptionalInt("cp_splits", &b->cp_splits, 0, INT64_MAX));
  SLUICE_RETURN_IF_ERROR(r.Double("iteration_ms", &b->iteration_ms, 0, kBig));
  SLUICE_RETURN_IF_ERROR(r.Double("ideal_ms", &b->ideal_ms, 0, kBig));
  SLUICE_RETURN_IF_ERROR(r.OptionalDouble("length_aware_ms", &b->length_aware_ms, 0, kBig));
  SLUICE_RETURN_IF_ERROR(r.Double("planning_ms", &b->planning_ms, 0, kBig));
  SLUICE_RETURN_IF_ERROR(r.Double("bubble", &b->bubble, 0, 1));
  SLUICE_RETURN_IF_ERROR(r.Double("comm", &b->comm, 0, 1));
  SLUICE_RETURN_IF_ERROR(r.Double("peak_memory_mb", &b->peak_memory_mb, 0, kBig));
  SLUICE_RETURN_IF_ERROR(BreakdownFromJson(r, "breakdown", &b->breakdown));
  SLUICE_RETURN_IF_ERROR(r.OptionalInt("strategy", &b->strategy, 0, INT64_MAX));
  SLUICE_RETURN_IF_ERROR(r.OptionalDouble("switch_ms", &b->switch_ms, 0, kBig));
  if (const nlohmann::json* screened = r.Child("screened")) {
    if (!screened->is_array()) return r.Error("screened", "must be an array of strategy indices");
    for (const nlohmann::json& i : *screened) {
      if (!i.is_number_integer() || i.get<int64_t>() < 0) {
        return r.Error("screened", "must be an array of strategy indices (integers >= 0)");
      }
      b->screened.push_back(i.get<int64_t>());
    }
    if (b->strategy < 0) return r.Error("screened", "is written only with 'strategy'");
  }
  SLUICE_RETURN_IF_ERROR(r.OptionalDouble("all_to_all_ms", &b->all_to_all_ms, 0, kBig));
  SLUICE_RETURN_IF_ERROR(
      r.OptionalDouble("exposed_all_to_all_ms", &b->exposed_all_to_all_ms, 0, kBig));
  return r.Finish();
}

nlohmann::json RunToJson(const MethodRun& m) {
  nlohmann::json batches = nlohmann::json::array();
  for (const BatchRecord& b : m.batches) batches.push_back(BatchToJson(b));
  nlohmann::json config = nullptr;
  if (m.config.has_value()) {
    config = {{"parallel", ParallelConfigToJson(m.config->parallel)},
              {"schedule", std::string(ScheduleKindName(m.config->schedule))},
              {"batching", m.config->batching}};
    if (m.config->dynamic_cp) config["dynamic_cp"] = true;
  }
  nlohmann::json j = {{"method", m.method},
          {"state", std::string(RunStateName(m.state))},
          {"reason", m.reason},
          {"config", config},
          {"adopted_from", m.adopted_from},
          {"search",
           {{"candidates", m.candidates}, {"feasible", m.feasible}, {"simulated", m.simulated}}},
          {"ok_batches", m.ok_batches},
          {"tokens_per_s", m.tokens_per_s},
          {"ran_tokens_per_s", m.ran_tokens_per_s},
          {"untrained_tokens", m.untrained_tokens},
          {"charged_ms", m.charged_ms},
          {"ideal_tokens_per_s", m.ideal_tokens_per_s},
          {"fraction_of_ideal", m.fraction_of_ideal},
          {"fraction_of_length_aware", m.fraction_of_length_aware},
          {"ratio_to_reference", m.ratio_to_reference},
          {"padding", m.padding},
          {"bubble", m.bubble},
          {"comm", m.comm},
          {"peak_memory_mb", m.peak_memory_mb},
          {"planning_ms", m.planning_ms},
          {"breakdown", BreakdownToJson(m.breakdown)},
          {"batches", batches}};
  if (m.hetero.has_value()) j["hetero"] = HeteroConfigToJson(*m.hetero);
  if (!m.strategies.empty()) {
    j["strategies"] = m.strategies;
    j["switches"] = m.switches;
    j["screen_margin"] =
        m.screen_margin.has_value() ? nlohmann::json(*m.screen_margin) : nlohmann::json("off");
  }
  if (m.all_to_all_ms > 0) {  // as for the batches
    j["all_to_all_ms"] = m.all_to_all_ms;
    j["exposed_all_to_all_ms"] = m.exposed_all_to_all_ms;
  }
  if (m.moe_overlap_rejected > 0) {
    j["moe_overlap_rejected"] = m.moe_overlap_rejected;
    j["moe_overlap_reason"] = m.moe_overlap_reason;
  }
  return j;
}

Status RunFromJson(const nlohmann::json& j, std::string_view source, const std::string& path,
                   MethodRun* m) {
  JsonObjectReader r(j, std::string(source), path);
  SLUICE_RETURN_IF_ERROR(r.status());
  static constexpr std::array<RunState, 4> kStates = {RunState::kOk, RunState::kOutOfMemory,
                                                      RunState::kUnsupported, RunState::kNotRun};
  SLUICE_RETURN_IF_ERROR(r.String("method", &m->method));
  SLUICE_RETURN_IF_ERROR(ReadEnum(r, "state", kStates, RunStateName, &m->state));
  SLUICE_RETURN_IF_ERROR(r.String("reason", &m->reason));
  const nlohmann::json* config = r.Child("config");
  if (config == nullptr) return r.Error("config", "is required (an object or null)");
  if (!config->is_null()) {
    JsonObjectReader c(*config, std::string(source), r.FieldPath("config"));
    SLUICE_RETURN_IF_ERROR(c.status());
    Candidate& chosen = m->config.emplace();
    const nlohmann::json* par = c.Child("parallel");
    if (par == nullptr) return c.Error("parallel", "is required");
    SLUICE_ASSIGN_OR_RETURN(
        chosen.parallel, ParallelConfigFromJson(
                             *par, fmt::format("{}: field '{}'", source, c.FieldPath("parallel"))));
    std::string schedule;
    SLUICE_RETURN_IF_ERROR(c.String("schedule", &schedule));
    auto kind = ParseScheduleKind(schedule);
    if (!kind.ok()) return c.Error("schedule", kind.status().message());
    chosen.schedule = *kind;
    SLUICE_RETURN_IF_ERROR(c.String("batching", &chosen.batching));
    SLUICE_RETURN_IF_ERROR(c.OptionalBool("dynamic_cp", &chosen.dynamic_cp));
    SLUICE_RETURN_IF_ERROR(c.Finish());
  }
  SLUICE_RETURN_IF_ERROR(r.String("adopted_from", &m->adopted_from));
  if (const nlohmann::json* hetero = r.Child("hetero")) {
    SLUICE_ASSIGN_OR_RETURN(
        m->hetero,
        HeteroConfigFromJson(*hetero, fmt::format("{}: field '{}'", source, r.FieldPath("hetero"))));
  }
  if (const nlohmann::json* strategies = r.Child("strategies")) {
    if (!strategies->is_array()) return r.Error("strategies", "must be an array of strings");
    for (const nlohmann::json& s : *strategies) {
      if (!s.is_string()) return r.Error("strategies", "must be an array of strings");
      m->strategies.push_back(s.get<std::string>());
    }
  }
  SLUICE_RETURN_IF_ERROR(r.OptionalInt("switches", &m->switches, 0, INT64_MAX));
  if (const nlohmann::json* margin = r.Child("screen_margin")) {
    if (margin->is_number() && margin->get<double>() >= 0 && margin->get<double>() < 1) {
      m->screen_margin = margin->get<double>();
    } else if (*margin != "off") {
      return r.Error("screen_margin", "must be \"off\" or a number in [0, 1)");
    }
  }
  const nlohmann::json* search = r.Child("search");
  if (search == nullptr) return r.Error("search", "is required");
  JsonObjectReader s(*search, std::string(source), r.FieldPath("search"));
  SLUICE_RETURN_IF_ERROR(s.status());
  SLUICE_RETURN_IF_ERROR(s.Int("candidates", &m->candidates, 0, INT64_MAX));
  SLUICE_RETURN_IF_ERROR(s.Int("feasible", &m->feasible, 0, INT64_MAX));
  SLUICE_RETURN_IF_ERROR(s.Int("simulated", &m->simulated, 0, INT64_MAX));
  SLUICE_RETURN_IF_ERROR(s.Finish());
  SLUICE_RETURN_IF_ERROR(r.Int("ok_batches", &m->ok_batches, 0, INT64_MAX));
  SLUICE_RETURN_IF_ERROR(r.Double("tokens_per_s", &m->tokens_per_s, 0, kBig));
  SLUICE_RETURN_IF_ERROR(r.Double("ran_tokens_per_s", &m->ran_tokens_per_s, 0, kBig));
  SLUICE_RETURN_IF_ERROR(r.Int("untrained_tokens", &m->untrained_tokens, 0, INT64_MAX));
  SLUICE_RETURN_IF_ERROR(r.Double("charged_ms", &m->charged_ms, 0, kBig));
  SLUICE_RETURN_IF_ERROR(r.Double("ideal_tokens_per_s", &m->ideal_tokens_per_s, 0, kBig));
  SLUICE_RETURN_IF_ERROR(r.Double("fraction_of_ideal", &m->fraction_of_ideal, 0, 1));
  SLUICE_RETURN_IF_ERROR(
      r.OptionalDouble("fraction_of_length_aware", &m->fraction_of_length_aware, 0, kBig));
  SLUICE_RETURN_IF_ERROR(r.Double("ratio_to_reference", &m->ratio_to_reference, 0, kBig));
  SLUICE_RETURN_IF_ERROR(r.Double("padding", &m->padding, 0, 1));
  SLUICE_RETURN_IF_ERROR(r.Double("bubble", &m->bubble, 0, 1));
  SLUICE_RETURN_IF_ERROR(r.Double("comm", &m->comm, 0, 1));
  SLUICE_RETURN_IF_ERROR(r.Double("peak_memory_mb", &m->peak_memory_mb, 0, kBig));
  SLUICE_RETURN_IF_ERROR(r.Double("planning_ms", &m->planning_ms, 0, kBig));
  SLUICE_RETURN_IF_ERROR(r.OptionalDouble("all_to_all_ms", &m->all_to_all_ms, 0, kBig));
  SLUICE_RETURN_IF_ERROR(
      r.OptionalDouble("exposed_all_to_all_ms", &m->exposed_all_to_all_ms, 0, kBig));
  SLUICE_RETURN_IF_ERROR(
      r.OptionalInt("moe_overlap_rejected", &m->moe_overlap_rejected, 0, INT64_MAX));
  SLUICE_RETURN_IF_ERROR(r.OptionalString("moe_overlap_reason", &m->moe_overlap_reason));
  SLUICE_RETURN_IF_ERROR(BreakdownFromJson(r, "breakdown", &m->breakdown));
  const nlohmann::json* batches = r.Child("batches");
  if (batches == nullptr || !batches->is_array()) return r.Error("batches", "must be an array");
  for (size_t i = 0; i < batches->size(); ++i) {
    BatchRecord b;
    const std::string path = fmt::format("{}[{}]", r.FieldPath("batches"), i);
    SLUICE_RETURN_IF_ERROR(BatchFromJson((*batches)[i], source, path, &b));
    // A dynamic run's indices name its strategies; a screened one did not run the batch.
    const int64_t n = static_cast<int64_t>(m->strategies.size());
    if (b.strategy >= n) {
      return InvalidArgumentError(
          fmt::format("{}: field '{}.strategy': {} is not one of the {} "
                      "strategies of the run",
                      source, path, b.strategy, n));
    }
    for (int64_t k : b.screened) {
      if (k >= n || k == b.strategy) {
        return InvalidArgumentError(
            fmt::format("{}: field '{}.screened': {} is not a strategy of the run other than the "
                        "batch's ({} strategies; the batch ran {})",
                        source, path, k, n, b.strategy));
      }
    }
    m->batches.push_back(std::move(b));
  }
  return r.Finish();
}

nlohmann::json LossToJson(const DataLoss& d) {
  return {{"samples", d.samples},
          {"tokens", d.tokens},
          {"clipped_samples", d.clipped_samples},
          {"clipped_tokens", d.clipped_tokens},
          {"dropped_long_samples", d.dropped_long_samples},
          {"dropped_long_tokens", d.dropped_long_tokens},
          {"dropped_budget_samples", d.dropped_budget_samples},
          {"dropped_budget_tokens", d.dropped_budget_tokens},
          {"kept_samples", d.kept_samples},
          {"kept_tokens", d.kept_tokens}};
}

// Reads "data_loss"; max_seqlen, tokens_per_batch and the long-sample rule come from `scenario`.
Status LossFromJson(JsonObjectReader& parent, const CompareScenario& scenario, DataLoss* d) {
  const nlohmann::json* j = parent.Child("data_loss");
  if (j == nullptr) return parent.Error("data_loss", "is required");
  JsonObjectReader r(*j, parent.source(), parent.FieldPath("data_loss"));
  SLUICE_RETURN_IF_ERROR(r.status());
  SLUICE_RETURN_IF_ERROR(r.Int("samples", &d->samples, 0, INT64_MAX));
  SLUICE_RETURN_IF_ERROR(r.Int("tokens", &d->tokens, 0, INT64_MAX));
  SLUICE_RETURN_IF_ERROR(r.Int("clipped_samples", &d->clipped_samples, 0, INT64_MAX));
  SLUICE_RETURN_IF_ERROR(r.Int("clipped_tokens", &d->clipped_tokens, 0, INT64_MAX));
  SLUICE_RETURN_IF_ERROR(r.Int("dropped_long_samples", &d->dropped_long_samples, 0, INT64_MAX));
  SLUICE_RETURN_IF_ERROR(r.Int("dropped_long_tokens", &d->dropped_long_tokens, 0, INT64_MAX));
  SLUICE_RETURN_IF_ERROR(r.Int("dropped_budget_samples", &d->dropped_budget_samples, 0, INT64_MAX));
  SLUICE_RETURN_IF_ERROR(r.Int("dropped_budget_tokens", &d->dropped_budget_tokens, 0, INT64_MAX));
  SLUICE_RETURN_IF_ERROR(r.Int("kept_samples", &d->kept_samples, 0, INT64_MAX));
  SLUICE_RETURN_IF_ERROR(r.Int("kept_tokens", &d->kept_tokens, 0, INT64_MAX));
  d->max_seqlen = scenario.max_seqlen;
  d->tokens_per_batch = scenario.tokens_per_batch;
  d->long_samples =
      scenario.long_samples == "drop" ? LongSamplePolicy::kDrop : LongSamplePolicy::kClip;
  return r.Finish();
}

Status StringsFromJson(JsonObjectReader& r, std::string_view key, std::vector<std::string>* out) {
  const nlohmann::json* j = r.Child(key);
  if (j == nullptr || !j->is_array()) return r.Error(key, "must be an array of strings");
  for (const nlohmann::json& s : *j) {
    if (!s.is_string()) return r.Error(key, "must be an array of strings");
    out->push_back(s.get<std::string>());
  }
  return Status::Ok();
}

nlohmann::json RateToJson(const AchievableRate& rate) {
  return {{"flops_per_s", rate.flops_per_s}, {"where", rate.where}};
}

Status RateFromJson(JsonObjectReader& parent, std::string_view key, AchievableRate* rate) {
  const nlohmann::json* j = parent.Child(key);
  if (j == nullptr) return parent.Error(key, "is required");
  JsonObjectReader r(*j, parent.source(), parent.FieldPath(key));
  SLUICE_RETURN_IF_ERROR(r.status());
  SLUICE_RETURN_IF_ERROR(r.Double("flops_per_s", &rate->flops_per_s, 0, kBig));
  SLUICE_RETURN_IF_ERROR(r.String("where", &rate->where));
  return r.Finish();
}

Status RunsFromJson(JsonObjectReader& r, std::string_view key, std::vector<MethodRun>* runs) {
  const nlohmann::json* j = r.Child(key);
  if (j == nullptr || !j->is_array()) return r.Error(key, "must be an array of method runs");
  for (size_t i = 0; i < j->size(); ++i) {
    MethodRun m;
    SLUICE_RETURN_IF_ERROR(
        RunFromJson((*j)[i], r.source(), fmt::format("{}[{}]", r.FieldPath(key), i), &m));
    runs->push_back(std::move(m));
  }
  return Status::Ok();
}

}  // namespace

nlohmann::json CompareResultToJson(const CompareResult& c) {
  nlohmann::json own = nlohmann::json::array(), controlled = nlohmann::json::array();
  for (const MethodRun& m : c.own) own.push_back(RunToJson(m));
  for (const MethodRun& m : c.controlled) controlled.push_back(RunToJson(m));
  return {{"format", kCompareFormat},
          {"scenario", CompareScenarioToJson(c.scenario)},
          {"description", c.description},
          {"partial", c.partial},
          {"batches", c.batches},
          {"devices", c.devices},
          {"memory_limit_mb", c.memory_limit_mb},
          {"memory_reserve_mb", c.memory_reserve_mb},
          {"data_loss", LossToJson(c.data_loss)},
          {"warnings", c.warnings},
          {"sweep_rate", RateToJson(c.sweep_rate)},
          {"rate", RateToJson(c.rate)},
          {"ideal_tokens_per_s", c.ideal_tokens_per_s},
          {"length_aware_tokens_per_s", c.length_aware_tokens_per_s},
          {"length_rates",
           {{"lengths", c.length_rates.lengths}, {"flops_per_s", c.length_rates.flops_per_s}}},
          {"controlled_config", c.controlled_config.has_value()
                                    ? ParallelConfigToJson(*c.controlled_config)
                                    : nlohmann::json()},
          {"own", own},
          {"controlled", controlled},
          {"skipped_configs", c.skipped_configs},
          {"score_batches", c.score_batches},
          {"candidates_scored", c.candidates_scored},
          {"search_seconds", c.search_seconds},
          {"run_seconds", c.run_seconds}};
}

StatusOr<CompareResult> CompareResultFromJson(const nlohmann::json& j, std::string_view source) {
  JsonObjectReader r(j, std::string(source));
  SLUICE_RETURN_IF_ERROR(r.status());
  std::string format;
  SLUICE_RETURN_IF_ERROR(r.String("format", &format));
  if (format != kCompareFormat) {
    return r.Error("format",
                   fmt::format("'{}' is not supported (allowed: '{}')", format, kCompareFormat));
  }
  CompareResult c;
  const nlohmann::json* scenario = r.Child("scenario");
  if (scenario == nullptr) return r.Error("scenario", "is required");
  SLUICE_ASSIGN_OR_RETURN(c.scenario,
                          CompareScenarioFromJson(*scenario, fmt::format("{}: scenario", source)));
  SLUICE_RETURN_IF_ERROR(r.String("description", &c.description));
  SLUICE_RETURN_IF_ERROR(r.OptionalBool("partial", &c.partial));
  SLUICE_RETURN_IF_ERROR(r.Int("batches", &c.batches, 0, INT64_MAX));
  SLUICE_RETURN_IF_ERROR(r.Int("devices", &c.devices, 0, INT64_MAX));
  SLUICE_RETURN_IF_ERROR(r.Double("memory_limit_mb", &c.memory_limit_mb, 0, kBig));
  SLUICE_RETURN_IF_ERROR(r.Double("memory_reserve_mb", &c.memory_reserve_mb, 0, kBig));
  SLUICE_RETURN_IF_ERROR(LossFromJson(r, c.scenario, &c.data_loss));
  SLUICE_RETURN_IF_ERROR(StringsFromJson(r, "warnings", &c.warnings));
  SLUICE_RETURN_IF_ERROR(RateFromJson(r, "sweep_rate", &c.sweep_rate));
  SLUICE_RETURN_IF_ERROR(RateFromJson(r, "rate", &c.rate));
  SLUICE_RETURN_IF_ERROR(r.Double("ideal_tokens_per_s", &c.ideal_tokens_per_s, 0, kBig));
  SLUICE_RETURN_IF_ERROR(
      r.OptionalDouble("length_aware_tokens_per_s", &c.length_aware_tokens_per_s, 0, kBig));
  if (const nlohmann::json* lr = r.Child("length_rates")) {
    JsonObjectReader q(*lr, std::string(source), "length_rates");
    SLUICE_RETURN_IF_ERROR(q.status());
    const nlohmann::json* lengths = q.Child("lengths");
    const nlohmann::json* rates = q.Child("flops_per_s");
    if (lengths == nullptr || rates == nullptr || !lengths->is_array() || !rates->is_array() ||
        lengths->size() != rates->size()) {
      return r.Error("length_rates",
                     "must hold arrays 'lengths' (integers) and 'flops_per_s' (numbers) of one "
                     "size");
    }
    for (size_t i = 0; i < lengths->size(); ++i) {
      const nlohmann::json& l = (*lengths)[i];
      const nlohmann::json& f = (*rates)[i];
      if (!l.is_number_integer() || l.get<int64_t>() < 1 || !f.is_number() ||
          !(f.get<double>() >= 0)) {
        return r.Error("length_rates",
                       "entries must be lengths >= 1 and rates >= 0 (FLOP/s per device)");
      }
      c.length_rates.lengths.push_back(l.get<int64_t>());
      c.length_rates.flops_per_s.push_back(f.get<double>());
    }
    SLUICE_RETURN_IF_ERROR(q.Finish());
  }
  const nlohmann::json* cfg = r.Child("controlled_config");
  if (cfg == nullptr) return r.Error("controlled_config", "is required (an object or null)");
  if (!cfg->is_null()) {
    SLUICE_ASSIGN_OR_RETURN(
        c.controlled_config,
        ParallelConfigFromJson(*cfg, fmt::format("{}: field 'controlled_config'", source)));
  }
  SLUICE_RETURN_IF_ERROR(RunsFromJson(r, "own", &c.own));
  SLUICE_RETURN_IF_ERROR(RunsFromJson(r, "controlled", &c.controlled));
  SLUICE_RETURN_IF_ERROR(StringsFromJson(r, "skipped_configs", &c.skipped_configs));
  const nlohmann::json* scored = r.Child("score_batches");
  if (scored == nullptr || !scored->is_array()) {
    return r.Error("score_batches", "must be an array of batch indices");
  }
  for (const nlohmann::json& i : *scored) {
    if (!i.is_number_integer() || i.get<int64_t>() < 0) {
      return r.Error("score_batches", "must be an array of batch indices (integers >= 0)");
    }
    c.score_batches.push_back(i.get<int64_t>());
  }
  SLUICE_RETURN_IF_ERROR(r.Int("candidates_scored", &c.candidates_scored, 0, INT64_MAX));
  SLUICE_RETURN_IF_ERROR(r.Double("search_seconds", &c.search_seconds, 0, kBig));
  SLUICE_RETURN_IF_ERROR(r.Double("run_seconds", &c.run_seconds, 0, kBig));
  SLUICE_RETURN_IF_ERROR(r.Finish());
  return c;
}

Status WriteCompareResultFile(const CompareResult& result, const std::string& path) {
  return WriteStringToFile(path, CompareResultToJson(result).dump(2) + "\n");
}

StatusOr<CompareResult> ReadCompareResultFile(const std::string& path) {
  SLUICE_ASSIGN_OR_RETURN(nlohmann::json j, ReadJsonFile(path));
  return CompareResultFromJson(j, path);
}

}  // namespace sluice
