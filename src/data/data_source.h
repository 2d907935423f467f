// LoadData: the one entry point behind `--data FILE|PRESET`.
//
// The argument names, in this order of precedence:
//   1. an existing file: read with ReadLengthsFile (format by extension unless given);
//   2. a real dataset shipped in data/lengths/ (mixture-4task, man-summarize, py-docstring,
//      py-file, gcide-define): real GPT-2 token counts, see data/lengths/README.md;
//   3. a generator preset (web, code, web-code, sft, long-context, flan-like).
// Anything else is NotFound, listing the presets. docs/data-presets.md describes every preset.
//
// DataOptions::num_samples picks how many samples: for generators the stream length (default
// kDefaultGeneratedSamples); for files and real datasets the first n lines (default all; asking
// for more than the file holds is an error). The shipped files are shuffled, so a prefix is a fair
// random sample. The seed drives generators only; shuffling for training is the batcher's job.
//
// Thread safety: free functions without shared state.
#pragma once

#include <cstdint>
#include <string>
#include <string_view>
#include <vector>

#include "base/status.h"
#include "data/reader.h"
#include "data/sample.h"

namespace sluice {

// The preset `--data` means when none is given.
inline constexpr std::string_view kDefaultDataPreset = "mixture-4task";
// Samples a generator preset produces when DataOptions::num_samples is 0.
inline constexpr int64_t kDefaultGeneratedSamples = 20000;
// The most samples DataOptions::num_samples may ask for (10^8: 3.2 GB of samples, before the
// batches and plans made of them); larger counts are refused before anything is allocated.
inline constexpr int64_t kMaxSamples = 100'000'000;

struct DataOptions {
  // Seed of generator presets (ignored for files and real datasets).
  uint64_t seed = 0;
  // Number of samples; 0 = the default (kDefaultGeneratedSamples, or the whole file).
  int64_t num_samples = 0;
  // How files are read (format override, field and column names). Real datasets ignore it.
  ReaderOptions reader;
};

struct DataPresetInfo {
  enum class Kind { kRealDataset, kGenerator };
  std::string name;
  Kind kind = Kind::kGenerator;
  std::string description;  // one line
};

// Real datasets first (the default first of all), then generator presets.
std::vector<DataPresetInfo> ListDataPresets();
// "mixture-4task (real, default): ..." lines, one per preset, for --help and error messages.
std::string FormatDataPresets();

// See the file comment. The Dataset's source is the path, or the preset name.
StatusOr<Dataset> LoadData(std::string_view file_or_preset, const DataOptions& options = {});

}  // namespace sluice
