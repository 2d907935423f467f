#include "sim/sim_stats.h"

#include <fmt/core.h>

#include <algorithm>
#include <unordered_map>

#include "cost/layer_work.h"

namespace sluice::sim_internal {
namespace {

double PassFlops(const PassWork& w) { return w.gemm_flops + w.attention_flops; }

// Useful FLOPs (forward + backward, no recompute, whole model on one device) of one sequence of
// `len` tokens, or (encoder-decoder) `len` input and `dec_len` target tokens.
double SequenceFlops(const ModelSpec& model, int64_t len, int64_t dec_len) {
  const WorkOptions options;
  auto layer = [&](LayerKind kind, const LayerShape& shape) {
    const LayerWork w = ComputeLayerWork(model, kind, shape, 1, Recompute::kNone, options);
    return PassFlops(w.forward) + PassFlops(w.backward);
  };
  double flops = 0;
  if (!model.is_encoder_decoder()) {
    if (len < 1) return 0;
    const LayerShape shape{1, len, 0};
    flops += static_cast<double>(model.layers) * layer(LayerKind::kEncoder, shape);
    flops += layer(LayerKind::kEmbedding, shape) + layer(LayerKind::kOutputHead, shape);
    return flops;
  }
  if (len >= 1) {
    const LayerShape enc{1, len, std::max<int64_t>(dec_len, 1)};
    flops += static_cast<double>(model.layers) * layer(LayerKind::kEncoder, enc);
    flops += layer(LayerKind::kEmbedding, enc);
  }
  if (len >= 1 && dec_len >= 1) {
    const LayerShape dec{1, len, dec_len};
    flops += static_cast<double>(model.decoder_layers) * layer(LayerKind::kDecoder, dec);
    flops += layer(LayerKind::kOutputHead, dec);
  }
  return flops;
}

}  // namespace

StatusOr<TokenCount> CountTokens(const ExecutionPlan& plan, std::span<const Sample> samples) {
  TokenCount out;
  const ModelSpec& model = plan.model;
  const bool enc_dec = model.is_encoder_decoder();
  double bound = 0;
  std::unordered_map<int64_t, const Sample*> by_id;
  by_id.reserve(samples.size());
  for (const Sample& s : samples) by_id.emplace(s.id, &s);
  for (size_t d = 0; d < plan.replicas.size(); ++d) {
    for (size_t i = 0; i < plan.replicas[d].micro_batches.size(); ++i) {
      const PlanMicroBatch& mb = plan.replicas[d].micro_batches[i];
      const int64_t seq = mb.shape.seqlen, dec = enc_dec ? mb.shape.dec_seqlen : 0;
      // Shapes are each in range but their products and sums need not be: keep the counts
      // below 2^61 (a plan of real sizes is far below) so that no int64 sum overflows.
      bound += std::max(static_cast<double>(mb.shape.mbs), static_cast<double>(mb.rows.size())) *
               static_cast<double>(seq + dec);
      if (!(bound < 2305843009213693952.0)) {
        return InvalidArgumentError(fmt::format(
            "simulation: plan replica {} micro-batch {}: the micro-batch shapes up to here hold "
            "{:.3g} tokens (mbs or rows x (seqlen + dec_seqlen)); allowed: at most 2^61 in all",
            d, i, bound));
      }
      out.padded += mb.shape.mbs * (seq + dec);
      if (samples.empty()) {
        out.real += static_cast<int64_t>(mb.rows.size()) * (seq + dec);
        out.model_flops += static_cast<double>(mb.rows.size()) * SequenceFlops(model, seq, dec);
        continue;
      }
      for (const auto& row : mb.rows) {
        int64_t row_in = 0, row_out = 0;
        for (int64_t id : row) {
          const auto it = by_id.find(id);
          if (it == by_id.end()) {
            return NotFoundError(
                fmt::format("simulation options: field 'samples' lacks sample id {} of replica {} "
                            "micro-batch {} (pass the plan's global batch)",
                            id, d, i));
          }
          const Sample& s = *it->second;
          int64_t in = 0, tgt = 0;
          if (enc_dec) {
            in = std::min(s.input_len, seq);
            tgt = std::min(s.target_len, dec);
          } else {
            in = std::min(s.tokens(), seq);
          }
          in = std::min(in, seq - row_in);
          tgt = std::min(tgt, dec - row_out);
          row_in += in;
          row_out += tgt;
          out.model_flops += SequenceFlops(model, in, tgt);
        }
        out.real += row_in + row_out;
      }
    }
  }
  return out;
}

MemorySweep SweepMemory(std::vector<MemoryDelta>& deltas, Bytes base, Bytes limit, bool record) {
  auto by_time = [](const MemoryDelta& a, const MemoryDelta& b) { return a.time < b.time; };
  if (!std::is_sorted(deltas.begin(), deltas.end(), by_time)) {
    std::stable_sort(deltas.begin(), deltas.end(), by_time);
  }
  MemorySweep out;
  out.peak = base;
  int64_t level = base.count();
  if (record) out.points.push_back({Duration::Zero(), base});
  for (size_t i = 0; i < deltas.size(); ++i) {
    const MemoryDelta& d = deltas[i];
    level += d.bytes;
    if (level > out.peak.count()) {
      out.peak = Bytes::Of(level);
      out.peak_instruction = d.instruction;
    }
    if (level > limit.count() && out.first_over_time < 0) {
      out.first_over_time = d.time;
      out.first_over_instruction = d.instruction;
    }
    const bool last_at_time = i + 1 == deltas.size() || deltas[i + 1].time != d.time;
    if (record && last_at_time) {
      const Duration t = Duration::Nanos(d.time);
      if (out.points.back().time == t) {
        out.points.back().bytes = Bytes::Of(level);
      } else if (out.points.back().bytes.count() != level) {
        out.points.push_back({t, Bytes::Of(level)});
      }
    }
  }
  return out;
}

Duration UnionWithin(std::vector<std::pair<Duration, Duration>>& spans, Duration from,
                     Duration to) {
  if (to <= from || spans.empty()) return Duration::Zero();
  std::sort(spans.begin(), spans.end());
  Duration total, cover_end = from;
  for (const auto& [start, end] : spans) {
    const Duration s = std::max(start, cover_end), e = std::min(end, to);
    if (e > s) {
      total += e - s;
      cover_end = e;
    }
  }
  return total;
}

}  // namespace sluice::sim_internal
