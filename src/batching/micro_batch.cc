#include "batching/micro_batch.h"

#include <fmt/core.h>

#include <algorithm>

#include "batching/stage_cost.h"

namespace sluice {

std::string_view PlanOutcomeName(PlanOutcome outcome) {
  switch (outcome) {
    case PlanOutcome::kOk:
      return "ok";
    case PlanOutcome::kOutOfMemory:
      return "out-of-memory";
  }
  return "?";
}

int64_t MicroBatch::num_samples() const {
  int64_t n = 0;
  for (const std::vector<int64_t>& row : rows) n += static_cast<int64_t>(row.size());
  return n;
}

Duration MicroBatch::Bottleneck() const {
  Duration out;
  for (const ChunkCost& c : stages) out = std::max(out, c.forward + c.backward());
  return out;
}

double MicroBatch::PaddingFraction() const {
  if (padded_tokens <= 0) return 0.0;
  const double f = 1.0 - static_cast<double>(real_tokens) / static_cast<double>(padded_tokens);
  return std::clamp(f, 0.0, 1.0);
}

BatchIndex::BatchIndex(std::span<const Sample> batch) : batch_(batch) {
  by_id_.reserve(batch.size());
  for (size_t i = 0; i < batch.size(); ++i) {
    by_id_.emplace_back(batch[i].id, static_cast<int64_t>(i));
  }
  std::sort(by_id_.begin(), by_id_.end());
}

bool BatchIndex::Contains(int64_t id) const {
  auto it = std::lower_bound(by_id_.begin(), by_id_.end(), std::make_pair(id, int64_t{0}));
  return it != by_id_.end() && it->first == id;
}

const Sample& BatchIndex::operator()(int64_t id) const {
  auto it = std::lower_bound(by_id_.begin(), by_id_.end(), std::make_pair(id, int64_t{0}));
  SLUICE_CHECK_MSG(it != by_id_.end() && it->first == id,
                   fmt::format("sample id {} is not in the batch", id));
  return batch_[static_cast<size_t>(it->second)];
}

bool PriceMicroBatch(const StageCostEvaluator& eval, const BatchIndex& index, MicroBatch* mb) {
  const bool encdec = eval.model().is_encoder_decoder();
  const int64_t pp = eval.pp();
  int64_t max_row = 0;
  int64_t max_dec = 0;
  int64_t real = 0;
  bool ok = !mb->rows.empty();
  std::vector<int64_t> lengths, dec_lengths;
  for (const std::vector<int64_t>& row : mb->rows) {
    if (row.empty()) ok = false;
    int64_t len = 0;
    int64_t dec = 0;
    for (int64_t id : row) {
      const Sample& s = index(id);
      len += eval.SeqLen(s);
      dec += eval.DecLen(s);
      real += s.tokens();
      if (mb->varlen) {
        lengths.push_back(eval.SeqLen(s));
        if (encdec) dec_lengths.push_back(eval.DecLen(s));
      }
    }
    max_row = std::max(max_row, len);
    max_dec = std::max(max_dec, dec);
  }
  mb->shape.mbs = static_cast<int64_t>(mb->rows.size());
  mb->shape.seqlen = eval.Pad(std::max<int64_t>(1, max_row));
  mb->shape.dec_seqlen = encdec ? eval.Pad(std::max<int64_t>(1, max_dec)) : 0;
  mb->real_tokens = real;
  mb->padded_tokens = mb->shape.mbs * (mb->shape.seqlen + mb->shape.dec_seqlen);
  std::vector<ChunkCost> stages;
  if (ok) {
    if (mb->varlen) {
      ok = encdec ? eval.EvaluateVarlenStages(lengths, dec_lengths, mb->recompute, &stages)
                  : eval.EvaluateVarlenStages(lengths, mb->recompute, &stages);
    } else {
      ok = eval.EvaluateStages(mb->shape, mb->recompute, &stages);
    }
  }
  stages.resize(static_cast<size_t>(pp));
  mb->stages = std::move(stages);
  return ok;
}

Duration PredictReplicaTime(std::span<const MicroBatch> micro_batches, int64_t pp) {
  Duration sum;
  Duration max;
  for (const MicroBatch& mb : micro_batches) {
    const Duration t = mb.Bottleneck();
    sum += t;
    max = std::max(max, t);
  }
  return sum + max * std::max<int64_t>(0, pp - 1);
}

namespace {

std::string Where(size_t replica, size_t mb) {
  return fmt::format("replica {}, micro-batch {}", replica, mb);
}

}  // namespace

Status ValidateBatchPlan(const BatchPlan& plan, std::span<const Sample> batch,
                         const StageCostEvaluator& eval) {
  const std::string method = plan.method.empty() ? "batch plan" : plan.method;
  if (plan.outcome != PlanOutcome::kOk) {
    if (plan.infeasible_reason.empty()) {
      return InternalError(
          fmt::format("{}: outcome {} without a reason", method, PlanOutcomeName(plan.outcome)));
    }
    return Status::Ok();
  }
  const BatchIndex index(batch);
  std::vector<std::pair<int64_t, std::string>> seen;  // (id, where it was found)
  {
    std::vector<int64_t> ids;
    ids.reserve(batch.size());
    for (const Sample& s : batch) ids.push_back(s.id);
    std::sort(ids.begin(), ids.end());
    auto dup = std::adjacent_find(ids.begin(), ids.end());
    if (dup != ids.end()) {
      return InvalidArgumentError(
          fmt::format("{}: the global batch holds sample id {} twice", method, *dup));
    }
  }
  if (static_cast<int64_t>(plan.replicas.size()) != eval.parallel().dp) {
    return InternalError(fmt::format("{}: {} replicas, the configuration has dp={}", method,
                                     plan.replicas.size(), eval.parallel().dp));
  }
  const bool encdec = eval.model().is_encoder_decoder();
  const size_t pp = static_cast<size_t>(eval.pp());
  for (size_t r = 0; r < plan.replicas.size(); ++r) {
    const std::vector<MicroBatch>& mbs = plan.replicas[r];
    for (size_t m = 0; m < mbs.size(); ++m) {
      const MicroBatch& mb = mbs[m];
      const std::string where = Where(r, m);
      if (mb.rows.empty()) return InternalError(fmt::format("{}: {}: no rows", method, where));
      if (mb.shape.mbs != static_cast<int64_t>(mb.rows.size())) {
        return InternalError(fmt::format("{}: {}: shape.mbs {} but {} rows", method, where,
                                         mb.shape.mbs, mb.rows.size()));
      }
      if (mb.stages.size() != pp) {
        return InternalError(
            fmt::format("{}: {}: per-stage costs need {} entries", method, where, pp));
      }
      for (size_t row = 0; row < mb.rows.size(); ++row) {
        if (mb.rows[row].empty()) {
          return InternalError(fmt::format("{}: {}: row {} is empty", method, where, row));
        }
        int64_t len = 0;
        int64_t dec = 0;
        for (int64_t id : mb.rows[row]) {
          if (!index.Contains(id)) {
            return InternalError(
                fmt::format("{}: {}: sample id {} is not in the global batch", method, where, id));
          }
          len += eval.SeqLen(index(id));
          dec += eval.DecLen(index(id));
          seen.emplace_back(id, where);
        }
        if (len > mb.shape.seqlen || (encdec && dec > mb.shape.dec_seqlen)) {
          return InternalError(fmt::format(
              "{}: {}: row {} holds {}{} tokens, more than the padded shape {}x{}{}", method, where,
              row, len, encdec ? fmt::format("+{}", dec) : "", mb.shape.mbs, mb.shape.seqlen,
              encdec ? fmt::format("x{}", mb.shape.dec_seqlen) : ""));
        }
      }
    }
    const std::string memory = CheckSequenceMemory(eval, mbs);
    if (!memory.empty()) {
      return InternalError(fmt::format("{}: replica {}: out of memory: {}", method, r, memory));
    }
  }
  for (const UnplacedSample& d : plan.dropped) {
    if (!index.Contains(d.id)) {
      return InternalError(
          fmt::format("{}: dropped sample id {} is not in the global batch", method, d.id));
    }
    if (d.reason.empty()) {
      return InternalError(fmt::format("{}: dropped sample id {} has no reason", method, d.id));
    }
    seen.emplace_back(d.id, "dropped");
  }
  std::stable_sort(seen.begin(), seen.end(),
                   [](const auto& a, const auto& b) { return a.first < b.first; });
  for (size_t i = 1; i < seen.size(); ++i) {
    if (seen[i].first == seen[i - 1].first) {
      return InternalError(fmt::format("{}: sample id {} appears twice ({}; {})", method,
                                       seen[i].first, seen[i - 1].second, seen[i].second));
    }
  }
  if (seen.size() != batch.size()) {
    for (const Sample& s : batch) {
      auto it = std::lower_bound(seen.begin(), seen.end(), s.id,
                                 [](const auto& e, int64_t id) { return e.first < id; });
      if (it == seen.end() || it->first != s.id) {
        return InternalError(
            fmt::format("{}: sample id {} is in no micro-batch and not dropped", method, s.id));
      }
    }
  }
  return Status::Ok();
}

}  // namespace sluice
