// Measures the expert-parallel all-to-all of this machine's local ranks (`sluice profile
// --all-to-all N`) and fits the alpha-beta link the simulator prices all-to-alls with.
//
// Every rank of an N-rank job (dp = ep = N, Gloo) runs `alltoall_base` on fp32 rows, the same
// call the runtime's MoE layers make (Communicator::AllToAllEp), at each size of
// `bytes_per_peer` (each rank sends that many bytes to every other member): `warmup` untimed
// calls, then `repeats` timed ones, each from its post to its completion. A size's time is the
// median over the timed calls of the slowest rank's time (the ranks put their medians in the
// job's store; rank 0 gathers them). The fit is the simulator's all-to-all model
// (docs/formats.md, plan `ns`): t = (N - 1) * latency + (bytes sent to the N - 1 others) /
// bandwidth, least squares of the relative error over the sizes (latency clamped at 0). The plan
// counts fp16 bytes where the runtime moves fp32, so the link written for plans has half the fp32
// bandwidth.
//
// Thread safety: one call per process, with no other torch work; the job's ranks call it
// together.
#pragma once

#include <chrono>
#include <cstdint>
#include <vector>

#include "base/status.h"
#include "base/units.h"
#include "model/cluster_spec.h"
#include "runtime/launcher.h"

namespace sluice::runtime {

struct AllToAllProfileOptions {
  std::vector<int64_t> bytes_per_peer = {4096, 16384, 65536, 262144, 1048576, 4194304};
  int64_t repeats = 5;  // timed calls per size (median)
  int64_t warmup = 2;   // untimed calls per size before them
  std::chrono::milliseconds timeout{60000};
};

struct AllToAllPoint {
  int64_t bytes_per_peer = 0;
  Duration time;  // median over the timed calls of the slowest rank
};

struct AllToAllProfile {
  int64_t ranks = 0;
  std::vector<AllToAllPoint> points;
  Duration latency;           // per member, the fit's alpha
  double bandwidth_fp32 = 0;  // bytes/s the fit's beta, of the fp32 bytes the runtime moves
  double mean_fit_error = 0;  // mean |fit - measured| / measured over the points
  // The link for plans (fp16 bytes): `latency`, bandwidth_fp32 / 2.
  LinkSpec PlanLink() const { return {bandwidth_fp32 / 2, latency}; }
};

// Runs on every rank of the job `env` describes (world size >= 2). Returns the profile on rank
// 0 (other ranks: an empty profile). Errors: the rendezvous or a collective failed or timed out
// (naming the size), options out of range (InvalidArgument).
StatusOr<AllToAllProfile> ProfileAllToAll(const DistEnv& env, const AllToAllProfileOptions& o);

}  // namespace sluice::runtime
