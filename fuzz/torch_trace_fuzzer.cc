// libFuzzer target for the reader of torch 1.13 CPU profiler traces (export_chrome_trace,
// trace_internal::ReadTorchCpuDocument): the input is read as rank 0 and as rank 1 of a pair,
// then the whole replay (trace_fuzz_util.h).
#include "trace_fuzz_util.h"

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  return sluice::trace_fuzz::Run(data, size, [](const nlohmann::json& doc) {
    std::vector<sluice::trace::RankTrace> ranks;
    for (int64_t r = 0; r < 2; ++r) {
      auto rank = sluice::trace_internal::ReadTorchCpuDocument(doc, "fuzz.json", r, 100'000);
      if (!rank.ok()) return;
      // Unnamed peers of a pair are the other rank, as ReadTraces decides.
      for (sluice::trace::CommOp& c : rank->comms) {
        if (c.kind != sluice::trace::CommKind::kCollective && c.peer < 0) c.peer = 1 - r;
      }
      ranks.push_back(std::move(*rank));
    }
    sluice::trace_fuzz::CheckRanks(std::move(ranks));
  });
}
