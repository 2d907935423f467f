// libFuzzer target for the data/ length readers (text, JSON Lines, CSV). Every input goes through
// all three formats, with default field names and with names taken from the input's first byte.
// Any input must give a Dataset or an InvalidArgument Status whose message names the source,
// never a crash. A Dataset that was read must satisfy Dataset::Validate(), round-trip through the
// text format (lengths), and be batched with every sample exactly once or dropped with a reason.
#include <cstddef>
#include <cstdint>
#include <cstdlib>
#include <string>
#include <string_view>
#include <vector>

#include "data/global_batcher.h"
#include "data/reader.h"
#include "data/stats.h"

namespace {

void Check(bool ok) {
  if (!ok) std::abort();
}

void CheckDataset(const sluice::Dataset& ds) {
  Check(!ds.empty());
  Check(ds.Validate().ok());

  // Lengths survive a round trip through the text format.
  std::string text;
  for (const sluice::Sample& s : ds.samples()) {
    text += std::to_string(s.input_len) + " " + std::to_string(s.target_len) + "\n";
  }
  sluice::StatusOr<sluice::Dataset> back =
      sluice::ParseLengths(text, sluice::LengthFormat::kText, {}, "round-trip");
  Check(back.ok() && back->size() == ds.size());
  for (size_t i = 0; i < ds.size(); ++i) {
    Check((*back)[i].input_len == ds[i].input_len && (*back)[i].target_len == ds[i].target_len);
  }

  // Batching keeps every sample exactly once or reports it.
  sluice::BatcherOptions o;
  o.tokens_per_batch = 4096;
  o.max_seqlen = 1024;
  o.drop_last = (ds.size() % 2) == 0;
  sluice::StatusOr<sluice::GlobalBatcher> b = sluice::GlobalBatcher::Create(ds, o);
  Check(b.ok());
  std::vector<int> seen(ds.size(), 0);  // ids are 0..n-1 for read datasets
  sluice::GlobalBatch batch;
  while (b->Next(&batch)) {
    Check(!batch.samples.empty() && batch.tokens <= o.tokens_per_batch);
    for (const sluice::Sample& s : batch.samples) ++seen[static_cast<size_t>(s.id)];
  }
  for (const sluice::DroppedSample& d : b->report().dropped) ++seen[static_cast<size_t>(d.id)];
  for (int n : seen) Check(n == 1);

  const sluice::DataStats stats = sluice::ComputeStats(ds);
  Check(stats.samples == static_cast<int64_t>(ds.size()));
  Check(!sluice::FormatStats(stats).empty());
}

void ParseAll(std::string_view text, const sluice::ReaderOptions& options) {
  for (sluice::LengthFormat format : {sluice::LengthFormat::kText, sluice::LengthFormat::kJsonLines,
                                      sluice::LengthFormat::kCsv}) {
    sluice::StatusOr<sluice::Dataset> ds = sluice::ParseLengths(text, format, options, "fuzz.in");
    if (ds.ok()) {
      CheckDataset(*ds);
    } else {
      Check(ds.status().code() == sluice::StatusCode::kInvalidArgument);
      Check(ds.status().message().rfind("fuzz.in", 0) == 0);
    }
  }
}

}  // namespace

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  const std::string_view text(reinterpret_cast<const char*>(data), size);
  ParseAll(text, {});
  if (size > 0) {
    // Short field names so that the fuzzer finds them: "a", "b", "c" or empty (not read).
    sluice::ReaderOptions o;
    const uint8_t k = data[0];
    o.input_field = (k & 1) ? "a" : "input_len";
    o.target_field = (k & 2) ? "b" : ((k & 4) ? "" : "target_len");
    o.task_field = (k & 8) ? "c" : ((k & 16) ? "" : "task");
    ParseAll(text.substr(1), o);
  }
  return 0;
}
