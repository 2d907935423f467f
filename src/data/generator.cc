#include "data/generator.h"

#include <fmt/core.h>

#include <cmath>

#include "base/json_util.h"

namespace sluice {
namespace {

using Kind = LengthDistribution::Kind;

constexpr LengthDistribution Zero() { return {Kind::kZero, 0, 0}; }
constexpr LengthDistribution LogNormal(double median, double sigma) {
  return {Kind::kLogNormal, median, sigma};
}
constexpr LengthDistribution Moments(double mean, double sd) {
  return {Kind::kLogNormalMoments, mean, sd};
}
constexpr LengthDistribution Uniform(double lo, double hi) { return {Kind::kUniform, lo, hi}; }
constexpr LengthDistribution Ratio(double median, double sigma) {
  return {Kind::kInputRatio, median, sigma};
}

// Parameters and their sources are documented in docs/data-presets.md; keep the two in step.
std::vector<GeneratorPreset> MakePresets() {
  // hydraulis-and-peers.md §4: log-normals fitted to Debian corpora (man pages: median 791,
  // python3.11 sources: median 2,324), suggested as stand-ins for web and code.
  const TaskProfile web{"web", 1, LogNormal(800, 1.0), Zero()};
  const TaskProfile code{"code", 1, LogNormal(2300, 1.2), Zero()};
  TaskProfile web70 = web, code30 = code;
  web70.weight = 0.7;
  code30.weight = 0.3;
  return {
      {"web", "decoder-only web text: log-normal, median 800, sigma_log 1.0", {web}},
      {"code", "decoder-only source code: log-normal, median 2300, sigma_log 1.2", {code}},
      {"web-code",
       "long-tailed pretraining mix (Hydraulis-style): 70% web + 30% code, decoder-only",
       {web70, code30}},
      // Alpaca turn lengths (ShareChat, arXiv 2512.17843): user 19.67 +- 15.19, assistant
      // 64.51 +- 64.85 tokens.
      {"sft",
       "Alpaca-like SFT pairs: prompt mean 19.7 sd 15.2, response mean 64.5 sd 64.9 (log-normal)",
       {{"sft", 1, Moments(19.67, 15.19), Moments(64.51, 64.85)}}},
      // LongAlign: 10k SFT samples of 8K-64K tokens, trained as one sequence.
      {"long-context",
       "LongAlign-like long sequences: uniform 8192..65536 tokens, decoder-only",
       {{"long-context", 1, Uniform(8192, 65536), Zero()}}},
      // FLAN-like: illustrative task profiles; together they match the synthetic log-normal of
      // DynaPipe's planner benchmark (input median 180 sigma 1.0, target median 12 sigma 1.1).
      {"flan-like",
       "FLAN-like multi-task encoder-decoder mix of 8 task types (input median ~180, target ~12)",
       {
           {"classify", 0.30, LogNormal(130, 0.6), LogNormal(4, 0.5)},
           {"qa", 0.20, LogNormal(200, 0.7), LogNormal(12, 0.7)},
           {"summarize", 0.08, LogNormal(600, 0.6), LogNormal(45, 0.5)},
           {"translate", 0.08, LogNormal(45, 0.5), Ratio(1.1, 0.2)},
           {"cot", 0.06, LogNormal(200, 0.5), LogNormal(90, 0.6)},
           {"dialog", 0.04, LogNormal(400, 0.8), LogNormal(30, 0.8)},
           {"few-shot", 0.16, LogNormal(700, 0.5), LogNormal(10, 0.7)},
           {"generate", 0.08, LogNormal(60, 0.6), LogNormal(60, 0.7)},
       }},
  };
}

bool Finite(double x) { return std::isfinite(x); }

Status CheckDistribution(const LengthDistribution& d, bool is_input, std::string_view task) {
  const auto bad = [&](std::string_view why) {
    return InvalidArgumentError(fmt::format("generator task '{}': {} length: {}", task,
                                            is_input ? "input" : "target", why));
  };
  if (!Finite(d.a) || !Finite(d.b)) return bad("parameters must be finite");
  switch (d.kind) {
    case Kind::kZero:
      if (is_input) return bad("the input length cannot always be 0");
      return Status::Ok();
    case Kind::kLogNormal:
    case Kind::kLogNormalMoments:
      if (d.a <= 0 || d.b < 0) return bad("needs a > 0 (median or mean) and b >= 0 (spread)");
      return Status::Ok();
    case Kind::kUniform:
      if (d.a < 1 || d.a > d.b || d.b > static_cast<double>(kMaxLength) || d.a != std::floor(d.a) ||
          d.b != std::floor(d.b)) {
        return bad(
            fmt::format("uniform bounds must be integers with 1 <= lo <= hi <= {}", kMaxLength));
      }
      return Status::Ok();
    case Kind::kInputRatio:
      if (is_input) return bad("the input length cannot be a ratio of itself");
      if (d.a <= 0 || d.b < 0) return bad("needs a median ratio > 0 and sigma >= 0");
      return Status::Ok();
  }
  return bad("unknown distribution kind");
}

// A moment-matched log-normal becomes (median, sigma): sigma^2 = ln(1 + cv^2),
// median = mean / sqrt(1 + cv^2).
LengthDistribution Canonical(const LengthDistribution& d) {
  if (d.kind != Kind::kLogNormalMoments) return d;
  const double cv = d.b / d.a;
  const double s2 = std::log1p(cv * cv);
  return LogNormal(d.a / std::sqrt(1 + cv * cv), std::sqrt(s2));
}

int64_t RoundLength(double x) {
  if (!(x < static_cast<double>(kMaxLength))) return kMaxLength;  // also catches NaN
  return std::max<int64_t>(1, static_cast<int64_t>(std::floor(x + 0.5)));
}

}  // namespace

const std::vector<GeneratorPreset>& GeneratorPresets() {
  static const std::vector<GeneratorPreset> presets = MakePresets();
  return presets;
}

const GeneratorPreset* FindGeneratorPreset(std::string_view name) {
  for (const GeneratorPreset& p : GeneratorPresets()) {
    if (p.name == name) return &p;
  }
  return nullptr;
}

SampleGenerator::SampleGenerator(std::string name, std::vector<TaskProfile> tasks, uint64_t seed)
    : name_(std::move(name)), tasks_(std::move(tasks)), rng_(seed) {
  double total = 0;
  for (const TaskProfile& t : tasks_) total += t.weight;
  double acc = 0;
  for (TaskProfile& t : tasks_) {
    task_names_.emplace_back(t.name);
    t.name = {};  // the caller's storage need not outlive the generator
    t.input = Canonical(t.input);
    t.target = Canonical(t.target);
    acc += t.weight;
    cumulative_.push_back(acc / total);
  }
  cumulative_.back() = 1.0;
}

StatusOr<SampleGenerator> SampleGenerator::Create(std::string_view preset, uint64_t seed) {
  const GeneratorPreset* p = FindGeneratorPreset(preset);
  if (p == nullptr) {
    std::vector<std::string_view> names;
    for (const GeneratorPreset& g : GeneratorPresets()) names.push_back(g.name);
    return NotFoundError(
        fmt::format("unknown generator preset '{}'; known: {}", preset, JoinAllowed(names)));
  }
  return FromProfile(std::string(p->name), p->tasks, seed);
}

StatusOr<SampleGenerator> SampleGenerator::FromProfile(std::string name,
                                                       std::vector<TaskProfile> tasks,
                                                       uint64_t seed) {
  if (tasks.empty()) {
    return InvalidArgumentError(fmt::format("generator '{}': needs at least one task", name));
  }
  for (size_t i = 0; i < tasks.size(); ++i) {
    const TaskProfile& t = tasks[i];
    if (t.name.empty()) {
      return InvalidArgumentError(fmt::format("generator '{}': task {} has no name", name, i));
    }
    for (size_t j = 0; j < i; ++j) {
      if (tasks[j].name == t.name) {
        return InvalidArgumentError(
            fmt::format("generator '{}': task '{}' appears twice", name, t.name));
      }
    }
    if (!(t.weight > 0) || !Finite(t.weight)) {
      return InvalidArgumentError(
          fmt::format("generator '{}': task '{}': weight must be a positive number, got {}", name,
                      t.name, t.weight));
    }
    SLUICE_RETURN_IF_ERROR(CheckDistribution(t.input, true, t.name));
    SLUICE_RETURN_IF_ERROR(CheckDistribution(t.target, false, t.name));
  }
  return SampleGenerator(std::move(name), std::move(tasks), seed);
}

int64_t SampleGenerator::Draw(const LengthDistribution& d, int64_t input_len) {
  switch (d.kind) {
    case Kind::kZero:
      return 0;
    case Kind::kLogNormal:
    case Kind::kLogNormalMoments:  // converted by Canonical(); kept for completeness
      return RoundLength(rng_.LogNormal(std::log(d.a), d.b));
    case Kind::kUniform:
      return rng_.UniformInt(static_cast<int64_t>(d.a), static_cast<int64_t>(d.b));
    case Kind::kInputRatio:
      return RoundLength(static_cast<double>(input_len) * rng_.LogNormal(std::log(d.a), d.b));
  }
  return 0;
}

Sample SampleGenerator::Next() {
  const double u = rng_.Uniform01();
  size_t t = 0;
  while (t + 1 < cumulative_.size() && u >= cumulative_[t]) ++t;
  Sample s;
  s.id = next_id_++;
  s.task = static_cast<TaskId>(t);
  s.input_len = Draw(tasks_[t].input, 0);
  s.target_len = Draw(tasks_[t].target, s.input_len);
  return s;
}

Dataset SampleGenerator::Take(int64_t n) {
  Dataset ds(name_);
  for (const std::string& task : task_names_) ds.InternTask(task);
  ds.Reserve(static_cast<size_t>(std::max<int64_t>(n, 0)));
  for (int64_t i = 0; i < n; ++i) {
    Sample s = Next();
    s.id = i;
    ds.Add(s);
  }
  return ds;
}

StatusOr<Dataset> GenerateDataset(std::string_view preset, int64_t n, uint64_t seed) {
  if (n < 1) {
    return InvalidArgumentError(
        fmt::format("generator '{}': the number of samples must be >= 1, got {}", preset, n));
  }
  SLUICE_ASSIGN_OR_RETURN(SampleGenerator gen, SampleGenerator::Create(preset, seed));
  return gen.Take(n);
}

}  // namespace sluice
