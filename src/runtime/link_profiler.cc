#include "runtime/link_profiler.h"

#include <fmt/core.h>

#include <algorithm>
#include <cmath>
#include <memory>
#include <sstream>
#include <string>

#include "runtime/comm.h"
#include "runtime/profiler.h"
#include "runtime/torch_pch.h"

namespace sluice::runtime {
namespace {

constexpr int64_t kRowFloats = 256;  // 1 KiB rows of fp32

}  // namespace

StatusOr<AllToAllProfile> ProfileAllToAll(const DistEnv& env, const AllToAllProfileOptions& o) {
  if (env.world_size < 2) {
    return InvalidArgumentError("--all-to-all: an all-to-all needs at least 2 ranks");
  }
  if (o.bytes_per_peer.empty() || o.repeats < 1 || o.warmup < 0) {
    return InvalidArgumentError("all-to-all profile: give sizes, repeats >= 1 and warmup >= 0");
  }
  const int64_t n = env.world_size;
  ParallelConfig par;
  par.dp = n;
  par.ep = n;
  SLUICE_ASSIGN_OR_RETURN(std::unique_ptr<Communicator> comm,
                          Communicator::Create(env, par, {0}, Backend::kGloo, o.timeout));
  std::vector<Duration> medians;
  for (const int64_t bytes : o.bytes_per_peer) {
    const int64_t rows = std::max<int64_t>(1, bytes / (kRowFloats * 4));
    const at::Tensor send = torch::ones({n * rows, kRowFloats}, torch::kFloat32);
    const at::Tensor recv = torch::empty({n * rows, kRowFloats}, torch::kFloat32);
    const std::vector<int64_t> splits(static_cast<size_t>(n), rows);
    std::vector<Duration> times;
    for (int64_t i = 0; i < o.warmup + o.repeats; ++i) {
      const auto t0 = std::chrono::steady_clock::now();
      SLUICE_ASSIGN_OR_RETURN(Communicator::Handle h, comm->AllToAllEp(recv, send, splits, splits));
      SLUICE_RETURN_IF_ERROR(
          comm->Wait(h).WithPrefix(fmt::format("all-to-all of {} bytes per peer", bytes)));
      const auto t1 = std::chrono::steady_clock::now();
      if (i >= o.warmup) {
        times.push_back(
            Duration::Nanos(std::chrono::duration_cast<std::chrono::nanoseconds>(t1 - t0).count()));
      }
    }
    medians.push_back(MedianDuration(std::move(times)));
  }
  // Every rank's medians to rank 0, which keeps the slowest rank's per size.
  std::string mine;
  for (const Duration& d : medians) mine += fmt::format("{} ", d.nanos());
  SLUICE_RETURN_IF_ERROR(comm->store().SetString(fmt::format("a2a-profile/{}", env.rank), mine));
  AllToAllProfile out;
  if (env.rank != 0) return out;
  std::vector<Duration> slowest = medians;
  for (int64_t r = 1; r < n; ++r) {
    SLUICE_ASSIGN_OR_RETURN(std::string text,
                            comm->store().GetString(fmt::format("a2a-profile/{}", r)));
    std::istringstream in(text);
    for (Duration& d : slowest) {
      int64_t ns = 0;
      if (!(in >> ns)) return InternalError(fmt::format("rank {} sent no time for a size", r));
      d = std::max(d, Duration::Nanos(ns));
    }
  }
  out.ranks = n;
  // Least squares of the relative error of t = a + b x (x = bytes sent to the others): weights
  // 1 / t^2, so that the small sizes, where the latency shows, count as much as the large ones.
  double sw = 0, sx = 0, sy = 0, sxx = 0, sxy = 0;
  for (size_t i = 0; i < slowest.size(); ++i) {
    const int64_t rows = std::max<int64_t>(1, o.bytes_per_peer[i] / (kRowFloats * 4));
    const int64_t per_peer = rows * kRowFloats * 4;
    out.points.push_back({per_peer, slowest[i]});
    const double x = static_cast<double>((n - 1) * per_peer);
    const double y = slowest[i].seconds();
    const double w = y > 0 ? 1 / (y * y) : 0;
    sw += w;
    sx += w * x;
    sy += w * y;
    sxx += w * x * x;
    sxy += w * x * y;
  }
  const double den = sw * sxx - sx * sx;
  double b = den > 0 ? (sw * sxy - sx * sy) / den : 0;
  double a = sw > 0 ? (sy - b * sx) / sw : 0;
  if (a < 0) {  // no negative latency: the best line through the origin
    a = 0;
    b = sxx > 0 ? sxy / sxx : 0;
  }
  if (!(b > 0)) {
    return FailedPreconditionError(
        "all-to-all profile: the times do not grow with the size; give larger sizes or more "
        "repeats");
  }
  out.latency = Duration::Seconds(a / static_cast<double>(n - 1));
  out.bandwidth_fp32 = 1 / b;
  double err = 0;
  for (const AllToAllPoint& p : out.points) {
    const double fit = a + b * static_cast<double>((n - 1) * p.bytes_per_peer);
    err += std::fabs(fit - p.time.seconds()) / p.time.seconds();
  }
  out.mean_fit_error = err / static_cast<double>(out.points.size());
  return out;
}

}  // namespace sluice::runtime
