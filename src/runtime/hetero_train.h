// Heterogeneous replicas in the runtime (`sluice train --replicas`, issue 16): one job's
// processes split into replica groups of different shapes (model/hetero_config.h), each running
// its own group plan, with the gradients synchronised across groups whose layers are cut
// differently.
//
// Processes: group g's processes follow the groups before it (HeteroConfig::DeviceOffsets, tp =
// 1: one process per device); inside a group they follow the homogeneous placement (comm.h:
// offset + plan rank * cp + cp index). Each group has its own Communicator (RankPlacement with
// the group's offset and a group prefix on its process-group names), ModelShard (the group's pp
// cut) and executor; the transfers and the in-group reductions (dp x cp, embedding copies) are
// the group plan's own.
//
// Planning: rank 0 runs the HeteroPlanner (planner/hetero.h) on each global batch: Hydraulis'
// stage 1 routes every sequence to a replica (long ones to the replicas that can hold them),
// then each group plans its sequences. Rank 0 publishes one package per group (plan_service.h,
// PlanKey(i, g)); a group's package holds its plan and every sample of the global batch, and
// each group normalises its loss by the labels of the whole global batch (GlobalBatchLabels),
// so the groups' losses and gradients add up to the single-process full-batch ones.
//
// Cross-group gradient synchronisation (CrossGroupSync), after each group's own reductions and
// before the optimizer step: every process publishes the names of the parameters it holds; for
// each parameter, its holders are the processes of every group holding it (parameter names are
// global, model.h, so a layer cut into stage 1 of a pp 2 group and stage 0 of a pp 1 group has
// the same names on both). Parameters with the same holders form one reduction group (the
// runtime form of planner/hetero.h's per-layer-range ReductionGroup, the word embedding's copies
// included); holders that all lie in one group need nothing more. Each holder contributes its
// gradient divided by the number of holders in its own group (after the group's reductions they
// all hold the group's sum), and one all-reduce over the holders gives every holder the sum over
// the groups: the gradient of the global batch's mean token loss.
//
// Thread safety: one thread (the trainer's).
#pragma once

#include <cstdint>
#include <memory>
#include <span>
#include <string>
#include <vector>

#include "base/status.h"
#include "data/sample.h"
#include "model/hetero_config.h"
#include "model/model_spec.h"
#include "runtime/comm.h"
#include "runtime/model.h"
#include "runtime/trainer.h"

namespace sluice::runtime {

// The replica group of process `rank` and its first process. REQUIRES: tp = 1 in every group,
// 0 <= rank < config.devices().
struct GroupOf {
  int64_t group = 0;
  int64_t offset = 0;
};
GroupOf ProcessGroupOf(const HeteroConfig& config, int64_t rank);

// The package dump of group `group` (`--dump-dir`, written by the group's first process):
// "iter-3.group-1.package".
std::string GroupPackageDumpName(int64_t iteration, int64_t group);

// Labels of every sample (the loss normaliser of every group).
int64_t GlobalBatchLabels(const ModelSpec& model, std::span<const Sample> samples);

class CrossGroupSync {
 public:
  // Collective over every process of the job (each calls it once, after its Communicator and
  // before the first iteration): publishes this process's parameter names under `key_prefix`,
  // reads every process's, and creates the reduction groups this process is in.
  static StatusOr<std::unique_ptr<CrossGroupSync>> Create(Communicator* comm, Watchdog* watchdog,
                                                          const ModelShard& shard,
                                                          const HeteroConfig& config);
  // Sums the gradients over the groups (see the file comment). Call after the group's own
  // reductions, before the optimizer step.
  Status Run(int64_t iteration);
  // Reduction groups this process takes part in.
  int64_t groups() const { return static_cast<int64_t>(mine_.size()); }

 private:
  struct Reduction {
    std::string name;
    std::vector<int64_t> members;             // global ranks, ascending
    std::vector<at::Tensor> params;           // this process's, in name order
    double weight = 1;                        // 1 / holders in this process's group
    c10::intrusive_ptr<c10d::ProcessGroup> pg;
  };
  CrossGroupSync() = default;
  Communicator* comm_ = nullptr;
  Watchdog* watchdog_ = nullptr;
  std::vector<Reduction> mine_;
};

}  // namespace sluice::runtime
