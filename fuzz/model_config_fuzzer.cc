// libFuzzer target for the model/ readers: ModelSpec, ClusterSpec and ParallelConfig JSON, and the
// `--parallel K=V,...` flag syntax. Any input must give a value or a Status, never a crash, and a
// value that was read must round-trip through its JSON form unchanged. Files are never read:
// ResolveParallel only sees inputs containing '=', which it parses as flags.
#include <cstddef>
#include <cstdint>
#include <cstdlib>
#include <string_view>

#include "base/json_util.h"
#include "model/cluster_spec.h"
#include "model/model_spec.h"
#include "model/parallel_config.h"

namespace {

// Aborts (a crash for libFuzzer) when `value` does not read back equal from ToJson's output.
template <typename T, typename FromJson, typename ToJson>
void CheckRoundTrip(const sluice::StatusOr<T>& value, FromJson from_json, ToJson to_json) {
  if (!value.ok()) return;
  sluice::StatusOr<T> back = from_json(to_json(*value), "round-trip");
  if (!back.ok() || !(*back == *value)) std::abort();
}

}  // namespace

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  const std::string_view text(reinterpret_cast<const char*>(data), size);
  sluice::StatusOr<nlohmann::json> j = sluice::ParseJson(text, "fuzz.json");
  if (j.ok()) {
    CheckRoundTrip(sluice::ModelSpecFromJson(*j, "fuzz.json"), sluice::ModelSpecFromJson,
                   sluice::ModelSpecToJson);
    CheckRoundTrip(sluice::ClusterSpecFromJson(*j, "fuzz.json"), sluice::ClusterSpecFromJson,
                   sluice::ClusterSpecToJson);
    CheckRoundTrip(sluice::ParallelConfigFromJson(*j, "fuzz.json"), sluice::ParallelConfigFromJson,
                   sluice::ParallelConfigToJson);
  }
  if (text.find('=') != std::string_view::npos) {
    sluice::StatusOr<sluice::ParallelConfig> flag = sluice::ResolveParallel(text);
    CheckRoundTrip(flag, sluice::ParallelConfigFromJson, sluice::ParallelConfigToJson);
  }
  return 0;
}
