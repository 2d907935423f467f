#include "passes/gradient_bucketing.h"

#include <fmt/core.h>

#include <utility>
#include <vector>

#include "cost/comm_model.h"

namespace sluice::passes {
namespace {

bool IsReduction(OpKind op) {
  return op == OpKind::kAllReduceGrad || op == OpKind::kReduceScatterGrad;
}

}  // namespace

std::string BucketGradientsPass::Describe() const {
  return fmt::format("bucket({})", FormatBytes(bucket_bytes_));
}

StatusOr<PassRecord> BucketGradientsPass::Run(ExecutionPlan* plan) const {
  if (bucket_bytes_.count() <= 0) {
    return InvalidArgumentError(
        fmt::format("bucket pass: bucket_bytes {} must be positive", bucket_bytes_.count()));
  }
  PassRecord record;
  record.pass = Describe();
  const AlphaBetaCommModel comm(plan->cluster);
  for (RankProgram& program : plan->ranks) {
    // The lowering's ring (dp * cp members).
    const CollectiveRing ring = GradientRing(plan->cluster, plan->parallel, program.pp_index);
    std::vector<Instruction> out;
    std::vector<Instruction> gathers;  // the new all-gathers, in bucket order
    out.reserve(program.instructions.size());
    int64_t next_bucket = 0;
    const std::vector<Instruction>& in = program.instructions;
    for (size_t i = 0; i < in.size();) {
      if (in[i].op == OpKind::kAllGatherParams) {  // rebuilt from the reductions below
        ++i;
        continue;
      }
      if (!IsReduction(in[i].op)) {
        out.push_back(in[i++]);
        continue;
      }
      // One run: consecutive reductions of one stage.
      const Instruction first = in[i];
      int64_t total = 0, old_count = 0;
      for (; i < in.size() && IsReduction(in[i].op) && in[i].stage == first.stage; ++i) {
        total += in[i].bytes.count();
        ++old_count;
      }
      const int64_t cap = bucket_bytes_.count();
      const int64_t n = total <= 0 ? 1 : (total + cap - 1) / cap;
      const bool zero2 = first.op == OpKind::kReduceScatterGrad;
      for (int64_t k = 0; k < n; ++k) {
        Instruction r;
        r.op = first.op;
        r.stage = first.stage;
        r.bucket = next_bucket++;
        r.bytes = Bytes::Of(total / n + (k < total % n ? 1 : 0));
        r.duration =
            comm.Collective(zero2 ? CollectiveKind::kReduceScatter : CollectiveKind::kAllReduce,
                            r.bytes, ring);
        out.push_back(r);
        if (zero2) {
          r.op = OpKind::kAllGatherParams;
          r.duration = comm.Collective(CollectiveKind::kAllGather, r.bytes, ring);
          gathers.push_back(r);
        }
      }
      if (n != old_count) {
        record.changes.push_back(fmt::format("rank {} stage {}: {} buckets -> {}", program.rank,
                                             first.stage, old_count, n));
      }
    }
    // The all-gathers follow OptimizerStep, which ends the rest of the program.
    for (Instruction& g : gathers) out.push_back(std::move(g));
    if (out != program.instructions) record.changed = true;
    program.instructions = std::move(out);
  }
  return record;
}

}  // namespace sluice::passes
