// libFuzzer target for the reader of sluice's runtime traces (`sluice train --trace-dir`,
// trace_internal::ReadSluiceDocument), then the whole replay (trace_fuzz_util.h).
#include "trace_fuzz_util.h"

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  return sluice::trace_fuzz::Run(data, size, [](const nlohmann::json& doc) {
    auto ranks = sluice::trace_internal::ReadSluiceDocument(doc, "fuzz.json", 100'000);
    if (ranks.ok()) sluice::trace_fuzz::CheckRanks(std::move(*ranks));
  });
}
