// The chain of one segmented MoE compute op and the order its pieces are issued in (internal to
// the MoE overlap passes, moe_overlap.h).
//
// A chain has 2P-1 elements: segments at even indices, all-to-alls at odd ones
// (plan/moe_segments.h). `cut[e]` is 0 for a whole element or n >= 2 for n slices. ChainSteps
// lists, in issue order, the pieces, posts and waits that run it: whole elements in order; a run
// of consecutive elements cut into n slices software-pipelined, slice by slice within each
// segment (piece (e, c), then the post of all-to-all (e+1, c)), each piece preceded by the wait of
// what it depends on. PipelinedTime prices a chain's steps on one compute and one all-to-all
// stream (Lancet's two-resource list schedule).
//
// Thread safety: pure functions.
#pragma once

#include <cstdint>
#include <vector>

#include "base/units.h"

namespace sluice::passes::internal {

struct ChainStep {
  enum class Kind : uint8_t { kPiece, kPost, kWait };
  Kind kind = Kind::kPiece;
  int64_t element = 0;
  int64_t slice = -1;  // -1: whole
};

// REQUIRES: cut.size() is odd; cut[e] == 0 or >= 2. `async_whole`: whole all-to-alls are posted
// and waited (else they block where they are posted: a kPost with no kWait).
std::vector<ChainStep> ChainSteps(const std::vector<int64_t>& cut, bool async_whole);

// The time the steps take on two streams: `seg[j]` the whole segment j, `a2a[j]` the whole
// all-to-all j, `latency[j]` its latency part (a slice of n costs latency + (a2a - latency) / n),
// a sliced compute piece costs seg / n + overhead. `token_slices`: the slices cut the tokens
// (the forward partition), so a dispatch slice (even j) first exchanges its row counts: one
// latency more (TokenSliceTime).
Duration PipelinedTime(const std::vector<ChainStep>& steps, const std::vector<int64_t>& cut,
                       const std::vector<Duration>& seg, const std::vector<Duration>& a2a,
                       const std::vector<Duration>& latency, Duration overhead,
                       bool token_slices = false);

// Slice of n of all-to-all j (whole time `a2a`, latency part `latency`): latency + (a2a -
// latency) / n, plus one latency for a token slice of a dispatch (j even), whose receivers learn
// the row counts from a count exchange first (docs/moe.md, "Token slices").
Duration SliceTime(Duration a2a, Duration latency, int64_t n, int64_t j, bool token_slices);

// Lancet's DP over a forward chain: the runs of segments [j, i) and their n that minimise
// PipelinedTime (token slices); returns the cut per element. What the runtime can execute
// (docs/moe.md, "Token slices") shapes it: one n in 2..max_chunks for every run of the chain
// (the op's rows are cut once), and a run starts at an even segment (attention and router: a
// token slice of the experts needs the rows' positions, which a whole dispatch does not give).
std::vector<int64_t> PartitionDp(const std::vector<Duration>& seg, const std::vector<Duration>& a2a,
                                 const std::vector<Duration>& latency, int64_t max_chunks,
                                 Duration overhead);

}  // namespace sluice::passes::internal
