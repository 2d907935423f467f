// SampleGenerator: seeded synthetic sample streams from named length-distribution presets.
//
// A preset is a mixture of tasks; each task has a weight and a distribution for its input and
// target lengths (log-normal, uniform, or a log-normal ratio of the input). Presets and where
// their parameters come from are listed in docs/data-presets.md:
//
//   web           decoder-only, log-normal, median 800, sigma_log 1.0
//   code          decoder-only, log-normal, median 2300, sigma_log 1.2
//   web-code      70% web + 30% code: the long-tailed pretraining mix of the Hydraulis scenario
//   sft           Alpaca-like prompt/response pairs, moment-matched log-normals (85 tokens, CV 0.8)
//   long-context  decoder-only, uniform 8192..65536 (LongAlign-like)
//   flan-like     8 encoder-decoder tasks; all together input median ~180, target median ~12
//
// Determinism: the stream is a pure function of (preset, seed). Every draw goes through base/Rng
// (xoshiro256** with its own normal), so the same seed gives the same samples on every platform.
// Each sample consumes draws in a fixed order: task, then input length, then target length.
// Lengths are rounded to the nearest integer and kept in [1, kMaxLength] (targets of
// decoder-only tasks are 0).
//
// Thread safety: a generator is used by one thread; separate generators are independent.
#pragma once

#include <cstdint>
#include <string>
#include <string_view>
#include <vector>

#include "base/rng.h"
#include "base/status.h"
#include "data/sample.h"

namespace sluice {

// How one side of a sample's length is drawn.
struct LengthDistribution {
  enum class Kind {
    kZero,              // always 0 (the target of a decoder-only task)
    kLogNormal,         // exp(N(ln a, b^2)): a = median, b = sigma of ln(length)
    kLogNormalMoments,  // log-normal with mean a and standard deviation b (moment-matched)
    kUniform,           // uniform integer in [a, b]
    kInputRatio,        // input_len * exp(N(ln a, b^2)): a = median target/input ratio, b = sigma
  };
  Kind kind = Kind::kZero;
  double a = 0;
  double b = 0;
};

// One task of a preset's mixture.
struct TaskProfile {
  std::string_view name;
  double weight = 1;  // relative; the weights of a preset need not sum to 1
  LengthDistribution input;
  LengthDistribution target;
};

struct GeneratorPreset {
  std::string_view name;
  std::string_view description;  // one line for `--data` help and ListDataPresets()
  std::vector<TaskProfile> tasks;
};

// Every generator preset, in documentation order.
const std::vector<GeneratorPreset>& GeneratorPresets();
// The preset named `name`, or nullptr.
const GeneratorPreset* FindGeneratorPreset(std::string_view name);

class SampleGenerator {
 public:
  // A generator for `preset`; NotFound lists the generator presets.
  static StatusOr<SampleGenerator> Create(std::string_view preset, uint64_t seed);
  // A generator for a custom mixture. InvalidArgument when `tasks` is empty, a weight is not
  // positive, or a distribution's parameters are out of range.
  static StatusOr<SampleGenerator> FromProfile(std::string name, std::vector<TaskProfile> tasks,
                                               uint64_t seed);

  // Task names in the order of the preset; Sample::task indexes this list.
  const std::vector<std::string>& task_names() const { return task_names_; }
  const std::string& name() const { return name_; }

  // The next sample of the unbounded stream; ids are 0, 1, 2, ...
  Sample Next();

  // The next `n` samples as a Dataset (source = the preset name, tasks in preset order).
  Dataset Take(int64_t n);

 private:
  SampleGenerator(std::string name, std::vector<TaskProfile> tasks, uint64_t seed);
  int64_t Draw(const LengthDistribution& d, int64_t input_len);

  std::string name_;
  std::vector<TaskProfile> tasks_;
  std::vector<std::string> task_names_;
  std::vector<double> cumulative_;  // cumulative normalized weights; back() == 1
  Rng rng_;
  int64_t next_id_ = 0;
};

// `n` samples of generator preset `preset` with `seed`. InvalidArgument when n < 1, NotFound
// (listing the presets) for an unknown name.
StatusOr<Dataset> GenerateDataset(std::string_view preset, int64_t n, uint64_t seed);

}  // namespace sluice
