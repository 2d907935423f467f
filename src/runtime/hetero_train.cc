#include "runtime/hetero_train.h"

#include <fmt/core.h>
#include <fmt/ranges.h>

#include <map>
#include <set>
#include <sstream>

#include "runtime/batch_layout.h"
#include "runtime/grad_reduction.h"

namespace sluice::runtime {

GroupOf ProcessGroupOf(const HeteroConfig& config, int64_t rank) {
  const std::vector<int64_t> offsets = config.DeviceOffsets();
  GroupOf out;
  for (size_t g = 0; g < offsets.size(); ++g) {
    if (rank >= offsets[g]) out = {static_cast<int64_t>(g), offsets[g]};
  }
  return out;
}

std::string GroupPackageDumpName(int64_t iteration, int64_t group) {
  return fmt::format("iter-{}.group-{}.package", iteration, group);
}

int64_t GlobalBatchLabels(const ModelSpec& model, std::span<const Sample> samples) {
  int64_t labels = 0;
  for (const Sample& s : samples) labels += SampleLabels(model, s);
  return labels;
}

Status CheckHeteroRunnable(const HeteroConfig& config, int64_t world_size,
                           std::string_view source) {
  for (size_t g = 0; g < config.groups.size(); ++g) {
    const ParallelConfig& p = config.groups[g];
    const auto bad = [&](std::string_view field, int64_t value, std::string_view allowed) {
      return InvalidArgumentError(fmt::format(
          "{}: group {} ('{}'): {} = {} is not run by the runtime's heterogeneous replicas "
          "(allowed: {})",
          source, g + 1, DescribeHetero(HeteroConfig{{p}}), field, value, allowed));
    };
    if (p.tp != 1) return bad("tp", p.tp, "tp = 1");
    if (p.ep != 1) return bad("ep", p.ep, "ep = 1");
    if (p.vpp != 1) return bad("vpp", p.vpp, "vpp = 1");
    if (p.zero >= 2) return bad("zero", p.zero, "zero = 0 or 1");
  }
  if (config.devices() != world_size) {
    return InvalidArgumentError(fmt::format(
        "{}: the replica groups ({}) need {} processes, but the job has {} (WORLD_SIZE or "
        "--nproc)",
        source, DescribeHetero(config), config.devices(), world_size));
  }
  return Status::Ok();
}

StatusOr<std::unique_ptr<CrossGroupSync>> CrossGroupSync::Create(Communicator* comm,
                                                                 Watchdog* watchdog,
                                                                 const ModelShard& shard,
                                                                 const HeteroConfig& config) {
  std::unique_ptr<CrossGroupSync> sync(new CrossGroupSync());
  sync->comm_ = comm;
  sync->watchdog_ = watchdog;
  const int64_t world = comm->env().world_size, me = comm->rank();
  std::map<std::string, at::Tensor> own;
  std::string text;
  for (const auto& [name, p] : shard.NamedParameters()) {
    own[name] = p;
    text += name + "\n";
  }
  StoreClient& store = comm->store();
  SLUICE_RETURN_IF_ERROR(store.SetString(fmt::format("sluice/hetero/names/{}", me), text));
  // Holders of every parameter name, over the whole job.
  std::map<std::string, std::vector<int64_t>> holders;
  watchdog->BeginWait("the parameter names of every process (heterogeneous replicas)", 0);
  for (int64_t r = 0; r < world; ++r) {
    StatusOr<std::string> names = store.GetString(fmt::format("sluice/hetero/names/{}", r));
    if (!names.ok()) {
      watchdog->EndWait();
      return names.status();
    }
    std::istringstream in(*names);
    for (std::string line; std::getline(in, line);) {
      if (!line.empty()) holders[line].push_back(r);
    }
  }
  watchdog->EndWait();
  // Names with the same holders, the holder sets in ascending order (every process computes the
  // same list, so the groups are created in the same order everywhere).
  std::map<std::vector<int64_t>, std::vector<std::string>> by_holders;
  for (const auto& [name, ranks] : holders) {
    std::set<int64_t> groups;
    for (const int64_t r : ranks) groups.insert(ProcessGroupOf(config, r).group);
    if (groups.size() > 1) by_holders[ranks].push_back(name);
  }
  const int64_t my_group = ProcessGroupOf(config, me).group;
  int64_t index = 0;
  for (const auto& [ranks, names] : by_holders) {
    const std::string name = fmt::format("xg{}", index++);
    if (std::find(ranks.begin(), ranks.end(), me) == ranks.end()) continue;
    Reduction red;
    red.name = name;
    red.members = ranks;
    int64_t same = 0;
    for (const int64_t r : ranks) same += ProcessGroupOf(config, r).group == my_group ? 1 : 0;
    red.weight = 1.0 / static_cast<double>(same);
    for (const std::string& n : names) red.params.push_back(own.at(n));
    SLUICE_ASSIGN_OR_RETURN(red.pg, comm->MakeSubgroup(name, ranks));
    sync->mine_.push_back(std::move(red));
  }
  return sync;
}

Status CrossGroupSync::Run(int64_t iteration) {
  torch::NoGradGuard no_grad;
  for (Reduction& red : mine_) {
    at::Tensor flat = FlattenGrads(red.params);
    if (red.weight != 1.0) flat.mul_(red.weight);
    std::vector<int64_t> peers;
    for (const int64_t r : red.members) {
      if (r != comm_->rank()) peers.push_back(r);
    }
    const std::string what = fmt::format(
        "the cross-group gradient sum {} over ranks [{}] (iteration {})", red.name,
        fmt::join(red.members, ", "), iteration);
    Communicator::Handle h;
    try {
      std::vector<at::Tensor> v{flat};
      h = red.pg->allreduce(v);
    } catch (const std::exception& e) {
      return FailedPreconditionError(fmt::format("{} failed: {}", what, e.what()));
    }
    watchdog_->BeginWait(what, peers);
    Status s = comm_->Wait(h);
    watchdog_->EndWait();
    if (!s.ok()) {
      const std::string blame = watchdog_->Blame(peers, what);
      return FailedPreconditionError(fmt::format(
          "{} failed{}: {}", what, blame.empty() ? "" : " (" + blame + ")", s.message()));
    }
    WriteFlatGrads(flat, red.params);
  }
  return Status::Ok();
}

}  // namespace sluice::runtime
