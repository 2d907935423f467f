// TraceRecorder: what one rank executed, written as a Chrome / Perfetto trace (JSON).
//
// Every executed instruction becomes one complete ("ph": "X") event on the rank's process
// (pid = rank) and the thread (tid) of its stream: 0 "compute" (load, forward, backward halves,
// frees, optimizer step), 1 "send" and 2 "recv" (a transfer from its Start being posted until its
// Finish returned, plus the Start and Finish instructions themselves on "compute"), 3 "collective"
// (a gradient bucket's all-reduce from posting until the optimizer step found it done). Times are
// microseconds since the job's epoch (rank 0's steady clock at rendezvous; CLOCK_MONOTONIC is
// shared by the processes of one host). `args` carry the op name, iteration, micro-batch, stage,
// peer and the bytes actually moved (fp32 on CPU: twice the plan's fp16 bytes); a send under
// `--link-delay-ms` also `handed_ts`, when the link-delay thread handed it to c10d. The format is
// listed in docs/formats.md ("Runtime trace").
//
// Thread safety: one thread records; not thread-safe.
#pragma once

#include <cstdint>
#include <span>
#include <string>
#include <vector>

#include "base/status.h"

namespace sluice::runtime {

enum class TraceStream : int { kCompute = 0, kSend = 1, kRecv = 2, kCollective = 3 };

struct TraceEvent {
  std::string name;  // InstructionText, e.g. "1F3", "ALLREDUCE(b2)"
  std::string op;    // OpKindName
  TraceStream stream = TraceStream::kCompute;
  int64_t iteration = 0;
  int64_t microbatch = -1;
  int64_t stage = -1;
  int64_t peer = -1;
  int64_t start_ns = 0;  // since the job's epoch
  int64_t end_ns = 0;
  int64_t bytes = 0;
  int64_t handed_ns = -1;  // a send under a link delay (comm.h): when c10d got it; -1 none
};

class TraceRecorder {
 public:
  TraceRecorder(int64_t rank, int64_t dp_index, int64_t pp_index)
      : rank_(rank), dp_index_(dp_index), pp_index_(pp_index) {}

  void Add(TraceEvent event) { events_.push_back(std::move(event)); }
  const std::vector<TraceEvent>& events() const { return events_; }

  // The rank's events as a Chrome trace document, with process and thread name metadata.
  std::string ToChromeJson() const;

 private:
  int64_t rank_, dp_index_, pp_index_;
  std::vector<TraceEvent> events_;
};

// Merges per-rank documents (ToChromeJson) into one. Errors name the document that is not a
// Chrome trace.
StatusOr<std::string> MergeChromeTraces(std::span<const std::string> documents);

}  // namespace sluice::runtime
