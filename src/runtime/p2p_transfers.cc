#include "runtime/p2p_transfers.h"

#include <fmt/core.h>

#include <string>

namespace sluice::runtime {
namespace {

std::pair<bool, int64_t> TransferKey(const Instruction& in) { return {IsSend(in.op), in.tag}; }

}  // namespace

PipelineTransfers::PipelineTransfers(Communicator& comm, Watchdog& watchdog, TraceRecorder& trace,
                                     std::chrono::steady_clock::time_point epoch,
                                     int64_t iteration, std::function<int64_t()> now)
    : comm_(comm),
      watchdog_(watchdog),
      trace_(trace),
      epoch_(epoch),
      iteration_(iteration),
      now_(std::move(now)) {}

Status PipelineTransfers::Send(const Instruction& in, const std::vector<at::Tensor>& tensors,
                               int64_t* bytes) {
  Transfer t;
  if (tensors.size() == 1) {
    t.flat = tensors[0].detach().contiguous();
  } else {
    std::vector<at::Tensor> flat;
    for (const at::Tensor& x : tensors) flat.push_back(x.detach().reshape({-1}));
    t.flat = torch::cat(flat);
  }
  const int64_t posted = now_();
  SLUICE_ASSIGN_OR_RETURN(t.handle, comm_.Send(t.flat, comm_.ProcessRank(in.peer), in.tag));
  return Post(in, std::move(t), posted, bytes);
}

Status PipelineTransfers::Recv(
    const Instruction& in, const std::vector<TensorShape>& shapes,
    const std::function<Status(std::vector<at::Tensor>)>& place, int64_t* bytes) {
  int64_t total = 0;
  for (const TensorShape& s : shapes) total += NumElements(s);
  Transfer t;
  t.flat = torch::empty({total}, torch::kFloat32);
  std::vector<at::Tensor> views;
  int64_t offset = 0;
  for (const TensorShape& s : shapes) {
    views.push_back(t.flat.narrow(0, offset, NumElements(s)).view(s));
    offset += NumElements(s);
  }
  SLUICE_RETURN_IF_ERROR(place(std::move(views)));
  const int64_t posted = now_();
  SLUICE_ASSIGN_OR_RETURN(t.handle, comm_.Recv(t.flat, comm_.ProcessRank(in.peer), in.tag));
  return Post(in, std::move(t), posted, bytes);
}

Status PipelineTransfers::Post(const Instruction& in, Transfer t, int64_t posted_ns,
                               int64_t* bytes) {
  t.posted_ns = posted_ns;
  t.bytes = t.flat.numel() * t.flat.element_size();
  *bytes = t.bytes;
  if (!transfers_.emplace(TransferKey(in), std::move(t)).second) {
    return InvalidArgumentError(fmt::format("tag {} is already in flight", in.tag));
  }
  return Status::Ok();
}

Status PipelineTransfers::Finish(const Instruction& in) {
  auto it = transfers_.find({IsSend(in.op), in.tag});
  if (it == transfers_.end()) return InvalidArgumentError("finish without a posted start");
  const int64_t peer = comm_.ProcessRank(in.peer);
  watchdog_.BeginWait(fmt::format("{} (iteration {})", InstructionText(in), iteration_), peer);
  Status s = comm_.Wait(it->second.handle);
  const int64_t end = now_();
  watchdog_.EndWait();
  if (!s.ok()) {
    return FailedPreconditionError(fmt::format("{} rank {} failed (rank {} died?): {}",
                                               IsSend(in.op) ? "send to" : "receive from", peer,
                                               peer, s.message()));
  }
  Instruction start;
  start.op = StartOf(in.op);
  start.microbatch = in.microbatch;
  start.stage = in.stage;
  start.peer = in.peer;
  start.tag = in.tag;
  TraceEvent e;
  e.name = InstructionText(start);
  e.op = std::string(OpKindName(start.op));
  e.stream = IsSend(in.op) ? TraceStream::kSend : TraceStream::kRecv;
  e.iteration = iteration_;
  e.microbatch = in.microbatch;
  e.stage = in.stage;
  e.peer = in.peer;
  e.start_ns = it->second.posted_ns;
  e.end_ns = end;
  e.bytes = it->second.bytes;
  if (const auto* d = dynamic_cast<const DelayedSend*>(it->second.handle.get())) {
    // Under --link-delay-ms: when the helper thread handed the send to c10d.
    e.handed_ns =
        std::chrono::duration_cast<std::chrono::nanoseconds>(d->handed_at() - epoch_).count();
  }
  trace_.Add(std::move(e));
  transfers_.erase(it);
  return Status::Ok();
}

}  // namespace sluice::runtime
