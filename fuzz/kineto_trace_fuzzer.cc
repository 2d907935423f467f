// libFuzzer target for the reader of Kineto traces (torch >= 2,
// trace_internal::ReadKinetoDocument): the input is read as one rank (its distributedInfo.rank,
// else 0), then the whole replay (trace_fuzz_util.h).
#include "trace_fuzz_util.h"

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  return sluice::trace_fuzz::Run(data, size, [](const nlohmann::json& doc) {
    auto rank = sluice::trace_internal::ReadKinetoDocument(doc, "fuzz.json", 0, 100'000);
    if (!rank.ok()) return;
    std::vector<sluice::trace::RankTrace> ranks;
    ranks.push_back(std::move(*rank));
    sluice::trace_fuzz::CheckRanks(std::move(ranks));
  });
}
