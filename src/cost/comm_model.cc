#include "cost/comm_model.h"

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

Duration AlphaBetaCommModel::Collective(CollectiveKind kind, Bytes size, int64_t group_size,
                                        bool spans_nodes) const {
  SLUICE_CHECK(group_size >= 1);
  if (group_size == 1) return Duration::Zero();
  const LinkSpec& link = spans_nodes ? inter_ : intra_;
  const double n = static_cast<double>(group_size);
  // Ring algorithms: `steps` messages of S/n bytes each, one after another.
  const int64_t steps = kind == CollectiveKind::kAllReduce ? 2 * (group_size - 1) : group_size - 1;
  const double bytes = static_cast<double>(steps) / n * static_cast<double>(size.count());
  return Duration::Seconds(bytes / link.bandwidth) + link.latency * steps;
}

}  // namespace sluice
