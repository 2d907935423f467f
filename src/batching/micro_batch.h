// MicroBatch and BatchPlan: what a batching method decides for one global batch.
//
// A BatchPlan gives, per data-parallel replica, the ordered micro-batches it runs. A micro-batch
// is a list of rows (one sample per row unless the method packs several samples into a row) and
// the padded shape the runtime will allocate: mbs = rows x seqlen [x dec_seqlen]. Packed rows
// either attend across the whole row (Megatron/DeepSpeed packing: the cost is the padded shape)
// or per sample (`varlen`, flash-attention style: the cost follows each sample's own length).
// Each micro-batch carries the recomputation level chosen for it and its predicted per-stage
// times and memory, from the StageCostEvaluator all methods share.
//
// Invariants of a kOk plan (checked by ValidateBatchPlan): every sample of the global batch is in
// exactly one row of one micro-batch, or in `dropped` with a reason; shape.mbs == rows.size();
// padded lengths cover every row; per-stage vectors have pp entries; memory fits the rule of
// stage_cost.h on every replica.
//
// Thread safety: value types.
#pragma once

#include <cstdint>
#include <span>
#include <string>
#include <vector>

#include "base/status.h"
#include "base/units.h"
#include "cost/chunk_cost.h"
#include "cost/cost_model.h"
#include "data/sample.h"

namespace sluice {

class StageCostEvaluator;

// HiGHS-style outcome: infeasible is a result, not an error.
enum class PlanOutcome { kOk, kOutOfMemory };
std::string_view PlanOutcomeName(PlanOutcome outcome);  // "ok" | "out-of-memory"

struct MicroBatch {
  std::vector<std::vector<int64_t>> rows;  // sample ids per row
  LayerShape shape;                        // padded shape; shape.mbs == rows.size()
  bool varlen = false;                     // per-sample attention inside packed rows
  Recompute recompute = Recompute::kNone;
  // Predicted cost per pipeline stage (device), pp entries (cost/chunk_cost.h; stored_until_w
  // is 0 here: a schedule sets it per virtual stage).
  std::vector<ChunkCost> stages;
  int64_t real_tokens = 0;                 // sum of the samples' tokens (after clipping)
  int64_t padded_tokens = 0;               // tokens the shape allocates (enc + dec)
  // Per-micro-batch context parallelism (dynamic_cp.h): the samples run in cp_split sub-groups
  // of cp / cp_split devices each, side by side; `stages` are then the sub-groups' maximum.
  int64_t cp_split = 1;
  // gbpc packs (megatron_gbp.h): the cp class of its samples, Megatron's per-sample cp (0: none).
  int64_t cp_class = 0;

  int64_t num_samples() const;
  // max over stages of forward + backward.
  Duration Bottleneck() const;
  // Fraction of allocated tokens that are padding, in [0, 1].
  double PaddingFraction() const;

  friend bool operator==(const MicroBatch&, const MicroBatch&) = default;
};

// A sample of the global batch that a method left out of every micro-batch, with the reason.
// (Length drops before batching are the data layer's DroppedSample, data/global_batcher.h.)
struct UnplacedSample {
  int64_t id = 0;
  std::string reason;  // e.g. "longer than the 2048-token rows of this packing"

  friend bool operator==(const UnplacedSample&, const UnplacedSample&) = default;
};

struct BatchPlan {
  PlanOutcome outcome = PlanOutcome::kOk;
  std::string infeasible_reason;                     // set when outcome != kOk
  std::vector<std::vector<MicroBatch>> replicas;     // [dp][order]
  std::vector<UnplacedSample> dropped;
  std::string method;                                // the method that produced it

  friend bool operator==(const BatchPlan&, const BatchPlan&) = default;
};

// Finds a global batch's samples by id (ids need not be dense or sorted). Immutable once built.
class BatchIndex {
 public:
  explicit BatchIndex(std::span<const Sample> batch);
  // REQUIRES: Contains(id).
  const Sample& operator()(int64_t id) const;
  bool Contains(int64_t id) const;
  std::span<const Sample> samples() const { return batch_; }

 private:
  std::span<const Sample> batch_;
  std::vector<std::pair<int64_t, int64_t>> by_id_;  // (id, position), sorted by id
};

// Fills a micro-batch's shape, times, memory and token counts from its rows, `varlen` and
// `recompute`, using the evaluator (padded: max lengths rounded up to the pad multiple; varlen:
// per-sample quadratic fits). Returns false when the cost model cannot answer for that shape.
bool PriceMicroBatch(const StageCostEvaluator& eval, const BatchIndex& index, MicroBatch* mb);

// Predicted time of one replica's micro-batches under 1F1B with pp stages:
// sum of bottleneck-stage times + (pp - 1) * max (DynaPipe's and Hydraulis' estimate).
Duration PredictReplicaTime(std::span<const MicroBatch> micro_batches, int64_t pp);

// Checks the invariants above against the global batch; the message names the replica,
// micro-batch and sample.
Status ValidateBatchPlan(const BatchPlan& plan, std::span<const Sample> batch,
                         const StageCostEvaluator& eval);

}  // namespace sluice
