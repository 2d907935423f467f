// PyTorch pipelining CSV: the schedule files torch.distributed.pipelining reads and writes
// (schedules.py: _PipelineScheduleRuntime._load_csv / _dump_csv), so a sluice schedule or plan
// can drive PyTorch's runtime and PyTorch's schedules can be lowered by sluice.
//
// One row per pipeline rank, one action per cell, no header: "<stage><type>[<microbatch>]" with
// the types F, B, I, W (compute) and SEND_F, RECV_F, SEND_B, RECV_B, REDUCE_GRAD. Two flavours:
//  - compute_only: F/B/I/W only, the order of a Schedule (PyTorch lowers it with _add_send_recv);
//    schedule/schedule_csv.h reads and writes it (ScheduleToCsv / ScheduleFromCsv).
//  - compute_comms: the order with explicit sends and receives, taken as is by PyTorch. sluice
//    writes it from an ExecutionPlan: each transfer Start becomes SEND_x / RECV_x at its place
//    (waits are implicit in PyTorch: a compute waits for its receive, sends are waited at the
//    end), and REDUCE_GRAD <stage> follows the stage's last backward as _add_reduce_grad does.
// Stage s must run on row s % pp (sluice's placement); V-shaped placements are rejected.
// Writers emit "\n" line ends; readers accept "\n" and "\r\n", skip empty cells (PyTorch's idle
// slots), strip blanks and one pair of double quotes around a cell. Every reader error names
// "<source>:<line>:<column>"; a schedule that does not run prints PyTorch's step x rank grid.
//
// Thread safety: pure functions.
#pragma once

#include <cstdint>
#include <string>
#include <string_view>
#include <vector>

#include "base/status.h"
#include "plan/execution_plan.h"
#include "schedule/action.h"

namespace sluice {

enum class PipeOp : uint8_t {
  kForward,
  kBackward,
  kBackwardInput,
  kBackwardWeight,
  kSendF,
  kRecvF,
  kSendB,
  kRecvB,
  kReduceGrad,
};

struct PipeAction {
  int64_t stage = 0;
  PipeOp op = PipeOp::kForward;
  int64_t microbatch = -1;  // -1 only for REDUCE_GRAD

  // "2F0", "1SEND_F3", "0REDUCE_GRAD".
  std::string ToString() const;
  friend bool operator==(const PipeAction&, const PipeAction&) = default;
};

// PyTorch's pipeline_order_with_comms for one data-parallel replica.
struct PipelineOrder {
  int64_t pp = 1;
  int64_t vpp = 1;
  int64_t num_microbatches = 0;
  std::vector<std::vector<PipeAction>> ranks;  // [pipeline rank][step]

  int64_t num_stages() const { return pp * vpp; }
  friend bool operator==(const PipelineOrder&, const PipelineOrder&) = default;
};

// compute_comms of replica `dp_index` of `plan`; `reduce_grad` adds the REDUCE_GRAD actions
// (leave it out for PyTorch releases whose runtime does not know them).
// REQUIRES: ValidatePlan(plan) is OK.
PipelineOrder PipelineOrderOf(const ExecutionPlan& plan, int64_t dp_index, bool reduce_grad = true);
std::string PipelineOrderToCsv(const PipelineOrder& order);
// Reads compute_comms (pp = rows) and validates it with ValidatePipelineOrder.
StatusOr<PipelineOrder> PipelineOrderFromCsv(std::string_view text, std::string_view source);
// Checks a compute_comms order: placement and ranges, the compute actions as
// CheckScheduleComplete does, every remote input received before use, sends after the compute
// that produces them, REDUCE_GRAD after the stage's backwards, and the static replay of the
// sends and receives (comm_replay.h). `source` prefixes the messages.
Status ValidatePipelineOrder(const PipelineOrder& order, std::string_view source);

}  // namespace sluice
