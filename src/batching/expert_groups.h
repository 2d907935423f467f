// Expert parallelism pairs the all-to-alls of the ep consecutive data-parallel replicas of a
// group one by one (plan/lower.h), so the replicas of a group must run the same number of
// micro-batches. Batching methods balance replicas by time or tokens, not by count, so their
// counts often differ by one or two.
//
// EqualizeExpertGroups, after batching: every group's count becomes the largest of its members'
// counts, or, when a member holds fewer samples than that, its sample count. Below the count a
// replica splits micro-batches: each time the one with the most rows (ties: the most samples,
// then the longest bottleneck) into its first ceil(m/2) and its last floor(m/2) rows, or, for a
// single row of several samples (a packed row), into a row of its first ceil(n/2) samples and a
// row of the rest; both halves are priced anew (PriceMicroBatch) and take the whole one's place
// in the order, first half first. A half holds a subset of the whole one's rows or samples, so
// its activations are no larger. Above the count (only where a member has too few samples) a
// replica merges pairs: of its 64 micro-batches with the shortest bottlenecks, the two (of the
// same varlen and cp class) whose merge adds the least bottleneck time and keeps the replica
// within the memory rule (SequenceFitsMemory), at the higher recompute level of the two; where
// no own pair fits, one of its micro-batches merges into another member's (its samples move to
// that replica), chosen the same way. Splits come before merges. The
// schedule and the lowering check the memory rule again afterwards. A split or merged
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

// Returns the number of splits and merges made (0 when ep <= 1 or the counts already agree).
// Errors (FailedPrecondition): no pair of a replica's micro-batches merges within the memory
// limit (naming the group, the replica and both counts); the cost model cannot price a half
// (naming the micro-batch). REQUIRES: plan->outcome == kOk, ep divides the replica count.
StatusOr<int64_t> EqualizeExpertGroups(BatchPlan* plan, std::span<const Sample> batch,
                                       const StageCostEvaluator& eval, int64_t ep);

}  // namespace sluice
