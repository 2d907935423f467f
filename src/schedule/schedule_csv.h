// The compute-only CSV of a Schedule, as torch.distributed.pipelining writes and reads it
// (_dump_csv / _load_csv with format="compute_only"): one row per rank in rank order, one
// action per cell in execution order ("0F0,0F1,0B0,..."), no header. docs/formats.md specifies
// it. sluice writes "\n" line ends and no idle cells; the reader also accepts "\r\n" (Python's
// csv module writes it) and skips empty cells (PyTorch's idle steps).
//
// Thread safety: pure functions.
#pragma once

#include <string>
#include <string_view>

#include "base/status.h"
#include "schedule/action.h"

namespace sluice {

// One line per rank, each ending in "\n" (a rank without actions is an empty line).
std::string ScheduleToCsv(const Schedule& schedule);

// Reads a compute-only CSV: pp = number of lines, vpp = (largest stage + 1) / pp, and
// num_microbatches = largest micro-batch + 1; `name` becomes Schedule::name. Errors quote the
// cell and name `source`:line:column; stage counts that are not a multiple of pp are errors.
// The result is not checked for completeness (CheckScheduleComplete does that).
StatusOr<Schedule> ScheduleFromCsv(std::string_view text, std::string_view source,
                                   std::string_view name);

}  // namespace sluice
