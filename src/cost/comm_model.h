// CommModel: time of a point-to-point transfer or a collective over the cluster's links.
//
// AlphaBetaCommModel is the closed form: a message of S bytes over a link costs
// alpha + S / beta. Collectives over n ranks use the ring algorithms' step counts:
//   all-reduce      2(n-1) steps of S/n bytes: 2(n-1)/n * S/B + 2(n-1) * alpha
//   reduce-scatter  (n-1) steps of S/n:       (n-1)/n * S/B + (n-1) * alpha
//   all-gather      (n-1) steps of S/n:       (n-1)/n * S/B + (n-1) * alpha   (S = output size)
//   all-to-all      (n-1) exchanges of S/n:   (n-1)/n * S/B + (n-1) * alpha   (S = per-rank buffer)
// A group within one node runs at the intra-node link's B and alpha. A group that spans nodes
// runs at the inter-node link's alpha and at B = min(intra-node B, c * inter-node B), c the
// ring's crossing shares (model/cluster_spec.h, CollectiveRing: with NCCL the devices of the ring
// on a node, whose NICs its channels leave by; 1 for Gloo and for rings with one device per
// node); a ring with one device per node has no intra-node hop and runs at the inter-node B. The simulator refines this with per-link contention;
// this model is what planners use.
//
// Thread safety: immutable after construction.
#pragma once

#include <cstdint>
#include <string_view>

#include "base/units.h"
#include "model/cluster_spec.h"

namespace sluice {

enum class CollectiveKind { kAllReduce, kReduceScatter, kAllGather, kAllToAll };
std::string_view CollectiveKindName(CollectiveKind kind);  // "all-reduce", ...

class CommModel {
 public:
  virtual ~CommModel() = default;
  // One message of `size` between two devices in the same node or in different nodes.
  virtual Duration PointToPoint(Bytes size, bool inter_node) const = 0;
  // A collective over the ring `ring` (its members, whether it crosses nodes, its crossing
  // shares; all-to-all takes only the first two). `size` is the per-rank buffer (all-gather: the
  // gathered output). A ring of one member costs zero.
  virtual Duration Collective(CollectiveKind kind, Bytes size,
                              const CollectiveRing& ring) const = 0;
};

class AlphaBetaCommModel final : public CommModel {
 public:
  explicit AlphaBetaCommModel(const ClusterSpec& cluster)
      : intra_(cluster.intra_node), inter_(cluster.inter_node) {}
  AlphaBetaCommModel(LinkSpec intra, LinkSpec inter) : intra_(intra), inter_(inter) {}

  Duration PointToPoint(Bytes size, bool inter_node) const override;
  Duration Collective(CollectiveKind kind, Bytes size,
                      const CollectiveRing& ring) const override;
  // The bandwidth one step of a ring collective moves at (see the top of this file).
  double RingBandwidth(const CollectiveRing& ring) const;

 private:
  LinkSpec intra_;
  LinkSpec inter_;
};

}  // namespace sluice
