#include "batching/stage_cost.h"

#include <fmt/core.h>

#include <algorithm>
#include <array>
#include <cmath>
#include <mutex>

#include "batching/micro_batch.h"
#include "batching/stage_cost_internal.h"
#include "model/chunk_cut.h"

namespace sluice {

using stage_cost_internal::CombineStage;
using stage_cost_internal::KindCosts;
using stage_cost_internal::LookupKinds;
using stage_cost_internal::SummaryBuilder;

StatusOr<StageCostEvaluator> StageCostEvaluator::Create(const CostModel& cost,
                                                        const ParallelConfig& par,
                                                        const ClusterSpec& cluster,
                                                        const StageCostOptions& options) {
  const ModelSpec& model = cost.model();
  SLUICE_RETURN_IF_ERROR(ValidateParallelConfig(par, "parallel config"));
  SLUICE_RETURN_IF_ERROR(CheckParallelFits(par, model, &cluster, "parallel config"));
  if (!cost.SupportsTp(par.tp)) {
    return InvalidArgumentError(
        fmt::format("parallel config: tp={} is not supported by the cost "
                    "model ({})",
                    par.tp, cost.Describe()));
  }
  if (options.pad_multiple < 1) {
    return InvalidArgumentError(
        fmt::format("stage cost options: pad_multiple must be >= 1, got {}", options.pad_multiple));
  }
  if (options.transient_boundary_buffers < 0) {
    return InvalidArgumentError(
        fmt::format("stage cost options: transient_boundary_buffers must be >= 0, got {}",
                    options.transient_boundary_buffers));
  }
  StageCostEvaluator e;
  e.cost_ = &cost;
  e.kinds_ = std::make_shared<KindCostCache>();
  e.par_ = par;
  e.options_ = options;
  e.limit_ = par.MemoryLimit(cluster);
  e.ring_ = CpRing{par.cp, CpRingLink(cluster, par)};
  e.chunk_layers_ = ChunkStageLayers(model, par);
  const std::vector<StageLayers>& chunks = e.chunk_layers_;
  e.stage_layers_.assign(static_cast<size_t>(par.pp), StageLayers{});
  for (int64_t c = 0; c < par.chunks(); ++c) {
    StageLayers& s = e.stage_layers_[static_cast<size_t>(c % par.pp)];
    s.encoder_layers += chunks[c].encoder_layers;
    s.decoder_layers += chunks[c].decoder_layers;
    s.embedding = s.embedding || chunks[c].embedding;
    s.output_head = s.output_head || chunks[c].output_head;
    s.decoder_embedding = s.decoder_embedding || chunks[c].decoder_embedding;
  }
  for (int64_t s = 0; s < par.pp; ++s) {
    const ModelStateMemory states = cost.ModelStates(e.stage_layers_[s], par);
    e.stage_states_.push_back(states);
    const Bytes budget = e.limit_ - states.total();
    if (budget <= Bytes::Zero()) {
      return FailedPreconditionError(
          fmt::format("parallel config: stage {} of {} needs {} of model states (mixed-precision "
                      "Adam, ZeRO-{}) "
                      "but the memory limit is {}; raise pp, tp, dp with ZeRO, or the memory limit",
                      s, model.name, FormatBytes(states.total()), par.zero, FormatBytes(e.limit_)));
    }
    e.budgets_.push_back(budget);
  }
  SLUICE_RETURN_IF_ERROR(e.FitVarlen());
  return e;
}

int64_t StageCostEvaluator::InFlight(int64_t stage, int64_t num_micro_batches) const {
  const int64_t m = std::max<int64_t>(1, num_micro_batches);
  if (options_.in_flight == InFlightPolicy::kGPipe) return m;
  if (options_.in_flight == InFlightPolicy::kInterleaved && par_.vpp > 1) {
    const int64_t chunks = (par_.pp - stage - 1) * 2 + (par_.vpp - 1) * par_.pp + 1;
    return std::max<int64_t>(1, std::min((chunks + par_.vpp - 1) / par_.vpp, m));
  }
  return std::max<int64_t>(1, std::min(par_.pp - stage, m));
}

int64_t StageCostEvaluator::SeqLen(const Sample& s) const {
  return model().is_encoder_decoder() ? s.input_len : s.input_len + s.target_len;
}

int64_t StageCostEvaluator::DecLen(const Sample& s) const {
  return model().is_encoder_decoder() ? s.target_len : 0;
}

int64_t StageCostEvaluator::Pad(int64_t len) const {
  const int64_t m = options_.pad_multiple;
  return (len + m - 1) / m * m;
}

namespace {

// Looks up the layer kinds the model uses at `shape`; false when one is infeasible.
// With cp > 1, per device of the cp group (cost/context_parallel.h).
bool LookupKindsUncached(const CostModel& cost, const LayerShape& shape, int64_t tp,
                         const CpRing& ring, Recompute rc, KindCosts* k) {
  const bool encdec = cost.model().is_encoder_decoder();
  if (shape.mbs < 1 || shape.seqlen < 1 || (encdec && shape.dec_seqlen < 1)) return false;
  k->encoder = ContextParallelLayer(cost, LayerKind::kEncoder, shape, tp, rc, ring);
  if (!k->encoder.feasible) return false;
  if (encdec) {
    k->decoder = ContextParallelLayer(cost, LayerKind::kDecoder, shape, tp, rc, ring);
    if (!k->decoder.feasible) return false;
  }
  k->embedding = ContextParallelLayer(cost, LayerKind::kEmbedding, shape, tp, rc, ring);
  if (!k->embedding.feasible) return false;
  k->head = ContextParallelLayer(cost, LayerKind::kOutputHead, shape, tp, rc, ring);
  return k->head.feasible;
}

}  // namespace

// The memo of one evaluator's LookupKindsUncached answers (stage_cost.h): a direct-mapped table
// of StageCostEvaluator::kKindCacheEntries slots (allocated at the first lookup), a new answer
// replacing the one in its slot. The evaluator's cost model, tp and ring are fixed, so (shape,
// recompute level) is the whole key.
class KindCostCache {
 public:
  // The answer for (shape, rc), from the memo or computed (outside the lock) and stored.
  bool Lookup(const CostModel& cost, const LayerShape& shape, int64_t tp, const CpRing& ring,
              Recompute rc, KindCosts* k) {
    const Key key{shape.mbs, shape.seqlen, shape.dec_seqlen, static_cast<int64_t>(rc)};
    const size_t slot = SlotOf(key);
    {
      std::lock_guard<std::mutex> lock(mu_);
      if (!slots_.empty() && slots_[slot].used && slots_[slot].key == key) {
        *k = slots_[slot].costs;
        return slots_[slot].ok;
      }
    }
    Slot fresh;
    fresh.key = key;
    fresh.used = true;
    fresh.ok = LookupKindsUncached(cost, shape, tp, ring, rc, &fresh.costs);
    *k = fresh.costs;
    std::lock_guard<std::mutex> lock(mu_);
    if (slots_.empty()) slots_.resize(static_cast<size_t>(StageCostEvaluator::kKindCacheEntries));
    slots_[slot] = fresh;
    return fresh.ok;
  }

 private:
  using Key = std::array<int64_t, 4>;  // mbs, seqlen, dec_seqlen, recompute level
  static_assert((StageCostEvaluator::kKindCacheEntries &
                 (StageCostEvaluator::kKindCacheEntries - 1)) == 0);
  static size_t SlotOf(const Key& k) {
    uint64_t h = 0x9E3779B97F4A7C15ull;
    for (int64_t x : k) h = (h ^ static_cast<uint64_t>(x)) * 0xBF58476D1CE4E5B9ull;
    h ^= h >> 31;
    return static_cast<size_t>(h) &
           static_cast<size_t>(StageCostEvaluator::kKindCacheEntries - 1);
  }
  struct Slot {
    Key key{};
    bool used = false;
    bool ok = false;
    KindCosts costs;  // as LookupKindsUncached left it (partly filled when !ok)
  };
  std::mutex mu_;
  std::vector<Slot> slots_;  // empty until the first answer is stored
};

namespace stage_cost_internal {

bool LookupKinds(KindCostCache& cache, const CostModel& cost, const LayerShape& shape, int64_t tp,
                 const CpRing& ring, Recompute rc, KindCosts* k) {
  return cache.Lookup(cost, shape, tp, ring, rc, k);
}

}  // namespace stage_cost_internal

bool StageCostEvaluator::EvaluateStages(const LayerShape& shape, Recompute rc,
                                        std::vector<ChunkCost>* out) const {
  out->assign(static_cast<size_t>(par_.pp), ChunkCost{});
  KindCosts k;
  if (!LookupKinds(*kinds_, *cost_, shape, par_.tp, ring_, rc, &k)) return false;
  for (int64_t s = 0; s < par_.pp; ++s) (*out)[s] = CombineStage(stage_layers_[s], k);
  return true;
}

bool StageCostEvaluator::EvaluateChunks(const LayerShape& shape, Recompute rc,
                                        std::vector<ChunkCost>* out) const {
  out->assign(chunk_layers_.size(), ChunkCost{});
  KindCosts k;
  if (!LookupKinds(*kinds_, *cost_, shape, par_.tp, ring_, rc, &k)) return false;
  for (size_t c = 0; c < chunk_layers_.size(); ++c) (*out)[c] = CombineStage(chunk_layers_[c], k);
  return true;
}

CostSummary StageCostEvaluator::Summarize(const LayerShape& shape, Recompute rc,
                                          int64_t num_micro_batches) const {
  KindCosts k;
  if (!LookupKinds(*kinds_, *cost_, shape, par_.tp, ring_, rc, &k)) return CostSummary{};
  SummaryBuilder b;
  for (int64_t s = 0; s < par_.pp; ++s) {
    b.Add(CombineStage(stage_layers_[s], k), InFlight(s, num_micro_batches), budgets_[s],
          HeldBuffers(shape, s), TransientBuffers(shape, s));
  }
  return b.Finish(true);
}

namespace {

// share = part / whole, or 1 / n when the whole is zero.
double Share(int64_t part, int64_t whole, int64_t n) {
  return whole > 0 ? static_cast<double>(part) / static_cast<double>(whole)
                   : 1.0 / static_cast<double>(n);
}

}  // namespace

void StageCostEvaluator::SplitOverChunks(const LayerShape& shape, Recompute rc,
                                         std::span<const ChunkCost> stages,
                                         std::vector<ChunkCost>* out) const {
  const int64_t pp = par_.pp, vpp = par_.vpp, n = pp * vpp;
  out->assign(static_cast<size_t>(n), ChunkCost{});
  if (vpp == 1) {
    for (int64_t c = 0; c < n; ++c) {
      (*out)[c] = stages[c];
      (*out)[c].stored_until_w = Bytes::Zero();
    }
    return;
  }
  std::vector<ChunkCost> chunk;
  const bool shares = EvaluateChunks(shape, rc, &chunk);
  for (int64_t c = 0; c < n; ++c) {
    const int64_t d = c % pp;
    const ChunkCost& st = stages[d];
    // The chunk's shares of its device's figures; its peak is its own high-water mark at the
    // padded shape, scaled like its stored bytes.
    const double even = 1.0 / static_cast<double>(vpp);
    double fw = even, bi = even, bw = even, mem = even, peak_scale = 1.0;
    if (shares) {
      ChunkCost sum;
      for (int64_t k = d; k < n; k += pp) {
        sum.forward += chunk[k].forward;
        sum.backward_input += chunk[k].backward_input;
        sum.backward_weight += chunk[k].backward_weight;
        sum.stored += chunk[k].stored;
      }
      fw = Share(chunk[c].forward.nanos(), sum.forward.nanos(), vpp);
      bi = Share(chunk[c].backward_input.nanos(), sum.backward_input.nanos(), vpp);
      bw = Share(chunk[c].backward_weight.nanos(), sum.backward_weight.nanos(), vpp);
      mem = Share(chunk[c].stored.count(), sum.stored.count(), vpp);
      peak_scale = Share(st.stored.count(), sum.stored.count(), 1);
    }
    ChunkCost& cc = (*out)[c];
    cc.forward = st.forward.Scaled(fw);
    cc.backward_input = st.backward_input.Scaled(bi);
    cc.backward_weight = st.backward_weight.Scaled(bw);
    cc.stored = st.stored.Scaled(mem);
    // Without shares the running layer's transient stays whole.
    cc.peak = shares ? chunk[c].peak.Scaled(peak_scale)
                     : cc.stored + std::max(Bytes::Zero(), st.peak - st.stored);
  }
}

CostSummary StageCostEvaluator::SummaryFromStages(const LayerShape& shape,
                                                  const std::vector<ChunkCost>& stages, bool ok,
                                                  int64_t num_micro_batches) const {
  if (!ok) return CostSummary{};
  SummaryBuilder b;
  for (int64_t s = 0; s < par_.pp; ++s) {
    b.Add(stages[s], InFlight(s, num_micro_batches), budgets_[s], HeldBuffers(shape, s),
          TransientBuffers(shape, s));
  }
  return b.Finish(true);
}

}  // namespace sluice
