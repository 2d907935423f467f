// Matching communications across ranks, and aligning the ranks' clocks (dPRO §1.4).
//
// Matching: c10d and NCCL pair point-to-point ops in posting order, so the k-th send from rank A
// to rank B with key K is the k-th receive on B from A with key K; the k-th collective with key K
// on every rank that has collectives with key K is one collective instance. Ranks whose counts
// disagree are matched up to the shorter and the rest is reported (a partial result).
//
// Alignment: offsets θ_r (ns, added to every time of rank r; θ of the lowest rank is 0).
//  1. Anchor on collective ends: a collective ends at nearly the same instant on each member, so
//     θ_s - θ_r is the median of end_r - end_s over the instances both share (spread out from the
//     reference rank through shared collectives).
//  2. Refine with send -> receive causality: a receive cannot be done before its send was posted,
//     recv_done + θ_B >= send_post + θ_A. Offsets that break a bound are moved onto it (a rank
//     no collective anchors keeps its own clock where the bounds allow it).
//  3. Receives posted before their send are clipped to the send's post (the transfer's interval
//     starts there); counted in the report.
//
// Thread safety: pure functions.
#pragma once

#include <cstdint>
#include <string>
#include <vector>

#include "base/status.h"
#include "trace/trace_model.h"

namespace sluice::trace {

struct MessageMatch {
  int64_t src = 0;   // sending rank
  int32_t send = 0;  // index into ranks[src].comms
  int64_t dst = 0;   // receiving rank
  int32_t recv = 0;  // index into ranks[dst].comms
};

struct CollectiveMatch {
  std::string key;
  int64_t order = 0;  // k-th instance of this key
  std::vector<std::pair<int64_t, int32_t>> members;  // (rank, comm index), ascending rank
};

struct Matching {
  std::vector<MessageMatch> messages;
  std::vector<CollectiveMatch> collectives;
  int64_t unmatched = 0;           // point-to-point ops and collective parts left unmatched
  std::vector<std::string> notes;  // what was left unmatched, naming ranks and ops
};

// REQUIRES: set.ranks[i].rank == i.
Matching MatchComms(const TraceSet& set);

struct ClockAlignment {
  std::vector<int64_t> offset_ns;  // [rank] added to every time of the rank
  std::vector<std::string> how;    // [rank] "reference", "collective ends (n=12)", "causality"...
  int64_t causality_bounds = 0;    // send -> receive bounds used
  int64_t violations = 0;          // bounds still broken after alignment (inconsistent traces)
  int64_t clipped_receives = 0;    // receives posted before their send
};

// Computes the offsets and shifts every op and done time of `set` by them.
ClockAlignment AlignClocks(TraceSet* set, const Matching& matching);

}  // namespace sluice::trace
