// Calibration: corrections to the cost model a plan trusted, fitted from traces of runs of known
// plans, so that `sluice simulate --calibration FILE` prices any plan of the same model, stages
// and machine closer to what runs (docs/trace.md, format "sluice-calibration/1" in
// docs/formats.md).
//
// Fit. The trace of `sluice train --plan P0 P1 ...` runs plan k as iteration k; each rank's ops of
// iteration k are its program's instructions in order (checked by their text: a trace of another
// plan is an error naming the rank, the iteration and the event). For every compute instruction
// (forward, backward, backward-input, backward-weight, optimizer step, load) the measured cost is
// its own time plus the host time since the rank's previous such op that the simulator does not
// model (gaps, frees, posts, and waits once their transfer was done; never the blocked part).
// Per (virtual stage, op) a least-squares line measured = scale x predicted + offset over the
// instructions (scale only, offset 0, when the predictions hardly vary or the line would have a
// negative offset or scale). Transfers give a link: wire time = latency + plan bytes / bandwidth
// (a robust line: the slope between the medians of the two halves by size, the latency the
// median of the rest; a bandwidth of 1e6 GB/s when times do not grow with size) over the matched
// messages (the transfer hubs of graph.h) that some side waited for (for the
// others the trace bounds the arrival only from above).
// Apply. Each compute instruction's duration becomes scale x duration + offset for its (stage, op);
// with a link fitted, the plan's cluster links take its latency and bandwidth.
//
// Thread safety: pure functions.
#pragma once

#include <cstdint>
#include <string>
#include <vector>

#include "base/status.h"
#include "plan/execution_plan.h"
#include "trace/analyze.h"

namespace sluice::trace {

struct OpCorrection {
  int64_t stage = -1;     // virtual stage; -1: any stage without its own entry
  std::string op;         // OpKindName: "forward", "backward", ..., "optimizer-step"
  double scale = 1.0;     // measured / predicted
  double offset_us = 0;   // added per instruction, µs
  int64_t samples = 0;    // instructions fitted
  double mean_abs_error_before = 0;  // mean |predicted - measured| / measured, uncorrected
  double mean_abs_error_after = 0;   // the same, corrected

  friend bool operator==(const OpCorrection&, const OpCorrection&) = default;
};

struct LinkCorrection {
  bool fitted = false;
  double latency_us = 0;
  double bandwidth_gb_per_s = 0;  // 1e9 bytes/s, the plan's (fp16) bytes
  int64_t samples = 0;

  friend bool operator==(const LinkCorrection&, const LinkCorrection&) = default;
};

struct Calibration {
  std::string source;  // what it was fitted from (trace folders, iterations)
  std::vector<OpCorrection> ops;
  LinkCorrection link;

  friend bool operator==(const Calibration&, const Calibration&) = default;
};

struct FitOptions {
  std::vector<int64_t> iterations;  // trace iterations to fit on; empty: every one with a plan
  bool fit_link = true;
};

// `plans[k]` is the plan iteration k of the trace ran. Errors: fewer plans than the iterations
// asked for, a rank or iteration whose ops are not its program's instructions (naming the file
// and the event), a trace that is not sluice's.
StatusOr<Calibration> FitCalibration(const Analysis& analysis,
                                     const std::vector<ExecutionPlan>& plans,
                                     const FitOptions& options);

// Rewrites durations (and links) of `plan`. Stages or ops without a correction keep theirs.
void ApplyCalibration(const Calibration& calibration, ExecutionPlan* plan);

std::string CalibrationToJson(const Calibration& calibration);
StatusOr<Calibration> CalibrationFromJson(std::string_view text, std::string_view source);
StatusOr<Calibration> ReadCalibrationFile(const std::string& path);

// Measured iteration time (ns) of each iteration of the analysed trace: first start to last end
// over every rank's ops of that iteration; [iteration], -1 when some rank has none.
std::vector<int64_t> MeasuredIterationTimes(const Analysis& analysis);

}  // namespace sluice::trace
