#include "cost/comm_model.h"

#include <algorithm>

#include "base/status.h"

namespace sluice {

std::string_view CollectiveKindName(CollectiveKind kind) {
  switch (kind) {
    case CollectiveKind::kAllReduce:
      return "all-reduce";
    case CollectiveKind::kReduceScatter:
      return "reduce-scatter";
    case CollectiveKind::kAllGather:
      return "all-gather";
    case CollectiveKind::kAllToAll:
      return "all-to-all";
  }
  return "?";
}

Duration AlphaBetaCommModel::PointToPoint(Bytes size, bool inter_node) const {
  const LinkSpec& link = inter_node ? inter_ : intra_;
  return link.latency + Duration::Seconds(static_cast<double>(size.count()) / link.bandwidth);
}

double AlphaBetaCommModel::RingBandwidth(const CollectiveRing& ring) const {
  if (!ring.spans_nodes) return intra_.bandwidth;
  const double crossing = static_cast<double>(ring.crossing_shares) * inter_.bandwidth;
  return ring.intra_hops ? std::min(intra_.bandwidth, crossing) : crossing;
}

Duration AlphaBetaCommModel::Collective(CollectiveKind kind, Bytes size,
                                        const CollectiveRing& ring) const {
  const int64_t group_size = ring.members;
  SLUICE_CHECK(group_size >= 1 && ring.crossing_shares >= 1);
  if (group_size == 1) return Duration::Zero();
  // All-to-all: every member's own flows, so one device's share whatever the ring.
  const double bandwidth = kind == CollectiveKind::kAllToAll
                               ? (ring.spans_nodes ? inter_ : intra_).bandwidth
                               : RingBandwidth(ring);
  const Duration latency = (ring.spans_nodes ? inter_ : intra_).latency;
  const double n = static_cast<double>(group_size);
  // Ring algorithms: `steps` messages of S/n bytes each, one after another.
  const int64_t steps = kind == CollectiveKind::kAllReduce ? 2 * (group_size - 1) : group_size - 1;
  const double bytes = static_cast<double>(steps) / n * static_cast<double>(size.count());
  return Duration::Seconds(bytes / bandwidth) + latency * steps;
}

}  // namespace sluice
