// libFuzzer target for the plan/ readers: the sluice-plan/1 JSON and MessagePack readers and the
// PyTorch compute_comms CSV importer. Every input goes to all three. Any input must give a value
// or a Status, never a crash. A value that was read must round-trip through its writer
// unchanged; a plan that was read must survive ValidatePlan, and when it is valid its PyTorch
// export must pass ValidatePipelineOrder (the two checkers agree).
#include <cstddef>
#include <cstdint>
#include <cstdlib>
#include <span>
#include <string_view>

#include "plan/plan_json.h"
#include "plan/pytorch_csv.h"
#include "plan/validate.h"

namespace {

void CheckPlan(const sluice::ExecutionPlan& plan) {
  sluice::StatusOr<sluice::ExecutionPlan> json =
      sluice::PlanFromJsonText(sluice::PlanToJsonText(plan), "round-trip.json");
  if (!json.ok() || !(*json == plan)) std::abort();
  sluice::StatusOr<sluice::ExecutionPlan> bin =
      sluice::PlanFromMsgpack(sluice::PlanToMsgpack(plan), "round-trip.msgpack");
  if (!bin.ok() || !(*bin == plan)) std::abort();
  if (!sluice::ValidatePlan(plan).ok()) return;
  for (int64_t d = 0; d < plan.dp(); ++d) {
    if (!sluice::ValidatePipelineOrder(sluice::PipelineOrderOf(plan, d), "export").ok()) {
      std::abort();
    }
  }
}

}  // namespace

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  const std::string_view text(reinterpret_cast<const char*>(data), size);
  sluice::StatusOr<sluice::ExecutionPlan> from_json = sluice::PlanFromJsonText(text, "fuzz.json");
  if (from_json.ok()) CheckPlan(*from_json);
  sluice::StatusOr<sluice::ExecutionPlan> from_bin =
      sluice::PlanFromMsgpack(std::span<const uint8_t>(data, size), "fuzz.msgpack");
  if (from_bin.ok()) CheckPlan(*from_bin);
  sluice::StatusOr<sluice::PipelineOrder> order = sluice::PipelineOrderFromCsv(text, "fuzz.csv");
  if (order.ok()) {
    sluice::StatusOr<sluice::PipelineOrder> back =
        sluice::PipelineOrderFromCsv(sluice::PipelineOrderToCsv(*order), "round-trip.csv");
    if (!back.ok() || !(*back == *order)) std::abort();
  }
  return 0;
}
