// ValidatePlan: the proof that an ExecutionPlan can run, run on every plan the planner emits and
// by `sluice plan check FILE`.
//
// Checks, in this order (the first failure is reported):
//  1. Structure: dp * pp programs with the right ids, one replica per dp index, micro-batches
//     with mbs rows and pp*vpp stage costs, shapes the model accepts (CheckPlanFitsModel:
//     sequence lengths within max_position), model states per pipeline rank, and no program that
//     declares more buffer slots than it allocates (slot ids are dense: 0 .. buffer_slots-1, so
//     nothing sized by buffer_slots can outgrow the program).
//  2. Samples: every sample id of the global batch is in exactly one row of one micro-batch or in
//     `dropped`, and no row holds a sample outside the batch.
//  3. Fields: every instruction's micro-batch, stage (on this rank), peer (the neighbour stage's
//     rank), tag (MessageTag), slots, tensor shapes (derived from the micro-batch's padded shape)
//     and byte counts are what its op requires; every slot id below buffer_slots is allocated.
//  4. Matching: between every pair of ranks, the k-th message one posts is the k-th the other
//     posts, with the same tag and shapes; every DP group posts identical collectives.
//  5. Per rank, in order: each micro-batch's F precedes its B (or I, then W) on each stage, and
//     every stage of the rank runs every micro-batch exactly once; a compute reads exactly the
//     buffers it needs and they hold the right tensors (received ones finished); every Start has
//     one later Finish; every slot is allocated before use, not overwritten while live, freed
//     once (not while a transfer uses it) and free at the end; reductions follow the stage's last
//     backward, and with dp * cp > 1 every stage is reduced before OptimizerStep, which comes once,
//     after all compute, followed only by all-gathers that match the reduce-scatters.
//  6. Deadlock: the static replay of all ranks' communication finishes (comm_replay.h).
//  7. Memory: on every rank, the plan's memory rule (plan/memory_rule.h) never exceeds the memory
//     limit: model states + activations (the recorded per-stage costs in program order,
//     EstimateSchedule's rule: F needs current + peak and then keeps `stored`; B and I need
//     current + max(0, peak - stored), then B frees `stored`, I all but `stored_until_w`, W the
//     rest) + every live buffer slot (fp16 boundary tensors, int64 token ids and labels, from the
//     instruction that allocates it to its free-buffer; a forward's stage input counted once,
//     inside its stored activations). The one memory rule: the planner rejects a lowered plan
//     that breaks it as out-of-memory, and the simulator's memory level is this rule's level on
//     its compute stream's time axis, so a plan that passes check 7 never runs out of memory in
//     the simulator and its simulated peak is PredictPeakMemory (docs/simulator.md, "Memory").
//
// A failure tied to an instruction prints, after the message, the step x rank grid of that rank's
// replica around it (PyTorch's _format_pipeline_order) with "<-- ERROR HERE".
//
// Thread safety: pure functions.
#pragma once

#include <cstdint>
#include <optional>
#include <string>
#include <vector>

#include "base/status.h"
#include "base/units.h"
#include "plan/execution_plan.h"
#include "plan/memory_rule.h"

namespace sluice {

struct ValidateOptions {
  bool check_memory = true;  // check 7 (off: a plan for a larger device may be inspected)
  int64_t grid_context = 6;  // steps printed before and after the failing one
};

// OK, or InvalidArgument naming the rank, the instruction and the problem, plus the grid.
Status ValidatePlan(const ExecutionPlan& plan, const ValidateOptions& options = {});

// ValidatePlan for a plan of which only rank `rank`'s program was rewritten from `original`
// (same header fields), REQUIRES: the plan with `original` in place passes ValidatePlan(plan,
// options). Gives exactly ValidatePlan(plan, options)'s result (ok, or the same error), checking
// only what the rewrite can change: the structure (cheap), the rank's fields, buffer order and
// memory, and the cross-rank communication replay only when the rank's sequence of
// communication ops differs from `original`'s (kinds, peers, tags, shapes, groups, collectives,
// and which post each wait waits for; compute ops moved between them change nothing there). The
// other ranks, the samples and the replay passed before and cannot have changed. Used by the
// passes (passes/pass.h, KeepIfValid): the plan optimizer validates thousands of candidates.
Status ValidateRankRewrite(const ExecutionPlan& plan, int64_t rank, const RankProgram& original,
                           const ValidateOptions& options = {});

// Part of check 1, also run by the simulator before anything is sized: every micro-batch's
// lengths (seqlen, and dec_seqlen of encoder-decoder models) are within the model's max_position
// unless it is varlen (positions restart at each sample of a varlen row, so the row may be
// longer), and it holds at most kMaxMicroBatchTokens tokens. InvalidArgument "plan
// check: replica D micro-batch I: ..." naming the shape, the limit and the model otherwise.
Status CheckPlanFitsModel(const ExecutionPlan& plan);
// The most tokens (mbs x (seqlen + dec_seqlen)) one micro-batch may hold: 2^26, far above any
// shape a planner makes for a real device (DynaPipe's largest are ~2^17), and small enough that
// the runtime's per-token tensors stay below a few GB.
inline constexpr int64_t kMaxMicroBatchTokens = int64_t{1} << 26;

// Predicted peak memory of each rank (check 7's rule, plan/memory_rule.h), by rank id; with
// options.count_buffers = false model states + activations only.
// REQUIRES: the plan passes checks 1-3.
std::vector<Bytes> PredictPeakMemory(const ExecutionPlan& plan,
                                     const MemoryRuleOptions& options = {});

// Check 7 alone: the first rank (in rank order) whose memory rule exceeds the plan's limit, the
// instruction whose change put it over (-1: its model states alone) and a message with the level
// and its parts. REQUIRES: the plan passes checks 1-3.
struct MemoryProblem {
  int64_t rank = 0;
  int64_t instruction = -1;
  std::string message;
};
std::optional<MemoryProblem> CheckPlanMemory(const ExecutionPlan& plan);

// The grid of replica `dp_index` (one column per pipeline rank, one row per instruction index)
// for steps [error_step - context, error_step + context], marking `error_step` of `rank`.
std::string FormatPlanGrid(const ExecutionPlan& plan, int64_t dp_index, int64_t rank,
                           int64_t error_step, int64_t context);

}  // namespace sluice
