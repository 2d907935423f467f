// The HTML report of `sluice replay --report FILE`: the measured and the replayed timelines of one
// iteration one above the other, the critical path, the replay error per iteration, the
// communication models and where each rank's time went (report::HtmlReport, like compare's).
//
// Thread safety: pure functions.
#pragma once

#include <string>
#include <vector>

#include "report/html_report.h"
#include "trace/analyze.h"
#include "trace/calibration.h"

namespace sluice::cli {

// `iteration` < 0: the iteration whose measured time is the median. `departures` (optional): the
// op classes against the plan's cost model (replay --plan).
report::HtmlReport BuildReplayReport(const trace::Analysis& a, const trace::Replays& r,
                                     int64_t iteration,
                                     const std::vector<trace::OpCorrection>* departures);

}  // namespace sluice::cli
