#include "schedule/test_util.h"

#include <algorithm>

#include "base/rng.h"

#ifndef SLUICE_TEST_SOURCE_DIR
#error "SLUICE_TEST_SOURCE_DIR must be defined by the build (sluice_test)"
#endif

namespace sluice::testing {

ScheduleCosts UniformCosts(int64_t pp, int64_t vpp, int64_t m, double f_us, double i_us,
                           double w_us, double stored_mb, double p2p_us) {
  ScheduleCosts c;
  c.pp = pp;
  c.vpp = vpp;
  ChunkCost cc;
  cc.forward = Duration::Micros(f_us);
  cc.backward_input = Duration::Micros(i_us);
  cc.backward_weight = Duration::Micros(w_us);
  cc.stored = Bytes::MB(stored_mb);
  cc.peak = cc.stored;
  cc.stored_until_w = cc.stored.Scaled(0.5);
  c.chunks.assign(static_cast<size_t>(m),
                  std::vector<ChunkCost>(static_cast<size_t>(pp * vpp), cc));
  c.p2p.assign(static_cast<size_t>(m),
               std::vector<Duration>(static_cast<size_t>(pp * vpp - 1), Duration::Micros(p2p_us)));
  return c;
}

ScheduleCosts RandomCosts(uint64_t seed, int64_t pp, int64_t vpp, int64_t m) {
  Rng rng(seed);
  ScheduleCosts c;
  c.pp = pp;
  c.vpp = vpp;
  const int64_t stages = pp * vpp;
  for (int64_t mb = 0; mb < m; ++mb) {
    const double size = std::clamp(rng.LogNormal(0, 0.6), 0.25, 2.0);
    std::vector<ChunkCost>& row = c.chunks.emplace_back();
    std::vector<Duration>& p2p = c.p2p.emplace_back();
    for (int64_t s = 0; s < stages; ++s) {
      const double j = 0.8 + 0.4 * rng.Uniform01();
      ChunkCost cc;
      cc.forward = Duration::Micros(100 * size * j);
      cc.backward_input = Duration::Micros(110 * size * j);
      cc.backward_weight = Duration::Micros(90 * size * j);
      cc.stored = Bytes::MB(100 * size * j);
      cc.peak = cc.stored.Scaled(1.3);
      cc.stored_until_w = cc.stored.Scaled(0.9);
      row.push_back(cc);
      if (s + 1 < stages) p2p.push_back(Duration::Micros(5 * size));
    }
  }
  return c;
}

void SetBudget(ScheduleCosts* costs, double mb) {
  costs->budget.assign(static_cast<size_t>(costs->pp), Bytes::MB(mb));
}

std::string GoldenPath(const std::string& file) {
  return std::string(SLUICE_TEST_SOURCE_DIR) + "/tests/golden/schedules/" + file;
}

}  // namespace sluice::testing
