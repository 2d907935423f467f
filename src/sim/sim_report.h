// The HTML report of one simulation (`sluice simulate --report`), as report::HtmlReport blocks:
//  - summary: the headline figures and a per-rank table (as FormatSimSummary);
//  - pipeline timeline: per rank a compute row and a communication row per stream kind used
//    (point-to-point, collective), bars labelled with the instruction text, the critical path
//    named in the tooltips;
//  - memory over time per rank (step chart in MB) with the memory limit as a dashed line;
//  - where time went: compute / exposed communication / bubble per rank (table and bars);
//  - the deadlock or out-of-memory finding, when there is one.
// Plans of more than 16 ranks show replica 0 only in the timeline and the memory chart (the
// section text says so); the tables cover every rank up to 64, as the summary does.
//
// Thread safety: pure functions.
#pragma once

#include <string>

#include "plan/execution_plan.h"
#include "plan/instruction.h"
#include "report/html_report.h"
#include "sim/simulator.h"

namespace sluice {

// REQUIRES: `result` comes from simulating `plan` (with record_timeline and record_memory for
// the timeline and memory sections; without them those sections say they were not recorded).
report::HtmlReport BuildSimulationReport(const ExecutionPlan& plan, const SimResult& result);

// The timeline colour category of an instruction (report::TimelineBar::category): "forward",
// "backward", "backward-input", "backward-weight", "load", "optimizer", "all-reduce",
// "reduce-scatter", "all-gather", "send", "recv" or "other". Every report that draws plan timelines uses
// it, so one op has one colour everywhere.
std::string TimelineCategory(OpKind op);

}  // namespace sluice
