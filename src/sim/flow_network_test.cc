// FlowNetwork's bottleneck fair share, with and without port weights (a ring crossing spread
// over several devices' NICs puts a share w < 1 of its bytes on each).
#include "sim/flow_network.h"

#include <gtest/gtest.h>

#include <vector>

namespace sluice::sim_internal {
namespace {

constexpr double kGB = 1e9;

// Seconds from `from` to the flow's completion.
double SecondsLeft(const FlowNetwork& net, int32_t flow, Duration from) {
  return (net.Completion(flow) - from).seconds();
}

TEST(FlowNetworkTest, AFlowMovesAtItsSlowestPortsFairShare) {
  FlowNetwork net;
  const int32_t a = net.AddPort(10 * kGB), b = net.AddPort(4 * kGB);
  const std::vector<int32_t> both = {a, b};
  const int32_t f = net.Open(both, Duration::Zero());
  net.SetBytes(f, Duration::Zero(), 8 * kGB);
  EXPECT_NEAR(SecondsLeft(net, f, Duration::Zero()), 2.0, 1e-9);  // port b: 4 GB/s
  const std::vector<int32_t> only_b = {b};
  const int32_t g = net.Open(only_b, Duration::Zero());  // b now has two flows: 2 GB/s each
  net.SetBytes(g, Duration::Zero(), 2 * kGB);
  EXPECT_NEAR(SecondsLeft(net, f, Duration::Zero()), 4.0, 1e-9);
  EXPECT_NEAR(SecondsLeft(net, g, Duration::Zero()), 1.0, 1e-9);
}

TEST(FlowNetworkTest, AWeightedPortLimitsTheFlowByItsShareOfTheBytes) {
  FlowNetwork net;
  // A ring crossing over 4 devices' NIC shares of 5 GB/s each: 1/4 of the bytes on each port.
  std::vector<int32_t> nics;
  for (int i = 0; i < 4; ++i) nics.push_back(net.AddPort(5 * kGB));
  const std::vector<double> quarter(4, 0.25);
  const int32_t ring = net.Open(nics, Duration::Zero(), quarter);
  net.SetBytes(ring, Duration::Zero(), 20 * kGB);
  EXPECT_NEAR(SecondsLeft(net, ring, Duration::Zero()), 1.0, 1e-9);  // 4 x 5 = 20 GB/s
  // A transfer on one of the NICs takes half that port: the ring slows to 4 x 2.5 = 10 GB/s,
  // the transfer moves at 2.5 GB/s.
  const std::vector<int32_t> one = {nics[0]};
  const int32_t p2p = net.Open(one, Duration::Zero());
  net.SetBytes(p2p, Duration::Zero(), 2.5 * kGB);
  EXPECT_NEAR(SecondsLeft(net, ring, Duration::Zero()), 2.0, 1e-9);
  EXPECT_NEAR(SecondsLeft(net, p2p, Duration::Zero()), 1.0, 1e-9);
  // When it leaves, the ring's rate comes back for the bytes it has left.
  net.Close(p2p, Duration::Seconds(1));
  EXPECT_NEAR(SecondsLeft(net, ring, Duration::Seconds(1)), 0.5, 1e-9);  // 10 GB left at 20
}

}  // namespace
}  // namespace sluice::sim_internal
