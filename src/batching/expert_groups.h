// Expert parallelism pairs the all-to-alls of the ep consecutive data-parallel replicas of a
// group one by one (plan/lower.h), so the replicas of a group must run the same number of
// micro-batches. Batching methods balance replicas by time or tokens, not by count, so their
// counts often differ by one or two.
//
// EqualizeExpertGroups, after batching, per group, in passes until the counts agree:
//  1. a member below the group's largest count splits micro-batches: each time the one with the
//     most rows (ties: the most samples, then the longest bottleneck) into its first ceil(m/2)
//     and its last floor(m/2) rows, or, for a single row of several samples (a packed row), into
//     a row of its first ceil(n/2) samples and a row of the rest; both halves are priced anew
//     (PriceMicroBatch) and take the whole one's place, first half first. A half holds a subset
//     of the whole one's rows or samples, so its activations are no larger;
//  2. a member left two or more below (its micro-batches hold one sample each) takes the
//     micro-batch with the shortest bottleneck of the fullest member that keeps both within the
//     memory rule (SequenceFitsMemory), at the end of its order;
//  3. else every member at the largest count loses one micro-batch: of its (and another
//     member's) 64 micro-batches with the shortest bottlenecks, the pair of the same varlen and cp
//     class whose merge adds the least bottleneck time and keeps both replicas within the memory
//     rule, its own pairs first, then one of its micro-batches merged into another member's (its
//     samples move to that replica); the merge runs at the higher recompute level of the two.
// The schedule and the lowering check the memory rule again afterwards. A split or merged
// micro-batch of per-micro-batch cp is priced whole (cp_split 1).
//
// Thread safety: pure function.
#pragma once

#include <cstdint>
#include <span>

#include "base/status.h"
#include "batching/micro_batch.h"
#include "batching/stage_cost.h"

namespace sluice {

// Returns the number of splits, moves and merges made (0 when ep <= 1 or the counts already
// agree). Errors (FailedPrecondition; the planner makes them the batch's out-of-memory outcome):
// no micro-batch of a replica merges or moves within the memory limit (naming the group, the
// replicas and their counts); the cost model cannot price a half (naming the micro-batch).
// REQUIRES: plan->outcome == kOk, ep divides the replica count.
StatusOr<int64_t> EqualizeExpertGroups(BatchPlan* plan, std::span<const Sample> batch,
                                       const StageCostEvaluator& eval, int64_t ep);

}  // namespace sluice
