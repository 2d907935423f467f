#include "planner/optimizer_candidates.h"

#include <algorithm>
#include <string_view>
#include <set>
#include <utility>

#include "passes/gradient_bucketing.h"
#include "passes/reorder.h"

namespace sluice {
namespace {

using Candidate = std::shared_ptr<const passes::PlanPass>;

// Index of `position` in the rank's compute ops, or -1.
int64_t ComputeOrdinal(const std::vector<int64_t>& computes, int64_t position) {
  const auto it = std::lower_bound(computes.begin(), computes.end(), position);
  return it != computes.end() && *it == position ? it - computes.begin() : -1;
}

// The Start of rank `rank` with tag `tag` and the given op, or -1.
int64_t FindStart(const RankProgram& p, OpKind op, int64_t tag) {
  for (size_t i = 0; i < p.instructions.size(); ++i) {
    if (p.instructions[i].op == op && p.instructions[i].tag == tag) return static_cast<int64_t>(i);
  }
  return -1;
}

OpKind PeerStartOf(OpKind op) {
  switch (op) {
    case OpKind::kSendActStart:
      return OpKind::kRecvActStart;
    case OpKind::kRecvActStart:
      return OpKind::kSendActStart;
    case OpKind::kSendGradStart:
      return OpKind::kRecvGradStart;
    default:
      return OpKind::kSendGradStart;
  }
}

// Hoists of the Start at (rank, i): by one, and to before the nearest Finish or compute op
// before it.
void AddHoists(const ExecutionPlan& plan, int64_t rank, int64_t i, std::vector<Candidate>* out) {
  if (i <= 0) return;
  out->push_back(std::make_shared<passes::HoistStartPass>(rank, i, 1));
  const std::vector<Instruction>& p = plan.ranks[rank].instructions;
  for (int64_t j = i - 1; j >= 0; --j) {
    if (IsCommFinish(p[j].op) || IsCompute(p[j].op)) {
      if (i - j > 1) out->push_back(std::make_shared<passes::HoistStartPass>(rank, i, i - j));
      break;
    }
  }
}

// Candidates from the critical path of `sim` (see the header), without duplicates.
}  // namespace

std::vector<Candidate> CriticalPathCandidates(const ExecutionPlan& plan, const SimResult& sim,
                                  const std::shared_ptr<const passes::RecomputePricer>& pricer) {
  std::vector<Candidate> all;
  bool collective = false;
  std::vector<std::vector<int64_t>> computes(plan.ranks.size());
  for (size_t r = 0; r < plan.ranks.size(); ++r) {
    computes[r] = passes::ComputePositions(plan.ranks[r]);
  }
  for (const SimInterval& iv : sim.critical_path) {
    const RankProgram& program = plan.ranks[iv.rank];
    const Instruction& in = program.instructions[iv.instruction];
    if (IsCompute(in.op)) {
      const std::vector<int64_t>& c = computes[iv.rank];
      const int64_t k = ComputeOrdinal(c, iv.instruction);
      const int64_t n = static_cast<int64_t>(c.size());
      if (k > 0) all.push_back(std::make_shared<passes::MoveComputePass>(iv.rank, k, k - 1));
      if (k + 1 < n) all.push_back(std::make_shared<passes::MoveComputePass>(iv.rank, k, k + 1));
      if (pricer != nullptr && in.op != OpKind::kBackwardWeight &&
          in.recompute != Recompute::kNone) {
        all.push_back(std::make_shared<passes::RecomputePass>(
            pricer, program.dp_index, in.microbatch, in.stage, Recompute::kNone));
        if (in.recompute == Recompute::kFull) {
          all.push_back(std::make_shared<passes::RecomputePass>(
              pricer, program.dp_index, in.microbatch, in.stage, Recompute::kSelective));
        }
      }
      for (int64_t j = k + 1; j < n; ++j) {  // the rank's next W, to just before this op
        if (program.instructions[c[j]].op == OpKind::kBackwardWeight) {
          all.push_back(std::make_shared<passes::MoveComputePass>(iv.rank, j, k));
          break;
        }
      }
    } else if (IsCommStart(in.op)) {
      AddHoists(plan, iv.rank, iv.instruction, &all);
      const int64_t peer = FindStart(plan.ranks[in.peer], PeerStartOf(in.op), in.tag);
      if (peer >= 0) AddHoists(plan, in.peer, peer, &all);
    } else if (IsCollective(in.op)) {
      collective = true;
    }
  }
  if (collective) {
    Bytes largest;
    for (const RankProgram& p : plan.ranks) {
      for (const Instruction& in : p.instructions) {
        if (IsCollective(in.op)) largest = std::max(largest, in.bytes);
      }
    }
    if (largest.count() > 1) {
      all.push_back(std::make_shared<passes::BucketGradientsPass>(Bytes::Of(largest.count() * 2)));
      all.push_back(std::make_shared<passes::BucketGradientsPass>(Bytes::Of(largest.count() / 2)));
    }
  }
  std::vector<Candidate> unique;
  std::set<std::string> seen;
  for (Candidate& c : all) {
    if (seen.insert(c->Describe()).second) unique.push_back(std::move(c));
  }
  return unique;
}

// The replica that holds most of the compute time on `sim`'s critical path, or -1.
int64_t CriticalReplica(const ExecutionPlan& plan, const SimResult& sim) {
  std::vector<int64_t> ns(static_cast<size_t>(plan.dp()), 0);
  for (const SimInterval& iv : sim.critical_path) {
    const Instruction& in = plan.ranks[iv.rank].instructions[iv.instruction];
    if (IsCompute(in.op)) ns[plan.ranks[iv.rank].dp_index] += (iv.end - iv.start).nanos();
  }
  int64_t best = -1;
  for (int64_t d = 0; d < plan.dp(); ++d) {
    if (ns[d] > 0 && (best < 0 || ns[d] > ns[best])) best = d;
  }
  return best;
}

size_t DrawCandidate(CandidateDraw draw, const std::vector<std::string>& kinds,
                     const OptimizeResult& result, Duration current, int64_t ranks, Rng* rng) {
  if (draw == CandidateDraw::kUniform || kinds.size() < 2) {
    return static_cast<size_t>(rng->UniformInt(0, static_cast<int64_t>(kinds.size()) - 1));
  }
  std::vector<std::string_view> distinct;
  std::vector<double> weight;
  std::vector<int64_t> count;
  for (const std::string& k : kinds) {
    const auto at = std::find(distinct.begin(), distinct.end(), k);
    if (at != distinct.end()) {
      ++count[static_cast<size_t>(at - distinct.begin())];
      continue;
    }
    distinct.push_back(k);
    count.push_back(1);
    // The simulated time a kind saved per simulation its candidates cost (a refused one: the
    // validation of one rank), after a prior of one simulation that saves a thousandth of the
    // current plan's time. Counted, not timed: the clock would make the draw, and so the plan,
    // depend on the machine's speed (a seed must give the same plan).
    const double prior_gain = 1e-3 * static_cast<double>(current.nanos());
    double gain = 0, cost = 1;
    for (const CandidateKindStats& st : result.kinds) {
      if (st.kind == k) {
        gain = static_cast<double>(std::max<int64_t>(st.gain.nanos(), 0));
        cost += static_cast<double>(st.simulated) +
                static_cast<double>(st.tried - st.simulated) / static_cast<double>(ranks);
      }
    }
    weight.push_back((gain + prior_gain) / cost);
  }
  double total = 0;
  for (double w : weight) total += w;
  double x = rng->Uniform01() * total;
  size_t kind = distinct.size() - 1;
  for (size_t i = 0; i < distinct.size(); ++i) {
    if (x < weight[i]) {
      kind = i;
      break;
    }
    x -= weight[i];
  }
  int64_t nth = rng->UniformInt(0, count[kind] - 1);
  for (size_t i = 0; i < kinds.size(); ++i) {
    if (kinds[i] == distinct[kind] && nth-- == 0) return i;
  }
  return kinds.size() - 1;  // not reached: count[kind] candidates are of that kind
}

}  // namespace sluice
