// PipelineTransfers: the pipeline's point-to-point activations and gradients of one rank's
// iteration, as the executor runs them (executor.cc). A send start flattens its tensors into one
// message and posts it; a receive start posts a receive into one buffer and hands back views of it
// in the plan's shapes (filled once its finish returns). Each finish waits for its start's
// transfer under the watchdog and traces it on the send or receive stream, from when it was posted
// (and, under --link-delay-ms, when the delaying thread handed it to c10d). A start is keyed by
// (direction, tag): the plan gives every transfer of an iteration its own tag.
//
// Thread safety: the executor's thread.
#pragma once

#include <chrono>
#include <cstdint>
#include <functional>
#include <map>
#include <utility>
#include <vector>

#include "base/status.h"
#include "plan/instruction.h"
#include "runtime/comm.h"
#include "runtime/trace_recorder.h"

namespace sluice::runtime {

class PipelineTransfers {
 public:
  // `epoch`: the trace clock's zero; `now`: nanoseconds on it. REQUIRES: every reference
  // outlives this.
  PipelineTransfers(Communicator& comm, Watchdog& watchdog, TraceRecorder& trace,
                    std::chrono::steady_clock::time_point epoch, int64_t iteration,
                    std::function<int64_t()> now);

  // Posts send start `in` of `tensors` (already checked against the plan's shapes). `*bytes`: the
  // message's bytes.
  Status Send(const Instruction& in, const std::vector<at::Tensor>& tensors, int64_t* bytes);
  // Posts receive start `in` of tensors of `shapes`; `place` is first given the tensors it will
  // fill (views of its buffer), and nothing is posted when it fails.
  Status Recv(const Instruction& in, const std::vector<TensorShape>& shapes,
              const std::function<Status(std::vector<at::Tensor>)>& place, int64_t* bytes);
  // Waits for the transfer of finish `in`'s start and traces it. Errors: no such start posted, or
  // the peer failed (named).
  Status Finish(const Instruction& in);

  // Transfers posted and not finished.
  size_t in_flight() const { return transfers_.size(); }

 private:
  struct Transfer {
    Communicator::Handle handle;
    at::Tensor flat;  // the message buffer (kept alive until the Finish)
    int64_t posted_ns = 0;
    int64_t bytes = 0;
  };
  Status Post(const Instruction& in, Transfer t, int64_t posted_ns, int64_t* bytes);

  Communicator& comm_;
  Watchdog& watchdog_;
  TraceRecorder& trace_;
  std::chrono::steady_clock::time_point epoch_;
  int64_t iteration_;
  std::function<int64_t()> now_;
  std::map<std::pair<bool, int64_t>, Transfer> transfers_;  // [(is send, tag)]
};

}  // namespace sluice::runtime
