// ProfiledCostModel: layer costs interpolated from a measured LayerCostTable.
//
// Create() checks that the table profiles the given model (kind, hidden, heads, ffn_hidden,
// head width; dense, GELU-style MLP, multi-head attention) and turns every (tp, recompute) entry
// into dense grids over (length [x decoder length] x micro-batch size) with NaN in the holes the
// table left unmeasured (out of memory). Layer() interpolates multilinearly:
//   - at a measured point it returns the table's own value exactly (a corner whose weight is 0
//     is never read, so a NaN neighbour cannot poison it);
//   - below the smallest measured length or micro-batch size it rounds up to it (conservative):
//     the whole answer, analytic parts included, is the one at the rounded-up shape;
//   - above the largest, next to a hole (any corner with a nonzero weight unmeasured), or at a
//     tp/recompute the table lacks, the answer is infeasible: never an extrapolation.
// Rows: "encoder" answers kEncoder (and is the decoder-only model's layer), "decoder" answers
// kDecoder at (enc_seqlen = shape.seqlen, dec_seqlen), "postprocess" answers kOutputHead at
// HeadLength() (the decoder length for encoder-decoder models). Times are ms, memory MB (10^6 B).
// MoE models (decoder-only; the table's `model.moe` equal to the model's): kEncoder answers the
// stack's mean layer, as CostModel says: with phi = MoeLayerFraction, forward, backward and
// stored activation are (1 - phi) x "encoder" (the dense layer) + phi x "moe_encoder" (the MoE
// layer), the peak the larger of the two; each row is needed only where its weight is not 0, and
// a shape either needed row cannot answer is infeasible. LayerParams mixes param_mb the same way.
//
// Not in the tables, answered analytically (AnalyticCostModel on `options.device`): the
// embedding's time and memory, the output head's memory, and the split of each measured
// backward into weight-gradient W = backward * LayerWork::WeightGradFraction() and input
// gradient I = backward - W (recomputed forward counts in I). LayerParams comes from param_mb
// (fp16 bytes / 2); where the table lacks it, from the analytic count.
//
// Thread safety: immutable after Create; Layer() does not allocate.
#pragma once

#include <array>
#include <cstdint>
#include <memory>
#include <string>
#include <vector>

#include "base/status.h"
#include "cost/analytic_cost_model.h"
#include "cost/cost_model.h"
#include "cost/profile_table.h"
#include "model/cluster_spec.h"
#include "model/model_spec.h"

namespace sluice {

struct ProfiledOptions {
  // The device the analytic parts (embedding, head memory) are computed for; default: the
  // A100-SXM4-40GB the shipped tables were measured on.
  DeviceSpec device{"a100-40g", 312e12, Bytes::GiB(40), 1555e9};
  AnalyticOptions analytic;  // embedding factors, tp link, flash attention (for the I/W split)
};

class ProfiledCostModel final : public CostModel {
 public:
  // Fails when the table does not profile `model` (the message names the file, the field and
  // both values) or lacks a series the model needs (encoder [and decoder] forward, backward,
  // stored and peak activation; postprocess forward and backward) in some entry.
  static StatusOr<std::unique_ptr<ProfiledCostModel>> Create(LayerCostTable table, ModelSpec model,
                                                             ProfiledOptions options = {});

  std::string Describe() const override;
  const ModelSpec& model() const override { return model_; }
  // Some table entry has this tp.
  bool SupportsTp(int64_t tp) const override;
  LayerCost Layer(LayerKind kind, const LayerShape& shape, int64_t tp, Recompute rc) const override;
  int64_t LayerParams(LayerKind kind, int64_t tp) const override;

  const LayerCostTable& table() const { return table_; }
  // The table's MoeSliceOverhead (its `moe_parts`), nullopt without them.
  std::optional<Duration> MoeSliceOverhead() const override {
    return sluice::MoeSliceOverhead(table_);
  }

  // A dense grid over up to three sorted axes (the last is the micro-batch size) holding
  // `metrics` values per point; NaN marks a hole. Public for tests and benchmarks.
  struct Grid {
    int dims = 0;                              // 2 or 3
    int metrics = 0;                           // values per grid point
    std::array<std::vector<int64_t>, 3> axes;  // ascending; axes[dims - 1] = mbs
    std::vector<double> values;                // row-major over axes, then metric
    // Interpolates at `point` (dims coordinates) into out[0..metrics) and rounds coordinates
    // below an axis up to its first point in place. False when infeasible.
    bool Lookup(int64_t* point, double* out) const;
  };

 private:
  struct ConfigGrids {
    int64_t tp = 0;
    Recompute recompute = Recompute::kNone;
    Grid encoder;      // forward ms, backward ms, stored MB, peak MB (an MoE model's dense layer)
    Grid moe_encoder;  // the same for an MoE model's MoE layer; dims 0 for dense models
    Grid decoder;  // same, over (enc_seqlen, dec_seqlen, mbs); dims 0 for decoder-only models
    Grid head;     // forward ms, backward ms
  };
  struct TpParams {
    int64_t tp = 0;
    std::array<int64_t, 4> params = {-1, -1, -1, -1};  // by LayerKind; -1 = not in the table
    int64_t moe_encoder = -1;                           // an MoE model's MoE layer
  };

  ProfiledCostModel(LayerCostTable table, ModelSpec model,
                    std::unique_ptr<AnalyticCostModel> analytic);
  const ConfigGrids* FindConfig(int64_t tp, Recompute rc) const;
  // kEncoder's forward ms, backward ms, stored MB and peak MB at `shape` into v[0..4) (the mean
  // layer of an MoE stack), and the shape answered for into *at (below-grid coordinates rounded
  // up). False when infeasible.
  bool LookupEncoder(const ConfigGrids& c, const LayerShape& shape, double* v,
                     LayerShape* at) const;

  LayerCostTable table_;
  ModelSpec model_;
  std::unique_ptr<AnalyticCostModel> analytic_;
  std::vector<ConfigGrids> configs_;
  std::vector<TpParams> params_;
  double moe_share_ = 0;  // MoeLayerFraction(model_, kEncoder)
};

}  // namespace sluice
