// Chrome / Perfetto trace JSON of a simulation (the "JSON Object Format" of the Trace Event
// Format, which chrome://tracing and ui.perfetto.dev load).
//
// One process per rank (pid = rank id, named "rank R (dp D, pp P)"), one thread per stream (tid =
// StreamKind value, named by StreamKindName: compute, send-next, send-prev, recv-prev, recv-next,
// collective), one complete event ("ph": "X") per SimInterval with the instruction's text as name
// (InstructionText: "2F3", "1SEND_F3", "ALLREDUCE(b2)"), category by op family (compute, p2p,
// collective), "ts"/"dur" in microseconds with ns precision, and args {microbatch, stage, shapes,
// bytes} plus "critical": true on the critical path. Each rank's memory timeline (if recorded)
// is a counter track "memory" in MB. docs/simulator.md ("Trace") shows an example.
//
// Thread safety: pure functions.
#pragma once

#include <string>
#include <string_view>

#include "base/status.h"
#include "plan/execution_plan.h"
#include "sim/simulator.h"

namespace sluice {

// The whole trace document. REQUIRES: `result` comes from simulating `plan`.
std::string ChromeTraceJson(const ExecutionPlan& plan, const SimResult& result);
// ChromeTraceJson into `path` (an error naming the path when it cannot be written).
Status WriteChromeTrace(const ExecutionPlan& plan, const SimResult& result, std::string_view path);

}  // namespace sluice
