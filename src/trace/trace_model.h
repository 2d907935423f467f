// The common form of a measured run, whatever trace format it came from (trace_reader.h).
//
// A TraceSet holds one RankTrace per rank. A rank's ops are intervals on its streams (a host
// thread, a GPU stream, sluice's "compute" stream), each stream's ops in time order and not
// overlapping (nested profiler events are flattened by the readers). A communication is two ops
// on one stream: a post (the op that hands the transfer to the library: sluice's *Start, the
// zero-length instant where a blocking c10d call or an NCCL kernel begins) and a wait (the op that
// returns once it is done: sluice's *Finish or OptimizerStep, the blocking call, the kernel), plus
// a CommOp saying with whom, how much and the latest instant the trace proves it done. Messages
// and collectives are matched across ranks later (graph.h), by order, as c10d pairs them.
//
// Times are nanoseconds on the rank's own clock until AlignClocks (align.h) shifts them.
//
// Thread safety: plain values.
#pragma once

#include <cstdint>
#include <string>
#include <string_view>
#include <vector>

namespace sluice::trace {

enum class TraceFormat : uint8_t {
  kSluice,    // `sluice train --trace-dir` (runtime/trace_recorder.h)
  kTorchCpu,  // torch 1.13 CPU profiler, export_chrome_trace (a JSON array of X events)
  kKineto,    // torch >= 2 Kineto profiler JSON (GPU kernels per stream, ac2g flows)
};
std::string_view TraceFormatName(TraceFormat format);  // "sluice", "torch-cpu", "kineto"

enum class TraceOpKind : uint8_t {
  kCompute,    // forward, backward, a kernel, a CPU op
  kCommPost,   // hands a transfer or collective to the library
  kCommWait,   // returns once the transfers it waits for are done
  kOptimizer,  // the optimizer step (waits for the rank's collectives in sluice traces)
  kOther,      // loads, frees, launches, host work that is none of the above
};
std::string_view TraceOpKindName(TraceOpKind kind);  // "compute", "post", "wait", ...

// A time the trace does not give (times may be negative on a rank's own clock).
inline constexpr int64_t kUnknownTime = INT64_MIN;

enum class CommKind : uint8_t { kSend, kRecv, kCollective };
std::string_view CommKindName(CommKind kind);  // "send", "recv", "collective"

struct TraceOp {
  std::string name;   // the event's name ("1F3", "aten::addmm", "ncclKernel_AllReduce...")
  std::string label;  // what it is: sluice's op ("forward"), torch's innermost annotation
  TraceOpKind kind = TraceOpKind::kCompute;
  int32_t stream = 0;  // index into RankTrace::streams
  int64_t start_ns = 0;
  int64_t end_ns = 0;
  int64_t iteration = -1;    // training step (-1: outside every step)
  int64_t microbatch = -1;   // sluice: the plan's micro-batch; -1 unknown
  int64_t stage = -1;        // sluice: virtual stage on this rank; -1 unknown
  int64_t bytes = 0;         // moved or loaded (sluice), message size (Kineto)
  int64_t event_index = -1;  // index of the event in its file's traceEvents (for messages)
  int32_t launched_by = -1;  // Kineto: the op (index in ops) that launched this GPU op; -1 none
};

struct CommOp {
  CommKind kind = CommKind::kSend;
  int64_t peer = -1;     // send / recv: the other rank; -1 unknown (then unmatched)
  std::string group;     // collective: member ranks "0,2,4" ("" = every rank of the set)
  std::string key;       // matched only with the same key (sluice: "act" / "grad"; "" otherwise)
  std::string instance;  // and the same instance when given (sluice: "iteration 2 mb 3": a
                         // lost op then leaves its partner alone instead of shifting the order)
  int64_t bytes = 0;     // payload, 0 unknown
  int32_t post = -1;     // op index of the post
  int32_t wait = -1;     // op index of the wait (several comms may share one wait)
  int64_t done_ns = kUnknownTime;  // latest instant the trace proves it complete (rank clock)
  std::string text;                // for messages: "1SEND_F3", "send act mb=0 to=1"
};

struct RankTrace {
  int64_t rank = 0;
  std::string source;  // file it came from
  TraceFormat format = TraceFormat::kSluice;
  std::vector<std::string> streams;  // stream names, index = TraceOp::stream
  std::vector<TraceOp> ops;          // grouped by stream, each stream in time order
  std::vector<CommOp> comms;         // in posting order
  // sluice: the MoE all-to-alls' intervals as the runtime recorded them on the collective stream
  // (name, label, iteration, start, end; not ops of the graph): a whole compute op performs its
  // all-to-alls inside its own time, which the calibration takes out of the op's.
  std::vector<TraceOp> all_to_alls;
};

struct TraceSet {
  std::vector<RankTrace> ranks;    // ascending rank, each rank once
  std::vector<std::string> notes;  // what the readers left out or guessed, for the report
};

// The name of `rank`'s stream `stream`, "-" when it has no such stream (a rank without ops).
std::string StreamName(const RankTrace& rank, int32_t stream);

// Sorts each rank's ops by (stream, start, end) and rewrites the op indices of its comms and
// launches. Readers call it last.
void SortOps(RankTrace* rank);

}  // namespace sluice::trace
