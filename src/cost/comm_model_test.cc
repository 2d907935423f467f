#include "cost/comm_model.h"

#include <gtest/gtest.h>

#include <algorithm>

namespace sluice {
namespace {

const LinkSpec kNvlink{300e9, Duration::Micros(3)};
const LinkSpec kEfa{6.25e9, Duration::Micros(15)};

// A ring of n members within one node, or over nodes with one device per node on each.
CollectiveRing Ring(int64_t n, bool spans) { return {.members = n, .spans_nodes = spans}; }

TEST(AlphaBetaCommModelTest, PointToPoint) {
  AlphaBetaCommModel m(kNvlink, kEfa);
  EXPECT_EQ(m.PointToPoint(Bytes::MB(300), false), Duration::Micros(3) + Duration::Millis(1));
  EXPECT_EQ(m.PointToPoint(Bytes::MB(6.25), true), Duration::Micros(15) + Duration::Millis(1));
  EXPECT_EQ(m.PointToPoint(Bytes::Zero(), false), Duration::Micros(3));
}

TEST(AlphaBetaCommModelTest, AllReduceIsTheRingFormula) {
  AlphaBetaCommModel m(kNvlink, kEfa);
  for (int64_t n : {2, 3, 4, 8, 64}) {
    for (int64_t bytes : {int64_t{1}, int64_t{1} << 20, int64_t{3} << 30}) {
      for (bool spans : {false, true}) {
        const LinkSpec& link = spans ? kEfa : kNvlink;
        const double s = static_cast<double>(bytes);
        const double k = static_cast<double>(n);
        const Duration expected =
            Duration::Seconds(2 * (k - 1) / k * s / link.bandwidth) + link.latency * (2 * (n - 1));
        EXPECT_EQ(m.Collective(CollectiveKind::kAllReduce, Bytes::Of(bytes), Ring(n, spans)), expected)
            << n << " ranks, " << bytes << " bytes";
      }
    }
  }
}

TEST(AlphaBetaCommModelTest, HalfRingCollectives) {
  AlphaBetaCommModel m(kNvlink, kEfa);
  const Bytes size = Bytes::MB(800);
  const Duration half = Duration::Seconds(7.0 / 8.0 * 800e6 / 300e9) + Duration::Micros(3) * 7;
  for (CollectiveKind kind :
       {CollectiveKind::kReduceScatter, CollectiveKind::kAllGather, CollectiveKind::kAllToAll}) {
    EXPECT_EQ(m.Collective(kind, size, Ring(8, false)), half) << CollectiveKindName(kind);
  }
  // An all-reduce is a reduce-scatter followed by an all-gather.
  EXPECT_EQ(m.Collective(CollectiveKind::kAllReduce, size, Ring(8, false)),
            Duration::Seconds(14.0 / 8.0 * 800e6 / 300e9) + Duration::Micros(3) * 14);
}

TEST(AlphaBetaCommModelTest, OneRankIsFreeAndNodesAreSlower) {
  AlphaBetaCommModel m(kNvlink, kEfa);
  EXPECT_EQ(m.Collective(CollectiveKind::kAllReduce, Bytes::GiB(1), Ring(1, true)), Duration::Zero());
  EXPECT_GT(m.Collective(CollectiveKind::kAllGather, Bytes::GiB(1), Ring(16, true)),
            m.Collective(CollectiveKind::kAllGather, Bytes::GiB(1), Ring(16, false)));
}

// A ring crossing nodes with c devices per node moves a step over c inter-node shares (NCCL's
// channels leave the node through every device's NIC), never faster than the intra-node link.
TEST(AlphaBetaCommModelTest, ACrossingMovesOverItsSharesUpToTheIntraNodeLink) {
  AlphaBetaCommModel m(kNvlink, kEfa);
  const Bytes size = Bytes::MB(800);
  for (int64_t shares : {1, 2, 8, 64}) {
    const CollectiveRing ring{.members = 16, .spans_nodes = true, .crossing_shares = shares,
                              .intra_hops = shares > 1};
    const double bandwidth = std::min(300e9, static_cast<double>(shares) * 6.25e9);
    EXPECT_EQ(m.RingBandwidth(ring), shares == 1 ? 6.25e9 : bandwidth);
    const Duration want =
        Duration::Seconds(2 * 15.0 / 16.0 * 800e6 / bandwidth) + Duration::Micros(15) * 30;
    EXPECT_EQ(m.Collective(CollectiveKind::kAllReduce, size, ring), want) << shares;
    // An all-to-all's flows are each member's own: the shares do not change it.
    EXPECT_EQ(m.Collective(CollectiveKind::kAllToAll, size, ring),
              m.Collective(CollectiveKind::kAllToAll, size, Ring(16, true)));
  }
  // One share and hops inside a node: the slower of the two links.
  const AlphaBetaCommModel slow_nvlink(LinkSpec{4e9, Duration::Micros(3)}, kEfa);
  EXPECT_EQ(slow_nvlink.RingBandwidth(CollectiveRing{.members = 4, .spans_nodes = true,
                                                     .intra_hops = true}),
            4e9);
  EXPECT_EQ(slow_nvlink.RingBandwidth(CollectiveRing{.members = 4, .spans_nodes = true}), 6.25e9);
}

TEST(AlphaBetaCommModelTest, FromClusterSpec) {
  ClusterSpec c;
  c.intra_node = kNvlink;
  c.inter_node = kEfa;
  AlphaBetaCommModel from_cluster(c);
  AlphaBetaCommModel direct(kNvlink, kEfa);
  EXPECT_EQ(from_cluster.PointToPoint(Bytes::MB(5), true), direct.PointToPoint(Bytes::MB(5), true));
}

TEST(CollectiveKindTest, Names) {
  EXPECT_EQ(CollectiveKindName(CollectiveKind::kAllReduce), "all-reduce");
  EXPECT_EQ(CollectiveKindName(CollectiveKind::kReduceScatter), "reduce-scatter");
  EXPECT_EQ(CollectiveKindName(CollectiveKind::kAllGather), "all-gather");
  EXPECT_EQ(CollectiveKindName(CollectiveKind::kAllToAll), "all-to-all");
}

}  // namespace
}  // namespace sluice
