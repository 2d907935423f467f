#include "passes/grad_overlap.h"

#include <algorithm>
#include <map>
#include <utility>

#include "model/chunk_cut.h"

namespace sluice::passes {
namespace {

bool IsReduction(OpKind op) {
  return op == OpKind::kAllReduceGrad || op == OpKind::kReduceScatterGrad;
}

// Word-embedding parameters of `stage` that complete only with the whole backward (the input
// embedding; a tied head's copy on a one-stage model is the same weight), per tp rank.
double EmbeddingAtEnd(const ExecutionPlan& plan, int64_t stage) {
  const ModelSpec& m = plan.model;
  const double vh = static_cast<double>(m.vocab) * static_cast<double>(m.hidden) /
                    static_cast<double>(plan.parallel.tp);
  return stage == 0 ? vh : 0;
}

}  // namespace

std::vector<double> MoeSegmentGradParams(const ExecutionPlan& plan, int64_t stage) {
  const ModelSpec& m = plan.model;
  const int64_t S = plan.num_stages();
  const ChunkCut cut = CutIntoChunks(m, plan.parallel)[static_cast<size_t>(stage)];
  const double t = static_cast<double>(plan.parallel.tp), h = static_cast<double>(m.hidden);
  const double mats = m.mlp == MlpKind::kSwiGlu ? 3 : 2;
  // Expert gradients are reduced over the replicas of each expert: none when dp <= ep.
  const bool experts_reduced = plan.parallel.dp / std::max<int64_t>(1, plan.parallel.ep) > 1;
  std::vector<double> seg;
  double acc = 0;
  auto layer = [&](int64_t index, bool decoder) {
    acc += 4 * h * h / t;  // QKV and output projections
    if (decoder) acc += 4 * h * h / t;
    if (m.IsMoeLayer(index)) {
      const MoeSpec& moe = *m.moe;
      const double fe =
          static_cast<double>(moe.expert_ffn_hidden > 0 ? moe.expert_ffn_hidden : m.ffn_hidden);
      acc += h * static_cast<double>(moe.experts);  // router
      seg.push_back(acc);
      const double local = static_cast<double>(moe.experts) /
                           static_cast<double>(std::max<int64_t>(1, plan.parallel.ep));
      seg.push_back(experts_reduced ? local * mats * h * fe / t : 0);
      acc = 0;
    } else {
      acc += mats * h * static_cast<double>(m.ffn_hidden) / t;
    }
  };
  for (int64_t i = cut.first_encoder_layer; i < cut.first_encoder_layer + cut.encoder_layers; ++i) {
    layer(i, false);
  }
  for (int64_t j = cut.first_decoder_layer; j < cut.first_decoder_layer + cut.decoder_layers; ++j) {
    layer(j, true);
  }
  // The output head's own weight (untied, or a tied copy on a stage without the embedding) is
  // done with the first backward segment.
  if (stage == S - 1 && (!m.tied_embeddings || S > 1)) {
    acc += static_cast<double>(m.vocab) * h / t;
  }
  seg.push_back(acc);
  return seg;
}

int64_t OverlapGradientReduction(ExecutionPlan* plan) {
  int64_t moved = 0;
  for (RankProgram& program : plan->ranks) {
    std::vector<Instruction>& ins = program.instructions;
    const int64_t n = static_cast<int64_t>(ins.size());
    // after[i]: the buckets posted right after instruction i (in bucket order).
    std::map<int64_t, std::vector<Instruction>> after;
    std::vector<bool> taken(static_cast<size_t>(n), false);
    for (int64_t p = 0; p < n;) {
      if (!IsReduction(ins[p].op)) {
        ++p;
        continue;
      }
      const int64_t s = ins[p].stage;
      int64_t end = p;
      while (end < n && IsReduction(ins[end].op) && ins[end].stage == s) ++end;
      const int64_t run_begin = p;
      p = end;
      // The stage's last backward micro-batch before the run.
      int64_t mb = -1;
      for (int64_t i = run_begin - 1; i >= 0 && mb < 0; --i) {
        const OpKind op = ins[i].op;
        if (ins[i].stage == s && (op == OpKind::kBackward || op == OpKind::kBackwardInput ||
                                  op == OpKind::kBackwardWeight)) {
          mb = ins[i].microbatch;
        }
      }
      if (mb < 0 || !plan->model.moe.has_value()) continue;
      // Where each segment's gradients are complete: its last W piece, else its last B piece.
      const std::vector<double> params = MoeSegmentGradParams(*plan, s);
      const size_t segments = params.size();
      std::vector<int64_t> done_w(segments, -1), done_b(segments, -1);
      bool whole = false;
      for (int64_t i = 0; i < run_begin; ++i) {
        const Instruction& in = ins[i];
        if (in.stage != s || in.microbatch != mb) continue;
        if (in.op != OpKind::kBackward && in.op != OpKind::kBackwardWeight) continue;
        if (in.segment < 0 || in.segment >= static_cast<int64_t>(segments)) {
          whole = true;
          continue;
        }
        (in.op == OpKind::kBackwardWeight ? done_w : done_b)[in.segment] = i;
      }
      const bool split = std::any_of(done_w.begin(), done_w.end(), [](int64_t i) { return i >= 0; });
      const std::vector<int64_t>& done = split ? done_w : done_b;
      if (whole || std::any_of(done.begin(), done.end(), [](int64_t i) { return i < 0; })) {
        continue;  // a whole backward (or an incomplete one): the run stays after it
      }
      // Bytes of the run per segment, in proportion to its parameters; the embedding's at the end.
      double total = EmbeddingAtEnd(*plan, s);
      for (double x : params) total += x;
      if (total <= 0) continue;
      double run_bytes = 0;
      for (int64_t i = run_begin; i < end; ++i) run_bytes += static_cast<double>(ins[i].bytes.count());
      std::vector<std::pair<int64_t, double>> ready;  // (instruction, bytes completed there)
      for (size_t j = 0; j < segments; ++j) {
        ready.emplace_back(done[j], run_bytes * params[j] / total);
      }
      std::sort(ready.begin(), ready.end());
      double cum_ready = 0, cum_bucket = 0;
      size_t k = 0;
      for (int64_t i = run_begin; i < end; ++i) {
        cum_bucket += static_cast<double>(ins[i].bytes.count());
        // The first piece at which the completed bytes cover buckets 0..i (1 byte of slack for
        // rounding); none: the run's own position, after the whole backward.
        while (k < ready.size() && cum_ready + ready[k].second < cum_bucket - 1) {
          cum_ready += ready[k].second;
          ++k;
        }
        const int64_t at = k < ready.size() ? ready[k].first : run_begin - 1;
        if (at < run_begin - 1) ++moved;
        after[at].push_back(ins[i]);
        taken[static_cast<size_t>(i)] = true;
      }
    }
    if (after.empty()) continue;
    std::vector<Instruction> out;
    out.reserve(ins.size());
    for (int64_t i = 0; i < n; ++i) {
      if (!taken[static_cast<size_t>(i)]) out.push_back(std::move(ins[i]));
      auto it = after.find(i);
      if (it != after.end()) {
        for (Instruction& b : it->second) out.push_back(std::move(b));
      }
    }
    ins = std::move(out);
  }
  return moved;
}

}  // namespace sluice::passes
