#include "runtime/reference.h"

#include <fmt/core.h>

#include <algorithm>
#include <memory>

#include "runtime/batch_layout.h"
#include "runtime/model.h"
#include "runtime/token_source.h"

namespace sluice::runtime {

StatusOr<ReferenceResult> RunReference(const ModelSpec& model, uint64_t seed, double lr,
                                       std::span<const ReferenceBatch> batches,
                                       int64_t grad_batch) {
  if (model.moe.has_value()) {
    return InvalidArgumentError(fmt::format(
        "RunReference: model '{}' has MoE layers, whose routing depends on the micro-batches; "
        "use RunMicroBatchReference",
        model.name));
  }
  SLUICE_ASSIGN_OR_RETURN(std::unique_ptr<ModelShard> shard,
                          ModelShard::Create(model, 1, 1, 0, seed));
  torch::optim::AdamW optimizer(
      shard->Parameters(), torch::optim::AdamWOptions(lr).betas({0.9, 0.95}).weight_decay(0.01));
  const TokenSource tokens(model.vocab, seed);
  const Chunk& chunk = shard->chunk(0);
  const bool enc_dec = model.is_encoder_decoder();
  ReferenceResult result;
  for (size_t b = 0; b < batches.size(); ++b) {
    int64_t labels = 0;
    for (const auto& row : batches[b]) {
      for (const Sample& s : row) labels += SampleLabels(model, s);
    }
    const double scale = 1.0 / static_cast<double>(std::max<int64_t>(labels, 1));
    double loss = 0;
    for (const auto& row : batches[b]) {
      PlanMicroBatch mb;
      mb.rows.emplace_back();
      for (const Sample& s : row) {
        mb.rows[0].push_back(s.id);
        mb.shape.seqlen += enc_dec ? s.input_len : s.input_len + s.target_len;
        mb.shape.dec_seqlen += enc_dec ? s.target_len : 0;
      }
      const SampleTable table = MakeSampleTable(row);
      SLUICE_ASSIGN_OR_RETURN(MicroBatchLayout layout, LayoutMicroBatch(model, mb, table));
      const MicroBatchInputs in = BuildMicroBatchInputs(model, layout, tokens, scale);
      std::vector<at::Tensor> inputs = {in.tokens};
      if (enc_dec) inputs.push_back(in.dec_tokens);
      const std::vector<at::Tensor> out = chunk.Forward(inputs, in.labels, in, false);
      out[0].backward();
      loss += out[0].item<double>();
    }
    result.losses.push_back(loss);
    if (static_cast<int64_t>(b) == grad_batch) {
      for (const auto& [name, p] : shard->NamedParameters()) {
        NamedValues v;
        v.name = name;
        const at::Tensor g = p.grad().defined() ? p.grad().contiguous() : torch::zeros_like(p);
        v.values.assign(g.data_ptr<float>(), g.data_ptr<float>() + g.numel());
        result.grads.push_back(std::move(v));
      }
    }
    optimizer.step();
    optimizer.zero_grad();
  }
  return result;
}

namespace {

void AppendGrads(const ModelShard& shard, std::vector<NamedValues>* out) {
  for (const auto& [name, p] : shard.NamedParameters()) {
    NamedValues v;
    v.name = name;
    const at::Tensor g = p.grad().defined() ? p.grad().contiguous() : torch::zeros_like(p);
    v.values.assign(g.data_ptr<float>(), g.data_ptr<float>() + g.numel());
    out->push_back(std::move(v));
  }
}

}  // namespace

StatusOr<ReferenceResult> RunMicroBatchReference(const ModelSpec& model, uint64_t seed, double lr,
                                                 std::span<const MicroBatchReferenceBatch> batches,
                                                 int64_t grad_batch) {
  SLUICE_ASSIGN_OR_RETURN(std::unique_ptr<ModelShard> shard,
                          ModelShard::Create(model, 1, 1, 0, seed));
  torch::optim::AdamW optimizer(
      shard->Parameters(), torch::optim::AdamWOptions(lr).betas({0.9, 0.95}).weight_decay(0.01));
  const TokenSource tokens(model.vocab, seed);
  const Chunk& chunk = shard->chunk(0);
  ReferenceResult result;
  for (size_t b = 0; b < batches.size(); ++b) {
    const SampleTable table = MakeSampleTable(batches[b].samples);
    int64_t labels = 0;
    for (const PlanMicroBatch& mb : batches[b].micro_batches) {
      for (const auto& row : mb.rows) {
        for (const int64_t id : row) labels += SampleLabels(model, table.at(id));
      }
    }
    const double scale = 1.0 / static_cast<double>(std::max<int64_t>(labels, 1));
    double loss = 0, aux = 0;
    int64_t assignments = 0, dropped = 0;
    for (const PlanMicroBatch& mb : batches[b].micro_batches) {
      SLUICE_ASSIGN_OR_RETURN(MicroBatchLayout layout, LayoutMicroBatch(model, mb, table));
      const MicroBatchInputs in = BuildMicroBatchInputs(model, layout, tokens, scale);
      std::vector<at::Tensor> inputs = {in.tokens};
      if (model.is_encoder_decoder()) inputs.push_back(in.dec_tokens);
      MoeContext moe;
      const std::vector<at::Tensor> out =
          chunk.Forward(inputs, in.labels, in, false, nullptr, chunk.has_moe() ? &moe : nullptr);
      at::Tensor objective = out[0];
      if (moe.aux_loss.defined()) {
        aux += moe.aux_loss.item<double>();
        objective = objective + moe.aux_loss;
      }
      objective.backward();
      loss += out[0].item<double>();
      assignments += moe.assignments;
      dropped += moe.dropped;
    }
    result.losses.push_back(loss);
    result.aux_losses.push_back(aux);
    result.assignments.push_back(assignments);
    result.dropped.push_back(dropped);
    if (static_cast<int64_t>(b) == grad_batch) AppendGrads(*shard, &result.grads);
    optimizer.step();
    optimizer.zero_grad();
  }
  return result;
}

}  // namespace sluice::runtime
