// LayerCostTable: the `layer-cost-table/1` file of measured per-layer times and memory.
//
// The file (docs/formats.md) holds one entry per (tp, recompute), each with rows of
// (micro-batch size -> value) keyed by a sequence length (or by encoder and decoder length for
// the decoder layer of an encoder-decoder model), for the stages "encoder" (the decoder-only
// model's layer too), "decoder", "postprocess" (the output head) and, in a table of a
// decoder-only MoE model (`model.moe`), "moe_encoder" (a layer whose MLP is the MoE layer; the
// "encoder" stage is then the stack's dense layer). A micro-batch size absent from a row was not
// measured because it ran out of memory.
//
// LayerCostTableFromJson is strict: the format string, every field's type, ascending positive
// micro-batch sizes, equal lengths of `mbs` and `value`, positive finite values, known stage
// names and unique row keys. Errors name the file, the field path with indices and the allowed
// values. The reader checks the file only; ProfiledCostModel::Create checks it against a model.
//
// Thread safety: value types and pure functions.
#pragma once

#include <array>
#include <cstdint>
#include <nlohmann/json.hpp>
#include <optional>
#include <string>
#include <string_view>
#include <vector>

#include "base/status.h"
#include "cost/cost_model.h"
#include "model/model_spec.h"

namespace sluice {

inline constexpr std::string_view kLayerCostTableFormat = "layer-cost-table/1";

// The profiled stages, in the file's spelling: "encoder", "decoder", "postprocess",
// "moe_encoder".
enum class TableStage { kEncoder = 0, kDecoder = 1, kPostprocess = 2, kMoeEncoder = 3 };
inline constexpr int kNumTableStages = 4;
std::string_view TableStageName(TableStage stage);

// One row: values at increasing micro-batch sizes for one sequence-length key.
struct CostRow {
  int64_t seqlen = 0;         // the row's length; the encoder length of a decoder row
  int64_t dec_seqlen = 0;     // decoder length of an encoder-decoder decoder row; 0 otherwise
  std::vector<int64_t> mbs;   // strictly ascending, >= 1
  std::vector<double> value;  // same length as mbs; positive, finite (ms or MB)

  friend bool operator==(const CostRow&, const CostRow&) = default;
};
using CostSeries = std::vector<CostRow>;  // empty: the table does not have this series

// One entry of `tables[]`.
struct TableConfig {
  int64_t tp = 1;
  Recompute recompute = Recompute::kNone;
  // Indexed by TableStage. Times in milliseconds per layer, memory in MB (10^6 bytes) per layer.
  std::array<CostSeries, kNumTableStages> forward_ms;
  std::array<CostSeries, kNumTableStages> backward_ms;
  std::array<CostSeries, kNumTableStages> stored_activation_mb;  // never for kPostprocess
  std::array<CostSeries, kNumTableStages> peak_activation_mb;    // never for kPostprocess
  // fp16 parameter MB per layer ("encoder", "decoder") and of the embedding; absent = unknown.
  std::optional<double> embedding_param_mb;
  std::array<std::optional<double>, kNumTableStages> param_mb;  // never for kPostprocess

  friend bool operator==(const TableConfig&, const TableConfig&) = default;
};

// The parts of one MoE layer that `sluice profile` times one by one (the file's `moe_parts`):
// "route" (router linear, softmax, top-k and the slot assignment), "dispatch" (the kept tokens
// into the capacity buffer), "experts" (every expert on its capacity rows), "combine" (expert
// outputs times their gates back to the tokens) and "experts_sliced" (the experts again, cut into
// `slices` capacity slices as the runtime runs Tutel's slices, without the all-to-alls).
enum class MoePart { kRoute = 0, kDispatch = 1, kExperts = 2, kCombine = 3, kExpertsSliced = 4 };
inline constexpr int kNumMoeParts = 5;
std::string_view MoePartName(MoePart part);

// The file's `moe_parts` object (tables of MoE models only): per part, rows keyed by sequence
// length as the stage series (ms, one MoE layer, ep 1, recompute none).
struct MoePartsTable {
  int64_t slices = 0;  // capacity slices of "experts_sliced", >= 2
  std::array<CostSeries, kNumMoeParts> forward_ms;
  std::array<CostSeries, kNumMoeParts> backward_ms;

  friend bool operator==(const MoePartsTable&, const MoePartsTable&) = default;
};

// The file's `model` object: what was profiled.
struct TableModel {
  std::string name;
  ModelKind kind = ModelKind::kDecoderOnly;
  int64_t hidden = 0;
  int64_t heads = 0;
  int64_t kv_channels = 0;  // per-head width when given (T5); 0 = hidden / heads
  int64_t ffn_hidden = 0;
  std::optional<MoeSpec> moe;  // the MoE layers profiled (decoder-only tables only); absent: dense
  std::vector<std::string> profiled_stages;  // documentation only

  friend bool operator==(const TableModel&, const TableModel&) = default;
};

struct LayerCostTable {
  std::string path;         // where it was read from (for messages and Describe())
  std::string measured_on;  // hardware and software, e.g. "NVIDIA A100-SXM4-40GB ..."
  std::string provenance;   // the file's `source`: where the numbers come from
  std::string layout;       // the file's own description of its layout (optional)
  TableModel model;
  std::vector<TableConfig> configs;  // unique (tp, recompute)
  std::optional<MoePartsTable> moe_parts;  // MoE tables written by `sluice profile`

  // The entry for (tp, rc), or nullptr.
  const TableConfig* Find(int64_t tp, Recompute rc) const;

  friend bool operator==(const LayerCostTable&, const LayerCostTable&) = default;
};

// Parses a layer-cost-table/1 document; `source` names the file in messages.
StatusOr<LayerCostTable> LayerCostTableFromJson(const nlohmann::json& j, std::string_view source);
// Reads and parses `path`.
StatusOr<LayerCostTable> ReadLayerCostTable(const std::string& path);
// OK when `table` profiles `model`'s layer shape: same kind, hidden, heads, head width
// (kv_channels) and ffn_hidden, multi-head attention and a two-matrix MLP (what the tables
// measured), and the same MoE layers (`model.moe` equal to the model's but for layer_interval,
// which the rows do not depend on; expert width 0 read as ffn_hidden; both absent for a dense
// model). The message names the file, the field and both
// values.
Status CheckTableMatchesModel(const LayerCostTable& table, const ModelSpec& model);
// What one sliced compute piece adds to the time of its share, measured by `table.moe_parts`:
// at each (seqlen, mbs) with all four series, ((sliced forward - experts forward) + (sliced
// backward - experts backward)) / (2 * slices), i.e. per piece of a forward or backward cut into
// `slices`; the median over those points, at least 0. nullopt without moe_parts or points.
std::optional<Duration> MoeSliceOverhead(const LayerCostTable& table);
// The inverse of LayerCostTableFromJson (round-trips every field the reader keeps).
nlohmann::json LayerCostTableToJson(const LayerCostTable& table);

}  // namespace sluice
