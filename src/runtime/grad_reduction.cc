#include "runtime/grad_reduction.h"

#include <fmt/core.h>

#include <algorithm>
#include <string>
#include <utility>

#include "runtime/layout.h"

namespace sluice::runtime {

at::Tensor FlattenGrads(const std::vector<at::Tensor>& params) {
  std::vector<at::Tensor> parts;
  for (const at::Tensor& p : params) {
    parts.push_back(p.grad().defined() ? p.grad().reshape({-1})
                                       : torch::zeros({p.numel()}, torch::kFloat32));
  }
  return torch::cat(parts);
}

void WriteFlatGrads(const at::Tensor& flat, const std::vector<at::Tensor>& params) {
  torch::NoGradGuard no_grad;
  int64_t offset = 0;
  for (const at::Tensor& p : params) {
    const at::Tensor reduced = flat.narrow(0, offset, p.numel()).view_as(p);
    if (p.grad().defined()) {
      p.mutable_grad().copy_(reduced);
    } else {
      p.mutable_grad() = reduced.clone();
    }
    offset += p.numel();
  }
}

GradientReduction::GradientReduction(ModelShard& shard, Communicator& comm, Watchdog& watchdog,
                                     TraceRecorder& trace, int64_t iteration,
                                     std::function<int64_t()> now)
    : shard_(shard),
      comm_(comm),
      watchdog_(watchdog),
      trace_(trace),
      iteration_(iteration),
      now_(std::move(now)) {}

Status GradientReduction::Prepare(const RankProgram& program) {
  std::map<int64_t, std::vector<Bytes>> bytes;
  for (const Instruction& in : program.instructions) {
    if (in.op != OpKind::kAllReduceGrad) continue;
    if (!shard_.HasChunk(in.stage)) {
      return InvalidArgumentError(fmt::format(
          "bucket {} reduces stage {}, which does not run on this rank", in.bucket, in.stage));
    }
    if (in.bytes.count() <= 0) {
      return InvalidArgumentError(fmt::format("bucket {} has no bytes", in.bucket));
    }
    stage_grads_[in.stage].bucket_ids.push_back(in.bucket);
    bytes[in.stage].push_back(in.bytes);
  }
  for (auto& [stage, g] : stage_grads_) {
    int64_t elements = 0;
    for (const at::Tensor& p : shard_.StageParameters(stage)) elements += p.numel();
    g.ranges = BucketRanges(bytes[stage], elements);
  }
  return Status::Ok();
}

Status GradientReduction::AllReduce(const Instruction& in, int64_t pc,
                                    const std::map<int64_t, int64_t>& last_backward,
                                    int64_t* bytes) {
  *bytes = 0;
  const auto last = last_backward.find(in.stage);
  if (last != last_backward.end() && pc < last->second) {
    deferred_[in.stage].push_back(&in);
    return Status::Ok();
  }
  return AllReduceNow(in, bytes);
}

Status GradientReduction::PostDeferred(int64_t index,
                                       const std::map<int64_t, int64_t>& last_backward) {
  for (auto it = deferred_.begin(); it != deferred_.end();) {
    if (last_backward.at(it->first) != index) {
      ++it;
      continue;
    }
    int64_t ignored = 0;
    for (const Instruction* b : it->second) SLUICE_RETURN_IF_ERROR(AllReduceNow(*b, &ignored));
    it = deferred_.erase(it);
  }
  return Status::Ok();
}

Status GradientReduction::AllReduceNow(const Instruction& in, int64_t* bytes) {
  auto it = stage_grads_.find(in.stage);
  if (it == stage_grads_.end()) return InternalError("bucket missed by the pre-scan");
  StageGrad& g = it->second;
  // The stage's first bucket: its gradients are final now.
  if (!g.flat.defined()) g.flat = FlattenGrads(shard_.StageParameters(in.stage));
  const auto pos = std::find(g.bucket_ids.begin(), g.bucket_ids.end(), in.bucket);
  const auto [begin, end] = g.ranges[pos - g.bucket_ids.begin()];
  Collective c;
  c.stage = in.stage;
  c.bucket = in.bucket;
  c.posted_ns = now_();
  if (end > begin) {
    const at::Tensor slice = g.flat.narrow(0, begin, end - begin);
    c.bytes = slice.numel() * slice.element_size();
    SLUICE_ASSIGN_OR_RETURN(c.handle, comm_.AllReduceDp(slice));
  }
  *bytes = c.bytes;
  collectives_.push_back(std::move(c));
  return Status::Ok();
}

Status GradientReduction::WaitWatched(const Communicator::Handle& h,
                                      const std::vector<int64_t>& peers, const std::string& what) {
  watchdog_.BeginWait(what, peers);
  Status s = comm_.Wait(h);
  watchdog_.EndWait();
  if (s.ok()) return s;
  const std::string blame = watchdog_.Blame(peers, what);
  return FailedPreconditionError(
      fmt::format("{} failed{}: {}", what, blame.empty() ? "" : " (" + blame + ")", s.message()));
}

Status GradientReduction::Finish() {
  for (Collective& c : collectives_) {
    if (!c.handle) continue;
    SLUICE_RETURN_IF_ERROR(WaitWatched(
        c.handle, comm_.dp_peers(),
        fmt::format("the all-reduce of gradient bucket {} (iteration {})", c.bucket, iteration_)));
    TraceEvent e;
    e.name = fmt::format("ALLREDUCE(b{})", c.bucket);
    e.op = std::string(OpKindName(OpKind::kAllReduceGrad));
    e.stream = TraceStream::kCollective;
    e.iteration = iteration_;
    e.stage = c.stage;
    e.start_ns = c.posted_ns;
    e.end_ns = now_();
    e.bytes = c.bytes;
    trace_.Add(std::move(e));
  }
  collectives_.clear();
  for (auto& [stage, g] : stage_grads_) {
    if (!g.flat.defined()) continue;
    WriteFlatGrads(g.flat, shard_.StageParameters(stage));
    g.flat = at::Tensor();
  }
  SLUICE_RETURN_IF_ERROR(ReduceExpertGrads());
  return ReduceEmbeddingGrad();
}

// ep > 1, dp > ep: sums the expert gradients over the replicas that hold the same experts (the ep
// group's all-to-alls already brought every replica's tokens of the group to them).
Status GradientReduction::ReduceExpertGrads() {
  const std::vector<at::Tensor>& params = shard_.ExpertParameters();
  if (!comm_.has_expert_dp_group() || params.empty()) return Status::Ok();
  const at::Tensor flat = FlattenGrads(params);
  const int64_t start = now_();
  SLUICE_ASSIGN_OR_RETURN(Communicator::Handle h, comm_.AllReduceExpertDp(flat));
  SLUICE_RETURN_IF_ERROR(WaitWatched(
      h, comm_.expert_dp_peers(),
      fmt::format("the expert-gradient sum over the expert data-parallel group (iteration {})",
                  iteration_)));
  TraceEvent e;
  e.name = "ALLREDUCE(experts)";
  e.op = std::string(OpKindName(OpKind::kAllReduceGrad));
  e.stream = TraceStream::kCollective;
  e.iteration = iteration_;
  e.start_ns = start;
  e.end_ns = now_();
  e.bytes = flat.numel() * flat.element_size();
  trace_.Add(std::move(e));
  WriteFlatGrads(flat, params);
  return Status::Ok();
}

Status GradientReduction::ReduceEmbeddingGrad() {
  const at::Tensor& wte = shard_.word_embedding();
  if (!comm_.has_embedding_group() || !wte.defined()) return Status::Ok();
  if (!wte.grad().defined()) wte.mutable_grad() = torch::zeros_like(wte);
  SLUICE_ASSIGN_OR_RETURN(Communicator::Handle h, comm_.AllReduceEmbedding(wte.grad()));
  return WaitWatched(h, comm_.embedding_peers(),
                     fmt::format("the word-embedding gradient sum (iteration {})", iteration_));
}

}  // namespace sluice::runtime
