#include "compare/ideal_bound.h"

#include <fmt/core.h>

#include <algorithm>

#include "cost/context_parallel.h"
#include "cost/layer_work.h"

namespace sluice {
namespace {

// Useful work: forward + backward without recomputation, attention's full score matrix (the
// simulator's model_flops and Megatron's MFU count it so).
double UsefulPass(const ModelSpec& model, LayerKind kind, const LayerShape& shape) {
  if (kind == LayerKind::kEmbedding) return 0;
  const LayerWork w =
      ComputeLayerWork(model, kind, shape, /*tp=*/1, Recompute::kNone, WorkOptions{});
  return w.forward.gemm_flops + w.forward.attention_flops + w.backward.gemm_flops +
         w.backward.attention_flops;
}

// All FLOPs (forward + backward with recomputation) of one layer, as the kernels run them.
double RunFlops(const ModelSpec& model, LayerKind kind, const LayerShape& shape, Recompute rc) {
  if (kind == LayerKind::kEmbedding) return 0;
  const LayerWork w = ComputeLayerWork(model, kind, shape, /*tp=*/1, rc, WorkOptions{});
  return w.forward.gemm_flops + w.forward.attention_flops + w.backward.gemm_flops +
         w.backward.attention_flops;
}

std::string ShapeText(LayerKind kind, const LayerShape& s) {
  if (kind == LayerKind::kDecoder || s.dec_seqlen > 0) {
    return fmt::format("{} x {} x {}", s.mbs, s.seqlen, s.dec_seqlen);
  }
  return fmt::format("{} x {}", s.mbs, s.seqlen);
}

}  // namespace

double FlopCounter::Layer(LayerKind kind, const LayerShape& shape) const {
  if (shape.mbs < 1 || shape.seqlen < 1) return 0;
  if ((kind == LayerKind::kDecoder ||
       (kind == LayerKind::kOutputHead && model_.is_encoder_decoder())) &&
      shape.dec_seqlen < 1) {
    return 0;
  }
  return UsefulPass(model_, kind, shape);
}

double FlopCounter::Stage(const StageLayers& stage, const LayerShape& shape) const {
  double f = 0;
  if (stage.encoder_layers > 0) {
    f += static_cast<double>(stage.encoder_layers) * Layer(LayerKind::kEncoder, shape);
  }
  if (stage.decoder_layers > 0) {
    f += static_cast<double>(stage.decoder_layers) * Layer(LayerKind::kDecoder, shape);
  }
  if (stage.output_head) f += Layer(LayerKind::kOutputHead, shape);
  return f;
}

LayerShape FlopCounter::SampleShape(const Sample& s) const {
  LayerShape shape;
  shape.mbs = 1;
  if (model_.is_encoder_decoder()) {
    shape.seqlen = s.input_len;
    shape.dec_seqlen = s.target_len;
  } else {
    shape.seqlen = s.input_len + s.target_len;
  }
  return shape;
}

double FlopCounter::SampleStage(const StageLayers& stage, const Sample& sample) const {
  return Stage(stage, SampleShape(sample));
}

double FlopCounter::SampleTotal(const Sample& sample) const {
  StageLayers all;
  all.encoder_layers = model_.layers;
  all.decoder_layers = model_.decoder_layers;
  all.embedding = true;
  all.output_head = true;
  return SampleStage(all, sample);
}

double FlopCounter::RecomputeShare(const StageLayers& stage, const LayerShape& shape,
                                   Recompute rc) const {
  if (rc == Recompute::kNone) return 0;
  double with = 0, without = 0;
  for (LayerKind kind : {LayerKind::kEncoder, LayerKind::kDecoder}) {
    const int64_t n = kind == LayerKind::kEncoder ? stage.encoder_layers : stage.decoder_layers;
    if (n == 0 || (kind == LayerKind::kDecoder && shape.dec_seqlen < 1)) continue;
    with += static_cast<double>(n) * RunFlops(model_, kind, shape, rc);
    without += static_cast<double>(n) * RunFlops(model_, kind, shape, Recompute::kNone);
  }
  if (stage.output_head) {
    const double head = RunFlops(model_, LayerKind::kOutputHead, shape, Recompute::kNone);
    with += head;
    without += head;
  }
  return with > 0 ? std::clamp((with - without) / with, 0.0, 1.0) : 0.0;
}

AchievableRate SweepAchievableRate(const CostModel& cost, const FlopCounter& flops,
                                   std::span<const int64_t> tps) {
  const ModelSpec& model = flops.model();
  AchievableRate best;
  std::vector<LayerKind> kinds = {LayerKind::kEncoder, LayerKind::kOutputHead};
  if (model.is_encoder_decoder()) kinds.push_back(LayerKind::kDecoder);
  std::vector<int64_t> lengths;
  for (int64_t len = 16; len <= model.max_position; len *= 2) lengths.push_back(len);
  for (int64_t tp : tps) {
    if (!cost.SupportsTp(tp)) continue;
    for (LayerKind kind : kinds) {
      const bool two_lengths = model.is_encoder_decoder() && kind != LayerKind::kEncoder;
      for (int64_t mbs = 1; mbs <= 256; mbs *= 2) {
        for (int64_t len : lengths) {
          if (len < 64 && !two_lengths) continue;
          for (int64_t dec : two_lengths ? lengths : std::vector<int64_t>{0}) {
            const LayerShape shape{mbs, len, dec};
            const LayerCost c = cost.Layer(kind, shape, tp, Recompute::kNone);
            const Duration t = c.forward + c.backward;
            if (!c.feasible || t <= Duration::Zero()) continue;
            const double rate = flops.Layer(kind, shape) / (static_cast<double>(tp) * t.seconds());
            if (rate > best.flops_per_s) {
              best.flops_per_s = rate;
              best.where = fmt::format("{} layer, tp {}, {} (sweep)", LayerKindName(kind), tp,
                                       ShapeText(kind, shape));
            }
          }
        }
      }
    }
  }
  return best;
}

double LengthRates::RateOf(int64_t length) const {
  if (lengths.empty()) return 0;
  const auto it = std::lower_bound(lengths.begin(), lengths.end(), length);
  if (it == lengths.end()) return flops_per_s.back();
  const size_t hi = static_cast<size_t>(it - lengths.begin());
  if (*it == length || hi == 0) return flops_per_s[hi];
  return std::max(flops_per_s[hi - 1], flops_per_s[hi]);
}

LengthRates SweepLengthRates(const CostModel& cost, const FlopCounter& flops,
                             const ClusterSpec& cluster, std::span<const int64_t> tps,
                             std::span<const int64_t> cps, double max_rate) {
  const ModelSpec& model = flops.model();
  constexpr int64_t kMaxTokens = int64_t{1} << 16;
  LengthRates out;
  std::vector<LayerKind> kinds = {LayerKind::kEncoder, LayerKind::kOutputHead};
  if (model.is_encoder_decoder()) kinds.push_back(LayerKind::kDecoder);
  for (int64_t len = 64; len <= model.max_position; len *= 2) {
    double best = 0;
    for (int64_t tp : tps) {
      if (!cost.SupportsTp(tp)) continue;
      for (int64_t cp : cps) {
        if (cp > 1 && model.is_encoder_decoder()) continue;
        if (cp > len) continue;
        ParallelConfig group;
        group.tp = tp;
        group.cp = cp;
        const CpRing ring{cp, CpRingLink(cluster, group)};
        for (int64_t mbs = 1; mbs == 1 || mbs * len <= kMaxTokens; mbs *= 2) {
          // A whole layer stack's rate: the sum of its kinds' FLOPs over the sum of their
          // times, each kind weighted by its layer count (the head once).
          double useful = 0, seconds = 0;
          bool ok = true;
          for (LayerKind kind : kinds) {
            const LayerShape shape{mbs, len, model.is_encoder_decoder() ? len : 0};
            const LayerCost c = ContextParallelLayer(cost, kind, shape, tp, Recompute::kNone, ring);
            if (!c.feasible) {
              ok = false;
              break;
            }
            const double n = kind == LayerKind::kOutputHead ? 1.0
                             : kind == LayerKind::kDecoder
                                 ? static_cast<double>(model.decoder_layers)
                                 : static_cast<double>(model.layers);
            useful += n * flops.Layer(kind, shape);
            seconds += n * static_cast<double>(tp * cp) * (c.forward + c.backward).seconds();
          }
          if (ok && seconds > 0) best = std::max(best, useful / seconds);
        }
      }
    }
    out.lengths.push_back(len);
    out.flops_per_s.push_back(std::min(best, max_rate));
  }
  return out;
}

double LengthAwareDeviceSeconds(const LengthRates& rates, const FlopCounter& flops,
                                std::span<const Sample> samples) {
  double seconds = 0;
  for (const Sample& s : samples) {
    const int64_t len = flops.model().is_encoder_decoder() ? std::max(s.input_len, s.target_len)
                                                           : s.input_len + s.target_len;
    const double rate = rates.RateOf(len);
    if (rate > 0) seconds += flops.SampleTotal(s) / rate;
  }
  return seconds;
}

void BatchAccount::Add(const BatchAccount& o) {
  useful_flops += o.useful_flops;
  device_seconds += o.device_seconds;
  compute += o.compute;
  padding += o.padding;
  recompute += o.recompute;
  comm += o.comm;
  imbalance += o.imbalance;
  bubble += o.bubble;
  max_op_rate = std::max(max_op_rate, o.max_op_rate);
}

BatchAccount AccountBatch(const PlanResult& plan, const SimResult& sim,
                          const StageCostEvaluator& eval, std::span<const Sample> batch,
                          const FlopCounter& flops, int64_t cluster_devices) {
  BatchAccount a;
  // Devices per plan rank: tp, times cp with context parallelism (per-device op times).
  const double tp = static_cast<double>(eval.parallel().devices_per_rank());
  const BatchIndex index(batch);
  const std::vector<StageLayers>& stages = eval.stage_layers();
  for (const std::vector<MicroBatch>& replica : plan.batch_plan.replicas) {
    for (const MicroBatch& mb : replica) {
      for (size_t s = 0; s < stages.size() && s < mb.stages.size(); ++s) {
        double useful = 0;
        for (const auto& row : mb.rows) {
          for (int64_t id : row) useful += flops.SampleStage(stages[s], index(id));
        }
        const double t = tp * (mb.stages[s].forward + mb.stages[s].backward()).seconds();
        a.useful_flops += useful;
        if (t <= 0) continue;
        a.max_op_rate = std::max(a.max_op_rate, useful / t);
        LayerShape row_shape = mb.shape;
        if (mb.varlen) row_shape.mbs = 1;
        const double padded = mb.varlen ? useful : flops.Stage(stages[s], mb.shape);
        if (padded > useful) a.padding += t * (1.0 - useful / padded);
        a.recompute += t * flops.RecomputeShare(stages[s], row_shape, mb.recompute);
      }
    }
  }
  const double iteration = sim.iteration_time.seconds();
  a.device_seconds = static_cast<double>(cluster_devices) * iteration;
  Duration busiest;
  for (const RankSimStats& r : sim.ranks) busiest = std::max(busiest, r.compute);
  double ranks_time = 0;
  for (const RankSimStats& r : sim.ranks) {
    const double idle = std::max(0.0, r.bubble.seconds());
    const double wait = std::min((busiest - r.compute).seconds(), idle);
    a.compute += tp * r.compute.seconds();
    a.comm += tp * r.exposed_comm.seconds();
    a.imbalance += tp * wait;
    a.bubble += tp * (idle - wait);
    ranks_time += tp * iteration;
  }
  // Devices the configuration leaves unused idle for the whole iteration.
  a.bubble += std::max(0.0, a.device_seconds - ranks_time);
  return a;
}

Breakdown Finalize(const BatchAccount& a, double rate) {
  Breakdown b;
  if (a.device_seconds <= 0 || rate <= 0) return b;
  const double total = a.device_seconds;
  const double useful = a.useful_flops / rate;
  double padding = a.padding, recompute = a.recompute;
  // The FLOP-ratio estimates of padding and recomputation may together exceed what the compute
  // left above the useful work; scale them down so the kernel-efficiency rest stays >= 0.
  const double above = std::max(0.0, a.compute - useful);
  if (padding + recompute > above && padding + recompute > 0) {
    const double k = above / (padding + recompute);
    padding *= k;
    recompute *= k;
  }
  b.useful = useful / total;
  b.padding = padding / total;
  b.recompute = recompute / total;
  b.kernel = std::max(0.0, a.compute - useful - padding - recompute) / total;
  b.comm = a.comm / total;
  b.imbalance = a.imbalance / total;
  b.bubble = a.bubble / total;
  // Rounding aside the parts add to 1; put the remainder (the simulator's own rounding of
  // compute + comm + bubble per rank) into the bubble so they sum exactly.
  const double sum =
      b.useful + b.padding + b.recompute + b.kernel + b.comm + b.imbalance + b.bubble;
  b.bubble = std::max(0.0, b.bubble + (1.0 - sum));
  return b;
}

}  // namespace sluice
