// Calibration: corrections to the cost model a plan trusted, fitted from traces of runs of known
// plans, so that `sluice simulate --calibration FILE` prices any plan of the same model, stages
// and machine closer to what runs (docs/trace.md, format "sluice-calibration/2" in
// docs/formats.md; "/1" files are still read).
//
// Fit. The trace of `sluice train --plan P0 P1 ...` runs plan k as iteration k; each rank's ops of
// iteration k are its program's instructions in order (checked by their text: a trace of another
// plan is an error naming the rank, the iteration and the event). For every compute instruction
// (forward, backward, backward-input, backward-weight, optimizer step, load) the measured cost is
// its own time plus the host time since the rank's previous such op that the simulator does not
// model (gaps, frees, posts, and waits once their transfer was done; never the blocked part).
// Per (virtual stage, op) the measured cost is fitted as a line on the cost model's own features
// of the instruction (OpFeatures: a constant, the plan's predicted duration, the micro-batch's
// padded tokens, its attention work, its rows and its tokens recomputed in full) by robust
// non-negative least squares: Huber weights re-fitted until they settle (outlying instructions, e.g. one preempted by another
// process, weigh less), every subset of the features tried with non-negative coefficients, and
// the subset with the least BIC kept (a feature is kept only when it explains more than the noise
// it adds). The all-stage entry of each op (used for stages the trace lacks) fits a constant and
// the prediction only. Transfers give a link: wire time = latency + plan bytes / bandwidth (a
// robust line: the slope between the medians of the two halves by size, the latency the median of
// the rest; a bandwidth of 1e6 GB/s when times do not grow with size) over the matched messages
// (the transfer hubs of graph.h) that some side waited for (for the others the trace bounds the
// arrival only from above). Last, what the simulator still leaves out per iteration: every fitted
// plan is simulated with the op and link corrections, and the median of measured - simulated
// iteration time becomes `iteration.offset_us`.
// Apply. Each fitted instruction's duration becomes its (stage, op) line at its features; with a
// link fitted, the plan's cluster links take its latency and bandwidth; the iteration offset is
// added to every rank's optimizer step (the op that ends each rank's iteration; a negative offset
// shortens it, never below 0).
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

// The features of one fitted instruction, from its plan: what the cost model prices it by.
struct OpFeatures {
  double predicted_ns = 0;  // the plan's duration
  double tokens = 0;        // padded tokens of its micro-batch: mbs x (seqlen + dec_seqlen)
  double attention = 0;     // attention work, token pairs: mbs x (seqlen^2 + dec_seqlen^2 +
                            // seqlen x dec_seqlen); the runtime attends over the padded rows
  double rows = 0;          // mbs
  // tokens when the instruction recomputes its forward in full (a forward that keeps only its
  // input, or the backward that reruns it), else 0: what recompute costs the runtime beyond what
  // the plan's duration says. Identifiable only from traces with both levels (docs/trace.md).
  double recomputed_tokens = 0;
};
// The features of `in` (an instruction of `plan`); a zero micro-batch part when it has none
// (optimizer step) or names none of the plan's.
OpFeatures FeaturesOf(const ExecutionPlan& plan, const RankProgram& program, const Instruction& in);

// measured ns = offset_us x 1e3 + scale x predicted_ns + per_token_ns x tokens +
//               per_attention_ns x attention + per_row_us x 1e3 x rows +
//               per_recomputed_token_ns x recomputed_tokens. Every coefficient >= 0.
// A "/1" file's entries have only the first two.
struct OpCorrection {
  int64_t stage = -1;     // virtual stage; -1: any stage without its own entry
  std::string op;         // OpKindName: "forward", "backward", ..., "optimizer-step"
  double scale = 1.0;     // per predicted ns
  double offset_us = 0;   // added per instruction, µs
  int64_t samples = 0;    // instructions fitted
  double mean_abs_error_before = 0;  // mean |predicted - measured| / measured, uncorrected
  double mean_abs_error_after = 0;   // the same, corrected
  double per_token_ns = 0;
  double per_attention_ns = 0;  // per token pair
  double per_row_us = 0;
  double per_recomputed_token_ns = 0;  // absent (0) in files written before it existed

  // The corrected duration (ns, >= 0) of an instruction with these features.
  double Predict(const OpFeatures& f) const;
  // The line as text, its nonzero terms only: "2.31 x plan + 410.0 us + 0.52 ns/token".
  std::string Describe() const;

  friend bool operator==(const OpCorrection&, const OpCorrection&) = default;
};

// One fitted instruction: its features and its measured cost.
struct OpSample {
  OpFeatures features;
  double measured_ns = 0;
};

enum class OpLine {
  kFeatures,        // robust non-negative fit on every feature, the subset chosen by BIC
  kPredictionOnly,  // the same on the constant and the prediction (the all-stage entries)
  kScale,           // "/1": scale x predicted + offset by plain least squares
};

// The per-(stage, op) fit FitCalibration makes (see the top of this file), with its errors
// before and after. REQUIRES: !samples.empty().
OpCorrection FitOpLine(const std::vector<OpSample>& samples, OpLine line);

// What the simulator leaves out per iteration after the op and link corrections.
struct IterationCorrection {
  double offset_us = 0;  // median measured - simulated iteration time (may be negative)
  int64_t samples = 0;   // iterations it was fitted on; 0: none (not fitted, or a "/1" file)

  friend bool operator==(const IterationCorrection&, const IterationCorrection&) = default;
};

struct LinkCorrection {
  bool fitted = false;
  double latency_us = 0;
  double bandwidth_gb_per_s = 0;  // 1e9 bytes/s, the plan's (fp16) bytes
  int64_t samples = 0;

  friend bool operator==(const LinkCorrection&, const LinkCorrection&) = default;
};

// Peak memory of one pipeline rank: measured peak = the simulated peak with the rank's model
// states raised by offset_bytes (framework and workspace memory the simulator does not count; may
// be negative, never below zero states) and its stages' activations (stored, transient peak,
// kept until W) scaled by activation_scale. Applied to a plan, so every consumer (simulate's
// out-of-memory check, plan, train's prediction) prices memory with it.
struct MemoryCorrection {
  int64_t pp_rank = 0;
  double offset_bytes = 0;
  double activation_scale = 1.0;  // > 0
  int64_t samples = 0;            // (iteration, rank) peaks fitted
  double mean_abs_error_before = 0;
  double mean_abs_error_after = 0;

  friend bool operator==(const MemoryCorrection&, const MemoryCorrection&) = default;
};

struct Calibration {
  std::string source;  // what it was fitted from (trace folders, iterations)
  std::vector<OpCorrection> ops;
  LinkCorrection link;
  IterationCorrection iteration;
  std::vector<MemoryCorrection> memory;  // per pipeline rank fitted; empty: not fitted

  friend bool operator==(const Calibration&, const Calibration&) = default;
};

struct FitOptions {
  std::vector<int64_t> iterations;  // trace iterations to fit on; empty: every one with a plan
  bool fit_link = true;
  bool fit_features = true;   // false: the "/1" line, scale x predicted + offset, least squares
  bool fit_iteration = true;  // simulate the fitted plans for the iteration offset
  // Measured peak tensor bytes, [iteration][rank] (train --metrics' peak_tensor_bytes_by_rank;
  // an entry < 0 or a missing iteration: not measured). Empty: no memory fit.
  std::vector<std::vector<int64_t>> peak_bytes;
  // Out, when not null: the time of the MoE all-to-alls that ran inside whole compute ops of the
  // fitted iterations (summed over ranks), which the fit takes out of those ops' measured time.
  int64_t* nested_all_to_all_ns = nullptr;
};

// The memory fit (MemoryCorrection) of the plans of `iterations` against `peak_bytes`: per
// pipeline rank, each fitted plan is simulated with its activations x1 and x2 (the peak's
// activation part A and the rest R, exact while the peak's instant does not move), and
// measured - R = offset + scale x A fitted by least squares over the (iteration, rank) samples;
// a single sample, activations that hardly vary (coefficient of variation < 5%) or a scale <= 0
// keep the scale at 1 and fit the offset alone (the median). Ranks without samples get none.
StatusOr<std::vector<MemoryCorrection>> FitMemory(
    const std::vector<ExecutionPlan>& plans, const std::vector<int64_t>& iterations,
    const std::vector<std::vector<int64_t>>& peak_bytes);

// Rewrites `plan`'s model states of m.pp_rank and the activation bytes of its stages.
void ApplyMemoryCorrection(const MemoryCorrection& m, ExecutionPlan* plan);

// The simulated peak memory (bytes) of each rank of `plan`; an error when it does not simulate.
StatusOr<std::vector<int64_t>> SimulatedPeakBytes(const ExecutionPlan& plan);

// `plans[k]` is the plan iteration k of the trace ran. Errors: fewer plans than the iterations
// asked for, a rank or iteration whose ops are not its program's instructions (naming the file
// and the event), a trace that is not sluice's.
StatusOr<Calibration> FitCalibration(const Analysis& analysis,
                                     const std::vector<ExecutionPlan>& plans,
                                     const FitOptions& options);

// Whether a calibration fits and applies corrections to ops of this kind: compute ops (F, B, I,
// W), the optimizer step and input loads; transfers and collectives are priced by the links.
bool IsCalibratedOp(OpKind op);

// Rewrites durations (and links) of `plan`. Stages or ops without a correction keep theirs.
void ApplyCalibration(const Calibration& calibration, ExecutionPlan* plan);

// The calibration file (docs/formats.md, calibration_json.cc).
std::string CalibrationToJson(const Calibration& calibration);
StatusOr<Calibration> CalibrationFromJson(std::string_view text, std::string_view source);
StatusOr<Calibration> ReadCalibrationFile(const std::string& path);

// Measured iteration time (ns) of each iteration of the analysed trace: first start to last end
// over every rank's ops of that iteration; [iteration], -1 when some rank has none.
std::vector<int64_t> MeasuredIterationTimes(const Analysis& analysis);

}  // namespace sluice::trace
