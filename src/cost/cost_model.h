// CostModel: time and memory of one layer chunk, the numbers every planner decision rests on.
//
// A query names a layer kind (encoder layer, decoder layer, embedding, output head), a padded
// micro-batch shape (micro-batch size x sequence length [x decoder length]), the tensor-parallel
// degree and the recomputation level. The answer is per ONE layer on ONE tensor-parallel rank:
// forward and backward time (backward split into input-gradient and weight-gradient parts for
// zero-bubble schedules), activation memory stored until backward, and the transient peak.
// A shape the model cannot answer for (beyond the profiled range, an out-of-memory hole in a
// table, an unsupported tp) is `feasible == false`: never a silent extrapolation.
//
// MoE models: Layer() and LayerParams() answer for the MEAN layer of a stack (for layer_interval
// k: one MoE layer and k-1 dense ones averaged), so that layers x Layer() is the stack's total.
// ModelStates() shards the experts' parameters over the expert-parallel degree.
//
// Layer kinds: kEncoder is a self-attention-only layer: a T5 encoder layer, and also the layer
// of a decoder-only (GPT/LLaMA) model, which the profile tables file under "encoder" (causal
// mask). kDecoder is an encoder-decoder model's decoder layer (self- and cross-attention),
// keyed by encoder and decoder length. kOutputHead is logits + loss ("postprocess").
//
// Thread safety: implementations are immutable after construction; Layer() and ModelStates()
// may be called from many threads. Layer() does not allocate.
#pragma once

#include <cstdint>
#include <optional>
#include <string>
#include <string_view>
#include <vector>

#include "base/status.h"
#include "base/units.h"
#include "model/model_spec.h"
#include "model/parallel_config.h"

namespace sluice {

enum class LayerKind { kEncoder, kDecoder, kEmbedding, kOutputHead };
enum class Recompute { kNone, kSelective, kFull };

// "encoder" | "decoder" | "embedding" | "output-head"
std::string_view LayerKindName(LayerKind kind);
// "none" | "selective" | "full"
std::string_view RecomputeName(Recompute rc);
// The inverse of RecomputeName; the error lists the allowed names.
StatusOr<Recompute> ParseRecompute(std::string_view name);

struct LayerShape {
  int64_t mbs = 1;         // sequences in the micro-batch
  int64_t seqlen = 0;      // padded encoder (or only) sequence length, tokens
  int64_t dec_seqlen = 0;  // padded decoder length: kDecoder, and kOutputHead of enc-dec models

  friend bool operator==(const LayerShape&, const LayerShape&) = default;
};

struct LayerCost {
  bool feasible = false;     // false: the model cannot answer (out of range / memory / tp)
  Duration forward;          // forward of one layer
  Duration backward;         // full backward = backward_input + backward_weight (+ recompute)
  Duration backward_input;   // input-gradient part (I), including any recomputed forward
  Duration backward_weight;  // weight-gradient part (W)
  Bytes stored_activation;   // kept from this layer's forward until its backward
  Bytes peak_activation;     // transient peak while running this layer

  friend bool operator==(const LayerCost&, const LayerCost&) = default;
};

// The layers one pipeline chunk holds.
struct StageLayers {
  int64_t encoder_layers = 0;  // kEncoder layers (all layers of a decoder-only model)
  int64_t decoder_layers = 0;  // kDecoder layers
  bool embedding = false;      // holds the input embedding
  bool output_head = false;    // holds the output head (a separate matrix unless tied; a stage
                               // with a tied head but without the embedding holds a copy of the
                               // word embedding, as Megatron-LM does for pp > 1)
  bool decoder_embedding = false;  // encoder-decoder: embeds the decoder inputs (the chunk that
                                   // ends the encoder), so it holds the word embedding (one copy
                                   // per stage, shared with the embedding or a tied head)

  friend bool operator==(const StageLayers&, const StageLayers&) = default;
};

// The layers of each of the par.chunks() pipeline chunks of `model` (model/chunk_cut.h's cut,
// par.layer_cut or the even one), the embedding on the first chunk and the output head on the
// last. REQUIRES: as CutIntoChunks.
std::vector<StageLayers> ChunkStageLayers(const ModelSpec& model, const ParallelConfig& par);

// Model-state memory of one device: mixed-precision Adam (fp16 weights 2 B, fp16 gradients
// 2 B, fp32 master weights + two moments 12 B per parameter) sharded as the ZeRO stage says.
struct ModelStateMemory {
  int64_t params = 0;  // parameters held by this device before ZeRO sharding (after tp)
  Bytes weights;       // fp16 weights resident on the device
  Bytes gradients;     // fp16 gradients
  Bytes optimizer;     // fp32 master weights and Adam moments
  Bytes total() const { return weights + gradients + optimizer; }

  friend bool operator==(const ModelStateMemory&, const ModelStateMemory&) = default;
};

// Applies mixed-precision Adam + ZeRO to `params` parameters replicated over `dp` ranks:
// ZeRO-1 shards the 12 B/param optimizer part over dp, ZeRO-2 also the gradients, ZeRO-3 also the
// weights; a shard is ceil(params / dp) parameters. REQUIRES: params >= 0, dp >= 1, 0 <= zero <= 3.
ModelStateMemory ModelStatesFromParams(int64_t params, int64_t dp, int64_t zero_stage);
// Adds two devices' worth of states field by field (used to combine dense and expert parts).
ModelStateMemory operator+(const ModelStateMemory& a, const ModelStateMemory& b);

class CostModel {
 public:
  virtual ~CostModel() = default;

  // One line saying which model answers and from what, e.g.
  // "profiled: data/profiles/a100_gpt_6.7b.json (A100-SXM4-40GB)".
  virtual std::string Describe() const = 0;
  virtual const ModelSpec& model() const = 0;
  // Whether queries at this tensor-parallel degree can be feasible at all.
  virtual bool SupportsTp(int64_t tp) const = 0;

  // Cost of ONE layer of `kind` on one tp rank. REQUIRES: shape.mbs >= 1, shape.seqlen >= 1,
  // shape.dec_seqlen >= 1 for kDecoder.
  virtual LayerCost Layer(LayerKind kind, const LayerShape& shape, int64_t tp,
                          Recompute rc) const = 0;

  // Parameters of ONE layer of `kind` on one tp rank (kOutputHead: 0 when tied to the embedding).
  virtual int64_t LayerParams(LayerKind kind, int64_t tp) const = 0;

  // What cutting an MoE layer's computation into slices adds to each sliced compute piece
  // (smaller GEMMs, the gathers and scatters, one more call each), when this model measured it
  // (a profiled table with MoE layer parts, profile_table.h); nullopt: unknown. The lowering
  // writes it into the plan, where the MoE overlap passes price their slices with it.
  virtual std::optional<Duration> MoeSliceOverhead() const { return std::nullopt; }

  // Model states of one device holding `stage` under `par` (tp, dp, ep, zero). Stage parameters
  // are layers x LayerParams plus embedding/head; MoE expert parameters (an analytic count) are
  // divided over ep and ZeRO-sharded over max(1, dp / ep) ranks, the rest over dp * cp.
  // REQUIRES: par.tp, par.dp, par.ep >= 1 and 0 <= par.zero <= 3.
  ModelStateMemory ModelStates(const StageLayers& stage, const ParallelConfig& par) const;
};

// Parameters of one device holding `stage` whose gradients the data-parallel reduction carries:
// ModelStates' params, less the experts' when each expert has one replica (dp / ep <= 1: the
// expert-parallel group holds every expert once, so nothing reduces them). With more replicas the
// experts stay in (they reduce over dp / ep ranks; plans have data-parallel collectives only, so
// this over-prices them).
int64_t ReducedGradientParams(const CostModel& cost, const StageLayers& stage,
                              const ParallelConfig& par);

}  // namespace sluice
