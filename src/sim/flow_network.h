// FlowNetwork: bandwidth sharing of the simulator's links (internal to src/sim/).
//
// The network is a set of ports, each with a capacity in bytes per second: the simulator gives
// every device an egress and an ingress port per link class (intra-node, inter-node), the
// "per device, per direction" bandwidth of ClusterSpec. A flow holds a set of ports (a
// point-to-point transfer: the sender's egress and the receiver's ingress; a ring collective: the
// egress and ingress ports of every hop), each with a weight w in (0, 1], the share of the flow's
// bytes that cross the port (1 unless given: a ring crossing spread over the NICs of several
// devices puts 1/c of its bytes on each of c ports), and, while it has bytes to move, moves them
// at
//   rate = min over its ports of capacity / (w * flows holding the port),
// the bottleneck fair share. Rates are piecewise constant: whenever a flow joins or leaves a port,
// every flow on that port is advanced to `now` at its old rate and gets its new rate; their
// predicted completions change, and the flows are listed in changed() so the simulator can
// reschedule their completion events (each carries the flow's version; older ones are stale).
// A join or leave re-rates each flow on the touched ports once (a ring collective holds hundreds
// of ports; re-rating it once per shared port made Open and Close quadratic in the ring size).
//
// Thread safety: one simulation's object; not shared.
#pragma once

#include <cstdint>
#include <span>
#include <vector>

#include "base/units.h"

namespace sluice::sim_internal {

class FlowNetwork {
 public:
  FlowNetwork() = default;
  FlowNetwork(const FlowNetwork&) = delete;
  FlowNetwork& operator=(const FlowNetwork&) = delete;

  // Adds a port of `bytes_per_second` (> 0) and returns its id.
  int32_t AddPort(double bytes_per_second);

  // A new flow on `ports` at time `now`, with no bytes to move yet (SetBytes starts them). Flows
  // sharing a port with it change rate. `weights` is empty (every weight 1) or one weight in
  // (0, 1] per port.
  int32_t Open(std::span<const int32_t> ports, Duration now,
               std::span<const double> weights = {});
  // Removes the flow from its ports; the flow id may be reused by a later Open.
  void Close(int32_t flow, Duration now);
  // Starts moving `bytes` (>= 0) at `now`; any bytes left from before are dropped.
  void SetBytes(int32_t flow, Duration now, double bytes);
  // Stops moving bytes (a latency phase between steps): the flow keeps its ports.
  void Pause(int32_t flow, Duration now);

  // When the flow's bytes will have moved at its current rate. REQUIRES: moving.
  Duration Completion(int32_t flow) const;
  bool moving(int32_t flow) const { return flows_[flow].moving; }
  uint32_t version(int32_t flow) const { return flows_[flow].version; }

  // Moving flows whose completion changed since the last ClearChanged(), without duplicates.
  const std::vector<int32_t>& changed() const { return changed_; }
  void ClearChanged();

 private:
  struct Port {
    double capacity = 0;         // bytes per second
    std::vector<int32_t> flows;  // flows holding the port, in joining order
  };
  struct Flow {
    std::vector<int32_t> ports;
    std::vector<double> weights;  // empty: 1 on every port
    double rate = 0;       // bytes per second while moving
    double remaining = 0;  // bytes left at `updated`
    Duration updated;
    bool moving = false;
    bool open = false;
    bool listed = false;  // in changed_
    uint32_t version = 0;
    uint64_t stamp = 0;  // the last RerateOn pass that re-rated it
  };

  void Advance(Flow& f, Duration now);
  void Rerate(int32_t flow, Duration now);
  // Re-rates every flow on `ports`, each once, in the order of first appearance.
  void RerateOn(std::span<const int32_t> ports, Duration now);
  void MarkChanged(int32_t flow);

  std::vector<Port> ports_;
  std::vector<Flow> flows_;
  std::vector<int32_t> free_flows_;
  std::vector<int32_t> changed_;
  uint64_t pass_ = 0;  // RerateOn passes so far
};

}  // namespace sluice::sim_internal
