// Text and JSON forms of a SimResult: the terminal table `sluice simulate` prints and the
// `sluice-sim-result/1` document of `--json` (docs/formats.md, "Simulation result").
//
// The table has one row per rank (finish, compute, exposed communication, bubble, communication
// busy time, peak memory) and a totals row, after a few lines of headline figures (outcome,
// iteration time, tokens/s of real tokens, MFU, imbalance, critical path). Plans of more than
// 64 ranks show replica 0 and the slowest replica only, and say so.
//
// Thread safety: pure functions.
#pragma once

#include <nlohmann/json.hpp>
#include <string>

#include "plan/execution_plan.h"
#include "sim/simulator.h"

namespace sluice {

inline constexpr const char* kSimResultFormat = "sluice-sim-result/1";

// REQUIRES (both): `result` comes from simulating `plan`.
std::string FormatSimSummary(const ExecutionPlan& plan, const SimResult& result);
nlohmann::json SimResultToJson(const ExecutionPlan& plan, const SimResult& result);

}  // namespace sluice
