// The weight-gradient tape of a split backward (model.h, WeightGradTape): the input gradients
// now, each recorded linear layer's dW = g_y^T x and db later, as autograd would have.
#include <algorithm>
#include <utility>
#include <vector>

#include "runtime/model.h"

namespace sluice::runtime {

void AccumulateGrad(const at::Tensor& param, at::Tensor g) {
  at::Tensor& grad = param.mutable_grad();
  if (!grad.defined()) {
    grad = std::move(g);
  } else {
    grad.add_(g);
  }
}

std::vector<at::Tensor> WeightGradTape::InputGradients(const std::vector<at::Tensor>& outputs,
                                                       const std::vector<at::Tensor>& grad_outputs,
                                                       const std::vector<at::Tensor>& leaves,
                                                       const std::vector<at::Tensor>& params) {
  const std::vector<at::Tensor> untaped = Untaped(params);
  std::vector<at::Tensor> targets = leaves;
  for (const Entry& e : entries_) targets.push_back(e.output);
  targets.insert(targets.end(), untaped.begin(), untaped.end());
  // Each recorded output's gradient is kept by a hook the moment autograd produces it, so a
  // segmented weight pass may take it while this call is still inside the engine.
  output_grads_.assign(entries_.size(), at::Tensor());
  done_.assign(entries_.size(), false);
  pending_ = true;
  for (size_t i = 0; i < entries_.size(); ++i) {
    entries_[i].output.register_hook([this, i](const at::Tensor& g) {
      if (!done_[i]) output_grads_[i] = g;
    });
  }
  std::vector<at::Tensor> grads =
      torch::autograd::grad(outputs, targets, grad_outputs, /*retain_graph=*/false,
                            /*create_graph=*/false, /*allow_unused=*/true);
  const size_t n_leaves = leaves.size(), n_taped = entries_.size();
  for (size_t i = 0; i < n_taped; ++i) {  // an output whose hook did not run
    if (!done_[i] && !output_grads_[i].defined()) output_grads_[i] = grads[n_leaves + i];
  }
  {
    torch::NoGradGuard no_grad;
    for (size_t i = 0; i < untaped.size(); ++i) {
      at::Tensor& g = grads[n_leaves + n_taped + i];
      if (g.defined()) AccumulateGrad(untaped[i], std::move(g));
    }
  }
  grads.resize(n_leaves);
  return grads;
}

void WeightGradTape::AccumulateEntry(size_t i) {
  done_[i] = true;
  if (!output_grads_[i].defined()) return;
  const Entry& e = entries_[i];
  const at::Tensor g = output_grads_[i].reshape({-1, output_grads_[i].size(-1)});
  output_grads_[i] = at::Tensor();
  AccumulateGrad(e.weight, g.t().mm(e.input.reshape({-1, e.input.size(-1)})));
  if (e.bias.defined()) AccumulateGrad(e.bias, g.sum(0));
}

void WeightGradTape::AccumulateWeightGrads() {
  SLUICE_CHECK(pending_ && output_grads_.size() == entries_.size());
  torch::NoGradGuard no_grad;
  for (size_t i = 0; i < entries_.size(); ++i) {
    if (!done_[i]) AccumulateEntry(i);
  }
  output_grads_.clear();
  pending_ = false;
}

void WeightGradTape::AccumulateWeightGrads(int64_t segment) {
  SLUICE_CHECK(pending_ && output_grads_.size() == entries_.size());
  torch::NoGradGuard no_grad;
  bool all = true;
  for (size_t i = 0; i < entries_.size(); ++i) {
    if (!done_[i] && entries_[i].segment == segment) AccumulateEntry(i);
    all = all && done_[i];
  }
  if (all) {
    output_grads_.clear();
    pending_ = false;
  }
}

std::vector<at::Tensor> WeightGradTape::Untaped(const std::vector<at::Tensor>& params) const {
  std::vector<const c10::TensorImpl*> taped;
  for (const Entry& e : entries_) {
    taped.push_back(e.weight.unsafeGetTensorImpl());
    if (e.bias.defined()) taped.push_back(e.bias.unsafeGetTensorImpl());
  }
  std::sort(taped.begin(), taped.end());
  std::vector<at::Tensor> out;
  for (const at::Tensor& p : params) {
    if (!std::binary_search(taped.begin(), taped.end(), p.unsafeGetTensorImpl())) {
      out.push_back(p);
    }
  }
  return out;
}

}  // namespace sluice::runtime
