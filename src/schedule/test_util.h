// Shared fixtures for the schedule tests (test-only; linked into schedule_test).
//
// Uniform and seeded random ScheduleCosts, and small helpers over schedules. Costs are in
// microseconds and megabytes so that numbers in tests stay readable.
//
// Thread safety: none needed; each test builds its own.
#pragma once

#include <cstdint>
#include <string>

#include "schedule/action.h"

namespace sluice::testing {

// Every micro-batch and stage costs f / i / w microseconds (B = i + w), stores `stored_mb` MB
// (peak = stored, stored_until_w = half of it), transfers cost `p2p_us`; budgets unlimited.
ScheduleCosts UniformCosts(int64_t pp, int64_t vpp, int64_t m, double f_us, double i_us,
                           double w_us, double stored_mb = 100, double p2p_us = 0);

// Seeded random costs: per micro-batch a size factor in [0.25, 2] (lognormal-like spread) times
// per-stage jitter in [0.8, 1.2]; forward ~ 100 us, I ~ 110 us, W ~ 90 us, stored ~ 100 MB,
// peak = 1.3 x stored, stored_until_w = 0.9 x stored, p2p ~ 5 us; budgets unlimited.
ScheduleCosts RandomCosts(uint64_t seed, int64_t pp, int64_t vpp, int64_t m);

// Sets every rank's budget to `mb` MB.
void SetBudget(ScheduleCosts* costs, double mb);

// The source tree's tests/golden/schedules/<file>.
std::string GoldenPath(const std::string& file);

}  // namespace sluice::testing
