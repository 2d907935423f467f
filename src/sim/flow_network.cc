#include "sim/flow_network.h"

#include <algorithm>
#include <cmath>
#include <limits>

#include "base/status.h"

namespace sluice::sim_internal {

int32_t FlowNetwork::AddPort(double bytes_per_second) {
  SLUICE_CHECK(bytes_per_second > 0);
  ports_.push_back({bytes_per_second, {}});
  return static_cast<int32_t>(ports_.size() - 1);
}

void FlowNetwork::Advance(Flow& f, Duration now) {
  if (f.moving && now > f.updated) {
    f.remaining -= f.rate * static_cast<double>((now - f.updated).nanos()) * 1e-9;
    if (f.remaining < 0) f.remaining = 0;
  }
  f.updated = now;
}

void FlowNetwork::MarkChanged(int32_t flow) {
  Flow& f = flows_[flow];
  ++f.version;
  if (f.moving && !f.listed) {
    f.listed = true;
    changed_.push_back(flow);
  }
}

void FlowNetwork::Rerate(int32_t flow, Duration now) {
  Flow& f = flows_[flow];
  Advance(f, now);
  double rate = std::numeric_limits<double>::infinity();
  for (size_t i = 0; i < f.ports.size(); ++i) {
    const Port& port = ports_[f.ports[i]];
    const double w = f.weights.empty() ? 1.0 : f.weights[i];
    rate = std::min(rate, port.capacity / (w * static_cast<double>(port.flows.size())));
  }
  if (rate != f.rate) {
    f.rate = rate;
    MarkChanged(flow);
  }
}

void FlowNetwork::RerateOn(std::span<const int32_t> ports, Duration now) {
  // A second Rerate of a flow in one pass would change nothing: its ports' counts are the same,
  // so its rate is, and Advance to the same `now` is a no-op. Skipping it keeps the result exact.
  const uint64_t pass = ++pass_;
  for (int32_t p : ports) {
    for (int32_t other : ports_[p].flows) {
      if (flows_[other].stamp == pass) continue;
      flows_[other].stamp = pass;
      Rerate(other, now);
    }
  }
}

int32_t FlowNetwork::Open(std::span<const int32_t> ports, Duration now,
                          std::span<const double> weights) {
  SLUICE_CHECK(weights.empty() || weights.size() == ports.size());
  for (double w : weights) SLUICE_CHECK(w > 0 && w <= 1);
  int32_t id;
  if (!free_flows_.empty()) {
    id = free_flows_.back();
    free_flows_.pop_back();
  } else {
    id = static_cast<int32_t>(flows_.size());
    flows_.emplace_back();
  }
  Flow& f = flows_[id];
  f.ports.assign(ports.begin(), ports.end());
  f.weights.assign(weights.begin(), weights.end());
  f.rate = 0;
  f.remaining = 0;
  f.updated = now;
  f.moving = false;
  f.open = true;
  for (int32_t p : f.ports) ports_[p].flows.push_back(id);
  RerateOn(f.ports, now);
  return id;
}

void FlowNetwork::Close(int32_t flow, Duration now) {
  Flow& f = flows_[flow];
  SLUICE_CHECK(f.open);
  f.open = false;
  f.moving = false;
  ++f.version;
  for (int32_t p : f.ports) {
    auto& list = ports_[p].flows;
    list.erase(std::find(list.begin(), list.end(), flow));
  }
  RerateOn(f.ports, now);
  free_flows_.push_back(flow);
}

void FlowNetwork::SetBytes(int32_t flow, Duration now, double bytes) {
  Flow& f = flows_[flow];
  SLUICE_CHECK(f.open);
  f.remaining = std::max(0.0, bytes);
  f.updated = now;
  f.moving = true;
  MarkChanged(flow);
}

void FlowNetwork::Pause(int32_t flow, Duration now) {
  Flow& f = flows_[flow];
  Advance(f, now);
  f.moving = false;
  ++f.version;
}

Duration FlowNetwork::Completion(int32_t flow) const {
  const Flow& f = flows_[flow];
  SLUICE_CHECK(f.moving && f.rate > 0);
  const double ns = std::round(f.remaining / f.rate * 1e9);
  return f.updated + Duration::Nanos(static_cast<int64_t>(ns));
}

void FlowNetwork::ClearChanged() {
  for (int32_t flow : changed_) flows_[flow].listed = false;
  changed_.clear();
}

}  // namespace sluice::sim_internal
