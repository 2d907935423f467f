#include "runtime/moe_exchange.h"

#include <fmt/core.h>
#include <fmt/ranges.h>

#include <algorithm>
#include <stdexcept>

namespace sluice::runtime {
namespace {

thread_local PlanExchange::OpState* tls_state = nullptr;

}  // namespace

void PlanExchange::Bind(OpState* state) { tls_state = state; }

PlanExchange::OpState* PlanExchange::Bound() { return tls_state; }

PlanExchange::OpState& PlanExchange::State() { return tls_state != nullptr ? *tls_state : main_; }

void PlanExchange::Begin(const std::vector<const Instruction*>* list, WeightGradTape* tape) {
  OpState& s = State();
  s.list = list;
  s.next = 0;
  s.tape = tape;
  s.results.clear();
  if (tape != nullptr) tape->set_segment(0);
}

void PlanExchange::Record(std::vector<at::Tensor>* cache) { State().record = cache; }

void PlanExchange::BeginReplay(const std::vector<const Instruction*>* list,
                               const std::vector<at::Tensor>* cache, WeightGradTape* tape) {
  Begin(list, tape);
  State().replay = cache;
}

Status PlanExchange::End(std::string_view what) {
  OpState& s = State();
  const size_t want = s.list != nullptr ? s.list->size() : 0;
  const size_t done = s.next;
  const size_t unread = s.results.size();
  const size_t unposted = s.channel != nullptr ? s.channel->posts.size() : 0;
  s.list = nullptr;
  s.record = nullptr;
  s.replay = nullptr;
  s.tape = nullptr;
  s.results.clear();
  s.counts.clear();
  if (unread > 0 || unposted > 0) {
    return InternalError(fmt::format(
        "the {} ended with {} all-to-all results it did not read and {} it handed over that "
        "were not posted",
        what, unread, unposted));
  }
  if (done != want) {
    return InvalidArgumentError(fmt::format(
        "the {} performed {} of the plan's {} all-to-alls (does the plan's model match?)", what,
        done, want));
  }
  return Status::Ok();
}

std::vector<int64_t> PlanExchange::NextRecvSplits(OpKind kind, int64_t layer) {
  const Instruction& in = Expect(kind, layer);
  if (in.chunks <= 0) return in.recv_splits;
  // A sliced one: its slices follow one another in the op's list; their splits sum to the
  // whole one's.
  const OpState& s = State();
  std::vector<int64_t> whole(in.recv_splits.size(), 0);
  for (int64_t c = 0; c < in.chunks; ++c) {
    const size_t k = s.next + static_cast<size_t>(c);
    const Instruction* slice = k < s.list->size() ? (*s.list)[k] : nullptr;
    if (slice == nullptr || slice->op != kind || slice->layer != layer || slice->chunk != c ||
        slice->chunks != in.chunks || slice->recv_splits.size() != whole.size()) {
      throw std::runtime_error(fmt::format(
          "{}: slice {} of {} is not the op's all-to-all {} (the runtime needs an all-to-all's "
          "slices listed one after another, in the order of docs/moe.md, \"Capacity slices\")",
          InstructionText(in), c, in.chunks,
          c == 0 ? std::string("next") : fmt::format("after slice {}", c - 1)));
    }
    for (size_t j = 0; j < whole.size(); ++j) whole[j] += slice->recv_splits[j];
  }
  return whole;
}

int64_t PlanExchange::NextSlices(OpKind kind, int64_t layer) { return Expect(kind, layer).chunks; }

at::Tensor PlanExchange::Exchange(OpKind kind, int64_t layer, const at::Tensor& rows,
                                  const std::vector<int64_t>& send,
                                  const std::vector<int64_t>& recv) {
  const int64_t ticket = PostOne(kind, layer, -1, rows, send, recv);
  at::Tensor out = Wait({ticket}).front();
  OpState& s = State();
  if (s.tape != nullptr) s.tape->set_segment(static_cast<int64_t>(s.next));
  return out;
}

int64_t PlanExchange::Post(OpKind kind, int64_t layer, int64_t slice, const at::Tensor& rows,
                           const std::vector<int64_t>& send, const std::vector<int64_t>& recv) {
  return PostOne(kind, layer, std::max<int64_t>(slice, -1), rows, send, recv);
}

std::vector<int64_t> RowSums(const at::Tensor& counts) {
  const at::Tensor sums = counts.sum(1).to(torch::kInt64).contiguous();
  const int64_t* p = sums.data_ptr<int64_t>();
  return std::vector<int64_t>(p, p + sums.numel());
}

int64_t PlanExchange::PostTokenSlice(OpKind kind, int64_t layer, int64_t slice,
                                     const at::Tensor& rows, const at::Tensor& send_counts,
                                     const at::Tensor& recv_counts) {
  const Instruction& in = Expect(kind, layer);
  if (in.chunks <= 0 || in.chunk != slice) {
    throw std::runtime_error(fmt::format(
        "the MoE layer {} runs its {} as token slice {}, the plan's next all-to-all is {}", layer,
        OpKindName(kind), slice, InstructionText(in)));
  }
  OpState& s = State();
  if (s.channel == nullptr || s.replay != nullptr) {
    throw std::runtime_error(fmt::format(
        "{}: token slices run in a segmented op, never replayed", InstructionText(in)));
  }
  SegmentChannel::Request r;
  r.in = &in;
  r.rows = rows.contiguous();
  r.ticket = static_cast<int64_t>(s.next);
  r.send_splits = RowSums(send_counts);
  if (recv_counts.defined()) {
    r.recv_splits = RowSums(recv_counts);
  } else {
    r.counts = send_counts.to(torch::kInt64).contiguous();
  }
  if (r.send_splits.size() != in.group.size() ||
      (!r.recv_splits.empty() && r.recv_splits.size() != in.group.size())) {
    throw std::runtime_error(fmt::format("{}: counts for {} members, the group has {}",
                                         InstructionText(in), r.send_splits.size(),
                                         in.group.size()));
  }
  s.channel->posts.push_back(std::move(r));
  return static_cast<int64_t>(s.next++);
}

at::Tensor PlanExchange::ReceivedCounts(int64_t ticket) {
  OpState& s = State();
  const auto it = s.counts.find(ticket);
  if (it == s.counts.end()) {
    throw std::runtime_error("PlanExchange::ReceivedCounts: no count exchange for this ticket");
  }
  at::Tensor out = std::move(it->second);
  s.counts.erase(it);
  return out;
}

int64_t PlanExchange::PostOne(OpKind kind, int64_t layer, int64_t slice, const at::Tensor& rows,
                              const std::vector<int64_t>& send, const std::vector<int64_t>& recv) {
  const Instruction& in = Expect(kind, layer);
  if (slice < 0 ? in.chunks > 0 : (in.chunks <= 0 || in.chunk != slice)) {
    throw std::runtime_error(fmt::format(
        "the MoE layer {} runs its {} {}, the plan's next all-to-all is {}", layer,
        OpKindName(kind), slice < 0 ? std::string("whole") : fmt::format("as slice {}", slice),
        InstructionText(in)));
  }
  if (send != in.send_splits || recv != in.recv_splits) {
    throw std::runtime_error(fmt::format(
        "{}: the MoE layer sends [{}] and receives [{}] rows, the plan says [{}] and [{}]",
        InstructionText(in), fmt::join(send, ", "), fmt::join(recv, ", "),
        fmt::join(in.send_splits, ", "), fmt::join(in.recv_splits, ", ")));
  }
  int64_t total = 0;
  for (const int64_t r : recv) total += r;
  OpState& s = State();
  const auto ticket = static_cast<int64_t>(s.next);
  if (s.replay != nullptr) {
    if (s.next >= s.replay->size() || (*s.replay)[s.next].size(0) != total) {
      throw std::runtime_error(fmt::format(
          "{}: the replayed forward's all-to-all has no recorded result", InstructionText(in)));
    }
    s.results[ticket] = (*s.replay)[s.next].clone();
  } else if (s.channel != nullptr) {
    // Segmented op: the executor posts it when the program reaches it and delivers the result
    // when it completes.
    SegmentChannel::Request r;
    r.in = &in;
    r.rows = rows.contiguous();
    r.ticket = ticket;
    s.channel->posts.push_back(std::move(r));
  } else {
    s.results[ticket] = Synchronous(in, rows, send, recv);
    performed_.insert(&in);
  }
  ++s.next;
  return ticket;
}

std::vector<at::Tensor> PlanExchange::Wait(const std::vector<int64_t>& tickets) {
  OpState& s = State();
  auto missing = [&] {
    for (const int64_t t : tickets) {
      if (s.results.count(t) == 0) return true;
    }
    return false;
  };
  if (missing() || (s.channel != nullptr && s.channel->slice_piece && s.replay == nullptr)) {
    if (s.channel == nullptr) {
      throw std::runtime_error("PlanExchange::Wait: a ticket that was never posted");
    }
    s.channel->awaiting = tickets;
    s.channel->fiber->Suspend();
    s.channel->awaiting.clear();
    if (missing()) {
      throw std::runtime_error(
          fmt::format("{}: the op resumed without the all-to-all's result",
                      InstructionText(*(*s.list)[static_cast<size_t>(tickets.front())])));
    }
  }
  std::vector<at::Tensor> out;
  for (const int64_t t : tickets) {
    auto it = s.results.find(t);
    out.push_back(std::move(it->second));
    s.results.erase(it);
    if (s.record != nullptr) {
      if (s.record->size() <= static_cast<size_t>(t)) s.record->resize(static_cast<size_t>(t) + 1);
      (*s.record)[static_cast<size_t>(t)] = out.back();
    }
  }
  return out;
}

StatusOr<int64_t> AwaitAllToAll(Communicator& comm, Watchdog& watchdog, TraceRecorder& trace,
                                const Instruction& in, Communicator::Handle& handle,
                                int64_t posted_ns, int64_t iteration,
                                const std::function<int64_t()>& now, bool record) {
  std::vector<int64_t> peers;
  for (const int64_t r : in.group) {
    if (r != comm.rank()) peers.push_back(r);
  }
  const std::string what = fmt::format("{} (iteration {})", InstructionText(in), iteration);
  const int64_t wait_start = now();
  watchdog.BeginWait(what, peers);
  const Status st = comm.Wait(handle);
  watchdog.EndWait();
  if (!st.ok()) {
    const std::string blame = watchdog.Blame(peers, what);
    return FailedPreconditionError(fmt::format(
        "{} failed{}: {}", what, blame.empty() ? "" : " (" + blame + ")", st.message()));
  }
  const int64_t end = now();
  if (!record) return end - wait_start;
  TraceEvent e;
  e.name = InstructionText(in);
  e.op = std::string(OpKindName(in.op));
  e.stream = TraceStream::kCollective;
  e.iteration = iteration;
  e.microbatch = in.microbatch;
  e.stage = in.stage;
  e.start_ns = posted_ns;
  e.end_ns = end;
  e.bytes = in.bytes.count();
  trace.Add(std::move(e));
  return end - wait_start;
}

at::Tensor PlanExchange::Synchronous(const Instruction& in, const at::Tensor& rows,
                                     const std::vector<int64_t>& send,
                                     const std::vector<int64_t>& recv) {
  int64_t total = 0;
  for (const int64_t r : recv) total += r;
  at::Tensor out = torch::empty({total, rows.size(1)}, rows.options());
  const int64_t start = now_();
  StatusOr<Communicator::Handle> h = comm_.AllToAllEp(out, rows, recv, send);
  if (!h.ok()) throw std::runtime_error(std::string(h.status().message()));
  const StatusOr<int64_t> waited =
      AwaitAllToAll(comm_, watchdog_, trace_, in, *h, start, iteration_, now_);
  if (!waited.ok()) throw std::runtime_error(std::string(waited.status().message()));
  nanos_ += now_() - start;
  return out;
}

const Instruction& PlanExchange::Expect(OpKind kind, int64_t layer) {
  const OpState& s = State();
  if (s.list == nullptr || s.next >= s.list->size()) {
    throw std::runtime_error(fmt::format(
        "the MoE layer {} needs an all-to-all ({}) that the plan does not give this compute op",
        layer, OpKindName(kind)));
  }
  const Instruction& in = *(*s.list)[s.next];
  if (in.op != kind || in.layer != layer) {
    throw std::runtime_error(
        fmt::format("the MoE layer {} runs {} next, the plan's next all-to-all is {}", layer,
                    OpKindName(kind), InstructionText(in)));
  }
  return in;
}

}  // namespace sluice::runtime
