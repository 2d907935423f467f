#include "runtime/moe.h"

#include <fmt/core.h>
#include <fmt/format.h>

#include <stdexcept>
#include <vector>

#include "plan/execution_plan.h"

namespace sluice::runtime {
namespace {

using torch::autograd::AutogradContext;
using torch::autograd::variable_list;

int64_t Sum(const std::vector<int64_t>& v) {
  int64_t s = 0;
  for (const int64_t x : v) s += x;
  return s;
}

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

}  // namespace

at::Tensor MoeForward(const ModelSpec& model, const MoeMlp& moe, const ExpertShard& shard,
                      const at::Tensor& x, const at::Tensor& real, double loss_scale,
                      WeightGradTape* tape, MoeContext* ctx) {
  SLUICE_CHECK(ctx != nullptr && model.moe.has_value());
  SLUICE_CHECK(shard.ep == 1 || ctx->exchange != nullptr);
  const int64_t experts = model.moe->experts, top_k = model.moe->top_k;
  const int64_t b = x.size(0), t = x.size(1), hidden = x.size(2), n = b * t;
  const bool decoder = model.is_encoder_decoder() && moe.layer >= model.layers;
  LayerShape shape;
  shape.mbs = b;
  (decoder ? shape.dec_seqlen : shape.seqlen) = t;
  const int64_t capacity = ExpertCapacity(model, shape, moe.layer);

  const at::Tensor xf = x.reshape({n, hidden});
  const at::Tensor probs = at::softmax(at::linear(xf, moe.router.weight), -1);  // [n, E]
  const auto [top_p, top_e] = probs.topk(top_k, -1);                            // [n, k]

  // Slots: choice by choice, then by position (see moe.h). No graph.
  std::vector<int64_t> token_of, slot_of, gate_of;  // per kept assignment
  std::vector<int64_t> assigned(static_cast<size_t>(experts), 0), used(assigned);
  int64_t real_tokens = 0;
  {
    const at::Tensor r = real.reshape({n}).to(torch::kBool).contiguous();
    const at::Tensor e = top_e.contiguous();
    const bool* rp = r.data_ptr<bool>();
    const int64_t* ep = e.data_ptr<int64_t>();
    for (int64_t i = 0; i < n; ++i) real_tokens += rp[i] ? 1 : 0;
    for (int64_t c = 0; c < top_k; ++c) {
      for (int64_t i = 0; i < n; ++i) {
        if (!rp[i]) continue;
        const int64_t ex = ep[i * top_k + c];
        ++assigned[ex];
        ++ctx->assignments;
        if (used[ex] >= capacity) {
          ++ctx->dropped;
          continue;
        }
        token_of.push_back(i);
        slot_of.push_back(ex * capacity + used[ex]++);
        gate_of.push_back(i * top_k + c);
      }
    }
  }
  const at::Tensor tokens = IndexTensor(token_of), slots = IndexTensor(slot_of);
  const at::Tensor dispatch =
      torch::zeros({experts * capacity, hidden}).index_add(0, slots, xf.index_select(0, tokens));

  // The rows this rank's experts work on: its own buffer (ep = 1), or what every member sent.
  const int64_t local = experts / shard.ep;
  std::vector<int64_t> send(static_cast<size_t>(shard.ep), local * capacity), recv;
  at::Tensor rows;
  if (shard.ep == 1) {
    recv = send;
    rows = dispatch;
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
    rows = AllToAll(ctx->exchange, OpKind::kAllToAllDispatch, moe.layer, dispatch, send, recv);
  }
  // Member j's rows are [local experts][C_j]; each expert runs on its slots of every member.
  std::vector<std::vector<at::Tensor>> pieces(recv.size());  // [member][local expert]
  std::vector<int64_t> offsets;
  int64_t offset = 0;
  for (const int64_t r : recv) {
    offsets.push_back(offset);
    offset += r;
  }
  SLUICE_CHECK(static_cast<int64_t>(moe.experts.size()) == local);
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
  at::Tensor expert_out = ordered.size() == 1 ? ordered[0] : at::cat(ordered);
  if (shard.ep > 1) {
    const std::vector<int64_t> back =
        ctx->exchange->NextRecvSplits(OpKind::kAllToAllCombine, moe.layer);
    if (back != send) {
      throw std::runtime_error(fmt::format(
          "MoE layer {}: the plan's combine receives [{}] rows, the layer's capacity {} x {} "
          "local experts",
          moe.layer, fmt::join(back, ", "), capacity, local));
    }
    expert_out =
        AllToAll(ctx->exchange, OpKind::kAllToAllCombine, moe.layer, expert_out, recv, send);
  }
  // Combine: each kept assignment's expert output times its router probability.
  const at::Tensor gates = top_p.reshape({n * top_k}).index_select(0, IndexTensor(gate_of));
  const at::Tensor y =
      torch::zeros({n, hidden})
          .index_add(0, tokens, expert_out.index_select(0, slots) * gates.unsqueeze(1));

  if (real_tokens > 0) {
    const at::Tensor mask = real.reshape({n, 1}).to(torch::kFloat32);
    const double nr = static_cast<double>(real_tokens);
    const at::Tensor mean_p = (probs * mask).sum(0) / nr;  // P_i
    std::vector<float> f;
    for (const int64_t a : assigned) {
      f.push_back(static_cast<float>(static_cast<double>(a) / (nr * static_cast<double>(top_k))));
    }
    const at::Tensor aux = (mean_p * torch::tensor(f)).sum() *
                           (kMoeAuxLossCoef * static_cast<double>(experts) * nr * loss_scale);
    ctx->aux_loss = ctx->aux_loss.defined() ? ctx->aux_loss + aux : aux;
  }
  return y.reshape({b, t, hidden});
}

}  // namespace sluice::runtime
