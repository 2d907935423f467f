// libFuzzer target for the layer-cost-table/1 reader and the model built on it.
//
// bytes -> ParseJson -> LayerCostTableFromJson; a table that parses must round-trip through
// LayerCostTableToJson, and, built into a ProfiledCostModel against a ModelSpec literal of the
// table's own model, must answer any shape without crashing: feasible answers have I + W == B
// and non-negative times and memory.
#include <cstddef>
#include <cstdint>
#include <cstdlib>
#include <memory>
#include <string_view>

#include "base/json_util.h"
#include "cost/profile_table.h"
#include "cost/profiled_cost_model.h"

namespace sluice {
namespace {

void Require(bool ok) {
  if (!ok) std::abort();
}

ModelSpec SpecOf(const TableModel& t) {
  ModelSpec m;
  m.name = t.name.empty() ? "fuzz" : t.name;
  m.kind = t.kind;
  m.layers = 2;
  m.decoder_layers = t.kind == ModelKind::kEncoderDecoder ? 2 : 0;
  m.hidden = t.hidden;
  m.heads = t.heads;
  m.kv_heads = t.heads;
  m.head_dim = t.kv_channels;
  m.ffn_hidden = t.ffn_hidden;
  m.vocab = 1000;
  m.max_position = 1 << 20;
  return m;
}

void Query(const ProfiledCostModel& model, int64_t tp, Recompute rc, const LayerShape& shape) {
  for (LayerKind kind :
       {LayerKind::kEncoder, LayerKind::kDecoder, LayerKind::kEmbedding, LayerKind::kOutputHead}) {
    const LayerCost c = model.Layer(kind, shape, tp, rc);
    if (!c.feasible) continue;
    Require(c.backward_input + c.backward_weight == c.backward);
    Require(c.forward >= Duration::Zero() && c.backward >= Duration::Zero());
    Require(c.stored_activation >= Bytes::Zero() && c.peak_activation >= Bytes::Zero());
  }
}

}  // namespace
}  // namespace sluice

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  using namespace sluice;
  const std::string_view text(reinterpret_cast<const char*>(data), size);
  StatusOr<nlohmann::json> j = ParseJson(text, "fuzz.json");
  if (!j.ok()) return 0;
  StatusOr<LayerCostTable> table = LayerCostTableFromJson(*j, "fuzz.json");
  if (!table.ok()) return 0;
  StatusOr<LayerCostTable> back = LayerCostTableFromJson(LayerCostTableToJson(*table), "fuzz.json");
  Require(back.ok() && *back == *table);
  StatusOr<std::unique_ptr<ProfiledCostModel>> model =
      ProfiledCostModel::Create(*table, SpecOf(table->model));
  if (!model.ok()) return 0;
  // A few shapes: tiny, typical, huge, and one derived from the input's size.
  const int64_t k = static_cast<int64_t>(size % 5000) + 1;
  const LayerShape shapes[] = {{1, 1, 1},
                               {3, 100, 50},
                               {k, k, k},
                               {2048, 8192, 8192},
                               {int64_t{1} << 30, int64_t{1} << 30, int64_t{1} << 30}};
  for (const TableConfig& c : table->configs) {
    for (const LayerShape& s : shapes) Query(**model, c.tp, c.recompute, s);
    StageLayers stage;
    stage.encoder_layers = 2;
    stage.embedding = true;
    stage.output_head = true;
    ParallelConfig par;
    par.tp = c.tp;
    par.dp = 2;
    par.zero = 3;
    Require((*model)->ModelStates(stage, par).total() >= Bytes::Zero());
  }
  return 0;
}
