// AnalyticCostModel: layer costs from FLOPs and bytes on a device roofline, with fitted factors.
//
// One pass (forward, or backward with its recomputation) of one layer costs
//   W = gemm_flops / (e_gemm * peak) + (attention_flops / peak + attention_bytes / hbm) / e_attn
//       + memory_bytes / (e_mem * hbm) + tp all-reduce time (ring, alpha-beta on `tp_link`)
//   time = (c^p + W^p)^(1/p)        (c: the per-layer floor; a smooth max of c and W)
// with work from ComputeLayerWork (layer_work.h) and factors (c, e_gemm, e_attn, e_mem, p) per
// (layer kind, tp, recompute, pass), either fitted to a profile table (cost_fit.h) or defaults.
// Backward splits into weight-gradient W = backward * LayerWork::WeightGradFraction() and
// input-gradient I = backward - W. Memory: ComputeActivation. A shape is infeasible only when a
// length exceeds model.max_position, tp is unsupported, or the layer's peak activation plus its
// fp16 weights and gradients exceed the device memory.
//
// Thread safety: immutable after Create; Layer() does not allocate.
#pragma once

#include <array>
#include <cstdint>
#include <memory>
#include <string>
#include <vector>

#include "base/status.h"
#include "base/units.h"
#include "cost/cost_model.h"
#include "cost/layer_work.h"
#include "model/cluster_spec.h"
#include "model/model_spec.h"

namespace sluice {

// Factors of one pass. Efficiencies may exceed 1 when the work counts are conservative.
struct PassFactors {
  Duration overhead = Duration::Millis(1.5);  // c: floor of one layer call (launches, syncs)
  double gemm_efficiency = 0.7;               // fraction of peak FLOP/s the linear layers reach
  double attention_efficiency = 0.75;         // of the attention roofline (score FLOPs and traffic)
  double memory_efficiency = 0.7;             // fraction of HBM bandwidth for elementwise traffic
  double sharpness = 4;                       // p of the smooth max; large p approaches max(c, W)

  friend bool operator==(const PassFactors&, const PassFactors&) = default;
};

struct LayerFactors {
  PassFactors forward;
  PassFactors backward;

  friend bool operator==(const LayerFactors&, const LayerFactors&) = default;
};

// Defaults: rounded medians of the factors fitted to the A100 GPT-6.7B table (docs/cost-models.md).
LayerFactors DefaultLayerFactors(LayerKind kind, Recompute rc);

// Factors per (layer kind, tp, recompute) with a fallback rule for what was not fitted.
class AnalyticFactors {
 public:
  struct Entry {
    LayerKind kind = LayerKind::kEncoder;
    int64_t tp = 1;
    Recompute recompute = Recompute::kNone;
    LayerFactors factors;

    friend bool operator==(const Entry&, const Entry&) = default;
  };

  // Adds or replaces the entry for (kind, tp, rc).
  void Set(LayerKind kind, int64_t tp, Recompute rc, const LayerFactors& factors);
  // Exact (kind, tp, rc); else the same kind and rc at the nearest fitted tp (log2 distance,
  // ties to the smaller tp); else, for kDecoder, kEncoder's factors by the same rule; else
  // DefaultLayerFactors(kind, rc). Does not allocate.
  LayerFactors Resolve(LayerKind kind, int64_t tp, Recompute rc) const;
  const std::vector<Entry>& entries() const { return entries_; }
  bool empty() const { return entries_.empty(); }

  friend bool operator==(const AnalyticFactors&, const AnalyticFactors&) = default;

 private:
  const Entry* Nearest(LayerKind kind, int64_t tp, Recompute rc) const;
  std::vector<Entry> entries_;
};

struct AnalyticOptions {
  AnalyticFactors factors;                           // empty: DefaultLayerFactors everywhere
  std::string factors_source = "built-in defaults";  // says where factors came from (Describe)
  WorkOptions work;                                  // flash attention on/off
  LinkSpec tp_link{300e9, Duration::Micros(3)};      // link of the tp all-reduces (intra-node)
  // The embedding (not in any table): memory-bound gather; only overhead, memory_efficiency
  // and sharpness are used.
  PassFactors embedding{Duration::Micros(50), 1.0, 1.0, 0.7, 4};
};

class AnalyticCostModel final : public CostModel {
 public:
  // Fails on an invalid model, a device without positive peak FLOP/s, bandwidth and memory, or
  // non-positive factors.
  static StatusOr<std::unique_ptr<AnalyticCostModel>> Create(ModelSpec model, DeviceSpec device,
                                                             AnalyticOptions options = {});

  std::string Describe() const override;
  const ModelSpec& model() const override { return model_; }
  // tp divides heads, and kv_heads divides tp or tp divides kv_heads.
  bool SupportsTp(int64_t tp) const override;
  LayerCost Layer(LayerKind kind, const LayerShape& shape, int64_t tp, Recompute rc) const override;
  int64_t LayerParams(LayerKind kind, int64_t tp) const override;

  const DeviceSpec& device() const { return device_; }
  const AnalyticOptions& options() const { return options_; }

  // Seconds of one pass of `work` under `f` on `device`, tp all-reduces over `link`.
  static double PassSeconds(const PassWork& work, const PassFactors& f, const DeviceSpec& device,
                            const LinkSpec& link, int64_t tp);
  // Seconds of the pass's tp all-reduces: ring, 2(n-1)/n * bytes / bandwidth + 2(n-1) * latency
  // each (0 when tp == 1).
  static double TpAllReduceSeconds(const PassWork& work, const LinkSpec& link, int64_t tp);
  // (c^p + w^p)^(1/p), computed without overflow. REQUIRES: c, w >= 0, p >= 1.
  static double SmoothMax(double c, double w, double p);

 private:
  AnalyticCostModel(ModelSpec model, DeviceSpec device, AnalyticOptions options);
  LayerFactors Factors(LayerKind kind, int64_t tp, Recompute rc) const;

  ModelSpec model_;
  DeviceSpec device_;
  AnalyticOptions options_;
  // Resolved factors for tp = 2^i, i < kCachedTps: [kind][rc][i].
  static constexpr int kCachedTps = 8;
  std::array<std::array<std::array<LayerFactors, kCachedTps>, 3>, 4> cache_;
};

}  // namespace sluice
