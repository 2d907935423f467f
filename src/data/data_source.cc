#include "data/data_source.h"

#include <fmt/core.h>

#include <array>

#include "base/json_util.h"
#include "base/paths.h"
#include "data/generator.h"

namespace sluice {
namespace {

struct RealDataset {
  std::string_view name;
  std::string_view description;
};

// Files data/lengths/<name>.jsonl; descriptions from data/lengths/README.md.
constexpr std::array<RealDataset, 5> kRealDatasets = {{
    {"mixture-4task",
     "30,000 real samples of the 4 tasks below, examples-proportional mix (GPT-2 token counts)"},
    {"man-summarize", "3,075 man pages: DESCRIPTION section -> NAME one-liner"},
    {"py-docstring", "20,000 Python functions: source -> docstring"},
    {"py-file", "8,175 whole Python files, decoder-only, max 989,348 tokens"},
    {"gcide-define", "20,000 GCIDE dictionary articles: headword -> definition"},
}};

const RealDataset* FindRealDataset(std::string_view name) {
  for (const RealDataset& d : kRealDatasets) {
    if (d.name == name) return &d;
  }
  return nullptr;
}

StatusOr<Dataset> TakePrefix(Dataset ds, int64_t n) {
  if (n < 0) {
    return InvalidArgumentError(
        fmt::format("{}: the number of samples must be >= 0, got {}", ds.source(), n));
  }
  if (n == 0) return ds;
  if (static_cast<size_t>(n) > ds.size()) {
    return InvalidArgumentError(
        fmt::format("{}: {} samples asked for, but it has only {}", ds.source(), n, ds.size()));
  }
  return ds.Prefix(static_cast<size_t>(n));
}

}  // namespace

std::vector<DataPresetInfo> ListDataPresets() {
  std::vector<DataPresetInfo> out;
  for (const RealDataset& d : kRealDatasets) {
    out.push_back(
        {std::string(d.name), DataPresetInfo::Kind::kRealDataset, std::string(d.description)});
  }
  for (const GeneratorPreset& g : GeneratorPresets()) {
    out.push_back(
        {std::string(g.name), DataPresetInfo::Kind::kGenerator, std::string(g.description)});
  }
  return out;
}

std::string FormatDataPresets() {
  const std::vector<DataPresetInfo> presets = ListDataPresets();
  size_t width = 0;
  for (const DataPresetInfo& p : presets) width = std::max(width, p.name.size());
  std::string out;
  for (const DataPresetInfo& p : presets) {
    const bool real = p.kind == DataPresetInfo::Kind::kRealDataset;
    const std::string tag = p.name == kDefaultDataPreset ? "real, default"
                            : real                       ? "real"
                                                         : "generator";
    out += fmt::format("  {:<{}}  {:<13}  {}\n", p.name, width, tag, p.description);
  }
  return out;
}

StatusOr<Dataset> LoadData(std::string_view file_or_preset, const DataOptions& options) {
  const std::string name(file_or_preset);
  if (name.empty()) {
    return InvalidArgumentError(
        fmt::format("no data named; give a file or a preset:\n{}", FormatDataPresets()));
  }
  if (options.num_samples < 0 || options.num_samples > kMaxSamples) {
    return InvalidArgumentError(
        fmt::format("{}: the number of samples must be in [0, {}] (0 = default), got {}", name,
                    kMaxSamples, options.num_samples));
  }
  if (FileExists(name)) {
    SLUICE_ASSIGN_OR_RETURN(Dataset ds, ReadLengthsFile(name, options.reader));
    return TakePrefix(std::move(ds), options.num_samples);
  }
  if (const RealDataset* real = FindRealDataset(name); real != nullptr) {
    SLUICE_ASSIGN_OR_RETURN(const std::string path,
                            DataFile(fmt::format("lengths/{}.jsonl", real->name)));
    ReaderOptions reader;
    reader.format = LengthFormat::kJsonLines;
    SLUICE_ASSIGN_OR_RETURN(Dataset ds, ReadLengthsFile(path, reader));
    ds.set_source(name);
    return TakePrefix(std::move(ds), options.num_samples);
  }
  if (FindGeneratorPreset(name) != nullptr) {
    const int64_t n = options.num_samples > 0 ? options.num_samples : kDefaultGeneratedSamples;
    return GenerateDataset(name, n, options.seed);
  }
  return NotFoundError(fmt::format("'{}': no such file and no such preset; presets:\n{}", name,
                                   FormatDataPresets()));
}

}  // namespace sluice
