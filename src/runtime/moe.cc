#include "runtime/moe.h"

#include <fmt/core.h>
#include <fmt/format.h>

#include <algorithm>
#include <chrono>
#include <map>
#include <memory>
#include <stdexcept>
#include <vector>

#include "plan/execution_plan.h"
#include "plan/moe_segments.h"
#include "runtime/moe_internal.h"

namespace sluice::runtime {
namespace moe_internal {

int64_t Sum(const std::vector<int64_t>& v) {
  int64_t s = 0;
  for (const int64_t x : v) s += x;
  return s;
}

at::Tensor ApplyLinear(const Linear& l, const at::Tensor& x, WeightGradTape* tape) {
  at::Tensor y = at::linear(x, l.weight, l.bias);
  if (tape != nullptr) tape->Add({x, y, l.weight, l.bias});
  return y;
}

at::Tensor ExpertMlp(const ModelSpec& m, const Expert& e, const at::Tensor& x,
                     WeightGradTape* tape) {
  if (m.mlp == MlpKind::kSwiGlu) {
    return ApplyLinear(e.fc2, at::silu(ApplyLinear(e.gate, x, tape)) * ApplyLinear(e.fc1, x, tape),
                       tape);
  }
  return ApplyLinear(e.fc2, at::gelu(ApplyLinear(e.fc1, x, tape)), tape);
}

at::Tensor IndexTensor(const std::vector<int64_t>& v) { return torch::tensor(v, torch::kInt64); }

// Each local expert on its rows of `rows` [sum(recv), hidden]: member j's block is [local
// experts][C_j] with C_j = recv[j] / local. Returns the outputs in the same layout.
at::Tensor RunLocalExperts(const ModelSpec& model, const MoeMlp& moe, const at::Tensor& rows,
                           const std::vector<int64_t>& recv, WeightGradTape* tape) {
  const auto local = static_cast<int64_t>(moe.experts.size());
  std::vector<std::vector<at::Tensor>> pieces(recv.size());  // [member][local expert]
  std::vector<int64_t> offsets;
  int64_t offset = 0;
  for (const int64_t r : recv) {
    offsets.push_back(offset);
    offset += r;
  }
  for (int64_t l = 0; l < local; ++l) {
    std::vector<at::Tensor> in;
    std::vector<int64_t> sizes;
    for (size_t j = 0; j < recv.size(); ++j) {
      const int64_t cj = recv[j] / local;
      in.push_back(rows.narrow(0, offsets[j] + l * cj, cj));
      sizes.push_back(cj);
    }
    const at::Tensor out =
        ExpertMlp(model, moe.experts[l], in.size() == 1 ? in[0] : at::cat(in), tape);
    const auto parts = out.split_with_sizes(sizes, 0);
    for (size_t j = 0; j < recv.size(); ++j) pieces[j].push_back(parts[j]);
  }
  std::vector<at::Tensor> ordered;
  for (auto& member : pieces) ordered.insert(ordered.end(), member.begin(), member.end());
  return ordered.size() == 1 ? ordered[0] : at::cat(ordered);
}

// `threaded`: the per-expert slots already taken (by earlier token slices), updated; null: none.
Routing Route(const MoeMlp& moe, const at::Tensor& xf, const at::Tensor& real, int64_t experts,
              int64_t top_k, int64_t capacity, MoeDropPolicy policy,
              std::vector<int64_t>* threaded) {
  Routing out;
  const int64_t n = xf.size(0);
  out.probs = at::softmax(at::linear(xf, moe.router.weight), -1);  // [n, E]
  auto [top_p, top_e] = out.probs.topk(top_k, -1);                 // [n, k]
  out.top_p = top_p;
  // Slots: choice by choice, then by position; or token by token (kPosition). See moe.h. No
  // graph.
  std::vector<int64_t> token_of, slot_of;
  out.assigned.assign(static_cast<size_t>(experts), 0);
  std::vector<int64_t> used = threaded != nullptr ? *threaded : out.assigned;
  const at::Tensor r = real.reshape({n}).to(torch::kBool).contiguous();
  const at::Tensor e = top_e.contiguous();
  const bool* rp = r.data_ptr<bool>();
  const int64_t* ep = e.data_ptr<int64_t>();
  for (int64_t i = 0; i < n; ++i) out.real_tokens += rp[i] ? 1 : 0;
  auto assign = [&](int64_t i, int64_t c) {
    if (!rp[i]) return;
    const int64_t ex = ep[i * top_k + c];
    ++out.assigned[ex];
    ++out.assignments;
    if (used[ex] >= capacity) {
      ++out.dropped;
      return;
    }
    token_of.push_back(i);
    slot_of.push_back(ex * capacity + used[ex]++);
    out.gate_of.push_back(i * top_k + c);
  };
  if (policy == MoeDropPolicy::kPosition) {
    for (int64_t i = 0; i < n; ++i) {
      for (int64_t c = 0; c < top_k; ++c) assign(i, c);
    }
  } else {
    for (int64_t c = 0; c < top_k; ++c) {
      for (int64_t i = 0; i < n; ++i) assign(i, c);
    }
  }
  out.tokens = IndexTensor(token_of);
  out.slots = IndexTensor(slot_of);
  if (threaded != nullptr) *threaded = used;
  return out;
}

// The kept tokens into the capacity buffer [rows, hidden] (empty slots zero).
at::Tensor Dispatch(const at::Tensor& xf, const Routing& r, int64_t rows) {
  return torch::zeros({rows, xf.size(1)}).index_add(0, r.slots, xf.index_select(0, r.tokens));
}

// Each kept assignment's expert output times its router probability, summed per token: [n,
// hidden].
at::Tensor Combine(const at::Tensor& expert_out, const at::Tensor& top_p, const Routing& r,
                   int64_t n) {
  const int64_t top_k = top_p.size(1);
  const at::Tensor gates = top_p.reshape({n * top_k}).index_select(0, IndexTensor(r.gate_of));
  return torch::zeros({n, expert_out.size(1)})
      .index_add(0, r.tokens, expert_out.index_select(0, r.slots) * gates.unsqueeze(1));
}

at::Tensor RunExpertsOnRowGroups(const ModelSpec& model, const MoeMlp& moe, const at::Tensor& x,
                                 const std::vector<std::vector<int64_t>>& rows_of,
                                 WeightGradTape* tape) {
  std::vector<int64_t> order;
  std::vector<at::Tensor> outs;
  for (size_t l = 0; l < rows_of.size(); ++l) {
    const std::vector<int64_t>& idx = rows_of[l];
    if (idx.empty()) continue;
    outs.push_back(ExpertMlp(model, moe.experts[l], x.index_select(0, IndexTensor(idx)), tape));
    order.insert(order.end(), idx.begin(), idx.end());
  }
  if (outs.empty()) return torch::zeros_like(x);
  return torch::zeros_like(x).index_copy(0, IndexTensor(order), at::cat(outs));
}

}  // namespace moe_internal

namespace {

using namespace moe_internal;  // NOLINT(google-build-using-namespace)

using torch::autograd::AutogradContext;
using torch::autograd::variable_list;


// One all-to-all of expert parallelism whose backward is the reverse all-to-all (swapped
// splits) of the same plan instruction kind and layer.
struct AllToAllFunction : torch::autograd::Function<AllToAllFunction> {
  static at::Tensor forward(AutogradContext* ctx, const at::Tensor& rows, int64_t exchange,
                            int64_t kind, int64_t layer, std::vector<int64_t> send,
                            std::vector<int64_t> recv) {
    ctx->saved_data["exchange"] = exchange;
    ctx->saved_data["kind"] = kind;
    ctx->saved_data["layer"] = layer;
    ctx->saved_data["send"] = send;
    ctx->saved_data["recv"] = recv;
    ctx->saved_data["hidden"] = rows.size(1);
    auto* ex = reinterpret_cast<ExpertExchange*>(exchange);
    return ex->Exchange(static_cast<OpKind>(kind), layer, rows.contiguous(), send, recv);
  }
  static variable_list backward(AutogradContext* ctx, variable_list grads) {
    auto* ex = reinterpret_cast<ExpertExchange*>(ctx->saved_data["exchange"].toInt());
    const auto kind = static_cast<OpKind>(ctx->saved_data["kind"].toInt());
    const int64_t layer = ctx->saved_data["layer"].toInt();
    const std::vector<int64_t> send = ctx->saved_data["send"].toIntVector();
    const std::vector<int64_t> recv = ctx->saved_data["recv"].toIntVector();
    // Every member must take part, also when no gradient reached this output.
    const at::Tensor g = grads[0].defined()
                             ? grads[0].contiguous()
                             : torch::zeros({Sum(recv), ctx->saved_data["hidden"].toInt()});
    // The plan names the backward's all-to-alls by the forward's kind, with swapped splits.
    at::Tensor out = ex->Exchange(kind, layer, g, recv, send);
    return {out, at::Tensor(), at::Tensor(), at::Tensor(), at::Tensor(), at::Tensor()};
  }
};

at::Tensor AllToAll(ExpertExchange* ex, OpKind kind, int64_t layer, const at::Tensor& rows,
                    const std::vector<int64_t>& send, const std::vector<int64_t>& recv) {
  return AllToAllFunction::apply(rows, reinterpret_cast<int64_t>(ex), static_cast<int64_t>(kind),
                                 layer, send, recv);
}


// Slices (plan/moe_segments.h): slice c of n of a split x is SplitPart(x, c, n) rows from
// SliceStart(x, c, n) of that member's block.
int64_t SliceStart(int64_t x, int64_t c, int64_t n) { return c * (x / n) + std::min(c, x % n); }

std::vector<int64_t> SliceSplits(const std::vector<int64_t>& splits, int64_t c, int64_t n) {
  std::vector<int64_t> out;
  for (const int64_t x : splits) out.push_back(SplitPart(x, c, n));
  return out;
}

// Slice c of `rows` [sum(splits), hidden] laid out in member blocks: each block's slice, in
// member order.
at::Tensor GatherSlice(const at::Tensor& rows, const std::vector<int64_t>& splits, int64_t c,
                       int64_t n) {
  std::vector<at::Tensor> parts;
  int64_t offset = 0;
  for (const int64_t x : splits) {
    parts.push_back(rows.narrow(0, offset + SliceStart(x, c, n), SplitPart(x, c, n)));
    offset += x;
  }
  return at::cat(parts).contiguous();
}

// The inverse: the n slices back into member blocks [sum(splits), hidden].
at::Tensor ScatterSlices(const std::vector<at::Tensor>& slices, const std::vector<int64_t>& splits,
                         int64_t n) {
  std::vector<at::Tensor> parts;
  for (size_t j = 0; j < splits.size(); ++j) {
    for (int64_t c = 0; c < n; ++c) {
      int64_t offset = 0;
      for (size_t i = 0; i < j; ++i) offset += SplitPart(splits[i], c, n);
      parts.push_back(slices[static_cast<size_t>(c)].narrow(0, offset, SplitPart(splits[j], c, n)));
    }
  }
  return at::cat(parts);
}

// The local experts on slice c of the received rows (`x`: [sum(SliceSplits(recv, c, n)),
// hidden]): each row's expert is its position in its member's whole block over C_j.
at::Tensor RunExpertsOnSlice(const ModelSpec& model, const MoeMlp& moe, const at::Tensor& x,
                             const std::vector<int64_t>& recv, int64_t c, int64_t n) {
  const auto local = static_cast<int64_t>(moe.experts.size());
  std::vector<std::vector<int64_t>> rows_of(static_cast<size_t>(local));
  int64_t position = 0;
  for (const int64_t x_j : recv) {
    const int64_t cj = x_j / local, start = SliceStart(x_j, c, n);
    for (int64_t i = 0; i < SplitPart(x_j, c, n); ++i) {
      rows_of[static_cast<size_t>((start + i) / cj)].push_back(position++);
    }
  }
  return RunExpertsOnRowGroups(model, moe, x, rows_of, nullptr);
}

// Tutel's capacity slices: dispatch, the local experts and combine cut into n slices, slice c's
// all-to-all posted before slice c-1's experts run (the plan's order: every dispatch slice
// posted at once, then per slice: wait, experts, post its combine). One autograd node: its
// backward runs the reverse (every combine gradient posted at once, then per slice: wait, the
// experts' backward of that slice, post its dispatch gradient) in the order the plan lists for
// the backward, which autograd's own order over per-slice nodes would not give. Input: the
// dispatch buffer [sum(send), hidden]; output: what combine returned, same layout.
struct SlicedExpertsFunction : torch::autograd::Function<SlicedExpertsFunction> {
  static at::Tensor forward(AutogradContext* ctx, const at::Tensor& dispatch, int64_t exchange,
                            int64_t model, int64_t moe, int64_t slices, std::vector<int64_t> send,
                            std::vector<int64_t> recv, bool grad) {
    auto* ex = reinterpret_cast<ExpertExchange*>(exchange);
    const auto& m = *reinterpret_cast<const ModelSpec*>(model);
    const auto& mlp = *reinterpret_cast<const MoeMlp*>(moe);
    const int64_t n = slices;
    const at::Tensor rows = dispatch.contiguous();
    std::vector<int64_t> posted;
    for (int64_t c = 0; c < n; ++c) {
      posted.push_back(ex->Post(OpKind::kAllToAllDispatch, mlp.layer, c,
                                GatherSlice(rows, send, c, n), SliceSplits(send, c, n),
                                SliceSplits(recv, c, n)));
    }
    std::vector<at::Tensor> xs, ys;
    std::vector<int64_t> back;
    for (int64_t c = 0; c < n; ++c) {
      const at::Tensor r = ex->Wait({posted[static_cast<size_t>(c)]}).front();
      const at::Tensor x = grad ? r.detach().requires_grad_(true) : r;
      at::Tensor y;
      {
        const at::AutoGradMode mode(grad);
        y = RunExpertsOnSlice(m, mlp, x, recv, c, n);
      }
      back.push_back(ex->Post(OpKind::kAllToAllCombine, mlp.layer, c, y.detach().contiguous(),
                              SliceSplits(recv, c, n), SliceSplits(send, c, n)));
      if (grad) {
        xs.push_back(x);
        ys.push_back(y);
      }
    }
    const at::Tensor out = ScatterSlices(ex->Wait(back), send, n);
    ctx->saved_data["exchange"] = exchange;
    ctx->saved_data["layer"] = mlp.layer;
    ctx->saved_data["slices"] = n;
    ctx->saved_data["send"] = send;
    ctx->saved_data["recv"] = recv;
    ctx->saved_data["x"] = xs;
    ctx->saved_data["y"] = ys;
    return out;
  }

  static variable_list backward(AutogradContext* ctx, variable_list grads) {
    auto* ex = reinterpret_cast<ExpertExchange*>(ctx->saved_data["exchange"].toInt());
    const int64_t layer = ctx->saved_data["layer"].toInt();
    const int64_t n = ctx->saved_data["slices"].toInt();
    const std::vector<int64_t> send = ctx->saved_data["send"].toIntVector();
    const std::vector<int64_t> recv = ctx->saved_data["recv"].toIntVector();
    const std::vector<at::Tensor> xs = ctx->saved_data["x"].toTensorVector();
    const std::vector<at::Tensor> ys = ctx->saved_data["y"].toTensorVector();
    SLUICE_CHECK(static_cast<int64_t>(xs.size()) == n && static_cast<int64_t>(ys.size()) == n);
    // Every member must take part, also when no gradient reached the output.
    const at::Tensor g =
        grads[0].defined() ? grads[0].contiguous() : torch::zeros({Sum(send), xs.front().size(1)});
    std::vector<int64_t> posted;
    for (int64_t c = 0; c < n; ++c) {
      posted.push_back(ex->Post(OpKind::kAllToAllCombine, layer, c, GatherSlice(g, send, c, n),
                                SliceSplits(send, c, n), SliceSplits(recv, c, n)));
    }
    std::vector<int64_t> back;
    for (int64_t c = 0; c < n; ++c) {
      const auto k = static_cast<size_t>(c);
      const at::Tensor gy = ex->Wait({posted[k]}).front();
      if (ys[k].requires_grad()) torch::autograd::backward({ys[k]}, {gy});
      const at::Tensor gx = xs[k].grad().defined() ? xs[k].grad() : torch::zeros_like(xs[k]);
      back.push_back(ex->Post(OpKind::kAllToAllDispatch, layer, c, gx.contiguous(),
                              SliceSplits(recv, c, n), SliceSplits(send, c, n)));
    }
    at::Tensor out = ScatterSlices(ex->Wait(back), send, n);
    return {out,          at::Tensor(), at::Tensor(), at::Tensor(),
            at::Tensor(), at::Tensor(), at::Tensor(), at::Tensor()};
  }
};


// ep 1: every all-to-all hands back what it was given (the profile's sliced experts run the
// training code path without the transfers).
class LoopbackExchange final : public ExpertExchange {
 public:
  LoopbackExchange(int64_t slices, std::vector<int64_t> splits)
      : slices_(slices), splits_(std::move(splits)) {}
  std::vector<int64_t> NextRecvSplits(OpKind, int64_t) override { return splits_; }
  int64_t NextSlices(OpKind, int64_t) override { return slices_; }
  at::Tensor Exchange(OpKind, int64_t, const at::Tensor& rows, const std::vector<int64_t>&,
                      const std::vector<int64_t>&) override {
    return rows;
  }
  int64_t Post(OpKind, int64_t, int64_t, const at::Tensor& rows, const std::vector<int64_t>&,
               const std::vector<int64_t>&) override {
    posted_.push_back(rows);
    return static_cast<int64_t>(posted_.size()) - 1;
  }
  int64_t PostTokenSlice(OpKind kind, int64_t layer, int64_t slice, const at::Tensor& rows,
                         const at::Tensor& send_counts, const at::Tensor&) override {
    counts_[static_cast<int64_t>(posted_.size())] = send_counts;
    return Post(kind, layer, slice, rows, {}, {});
  }
  at::Tensor ReceivedCounts(int64_t ticket) override { return counts_.at(ticket); }
  std::vector<at::Tensor> Wait(const std::vector<int64_t>& tickets) override {
    std::vector<at::Tensor> out;
    for (const int64_t t : tickets) out.push_back(posted_[static_cast<size_t>(t)]);
    return out;
  }

 private:
  int64_t slices_;
  std::vector<int64_t> splits_;
  std::vector<at::Tensor> posted_;
  std::map<int64_t, at::Tensor> counts_;
};

}  // namespace

at::Tensor MoeForward(const ModelSpec& model, const MoeMlp& moe, const ExpertShard& shard,
                      const at::Tensor& x, const at::Tensor& real, double loss_scale,
                      WeightGradTape* tape, MoeContext* ctx) {
  SLUICE_CHECK(ctx != nullptr && model.moe.has_value());
  SLUICE_CHECK(shard.ep == 1 || ctx->exchange != nullptr);
  if (ctx->partition != nullptr) {
    return PartitionedMoeForward(model, moe, shard, x, real, tape, ctx);
  }
  const int64_t experts = model.moe->experts, top_k = model.moe->top_k;
  const int64_t b = x.size(0), t = x.size(1), hidden = x.size(2), n = b * t;
  const bool decoder = model.is_encoder_decoder() && moe.layer >= model.layers;
  LayerShape shape;
  shape.mbs = b;
  (decoder ? shape.dec_seqlen : shape.seqlen) = t;
  const int64_t capacity = ExpertCapacity(model, shape, moe.layer);

  const at::Tensor xf = x.reshape({n, hidden});
  const Routing routing =
      Route(moe, xf, real, experts, top_k, capacity, model.moe->drop_policy);
  ctx->assignments += routing.assignments;
  ctx->dropped += routing.dropped;
  const at::Tensor dispatch = Dispatch(xf, routing, experts * capacity);
  // The rows this rank's experts work on: its own buffer (ep = 1), or what every member sent;
  // expert_out: what the experts made of this rank's slots, in the dispatch buffer's layout.
  const int64_t local = experts / shard.ep;
  SLUICE_CHECK(static_cast<int64_t>(moe.experts.size()) == local);
  std::vector<int64_t> send(static_cast<size_t>(shard.ep), local * capacity), recv;
  at::Tensor expert_out;
  if (shard.ep == 1) {
    expert_out = RunLocalExperts(model, moe, dispatch, send, tape);
  } else {
    recv = ctx->exchange->NextRecvSplits(OpKind::kAllToAllDispatch, moe.layer);
    if (static_cast<int64_t>(recv.size()) != shard.ep) {
      throw std::runtime_error(
          fmt::format("MoE layer {}: the plan's dispatch has {} members, the "
                      "model's expert group {}",
                      moe.layer, recv.size(), shard.ep));
    }
    for (const int64_t r : recv) {
      if (r % local != 0) {
        throw std::runtime_error(fmt::format(
            "MoE layer {}: the plan's dispatch receives {} rows from a member, not a multiple of "
            "the {} local experts",
            moe.layer, r, local));
      }
    }
    const int64_t slices = ctx->exchange->NextSlices(OpKind::kAllToAllDispatch, moe.layer);
    if (slices > 0) {
      if (tape != nullptr) {
        throw std::runtime_error(fmt::format(
            "MoE layer {}: the plan cuts its all-to-alls into slices in an op whose backward is "
            "split (input and weight gradients): sliced experts run in whole backward ops only",
            moe.layer));
      }
      if (at::GradMode::is_enabled() && !dispatch.requires_grad()) {
        // The experts' weights reach autograd only through this node, which exists only when
        // its input needs a gradient.
        throw std::runtime_error(fmt::format(
            "MoE layer {}: sliced experts need their input to require a gradient", moe.layer));
      }
      expert_out = SlicedExpertsFunction::apply(
          dispatch, reinterpret_cast<int64_t>(ctx->exchange), reinterpret_cast<int64_t>(&model),
          reinterpret_cast<int64_t>(&moe), slices, send, recv, at::GradMode::is_enabled());
    } else {
      const at::Tensor rows =
          AllToAll(ctx->exchange, OpKind::kAllToAllDispatch, moe.layer, dispatch, send, recv);
      const at::Tensor out = RunLocalExperts(model, moe, rows, recv, tape);
      const std::vector<int64_t> back =
          ctx->exchange->NextRecvSplits(OpKind::kAllToAllCombine, moe.layer);
      if (back != send) {
        throw std::runtime_error(fmt::format(
            "MoE layer {}: the plan's combine receives [{}] rows, the layer's capacity {} x {} "
            "local experts",
            moe.layer, fmt::join(back, ", "), capacity, local));
      }
      expert_out = AllToAll(ctx->exchange, OpKind::kAllToAllCombine, moe.layer, out, recv, send);
    }
  }
  const at::Tensor y = Combine(expert_out, routing.top_p, routing, n);

  if (routing.real_tokens > 0) {
    const at::Tensor mask = real.reshape({n, 1}).to(torch::kFloat32);
    const double nr = static_cast<double>(routing.real_tokens);
    const at::Tensor mean_p = (routing.probs * mask).sum(0) / nr;  // P_i
    std::vector<float> f;
    for (const int64_t a : routing.assigned) {
      f.push_back(static_cast<float>(static_cast<double>(a) / (nr * static_cast<double>(top_k))));
    }
    const at::Tensor aux = (mean_p * torch::tensor(f)).sum() *
                           (kMoeAuxLossCoef * static_cast<double>(experts) * nr * loss_scale);
    ctx->aux_loss = ctx->aux_loss.defined() ? ctx->aux_loss + aux : aux;
  }
  return y.reshape({b, t, hidden});
}

MoePartTimes TimeMoeParts(const ModelSpec& model, const MoeMlp& moe, const at::Tensor& x,
                          int64_t slices, at::Generator& gen) {
  using Clock = std::chrono::steady_clock;
  SLUICE_CHECK(model.moe.has_value() && slices >= 2);
  const int64_t experts = model.moe->experts, top_k = model.moe->top_k;
  SLUICE_CHECK(static_cast<int64_t>(moe.experts.size()) == experts);
  const int64_t b = x.size(0), t = x.size(1), hidden = x.size(2), n = b * t;
  LayerShape shape;
  shape.mbs = b;
  shape.seqlen = t;
  const int64_t capacity = ExpertCapacity(model, shape, moe.layer);
  const int64_t rows = experts * capacity;
  const at::Tensor real = torch::ones({b, t}, torch::kBool);
  const at::Tensor xf = x.reshape({n, hidden}).detach();
  auto leaf = [](const at::Tensor& v) { return v.detach().clone().requires_grad_(true); };
  auto grad_like = [&](at::IntArrayRef sizes) {
    return torch::randn(sizes, gen, torch::kFloat32) * 1e-3;
  };
  auto since = [](Clock::time_point a, Clock::time_point b) {
    return Duration::Nanos(std::chrono::duration_cast<std::chrono::nanoseconds>(b - a).count());
  };
  MoePartTimes out;
  auto record = [&](MoePart part, Clock::time_point t0, Clock::time_point t1,
                    Clock::time_point t2) {
    out.forward[static_cast<size_t>(part)] = since(t0, t1);
    out.backward[static_cast<size_t>(part)] = since(t1, t2);
  };

  // Route: the router's gradient comes from the gates (combine) and the load-balancing loss.
  const at::Tensor g_probs = grad_like({n, experts}), g_top = grad_like({n, top_k});
  const at::Tensor xr = leaf(xf);
  Clock::time_point t0 = Clock::now();
  const Routing routing =
      Route(moe, xr, real, experts, top_k, capacity, model.moe->drop_policy);
  Clock::time_point t1 = Clock::now();
  torch::autograd::backward({routing.probs, routing.top_p}, {g_probs, g_top});
  record(MoePart::kRoute, t0, t1, Clock::now());

  const at::Tensor g_rows = grad_like({rows, hidden});
  const at::Tensor xd = leaf(xf);
  t0 = Clock::now();
  const at::Tensor buffer = Dispatch(xd, routing, rows);
  t1 = Clock::now();
  torch::autograd::backward({buffer}, {g_rows});
  record(MoePart::kDispatch, t0, t1, Clock::now());

  const std::vector<int64_t> splits = {rows};
  const at::Tensor xe = leaf(buffer);
  t0 = Clock::now();
  const at::Tensor expert_out = RunLocalExperts(model, moe, xe, splits, nullptr);
  t1 = Clock::now();
  torch::autograd::backward({expert_out}, {g_rows});
  record(MoePart::kExperts, t0, t1, Clock::now());

  const at::Tensor g_y = grad_like({n, hidden});
  const at::Tensor xc = leaf(expert_out), pc = leaf(routing.top_p);
  t0 = Clock::now();
  const at::Tensor y = Combine(xc, pc, routing, n);
  t1 = Clock::now();
  torch::autograd::backward({y}, {g_y});
  record(MoePart::kCombine, t0, t1, Clock::now());

  LoopbackExchange loopback(slices, splits);
  const at::Tensor xs = leaf(buffer);
  t0 = Clock::now();
  const at::Tensor sliced = SlicedExpertsFunction::apply(
      xs, reinterpret_cast<int64_t>(static_cast<ExpertExchange*>(&loopback)),
      reinterpret_cast<int64_t>(&model), reinterpret_cast<int64_t>(&moe), slices, splits, splits,
      true);
  t1 = Clock::now();
  torch::autograd::backward({sliced}, {g_rows});
  record(MoePart::kExpertsSliced, t0, t1, Clock::now());
  return out;
}

}  // namespace sluice::runtime
