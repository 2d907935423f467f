// libFuzzer target for the schedule/ text forms: the compute-only CSV (ScheduleFromCsv) and the
// action text (ParseAction). Any input must give a Schedule or an InvalidArgument Status whose
// message names the source, never a crash. A Schedule that was read must write back to a CSV that
// reads into the same Schedule, survive CheckScheduleComplete, and, when complete and small, run
// through EstimateSchedule with uniform costs to an answer (finished or a deadlock, never a hang).
#include <cstddef>
#include <cstdint>
#include <cstdlib>
#include <string>
#include <string_view>
#include <vector>

#include "schedule/action.h"
#include "schedule/estimator.h"
#include "schedule/schedule_csv.h"

namespace {

void Check(bool ok) {
  if (!ok) std::abort();
}

void CheckSchedule(const sluice::Schedule& s) {
  const std::string csv = sluice::ScheduleToCsv(s);
  sluice::StatusOr<sluice::Schedule> back = sluice::ScheduleFromCsv(csv, "round-trip", s.name);
  Check(back.ok() && *back == s);

  const sluice::Status complete = sluice::CheckScheduleComplete(s);
  if (!complete.ok()) {
    Check(complete.code() == sluice::StatusCode::kInvalidArgument);
    return;
  }
  if (s.num_microbatches * s.num_stages() > 4096) return;
  sluice::ScheduleCosts costs;
  costs.pp = s.pp;
  costs.vpp = s.vpp;
  sluice::ChunkCost c;
  c.forward = sluice::Duration::Micros(1);
  c.backward_input = sluice::Duration::Micros(1);
  c.backward_weight = sluice::Duration::Micros(1);
  c.stored = sluice::Bytes::MB(1);
  c.peak = sluice::Bytes::MB(1);
  costs.chunks.assign(static_cast<size_t>(s.num_microbatches),
                      std::vector<sluice::ChunkCost>(static_cast<size_t>(s.num_stages()), c));
  const sluice::ScheduleEstimate e = sluice::EstimateSchedule(s, costs);
  Check(e.completed || !e.problem.empty());
}

}  // namespace

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  const std::string_view text(reinterpret_cast<const char*>(data), size);
  sluice::StatusOr<sluice::Schedule> s = sluice::ScheduleFromCsv(text, "fuzz.csv", "fuzz");
  if (s.ok()) {
    CheckSchedule(*s);
  } else {
    Check(s.status().code() == sluice::StatusCode::kInvalidArgument);
    Check(s.status().message().rfind("fuzz.csv", 0) == 0);
  }
  sluice::StatusOr<sluice::Action> a = sluice::ParseAction(text, "fuzz.in");
  if (a.ok()) {
    sluice::StatusOr<sluice::Action> again = sluice::ParseAction(a->ToString(), "again");
    Check(again.ok() && *again == *a);
  } else {
    Check(a.status().message().rfind("fuzz.in: ", 0) == 0);
  }
  return 0;
}
