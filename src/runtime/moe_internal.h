// Internal to the MoE layer's implementation (moe.cc, moe_partition.cc): the routing and expert
// functions both the whole layer and its token slices run.
//
// Thread safety: as model.h.
#pragma once

#include <cstdint>
#include <vector>

#include "runtime/model.h"
#include "runtime/moe.h"

namespace sluice::runtime::moe_internal {

int64_t Sum(const std::vector<int64_t>& v);
at::Tensor IndexTensor(const std::vector<int64_t>& v);

// y = x W^T + b, recorded on `tape` (when non-null) for a split backward.
at::Tensor ApplyLinear(const Linear& l, const at::Tensor& x, WeightGradTape* tape);
// One expert's MLP on its rows x [rows, hidden].
at::Tensor ExpertMlp(const ModelSpec& m, const Expert& e, const at::Tensor& x,
                     WeightGradTape* tape);
// Each local expert on its rows of `rows` [sum(recv), hidden]: member j's block is [local
// experts][C_j] with C_j = recv[j] / local. Returns the outputs in the same layout.
at::Tensor RunLocalExperts(const ModelSpec& model, const MoeMlp& moe, const at::Tensor& rows,
                           const std::vector<int64_t>& recv, WeightGradTape* tape);
// Local expert l on the rows `rows_of[l]` of x [rows, hidden]; the outputs in x's layout (zero
// in rows no expert took).
at::Tensor RunExpertsOnRowGroups(const ModelSpec& model, const MoeMlp& moe, const at::Tensor& x,
                                 const std::vector<std::vector<int64_t>>& rows_of,
                                 WeightGradTape* tape);

// The router's decisions on one micro-batch's tokens xf [n, hidden] (moe.h): each kept
// assignment's token, slot (expert * capacity + place) and gate (index into top_p), in the
// order slots were given; the per-expert assignments before dropping and the counts.
struct Routing {
  at::Tensor probs;  // [n, E], in the graph
  at::Tensor top_p;  // [n, top_k], in the graph
  at::Tensor tokens, slots;
  std::vector<int64_t> gate_of;
  std::vector<int64_t> assigned;  // per expert, before dropping
  int64_t real_tokens = 0, assignments = 0, dropped = 0;
};
// `threaded`: the per-expert slots already taken (by earlier token slices), updated; null: none.
// `policy`: the order slots are given in (model_spec.h MoeDropPolicy).
Routing Route(const MoeMlp& moe, const at::Tensor& xf, const at::Tensor& real, int64_t experts,
              int64_t top_k, int64_t capacity, MoeDropPolicy policy,
              std::vector<int64_t>* threaded = nullptr);
// The kept tokens into the capacity buffer [rows, hidden] (empty slots zero).
at::Tensor Dispatch(const at::Tensor& xf, const Routing& r, int64_t rows);
// Each kept assignment's expert output (expert_out's row at its slot) times its router
// probability, summed per token: [n, hidden].
at::Tensor Combine(const at::Tensor& expert_out, const at::Tensor& top_p, const Routing& r,
                   int64_t n);

// MoeForward for one token slice (moe.h, MoePartition; moe_partition.cc).
at::Tensor PartitionedMoeForward(const ModelSpec& model, const MoeMlp& moe,
                                 const ExpertShard& shard, const at::Tensor& x,
                                 const at::Tensor& real, WeightGradTape* tape, MoeContext* ctx);

}  // namespace sluice::runtime::moe_internal
