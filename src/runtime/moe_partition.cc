// Token slices of a partitioned forward (moe.h, MoePartition): the slices' shared state per MoE
// layer, the all-to-all nodes whose backward is the whole layer's, and one slice's MoE layer.
#include "runtime/moe.h"

#include <fmt/core.h>
#include <fmt/format.h>
#include <torch/csrc/autograd/functions/utils.h>

#include <algorithm>
#include <map>
#include <memory>
#include <stdexcept>
#include <string>
#include <vector>

#include "plan/execution_plan.h"
#include "runtime/moe_internal.h"

namespace sluice::runtime {
namespace {

using namespace moe_internal;  // NOLINT(google-build-using-namespace)
using torch::autograd::variable_list;

// One all-to-all of an MoE layer over every token slice of a partitioned forward: slice k's rows
// sent are the node's k-th edge, what slice k received its k-th output. Its backward is the
// whole layer's all-to-all of the plan's backward op (the forward's kind, splits swapped, as
// AllToAllFunction's): the output gradients placed at their rows of the whole layout
// `back_send` (zero elsewhere: empty capacity slots), exchanged, and each input's gradient taken
// from its rows of the result.
struct TokenSliceExchangeNode : torch::autograd::Node {
  ExpertExchange* exchange = nullptr;
  OpKind kind = OpKind::kAllToAllDispatch;
  int64_t layer = 0, hidden = 0;
  std::vector<int64_t> back_send, back_recv;
  std::vector<at::Tensor> out_rows;  // per output: its rows of the back_send layout
  std::vector<at::Tensor> in_rows;   // per input: its rows of the back_recv layout

  // Its inputs arrive slice by slice, after its first outputs have parents, so its topological
  // number (which must exceed its children's, and which autograd may no longer update then) is
  // set above any graph's depth from the start; edges are added without updating it.
  TokenSliceExchangeNode() { topological_nr_ = uint64_t{1} << 40; }
  void AddInput(torch::autograd::Edge edge) { next_edges_.push_back(std::move(edge)); }

  variable_list apply(variable_list&& grads) override {
    at::Tensor g = torch::zeros({Sum(back_send), hidden});
    for (size_t k = 0; k < grads.size() && k < out_rows.size(); ++k) {
      if (grads[k].defined()) g.index_copy_(0, out_rows[k], grads[k]);
    }
    const at::Tensor r = exchange->Exchange(kind, layer, g, back_send, back_recv);
    variable_list out;
    for (const at::Tensor& rows : in_rows) out.push_back(r.index_select(0, rows));
    return out;
  }
  std::string name() const override { return "MoeTokenSliceAllToAll"; }
};

std::shared_ptr<TokenSliceExchangeNode> MakeNode(ExpertExchange* ex, OpKind kind, int64_t layer,
                                                 int64_t hidden, std::vector<int64_t> back_send,
                                                 std::vector<int64_t> back_recv) {
  std::shared_ptr<TokenSliceExchangeNode> node(new TokenSliceExchangeNode(),
                                               torch::autograd::deleteNode);
  node->exchange = ex;
  node->kind = kind;
  node->layer = layer;
  node->hidden = hidden;
  node->back_send = std::move(back_send);
  node->back_recv = std::move(back_recv);
  return node;
}

// `input` (rows `in_rows` of the node's back_recv layout) was sent and `output` (computed
// without a graph; rows `out_rows` of back_send) received: output becomes the node's next output.
void Attach(const std::shared_ptr<TokenSliceExchangeNode>& node, const at::Tensor& input,
            at::Tensor& output, at::Tensor in_rows, at::Tensor out_rows) {
  node->AddInput(torch::autograd::impl::gradient_edge(input));
  node->in_rows.push_back(std::move(in_rows));
  node->out_rows.push_back(std::move(out_rows));
  torch::autograd::set_history(output, node);
}

at::Tensor Range(int64_t n) { return torch::arange(n, torch::kInt64); }

// The local experts on a token slice's received rows `rows`, laid out by member, then local
// expert (`counts` [ep, local] rows each). Returns the outputs in the same layout.
at::Tensor RunExpertsOnRows(const ModelSpec& model, const MoeMlp& moe, const at::Tensor& rows,
                            const at::Tensor& counts, WeightGradTape* tape) {
  const int64_t members = counts.size(0), local = counts.size(1);
  const auto cnt = counts.accessor<int64_t, 2>();
  std::vector<std::vector<int64_t>> rows_of(static_cast<size_t>(local));
  int64_t position = 0;
  for (int64_t j = 0; j < members; ++j) {
    for (int64_t l = 0; l < local; ++l) {
      for (int64_t i = 0; i < cnt[j][l]; ++i) rows_of[static_cast<size_t>(l)].push_back(position++);
    }
  }
  return RunExpertsOnRowGroups(model, moe, rows, rows_of, tape);
}

// One MoE layer's state over the token slices of a partitioned forward.
struct PartitionLayer {
  bool started = false;
  int64_t capacity = 0, next_slice = 0;
  std::vector<int64_t> send, recv;             // the whole layer's splits
  std::vector<int64_t> used, assigned;         // per expert: slots taken so far, assignments
  int64_t real = 0;                            // real tokens routed
  at::Tensor prob_sum;                         // [E] the router's probabilities summed (graph)
  std::vector<std::vector<int64_t>> received;  // [member][local expert] token-slice rows so far
  std::vector<at::Tensor> parts, part_rows;    // what goes into a whole all-to-all, and where
  int64_t dispatch_ticket = -1, combine_ticket = -1;
  at::Tensor whole_in;                         // the whole all-to-all's input (graph)
  at::Tensor expert_out;                       // the whole combine's result, for every slice
  bool experts_done = false;
  std::shared_ptr<TokenSliceExchangeNode> dispatch_node, combine_node;
};

}  // namespace

struct MoePartition::Impl {
  int64_t slices = 0, rows = 0;
  std::map<int64_t, PartitionLayer> layers;  // [MoE layer id]
  std::vector<int64_t> segment;              // [slice] the forward segment it runs
  int64_t assignments = 0, dropped = 0;
};

MoePartition::MoePartition(int64_t slices, int64_t rows) : impl_(std::make_unique<Impl>()) {
  impl_->slices = slices;
  impl_->rows = rows;
  impl_->segment.assign(static_cast<size_t>(std::max<int64_t>(slices, 0)), 0);
}
MoePartition::~MoePartition() = default;
int64_t MoePartition::slices() const { return impl_->slices; }
int64_t MoePartition::rows() const { return impl_->rows; }
int64_t MoePartition::assignments() const { return impl_->assignments; }
int64_t MoePartition::dropped() const { return impl_->dropped; }

at::Tensor MoePartition::AuxLoss(const ModelSpec& model, double loss_scale) const {
  SLUICE_CHECK(model.moe.has_value());
  at::Tensor total;
  for (const auto& [layer, L] : impl_->layers) {
    if (L.real == 0 || !L.prob_sum.defined()) continue;
    const double nr = static_cast<double>(L.real);
    std::vector<float> f;
    for (const int64_t a : L.assigned) {
      f.push_back(static_cast<float>(static_cast<double>(a) /
                                     (nr * static_cast<double>(model.moe->top_k))));
    }
    const at::Tensor aux = (L.prob_sum / nr * torch::tensor(f)).sum() *
                           (kMoeAuxLossCoef * static_cast<double>(model.moe->experts) * nr *
                            loss_scale);
    total = total.defined() ? total + aux : aux;
  }
  return total;
}

namespace moe_internal {

// MoeForward for one token slice (moe.h, MoePartition): the rows of slice ctx->slice; stops
// (ctx->park) at each of the layer's all-to-all boundaries, where the executor runs the plan's
// next piece of this slice.
at::Tensor PartitionedMoeForward(const ModelSpec& model, const MoeMlp& moe,
                                 const ExpertShard& shard, const at::Tensor& x,
                                 const at::Tensor& real, WeightGradTape* tape, MoeContext* ctx) {
  MoePartition::Impl& P = ctx->partition->impl();
  ExpertExchange* ex = ctx->exchange;
  const int64_t c = ctx->slice, n = P.slices, layer = moe.layer;
  if (shard.ep <= 1 || ex == nullptr || !ctx->park || c < 0 || c >= n) {
    throw std::runtime_error(fmt::format(
        "MoE layer {}: token slices run with expert parallelism in a segmented op", layer));
  }
  const bool grad = at::GradMode::is_enabled();
  const int64_t experts = model.moe->experts, top_k = model.moe->top_k;
  const int64_t b = x.size(0), t = x.size(1), hidden = x.size(2), ntok = b * t;
  const int64_t local = experts / shard.ep;
  SLUICE_CHECK(static_cast<int64_t>(moe.experts.size()) == local);
  PartitionLayer& L = P.layers[layer];
  if (!L.started) {
    L.started = true;
    const bool decoder = model.is_encoder_decoder() && layer >= model.layers;
    LayerShape shape;  // the whole micro-batch's: capacity is the unpartitioned layer's
    shape.mbs = P.rows;
    (decoder ? shape.dec_seqlen : shape.seqlen) = t;
    L.capacity = ExpertCapacity(model, shape, layer);
    L.send.assign(static_cast<size_t>(shard.ep), local * L.capacity);
    L.recv = ex->NextRecvSplits(OpKind::kAllToAllDispatch, layer);
    if (static_cast<int64_t>(L.recv.size()) != shard.ep) {
      throw std::runtime_error(fmt::format(
          "MoE layer {}: the plan's dispatch has {} members, the model's expert group {}", layer,
          L.recv.size(), shard.ep));
    }
    for (const int64_t r : L.recv) {
      if (r % local != 0) {
        throw std::runtime_error(fmt::format(
            "MoE layer {}: the plan's dispatch receives {} rows from a member, not a multiple of "
            "the {} local experts",
            layer, r, local));
      }
    }
    L.used.assign(static_cast<size_t>(experts), 0);
    L.assigned.assign(static_cast<size_t>(experts), 0);
    L.received.assign(static_cast<size_t>(shard.ep), std::vector<int64_t>(local, 0));
  }
  if (L.next_slice != c) {
    throw std::runtime_error(fmt::format(
        "MoE layer {}: token slice {} routes before slice {} (expert capacity is threaded from "
        "slice to slice, in order)",
        layer, c, L.next_slice));
  }
  ++L.next_slice;
  const int64_t C = L.capacity;
  const at::Tensor xf = x.reshape({ntok, hidden});
  const Routing r = Route(moe, xf, real, experts, top_k, C, model.moe->drop_policy, &L.used);
  P.assignments += r.assignments;
  P.dropped += r.dropped;
  for (size_t e = 0; e < L.assigned.size(); ++e) L.assigned[e] += r.assigned[e];
  L.real += r.real_tokens;
  if (r.real_tokens > 0) {
    const at::Tensor ps = (r.probs * real.reshape({ntok, 1}).to(torch::kFloat32)).sum(0);
    L.prob_sum = L.prob_sum.defined() ? L.prob_sum + ps : ps;
  }
  auto park = [&] {
    ctx->park();
    const int64_t seg = ++P.segment[static_cast<size_t>(c)];
    if (tape != nullptr) tape->set_segment(seg);
  };
  auto check_combine = [&] {
    const std::vector<int64_t> back = ex->NextRecvSplits(OpKind::kAllToAllCombine, layer);
    if (back != L.send) {
      throw std::runtime_error(fmt::format(
          "MoE layer {}: the plan's combine receives [{}] rows, the layer's capacity {} x {} "
          "local experts",
          layer, fmt::join(back, ", "), C, local));
    }
  };
  auto post_whole_combine = [&](const at::Tensor& in) {
    check_combine();
    L.whole_in = in;
    L.combine_ticket = ex->Post(OpKind::kAllToAllCombine, layer, -1, in.detach(), L.recv, L.send);
  };
  auto combine_whole = [&] {
    if (!L.expert_out.defined()) {
      at::Tensor out = ex->Wait({L.combine_ticket}).front();
      if (grad) {
        Attach(MakeNode(ex, OpKind::kAllToAllCombine, layer, hidden, L.send, L.recv), L.whole_in,
               out, Range(Sum(L.recv)), Range(Sum(L.send)));
      }
      L.expert_out = out;
      L.whole_in = at::Tensor();
    }
    return Combine(L.expert_out, r.top_p, r, ntok);
  };

  at::Tensor y;
  const int64_t dispatch_slices = ex->NextSlices(OpKind::kAllToAllDispatch, layer);
  if (dispatch_slices == 0) {
    // A whole dispatch: every slice's rows into the capacity buffer; the last slice posts it.
    L.parts.push_back(xf.index_select(0, r.tokens));
    L.part_rows.push_back(r.slots);
    if (c == n - 1) {
      const at::Tensor X = torch::zeros({experts * C, hidden})
                               .index_add(0, at::cat(L.part_rows), at::cat(L.parts));
      L.parts.clear();
      L.part_rows.clear();
      L.whole_in = X;
      L.dispatch_ticket =
          ex->Post(OpKind::kAllToAllDispatch, layer, -1, X.detach(), L.send, L.recv);
    }
    park();  // the end of the segment before the dispatch
    if (!L.experts_done) {  // the first slice to run the experts segment runs it whole
      at::Tensor R = ex->Wait({L.dispatch_ticket}).front();
      if (grad) {
        Attach(MakeNode(ex, OpKind::kAllToAllDispatch, layer, hidden, L.recv, L.send), L.whole_in,
               R, Range(Sum(L.send)), Range(Sum(L.recv)));
      }
      if (ex->NextSlices(OpKind::kAllToAllCombine, layer) != 0) {
        throw std::runtime_error(fmt::format(
            "MoE layer {}: a token-sliced combine after a whole dispatch (the runtime slices a "
            "partitioned forward's runs from an attention segment on, docs/moe.md)",
            layer));
      }
      post_whole_combine(RunLocalExperts(model, moe, R, L.recv, tape));
      L.experts_done = true;
    }
    park();  // the end of the experts segment
    y = combine_whole();
  } else {
    if (dispatch_slices != n) {
      throw std::runtime_error(fmt::format(
          "MoE layer {}: the plan cuts its dispatch into {} token slices, the op into {}", layer,
          dispatch_slices, n));
    }
    // The slice's kept assignments in slot order: by member, local expert, slot.
    const int64_t kept = r.slots.numel();
    const int64_t* sp = r.slots.data_ptr<int64_t>();
    const int64_t* tp = r.tokens.data_ptr<int64_t>();
    std::vector<int64_t> order(static_cast<size_t>(kept));
    for (int64_t i = 0; i < kept; ++i) order[static_cast<size_t>(i)] = i;
    std::sort(order.begin(), order.end(), [&](int64_t a, int64_t b2) { return sp[a] < sp[b2]; });
    std::vector<int64_t> slots, tokens, gates;
    at::Tensor counts = torch::zeros({shard.ep, local}, torch::kInt64);
    auto cnt = counts.accessor<int64_t, 2>();
    for (const int64_t i : order) {
      slots.push_back(sp[i]);
      tokens.push_back(tp[i]);
      gates.push_back(r.gate_of[static_cast<size_t>(i)]);
      const int64_t e = sp[i] / C;
      ++cnt[e / local][e % local];
    }
    const at::Tensor rows = xf.index_select(0, IndexTensor(tokens));
    const int64_t tk = ex->PostTokenSlice(OpKind::kAllToAllDispatch, layer, c, rows.detach(),
                                          counts, at::Tensor());
    park();  // the end of the segment before the dispatch
    at::Tensor R = ex->Wait({tk}).front();
    const at::Tensor rc = ex->ReceivedCounts(tk);
    if (rc.dim() != 2 || rc.size(0) != shard.ep || rc.size(1) != local) {
      throw std::runtime_error(fmt::format("MoE layer {}: received counts of the wrong shape",
                                           layer));
    }
    // Where the received rows lie in the whole layer's receive layout.
    std::vector<int64_t> at_rows;
    const auto rcnt = rc.accessor<int64_t, 2>();
    int64_t offset = 0;
    for (int64_t j = 0; j < shard.ep; ++j) {
      const int64_t cj = L.recv[static_cast<size_t>(j)] / local;
      for (int64_t l = 0; l < local; ++l) {
        int64_t& got = L.received[static_cast<size_t>(j)][static_cast<size_t>(l)];
        if (rcnt[j][l] < 0 || got + rcnt[j][l] > cj) {
          throw std::runtime_error(fmt::format(
              "MoE layer {}: member {} sends {} rows for local expert {} in token slice {}, "
              "over its capacity {} ({} so far)",
              layer, j, rcnt[j][l], l, c, cj, got));
        }
        for (int64_t i = 0; i < rcnt[j][l]; ++i) at_rows.push_back(offset + l * cj + got + i);
        got += rcnt[j][l];
      }
      offset += L.recv[static_cast<size_t>(j)];
    }
    if (R.size(0) != static_cast<int64_t>(at_rows.size())) {
      throw std::runtime_error(fmt::format(
          "MoE layer {}: token slice {} received {} rows, its counts say {}", layer, c, R.size(0),
          at_rows.size()));
    }
    const at::Tensor recv_rows = IndexTensor(at_rows), send_rows = IndexTensor(slots);
    if (grad) {
      if (!L.dispatch_node) {
        L.dispatch_node = MakeNode(ex, OpKind::kAllToAllDispatch, layer, hidden, L.recv, L.send);
      }
      Attach(L.dispatch_node, rows, R, send_rows, recv_rows);
    }
    const at::Tensor O = RunExpertsOnRows(model, moe, R, rc, tape);
    const int64_t combine_slices = ex->NextSlices(OpKind::kAllToAllCombine, layer);
    if (combine_slices == n) {
      const int64_t tc =
          ex->PostTokenSlice(OpKind::kAllToAllCombine, layer, c, O.detach(), rc, counts);
      park();  // the end of the experts segment
      at::Tensor Y = ex->Wait({tc}).front();
      if (Y.size(0) != kept) {
        throw std::runtime_error(fmt::format(
            "MoE layer {}: token slice {}'s combine returned {} rows for its {} kept assignments",
            layer, c, Y.size(0), kept));
      }
      if (grad) {
        if (!L.combine_node) {
          L.combine_node = MakeNode(ex, OpKind::kAllToAllCombine, layer, hidden, L.send, L.recv);
        }
        Attach(L.combine_node, O, Y, recv_rows, send_rows);
      }
      const at::Tensor g =
          r.top_p.reshape({ntok * top_k}).index_select(0, IndexTensor(gates));
      y = torch::zeros({ntok, hidden}).index_add(0, IndexTensor(tokens), Y * g.unsqueeze(1));
    } else if (combine_slices == 0) {
      // A whole combine: every slice's expert outputs into the receive layout; the last posts.
      L.parts.push_back(O);
      L.part_rows.push_back(recv_rows);
      if (c == n - 1) {
        const at::Tensor whole = torch::zeros({Sum(L.recv), hidden})
                                     .index_add(0, at::cat(L.part_rows), at::cat(L.parts));
        L.parts.clear();
        L.part_rows.clear();
        post_whole_combine(whole);
      }
      park();  // the end of the experts segment
      y = combine_whole();
    } else {
      throw std::runtime_error(fmt::format(
          "MoE layer {}: the plan cuts its combine into {} token slices, the op into {}", layer,
          combine_slices, n));
    }
  }
  return y.reshape({b, t, hidden});
}
}  // namespace moe_internal
}  // namespace sluice::runtime
