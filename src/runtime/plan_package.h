// PlanPackage: what rank 0 hands every rank per iteration through the rendezvous store, and the
// check that a plan fits the job that is running.
//
// A package is one iteration's validated ExecutionPlan (as MessagePack, plan/plan_json.h) plus
// the lengths of its samples (after clipping; any rank can then materialise the tokens), or a
// marker that the data is exhausted, or the error that stopped planning. Encoding, little-endian:
//   "SLPK" u8:version(1) u8:kind(0 plan, 1 end, 2 error) i64:iteration i64:batch_index
//   i64:n_samples { i64:id i64:input_len i64:target_len }*n  i64:len bytes[len]
// where the trailing bytes are the plan's MessagePack (kind 0) or the UTF-8 error (kind 2).
// Every rank hashes the bytes it received (FNV-1a 64, layout.h) and compares the hash rank 0
// published beside them.
//
// Thread safety: value types and pure functions.
#pragma once

#include <cstdint>
#include <span>
#include <string>
#include <string_view>
#include <vector>

#include "base/status.h"
#include "data/sample.h"
#include "model/model_spec.h"
#include "model/parallel_config.h"
#include "plan/execution_plan.h"

namespace sluice::runtime {

enum class PackageKind : uint8_t { kPlan = 0, kEnd = 1, kError = 2 };

struct PlanPackage {
  PackageKind kind = PackageKind::kPlan;
  int64_t iteration = 0;      // position in this training run, 0, 1, ...
  int64_t batch_index = 0;    // the GlobalBatch index the plan was made for
  std::vector<Sample> samples;  // the batch's samples, clipped lengths (task is not carried)
  ExecutionPlan plan;           // kPlan only
  std::string error;            // kError only

  friend bool operator==(const PlanPackage&, const PlanPackage&) = default;
};

std::vector<uint8_t> EncodePackage(const PlanPackage& package);
// Errors name `source` and what is malformed (magic, version, kind, truncation, the plan).
StatusOr<PlanPackage> DecodePackage(std::span<const uint8_t> bytes, std::string_view source);

// What the running job is: the plan must match it field by field.
struct JobConfig {
  ModelSpec model;
  ParallelConfig parallel;
  int64_t world_size = 1;  // processes in the job
};

// InvalidArgument naming the first field of `plan` that differs from `job`
// ("<source>: field 'model.layers': the plan has 6, this run has 4"), or a world size that is
// not dp * pp * tp * cp of the plan. Compares every ModelSpec field and dp, pp, tp, ep, vpp,
// zero, cp (the memory limit is the planner's business).
Status CheckPlanMatches(const ExecutionPlan& plan, const JobConfig& job, std::string_view source);

}  // namespace sluice::runtime
