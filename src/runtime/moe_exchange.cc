#include "runtime/moe_exchange.h"

#include <fmt/core.h>
#include <fmt/ranges.h>

#include <stdexcept>

namespace sluice::runtime {
namespace {

thread_local PlanExchange::OpState* tls_state = nullptr;

}  // namespace

void PlanExchange::Bind(OpState* state) { tls_state = state; }

PlanExchange::OpState& PlanExchange::State() { return tls_state != nullptr ? *tls_state : main_; }

void PlanExchange::Begin(const std::vector<const Instruction*>* list, WeightGradTape* tape) {
  OpState& s = State();
  s.list = list;
  s.next = 0;
  s.tape = tape;
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
  s.list = nullptr;
  s.record = nullptr;
  s.replay = nullptr;
  s.tape = nullptr;
  if (done != want) {
    return InvalidArgumentError(fmt::format(
        "the {} performed {} of the plan's {} all-to-alls (does the plan's model match?)", what,
        done, want));
  }
  return Status::Ok();
}

std::vector<int64_t> PlanExchange::NextRecvSplits(OpKind kind, int64_t layer) {
  return Expect(kind, layer).recv_splits;
}

at::Tensor PlanExchange::Exchange(OpKind kind, int64_t layer, const at::Tensor& rows,
                                  const std::vector<int64_t>& send,
                                  const std::vector<int64_t>& recv) {
  const Instruction& in = Expect(kind, layer);
  if (send != in.send_splits || recv != in.recv_splits) {
    throw std::runtime_error(fmt::format(
        "{}: the MoE layer sends [{}] and receives [{}] rows, the plan says [{}] and [{}]",
        InstructionText(in), fmt::join(send, ", "), fmt::join(recv, ", "),
        fmt::join(in.send_splits, ", "), fmt::join(in.recv_splits, ", ")));
  }
  int64_t total = 0;
  for (const int64_t r : recv) total += r;
  OpState& s = State();
  at::Tensor out;
  if (s.replay != nullptr) {
    if (s.next >= s.replay->size() || (*s.replay)[s.next].size(0) != total) {
      throw std::runtime_error(fmt::format(
          "{}: the replayed forward's all-to-all has no recorded result", InstructionText(in)));
    }
    out = (*s.replay)[s.next].clone();
  } else if (s.channel != nullptr) {
    // Segmented op: the executor posts it when the program reaches it; a later piece resumes
    // this fiber with what arrived.
    s.channel->request = &in;
    s.channel->rows = rows.contiguous();
    s.channel->received = at::Tensor();
    s.channel->fiber->Suspend();
    out = s.channel->received;
    s.channel->received = at::Tensor();
    if (!out.defined() || out.size(0) != total) {
      throw std::runtime_error(
          fmt::format("{}: resumed without the all-to-all's result", InstructionText(in)));
    }
  } else {
    out = Synchronous(in, rows, send, recv);
    performed_.insert(&in);
  }
  ++s.next;
  if (s.tape != nullptr) s.tape->set_segment(static_cast<int64_t>(s.next));
  if (s.record != nullptr) s.record->push_back(out);
  return out;
}

StatusOr<int64_t> AwaitAllToAll(Communicator& comm, Watchdog& watchdog, TraceRecorder& trace,
                                const Instruction& in, Communicator::Handle& handle,
                                int64_t posted_ns, int64_t iteration,
                                const std::function<int64_t()>& now) {
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
    return FailedPreconditionError(fmt::format("{} failed{}: {}", what,
                                               blame.empty() ? "" : " (" + blame + ")",
                                               st.message()));
  }
  const int64_t end = now();
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
