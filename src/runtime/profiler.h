// Profiler: measures the runtime's own layers on the machine it runs on and produces a
// `layer-cost-table/1` table (docs/formats.md), the format of the shipped A100 tables, so the
// planner and simulator can price plans with this machine's costs (`--cost profiled:FILE`).
//
// What is measured, per point of the grid (micro-batch size x sequence length [x decoder length]
// x recomputation), on the runtime's models (model.h) at tp 1:
//   - "encoder": one layer of the model's (encoder) stack; "decoder": one decoder layer of an
//     encoder-decoder model (keyed by encoder and decoder length); each timed as a whole chunk of
//     a probe model cut so that the chunk holds exactly that one layer (Chunk::Forward, then
//     autograd with random output gradients, as the executor runs a middle pipeline stage);
//   - "moe_encoder" (decoder-only MoE models): one MoE layer (router, capacity, dropping, every
//     expert on this rank, as at ep 1; its load-balancing loss differentiated with the output);
//     "encoder" is then one of the stack's dense layers, measured only when it has some (an MoE
//     layer every k >= 2 layers). The probe model has max(3, 2k) layers so that both kinds sit
//     in middle chunks. Expert-parallel runs compute the same expert rows per rank (E/ep experts
//     on the rows of ep members), so the ep 1 layer prices them; their all-to-alls are priced
//     by the simulator's links;
//   - "postprocess" (final norm, output head, loss): the last chunk of a probe model with no
//     layers (ModelShard::Create accepts it; the chunk then holds only the head), at recompute
//     none; keyed by the length the head reads (the decoder length for encoder-decoder models).
// Recompute: "selective" recomputes the attention core in the backward (Chunk::Forward's
// `selective`); "full" runs the forward without autograd and the backward re-runs it with
// autograd first (its time counts in the backward, as the format says).
// Times: `warmup` untimed runs, then the median of `repeats` timed runs (steady clock; CPU ops
// are synchronous). Memory, from a CpuMemoryCounter (memory_stats.h) relative to the live bytes
// before the forward: stored = live after the forward (saved tensors and the layer's output),
// peak = highest live during forward and backward; the largest over the timed runs. A point whose
// activations exceed `activation_limit` (or whose allocation fails) is a hole (out of memory);
// larger micro-batch sizes of that row are then not tried.
//
// The table's model must be describable by the format (multi-head attention, GELU MLP, MoE
// layers only in decoder-only models); ValidateProfileOptions rejects others, naming the flag. Messages name the `sluice profile`
// flag the option comes from (--mbs, --seqlen, ...).
//
// Thread safety: ProfileModel sets libtorch's intra-op thread count and installs the counting CPU
// allocator for its duration (both process-wide, both restored on return); run one at a time,
// with no other torch work in the process.
#pragma once

#include <cstdint>
#include <optional>
#include <string>
#include <vector>

#include "base/progress.h"
#include "base/status.h"
#include "base/units.h"
#include "cost/cost_model.h"
#include "cost/profile_table.h"
#include "model/model_spec.h"

namespace sluice::runtime {

struct ProfileOptions {
  std::vector<int64_t> mbs = {1, 2, 4};           // micro-batch sizes (--mbs), distinct, >= 1
  std::vector<int64_t> seqlens = {64, 128, 256};  // (encoder) lengths (--seqlen)
  // Decoder lengths of an encoder-decoder model (--dec-seqlen); empty = the same as seqlens.
  std::vector<int64_t> dec_seqlens;
  std::vector<Recompute> recompute = {Recompute::kNone};  // --recompute, distinct
  int64_t repeats = 5;  // timed runs per point, median (--repeats, [1, 1000])
  int64_t warmup = 2;   // untimed runs before them (--warmup, [0, 1000])
  int64_t threads = 1;  // libtorch intra-op threads while measuring (--threads, [1, 1024])
  uint64_t seed = 0;    // weights and tokens
  // Activation bytes one layer may hold; a point above it is a hole (--max-activation-mb).
  std::optional<Bytes> activation_limit;
  std::string command;  // recorded in the table's `source` (the command line)
};

// Checks the options against the model: lists non-empty, values in range and distinct, lengths
// within [1, model.max_position], decoder lengths only for encoder-decoder models, and a model
// the format can describe and the runtime can build.
Status ValidateProfileOptions(const ModelSpec& model, const ProfileOptions& options);

// Units of work ProfileModel reports to its Progress (one per grid point and series).
int64_t ProfileWorkUnits(const ModelSpec& model, const ProfileOptions& options);

// A description of the CPU and thread count for the table's `measured_on`.
std::string DescribeCpu(int64_t threads);

// The median of timed runs (the mean of the two middle ones for an even count), as the table's
// times and the all-to-all profile (link_profiler.h) take them. REQUIRES: !v.empty().
Duration MedianDuration(std::vector<Duration> v);

// Runs the grid and returns the table (tp 1, one entry per recompute level, sorted as the options
// give them). `progress`, when not null, advances by ProfileWorkUnits in total. Errors: invalid
// options, a counter that cannot be installed, an output head whose time cannot be told apart
// from timing noise (FailedPrecondition; more repeats help), nothing fitting the activation limit,
// and libtorch errors other than running out of memory (Internal).
StatusOr<LayerCostTable> ProfileModel(const ModelSpec& model, const ProfileOptions& options,
                                      Progress* progress);

}  // namespace sluice::runtime
