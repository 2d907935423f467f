// The simulator's compiled form of an ExecutionPlan (internal to src/sim/): what the event
// engine reads of each instruction, in flat arrays.
//
// Engine::Prepare compiles every rank's program, rank after rank, into one array of SimOp (32
// bytes each, two to a cache line) with their slots in one array of slot indices, and copies the
// memory rule's figures of every (micro-batch, stage) into one ChunkMemory table. The run reads
// only these: never the plan's Instructions, each of which holds three heap vectors (shapes,
// inputs, outputs), so that a 1,024-rank plan of a million instructions is walked with two
// streams of compact records instead of four pointer chases per instruction.
//
// Invariants (Prepare checks the plan first): an op's slots are indices into its rank's slot
// states (< the rank's slot count); aux names an existing chunk or rank; the ops of all ranks are
// followed by one end marker, so every op's slots end where the next op's begin.
//
// Thread safety: plain data, written by Prepare and read by one Engine.
#pragma once

#include <cstdint>

#include "base/units.h"
#include "plan/instruction.h"
#include "plan/moe_segments.h"

namespace sluice::sim_internal {

// One instruction as the engine reads it. No default member values: Prepare writes every field
// of every op into uninitialised storage.
struct SimOp {
  OpKind op;
  uint8_t piece;  // compute ops: kFirstPiece | kLastPiece (plan/moe_segments.h); else 0
  int32_t slots;  // first of its slots in Engine::slot_refs_: the inputs, then the outputs, up
                  // to the next op's `slots` (the compiled program ends with a marker op)
  int32_t n_in;
  int32_t aux;    // compute ops: their chunk in Engine::chunks_; point-to-point: the peer; else 0
  int64_t value;  // compute ops and optimizer-step: duration (ns) x the rank's compute factor;
                  // load-input: duration (ns); point-to-point: tag; else 0
  Bytes bytes;    // payload of transfers, collectives and loads; the buffer a receive or a
                  // compute op's output allocates (fp16 bytes of its shapes; 0 without outputs)
};
static_assert(sizeof(SimOp) == 32);

// The memory rule's figures of one (micro-batch, stage) chunk (the plan's ChunkCost). Its index
// identifies the chunk: two compute ops of a rank name the same chunk iff they have the same aux.
struct ChunkMemory {
  int64_t peak = 0, stored = 0, stored_until_w = 0;
};

}  // namespace sluice::sim_internal
