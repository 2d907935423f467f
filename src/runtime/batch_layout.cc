#include "runtime/batch_layout.h"

#include <fmt/core.h>

namespace sluice::runtime {

SampleTable MakeSampleTable(std::span<const Sample> samples) {
  SampleTable t;
  t.reserve(samples.size());
  for (const Sample& s : samples) t[s.id] = s;
  return t;
}

int64_t SampleLabels(const ModelSpec& model, const Sample& s) {
  return model.is_encoder_decoder() ? s.target_len : s.input_len + s.target_len;
}

StatusOr<MicroBatchLayout> LayoutMicroBatch(const ModelSpec& model, const PlanMicroBatch& mb,
                                            const SampleTable& samples) {
  MicroBatchLayout out;
  out.shape = mb.shape;
  out.varlen = mb.varlen;
  if (static_cast<int64_t>(mb.rows.size()) != mb.shape.mbs) {
    return InvalidArgumentError(fmt::format("micro-batch has {} rows but mbs {}", mb.rows.size(),
                                            mb.shape.mbs));
  }
  const bool enc_dec = model.is_encoder_decoder();
  for (size_t r = 0; r < mb.rows.size(); ++r) {
    std::vector<RowSegment> row;
    int64_t pos = 0, dec_pos = 0;
    for (const int64_t id : mb.rows[r]) {
      const auto it = samples.find(id);
      if (it == samples.end()) {
        return InvalidArgumentError(fmt::format("sample {} (row {}) is not in the batch", id, r));
      }
      const Sample& s = it->second;
      RowSegment seg;
      seg.sample_id = id;
      seg.begin = pos;
      seg.length = enc_dec ? s.input_len : s.input_len + s.target_len;
      seg.dec_begin = dec_pos;
      seg.dec_length = enc_dec ? s.target_len : 0;
      // A plan that records its segments must agree with the data it is run on.
      const size_t k = row.size();
      if (r < mb.seg_lens.size() && k < mb.seg_lens[r].size() && mb.seg_lens[r][k] != seg.length) {
        return InvalidArgumentError(fmt::format(
            "sample {} (row {}): the plan's seg_lens give {} tokens, the data {}", id, r,
            mb.seg_lens[r][k], seg.length));
      }
      if (r < mb.dec_seg_lens.size() && k < mb.dec_seg_lens[r].size() &&
          mb.dec_seg_lens[r][k] != seg.dec_length) {
        return InvalidArgumentError(fmt::format(
            "sample {} (row {}): the plan's dec_seg_lens give {} decoder tokens, the data {}", id,
            r, mb.dec_seg_lens[r][k], seg.dec_length));
      }
      pos += seg.length;
      dec_pos += seg.dec_length;
      out.label_tokens += SampleLabels(model, s);
      row.push_back(seg);
    }
    if (pos > mb.shape.seqlen || (enc_dec && dec_pos > mb.shape.dec_seqlen)) {
      return InvalidArgumentError(fmt::format(
          "row {} needs {} tokens{} but the micro-batch is padded to {}{}", r, pos,
          enc_dec ? fmt::format(" and {} decoder tokens", dec_pos) : "", mb.shape.seqlen,
          enc_dec ? fmt::format(" x {}", mb.shape.dec_seqlen) : ""));
    }
    out.rows.push_back(std::move(row));
  }
  return out;
}

StatusOr<int64_t> GlobalLabelTokens(const ExecutionPlan& plan, const SampleTable& samples) {
  int64_t total = 0;
  for (const PlanReplica& rep : plan.replicas) {
    for (const PlanMicroBatch& mb : rep.micro_batches) {
      for (const auto& row : mb.rows) {
        for (const int64_t id : row) {
          const auto it = samples.find(id);
          if (it == samples.end()) {
            return InvalidArgumentError(fmt::format("sample {} is not in the batch", id));
          }
          total += SampleLabels(plan.model, it->second);
        }
      }
    }
  }
  return total;
}

}  // namespace sluice::runtime
