// BatchLayout: where each sample's tokens sit inside a planned micro-batch, and the label count
// every loss is normalised by. Torch-free: the tensors are built from it in model.cc.
//
// A plan row holds one sample or several packed one after the other. In a varlen micro-batch
// every packed sample attends only to itself (flash-attention varlen) and its positions start at
// 0; in a padded micro-batch a row that packs several samples attends across the whole row, with
// positions running on (Megatron/DeepSpeed pack-dataset, micro_batch.h). Decoder-only: a sample
// of L = input_len + target_len tokens occupies L positions of its row and predicts L next tokens
// of its own (its token stream is L + 1 long). Encoder-decoder: input_len encoder positions and
// target_len decoder positions, each side packed separately, target_len labels. Everything after
// the last segment is padding.
//
// Loss normalisation: every micro-batch's loss is the sum of its token losses divided by the
// number of labels of the whole global batch (all replicas), so the summed gradients of a
// pipelined, data-parallel iteration equal the gradient of the batch's mean token loss.
//
// Thread safety: value types and pure functions.
#pragma once

#include <cstdint>
#include <span>
#include <string_view>
#include <unordered_map>
#include <vector>

#include "base/status.h"
#include "data/sample.h"
#include "model/model_spec.h"
#include "plan/execution_plan.h"

namespace sluice::runtime {

struct RowSegment {
  int64_t sample_id = 0;
  int64_t begin = 0;      // first position in the (encoder or only) row
  int64_t length = 0;     // positions: decoder-only L, encoder-decoder input_len
  int64_t dec_begin = 0;  // encoder-decoder: first position in the decoder row
  int64_t dec_length = 0; // encoder-decoder: target_len (labels)

  friend bool operator==(const RowSegment&, const RowSegment&) = default;
};

struct MicroBatchLayout {
  LayerShape shape;
  bool varlen = false;                        // per-sample attention; else whole-row attention
  std::vector<std::vector<RowSegment>> rows;  // [row] segments, in packing order
  int64_t label_tokens = 0;                   // labels this micro-batch predicts

  friend bool operator==(const MicroBatchLayout&, const MicroBatchLayout&) = default;
};

// Samples of a global batch by id.
using SampleTable = std::unordered_map<int64_t, Sample>;
SampleTable MakeSampleTable(std::span<const Sample> samples);

// Labels one sample contributes (decoder-only: input + target, encoder-decoder: target).
int64_t SampleLabels(const ModelSpec& model, const Sample& s);

// Lays out `mb`. Errors: a sample id the table lacks, a row whose samples do not fit the padded
// shape, a row count that is not shape.mbs.
StatusOr<MicroBatchLayout> LayoutMicroBatch(const ModelSpec& model, const PlanMicroBatch& mb,
                                            const SampleTable& samples);

// Labels of every micro-batch of every replica of `plan` (the loss normaliser).
StatusOr<int64_t> GlobalLabelTokens(const ExecutionPlan& plan, const SampleTable& samples);

}  // namespace sluice::runtime
