// Action and Schedule: the order of compute work on each pipeline rank, the input of lowering.
//
// An Action is one unit of compute of one micro-batch on one virtual stage: F (forward), B (full
// backward), I (input-gradient half of the backward) or W (weight-gradient half). Its text form is
// PyTorch pipelining's: "<stage><kind><microbatch>", e.g. "2F0", "1I3", "0W2".
//
// A Schedule lists, for every pipeline rank, its actions in execution order. Virtual stages are
// numbered 0 .. pp*vpp-1 along the model; stage s runs on rank s % pp (Megatron's interleaved
// placement; vpp = 1 is the plain linear placement). For encoder-decoder models the stages are
// the same chunks StageCostEvaluator cuts (encoder stacks first).
//
// Invariants of a valid schedule (CheckScheduleComplete): for every micro-batch and stage exactly
// one F and either one B or one I followed later by one W, on the stage's rank; F before B/I on a
// stage; a micro-batch's F on stage s+1 comes after its F on s in dependency terms (checked by
// simulation, not by list order, since ranks run concurrently).
//
// Thread safety: value types.
#pragma once

#include <cstdint>
#include <string>
#include <string_view>
#include <vector>

#include "base/status.h"
#include "base/units.h"
#include "cost/chunk_cost.h"

namespace sluice {

enum class ActionKind { kForward, kBackward, kBackwardInput, kBackwardWeight };
char ActionKindLetter(ActionKind kind);  // 'F', 'B', 'I', 'W'

struct Action {
  int64_t stage = 0;  // virtual stage 0 .. pp*vpp-1
  ActionKind kind = ActionKind::kForward;
  int64_t microbatch = 0;  // index into the replica's micro-batch list (execution order)

  // "2F0".
  std::string ToString() const;
  friend bool operator==(const Action&, const Action&) = default;
};

// Parses "2F0"; the error quotes the text and names `source` (file:line:column when known).
StatusOr<Action> ParseAction(std::string_view text, std::string_view source);

struct Schedule {
  std::string name;  // generator that produced it: "1f1b", "zb-h1", ...
  int64_t pp = 1;    // ranks
  int64_t vpp = 1;   // virtual stages per rank
  int64_t num_microbatches = 0;
  std::vector<std::vector<Action>> ranks;  // [rank][order]

  int64_t num_stages() const { return pp * vpp; }
  int64_t RankOf(int64_t stage) const { return stage % pp; }
  friend bool operator==(const Schedule&, const Schedule&) = default;
};

// Per micro-batch, per virtual stage: what one action costs. Micro-batches are NOT uniform.
struct ScheduleCosts {
  int64_t pp = 1;
  int64_t vpp = 1;
  // [microbatch][virtual stage]
  std::vector<std::vector<ChunkCost>> chunks;
  // Transfer time of one micro-batch's boundary tensor from stage s to s+1 (activations
  // forward, gradients backward; same size): [microbatch][stage], stage < pp*vpp - 1.
  // Empty: transfers are free.
  std::vector<std::vector<Duration>> p2p;
  // Buffer bytes a micro-batch holds on a virtual stage from its F until its B or I ends (the
  // boundary tensor the stage sends on, token ids and labels; StageCostEvaluator::
  // ChunkHeldBuffers): they count like stored activations. [microbatch][virtual stage]. Empty:
  // none.
  std::vector<std::vector<Bytes>> held;
  // Memory budget per rank for activations and held buffers: the memory limit minus model states
  // and the room kept for transient buffers (StageCostEvaluator::TransientBuffers). Empty:
  // unlimited.
  std::vector<Bytes> budget;

  int64_t num_microbatches() const { return static_cast<int64_t>(chunks.size()); }
  // held[mb][stage], or zero when `held` is empty.
  Bytes Held(int64_t mb, int64_t stage) const {
    return held.empty() ? Bytes::Zero() : held[mb][stage];
  }
};

// Checks the invariants above that a list can show (coverage, F before B/I before W per stage,
// stage on its rank). The message prints a step x rank grid marking the first bad action.
Status CheckScheduleComplete(const Schedule& schedule);

}  // namespace sluice
