// libFuzzer target for the compare/ readers of `sluice compare`: the scenario JSON
// (CompareScenarioFromJson, docs/formats.md "Compare scenario"), the method shorthands and
// ASSIGNER+BATCHER names (MethodSpecFor, as `--methods` and a scenario's "methods" read them)
// and the results file (CompareResultFromJson, "sluice-compare/1"). Any input must give a value
// or a Status, never a crash. A scenario that was read must pass ValidateCompareScenario and
// round-trip through its JSON form unchanged; so must a results file. Files are never read: the
// scenario reader is given no base folder, so model/cluster/data paths stay as written.
#include <cstddef>
#include <cstdint>
#include <cstdlib>
#include <string>
#include <string_view>

#include "base/json_util.h"
#include "compare/compare_json.h"
#include "compare/compare_scenario.h"

namespace {

void CheckScenario(const sluice::CompareScenario& s) {
  if (!sluice::ValidateCompareScenario(s, "fuzz.json").ok()) std::abort();
  sluice::StatusOr<sluice::CompareScenario> back =
      sluice::CompareScenarioFromJson(sluice::CompareScenarioToJson(s), "round-trip.json");
  if (!back.ok() || !(*back == s)) std::abort();
}

}  // namespace

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  const std::string_view text(reinterpret_cast<const char*>(data), size);
  sluice::StatusOr<nlohmann::json> j = sluice::ParseJson(text, "fuzz.json");
  if (j.ok()) {
    sluice::StatusOr<sluice::CompareScenario> s = sluice::CompareScenarioFromJson(*j, "fuzz.json");
    if (s.ok()) CheckScenario(*s);
    sluice::StatusOr<sluice::CompareResult> r = sluice::CompareResultFromJson(*j, "fuzz.json");
    if (r.ok()) {
      sluice::StatusOr<sluice::CompareResult> back =
          sluice::CompareResultFromJson(sluice::CompareResultToJson(*r), "round-trip.json");
      if (!back.ok() || !(*back == *r)) std::abort();
    }
  }
  // The text as one method name (short inputs only: names are a few words).
  if (size <= 64) {
    sluice::StatusOr<sluice::MethodSpec> m = sluice::MethodSpecFor(text, "--methods");
    if (m.ok() && (m->batching.empty() || m->schedules.empty() || m->name != text)) std::abort();
  }
  return 0;
}
