// Sample orders for consecutive-split micro-batching (DynaPipe's first stage).
//
// A consecutive-split batcher cuts an ordered list of samples into runs, so the order decides
// which samples can share a micro-batch. Decoder-only samples have one length: sort it
// descending. Encoder-decoder samples are points (input, target) with no total order; DynaPipe
// walks an open travelling-salesman path through them (L1 distance), so that neighbours on the
// path have similar input and target lengths, with a lexicographic sort as the ablation
// ("DP (S)" vs "DP (T)").
//
// TspPathOrder: identical points are merged first; a nearest-neighbour path starts at the point
// with the largest input + target; then 2-opt and Or-opt (segments of 1-3 points) moves over each
// point's nearest neighbours improve it until no move helps or a work budget (counted distance
// evaluations, not wall time, so the result is deterministic) is spent; finally the path is turned
// so that its larger end comes first. Ties always break on the smaller index.
//
// Every function returns a permutation of 0..n-1 (indices into its input) and is deterministic.
// Thread safety: pure functions.
#pragma once

#include <cstdint>
#include <span>
#include <string_view>
#include <vector>

#include "base/status.h"
#include "batching/stage_cost.h"
#include "data/sample.h"

namespace sluice {

// A sample as a point: encoder (or only) length and decoder length.
struct LengthPoint {
  int64_t enc = 0;
  int64_t dec = 0;

  friend bool operator==(const LengthPoint&, const LengthPoint&) = default;
};

enum class SampleOrder {
  kAuto,            // decoder-only: kSortDescending; encoder-decoder: kTspPath
  kSortDescending,  // by enc + dec descending (decoder-only: the sequence length)
  kTspPath,         // open L1 TSP path (see above)
  kLexicographic,   // by (enc, dec) descending
};
std::string_view SampleOrderName(SampleOrder order);  // "auto" | "sort" | "tsp" | "lexicographic"
StatusOr<SampleOrder> ParseSampleOrder(std::string_view name);  // error lists the names

struct TspOptions {
  // Neighbours per point that 2-opt and Or-opt try to connect it to.
  int64_t neighbours = 8;
  // Budget of distance evaluations for nearest-neighbour lists and improvement moves; the
  // nearest-neighbour path itself always completes. 0 = no improvement.
  int64_t max_work = 20'000'000;
};

// Indices sorted by enc + dec descending, then enc descending, then index ascending.
std::vector<int64_t> SortDescendingOrder(std::span<const LengthPoint> points);
// Indices sorted by (enc, dec) descending, then index ascending.
std::vector<int64_t> LexicographicOrder(std::span<const LengthPoint> points);
// Open L1 TSP path through the points (see the file comment).
std::vector<int64_t> TspPathOrder(std::span<const LengthPoint> points,
                                  const TspOptions& options = {});
// Sum of L1 distances between consecutive points of `order`.
int64_t PathLength(std::span<const LengthPoint> points, std::span<const int64_t> order);

// The samples as points the way `eval` pads them: (Pad(SeqLen), Pad(DecLen)) for
// encoder-decoder models, (SeqLen, 0) for decoder-only ones (unpadded, so ties keep length order).
std::vector<LengthPoint> SamplePoints(std::span<const Sample> samples,
                                      const StageCostEvaluator& eval);
// The order `order` gives the samples (kAuto resolved by the model kind). Identical points keep
// the samples' own order refined by raw (input, target) lengths descending.
std::vector<int64_t> OrderSamples(std::span<const Sample> samples, const StageCostEvaluator& eval,
                                  SampleOrder order, const TspOptions& options = {});

}  // namespace sluice
