#include "runtime/profiler.h"

#include <fmt/core.h>
#include <fmt/ranges.h>

#include <algorithm>
#include <chrono>
#include <map>
#include <memory>
#include <set>
#include <tuple>
#include <utility>

#include "runtime/batch_layout.h"
#include "runtime/memory_stats.h"
#include "runtime/model.h"
#include "runtime/moe.h"
#include "runtime/token_source.h"
#include "runtime/torch_pch.h"

namespace sluice::runtime {
namespace {

// Layer probes: a model with 3 layers per stack cut into one-layer chunks, so chunk 1
// (decoder-only) or chunks 1 and 4 (encoder-decoder, 6 chunks) hold exactly one layer and nothing
// else. A decoder-only MoE model with an MoE layer every k-th layer has max(3, 2k) layers in as
// many chunks: chunk k - 1 (chunk 1 when k = 1) holds an MoE layer, chunk k (k >= 2) a dense one,
// both between the first and the last chunk. Head probe: the same model with no layers cut into 2
// chunks; chunk 1 holds only the final norm, the output head and the loss.
constexpr int64_t kProbeLayers = 3;

using Clock = std::chrono::steady_clock;

class ScopedThreads {
 public:
  explicit ScopedThreads(int64_t threads) : previous_(at::get_num_threads()) {
    at::set_num_threads(static_cast<int>(threads));
  }
  ~ScopedThreads() { at::set_num_threads(previous_); }
  ScopedThreads(const ScopedThreads&) = delete;
  ScopedThreads& operator=(const ScopedThreads&) = delete;

 private:
  int previous_;
};

std::vector<int64_t> Sorted(std::vector<int64_t> v) {
  std::sort(v.begin(), v.end());
  return v;
}

// The probe chunks of one model.
struct Probes {
  ModelSpec model;                        // the layer probe model (kProbeLayers per stack)
  ModelSpec head_model;                   // the head probe model (no layers)
  std::unique_ptr<ModelShard> encoder;    // one encoder (decoder-only: the; MoE: a dense) layer
  std::unique_ptr<ModelShard> moe;        // MoE models: one MoE layer
  std::unique_ptr<ModelShard> decoder;    // encoder-decoder: one decoder layer
  std::unique_ptr<ModelShard> head;       // final norm + head + loss
  std::unique_ptr<ModelShard> embedding;  // chunk 0: embedding + one layer (parameter count)
  int64_t encoder_stage = 1, decoder_stage = 4, moe_stage = -1;

  // REQUIRES: encoder (absent for an MoE model whose every layer is an MoE layer).
  const Chunk& encoder_chunk() const { return encoder->chunk(encoder_stage); }
  const Chunk& moe_chunk() const { return moe->chunk(moe_stage); }
  const Chunk& decoder_chunk() const { return decoder->chunk(decoder_stage); }
  const Chunk& head_chunk() const { return head->chunk(1); }
  // The layer chunk 0 holds beside the embedding.
  const Chunk& first_layer_chunk() const {
    return encoder != nullptr ? encoder_chunk() : moe_chunk();  // layer 0 is dense when k >= 2
  }
};

StatusOr<Probes> MakeProbes(const ModelSpec& model, uint64_t seed) {
  Probes p;
  const bool enc_dec = model.is_encoder_decoder();
  p.model = model;
  p.model.layers = kProbeLayers;
  if (enc_dec) p.model.decoder_layers = kProbeLayers;
  int64_t chunks = enc_dec ? 2 * kProbeLayers : kProbeLayers;
  p.encoder_stage = 1;
  p.decoder_stage = enc_dec ? kProbeLayers + 1 : -1;
  if (model.moe.has_value()) {
    const int64_t k = model.moe->layer_interval;
    p.model.layers = std::max<int64_t>(kProbeLayers, 2 * k);
    chunks = p.model.layers;
    p.moe_stage = k == 1 ? 1 : k - 1;
    p.encoder_stage = k;  // a dense layer when k >= 2
    SLUICE_ASSIGN_OR_RETURN(p.moe, ModelShard::Create(p.model, chunks, 1, p.moe_stage, seed));
  }
  if (!model.moe.has_value() || model.moe->layer_interval >= 2) {
    SLUICE_ASSIGN_OR_RETURN(p.encoder,
                            ModelShard::Create(p.model, chunks, 1, p.encoder_stage, seed));
  }
  if (enc_dec) {
    SLUICE_ASSIGN_OR_RETURN(p.decoder,
                            ModelShard::Create(p.model, chunks, 1, p.decoder_stage, seed));
  }
  SLUICE_ASSIGN_OR_RETURN(p.embedding, ModelShard::Create(p.model, chunks, 1, 0, seed));
  p.head_model = model;
  p.head_model.layers = 0;
  p.head_model.decoder_layers = 0;
  auto head = ModelShard::Create(p.head_model, 2, 1, 1, seed);
  if (!head.ok()) {
    return InternalError(fmt::format(
        "profile: the runtime cannot build the head-only probe chunk (a model with no layers cut "
        "into 2 chunks): {}",
        head.status().message()));
  }
  p.head = std::move(head).value();
  // Gradients exist from the start, as in training after the first step: every measured backward
  // accumulates into them instead of allocating them.
  for (ModelShard* shard : {p.encoder.get(), p.moe.get(), p.decoder.get(), p.head.get()}) {
    if (shard == nullptr) continue;
    for (at::Tensor& t : shard->Parameters()) t.mutable_grad() = torch::zeros_like(t);
  }
  return p;
}

int64_t Numel(const std::vector<at::Tensor>& params) {
  int64_t n = 0;
  for (const at::Tensor& t : params) n += t.numel();
  return n;
}
double Fp16Mb(int64_t params) { return static_cast<double>(params) * 2.0 / 1e6; }

// What a chunk is given: the micro-batch's tokens, masks and labels, the boundary activations
// (requiring gradients) and, for chunks that do not end in the loss, the gradients of outputs.
struct PointInputs {
  MicroBatchInputs mb;
  std::vector<at::Tensor> activations;
  std::vector<at::Tensor> grad_outputs;
};

enum class ProbeKind { kEncoderLayer, kDecoderLayer, kHead };

PointInputs MakeInputs(const ModelSpec& model, const LayerShape& shape, ProbeKind kind,
                       const TokenSource& tokens, at::Generator& gen) {
  const bool enc_dec = model.is_encoder_decoder();
  MicroBatchLayout layout;
  layout.shape = shape;
  for (int64_t r = 0; r < shape.mbs; ++r) {
    RowSegment s;
    s.sample_id = r;
    s.length = shape.seqlen;
    if (enc_dec) s.dec_length = shape.dec_seqlen;
    layout.rows.push_back({s});
    layout.label_tokens += enc_dec ? shape.dec_seqlen : shape.seqlen;
  }
  PointInputs in;
  in.mb = BuildMicroBatchInputs(
      model, layout, tokens, 1.0 / static_cast<double>(std::max<int64_t>(1, layout.label_tokens)));
  auto act = [&](int64_t len) {
    return torch::randn({shape.mbs, len, model.hidden}, gen, torch::kFloat32).requires_grad_(true);
  };
  const bool two_streams = enc_dec && kind != ProbeKind::kEncoderLayer;
  if (two_streams) {
    in.activations = {act(shape.seqlen), act(shape.dec_seqlen)};
  } else {
    in.activations = {act(shape.seqlen)};
  }
  if (kind != ProbeKind::kHead) {
    for (const at::Tensor& a : in.activations) {
      in.grad_outputs.push_back(torch::randn(a.sizes(), gen, torch::kFloat32) * 1e-3);
    }
  }
  return in;
}

struct Pass {
  Duration forward, backward;
  Bytes stored, peak;
};

bool IsOutOfMemory(const std::exception& e, const CpuMemoryCounter& counter) {
  if (counter.limit_hit() || dynamic_cast<const std::bad_alloc*>(&e) != nullptr) return true;
  const std::string_view what = e.what();
  return what.find("not enough memory") != std::string_view::npos ||
         what.find("can't allocate memory") != std::string_view::npos;
}

// One forward and backward of `chunk`; nullopt when it ran out of memory (or would hold more
// than `limit` above what was live before it).
StatusOr<std::optional<Pass>> RunOnce(const Chunk& chunk, PointInputs& in, Recompute rc,
                                      std::optional<Bytes> limit, CpuMemoryCounter& counter) {
  for (at::Tensor& a : in.activations) a.mutable_grad().reset();
  const Bytes base = counter.current();
  counter.ResetPeak();
  counter.SetLimit(limit.has_value() ? std::optional<Bytes>(base + *limit) : std::nullopt);
  struct ClearLimit {
    CpuMemoryCounter& c;
    ~ClearLimit() { c.SetLimit(std::nullopt); }
  } clear_limit{counter};
  try {
    const bool full = rc == Recompute::kFull;
    const bool selective = rc == Recompute::kSelective;
    // MoE layers (all experts on this rank, ep 1) add their load-balancing loss, which the
    // backward differentiates as the executor's does.
    MoeContext moe_forward, moe_again;
    const bool moe = chunk.has_moe();
    auto backward = [&](std::vector<at::Tensor> outs, const MoeContext& ctx) {
      std::vector<at::Tensor> grads = in.grad_outputs;
      if (ctx.aux_loss.defined()) {
        outs.push_back(ctx.aux_loss);
        grads.push_back(torch::ones_like(ctx.aux_loss));
      }
      torch::autograd::backward(outs, grads);
    };
    const Clock::time_point t0 = Clock::now();
    std::vector<at::Tensor> outs;
    if (full) {
      torch::NoGradGuard no_grad;
      outs = chunk.Forward(in.activations, in.mb.labels, in.mb, false, nullptr,
                           moe ? &moe_forward : nullptr);
    } else {
      outs = chunk.Forward(in.activations, in.mb.labels, in.mb, selective, nullptr,
                           moe ? &moe_forward : nullptr);
    }
    const Clock::time_point t1 = Clock::now();
    const Bytes stored = counter.current() - base;
    if (full) {
      // Keep the stored outputs alive (the next layer holds them) while recomputing.
      backward(chunk.Forward(in.activations, in.mb.labels, in.mb, false, nullptr,
                             moe ? &moe_again : nullptr),
               moe_again);
    } else {
      backward(outs, moe_forward);
    }
    const Clock::time_point t2 = Clock::now();
    Pass pass;
    pass.forward =
        Duration::Nanos(std::chrono::duration_cast<std::chrono::nanoseconds>(t1 - t0).count());
    pass.backward =
        Duration::Nanos(std::chrono::duration_cast<std::chrono::nanoseconds>(t2 - t1).count());
    pass.stored = stored;
    pass.peak = counter.peak() - base;
    return std::optional<Pass>(pass);
  } catch (const std::exception& e) {
    if (IsOutOfMemory(e, counter)) return std::optional<Pass>();
    // c10::Error's text goes on with a C++ stack trace after its first line.
    const std::string what = e.what();
    return InternalError(
        fmt::format("profile: libtorch failed: {}", what.substr(0, what.find('\n'))));
  }
}

double MedianMs(std::vector<Duration> v) { return MedianDuration(std::move(v)).millis(); }

struct PointResult {
  double forward_ms = 0, backward_ms = 0;
  Bytes stored, peak;
};

// Warm-up, then `repeats` timed passes: medians of the times, the largest memory.
StatusOr<std::optional<PointResult>> MeasureLayer(const Chunk& chunk, PointInputs& in, Recompute rc,
                                                  const ProfileOptions& o,
                                                  CpuMemoryCounter& counter) {
  std::vector<Duration> fwd, bwd;
  PointResult r;
  for (int64_t i = 0; i < o.warmup + o.repeats; ++i) {
    SLUICE_ASSIGN_OR_RETURN(std::optional<Pass> p,
                            RunOnce(chunk, in, rc, o.activation_limit, counter));
    if (!p.has_value()) return std::optional<PointResult>();
    if (i < o.warmup) continue;
    fwd.push_back(p->forward);
    bwd.push_back(p->backward);
    r.stored = std::max(r.stored, p->stored);
    r.peak = std::max(r.peak, p->peak);
  }
  r.forward_ms = MedianMs(fwd);
  r.backward_ms = MedianMs(bwd);
  return std::optional<PointResult>(r);
}

// The capacity slices of the MoE parts' "experts_sliced" (the tutel rewrite's default degree,
// passes/moe_overlap.h).
constexpr int64_t kProfileMoeSlices = 4;

// The MoE layer's parts at one point: warm-up, then `repeats` timed runs, medians; nullopt when
// it ran out of memory.
StatusOr<std::optional<MoePartTimes>> MeasureMoeParts(const ModelSpec& model, const MoeMlp& moe,
                                                      const LayerShape& shape,
                                                      const ProfileOptions& o,
                                                      CpuMemoryCounter& counter,
                                                      at::Generator& gen) {
  std::array<std::vector<Duration>, kNumMoeParts> fwd, bwd;
  counter.SetLimit(o.activation_limit.has_value()
                       ? std::optional<Bytes>(counter.current() + *o.activation_limit)
                       : std::nullopt);
  struct ClearLimit {
    CpuMemoryCounter& c;
    ~ClearLimit() { c.SetLimit(std::nullopt); }
  } clear_limit{counter};
  try {
    const at::Tensor x =
        torch::randn({shape.mbs, shape.seqlen, model.hidden}, gen, torch::kFloat32);
    for (int64_t i = 0; i < o.warmup + o.repeats; ++i) {
      const MoePartTimes t = TimeMoeParts(model, moe, x, kProfileMoeSlices, gen);
      if (i < o.warmup) continue;
      for (size_t k = 0; k < static_cast<size_t>(kNumMoeParts); ++k) {
        fwd[k].push_back(t.forward[k]);
        bwd[k].push_back(t.backward[k]);
      }
    }
  } catch (const std::exception& e) {
    if (IsOutOfMemory(e, counter)) return std::optional<MoePartTimes>();
    const std::string what = e.what();
    return InternalError(fmt::format("profile: libtorch failed in the MoE layer parts: {}",
                                     what.substr(0, what.find('\n'))));
  }
  MoePartTimes out;
  for (size_t k = 0; k < static_cast<size_t>(kNumMoeParts); ++k) {
    out.forward[k] = MedianDuration(fwd[k]);
    out.backward[k] = MedianDuration(bwd[k]);
  }
  return std::optional<MoePartTimes>(out);
}

// Results by (key, dec key) -> mbs -> value, for one series.
using SeriesMap = std::map<std::pair<int64_t, int64_t>, std::map<int64_t, double>>;

CostSeries ToSeries(const SeriesMap& m, bool pair_keys) {
  CostSeries out;
  for (const auto& [key, points] : m) {
    if (points.empty()) continue;
    CostRow row;
    row.seqlen = key.first;
    row.dec_seqlen = pair_keys ? key.second : 0;
    for (const auto& [mbs, v] : points) {
      row.mbs.push_back(mbs);
      row.value.push_back(v);
    }
    out.push_back(std::move(row));
  }
  return out;
}

// A positive value for the file: memory that rounds to 0 MB is written as 1 byte.
double PositiveMb(Bytes b) { return std::max(b.mb(), 1e-6); }

struct LayerSeries {
  SeriesMap forward, backward, stored, peak;
  void Add(std::pair<int64_t, int64_t> key, int64_t mbs, const PointResult& r) {
    forward[key][mbs] = r.forward_ms;
    backward[key][mbs] = r.backward_ms;
    stored[key][mbs] = PositiveMb(r.stored);
    peak[key][mbs] = PositiveMb(r.peak);
  }
};

}  // namespace

Duration MedianDuration(std::vector<Duration> v) {
  SLUICE_CHECK(!v.empty());
  std::sort(v.begin(), v.end());
  const size_t n = v.size();
  return n % 2 == 1 ? v[n / 2] : Duration::Nanos((v[n / 2 - 1].nanos() + v[n / 2].nanos()) / 2);
}

StatusOr<LayerCostTable> ProfileModel(const ModelSpec& model, const ProfileOptions& o,
                                      Progress* progress) {
  SLUICE_RETURN_IF_ERROR(ValidateProfileOptions(model, o));
  const bool enc_dec = model.is_encoder_decoder();
  const std::vector<int64_t> mbs_list = Sorted(o.mbs);
  const std::vector<int64_t> seqlens = Sorted(o.seqlens);
  const std::vector<int64_t> dec_seqlens =
      Sorted(o.dec_seqlens.empty() ? o.seqlens : o.dec_seqlens);
  auto advance = [&](int64_t n) {
    if (progress != nullptr) progress->Add(n);
  };

  // The counter is created first so that it outlives every tensor made below.
  SLUICE_ASSIGN_OR_RETURN(std::unique_ptr<CpuMemoryCounter> counter, CpuMemoryCounter::Install());
  ScopedThreads threads(o.threads);
  SLUICE_ASSIGN_OR_RETURN(Probes probes, MakeProbes(model, o.seed));
  const TokenSource tokens(model.vocab, o.seed);
  at::Generator gen = at::make_generator<at::CPUGeneratorImpl>(o.seed ^ 0x70726f66696c65ULL);
  {
    // The process's first run of a probe pays one-time costs (kernel selection, thread pools,
    // allocator caches); it is never timed, whatever --warmup says.
    const LayerShape smallest{mbs_list.front(), seqlens.front(), enc_dec ? dec_seqlens.front() : 0};
    std::vector<std::pair<const Chunk*, ProbeKind>> all = {
        {&probes.head_chunk(), ProbeKind::kHead}};
    if (probes.encoder != nullptr) all.emplace_back(&probes.encoder_chunk(), ProbeKind::kEncoderLayer);
    if (probes.moe != nullptr) all.emplace_back(&probes.moe_chunk(), ProbeKind::kEncoderLayer);
    if (enc_dec) all.emplace_back(&probes.decoder_chunk(), ProbeKind::kDecoderLayer);
    for (const auto& [chunk, kind] : all) {
      PointInputs in = MakeInputs(probes.model, smallest, kind, tokens, gen);
      SLUICE_ASSIGN_OR_RETURN(std::optional<Pass> ignored,
                              RunOnce(*chunk, in, Recompute::kNone, std::nullopt, *counter));
      (void)ignored;
    }
  }

  // One row of a layer kind: every micro-batch size at every recompute level. A hole stops that
  // level's row (a larger micro-batch cannot fit either).
  auto measure_row = [&](const Chunk& chunk, ProbeKind kind, std::pair<int64_t, int64_t> key,
                         int64_t seqlen, int64_t dec_len, const std::vector<Recompute>& levels,
                         std::map<Recompute, LayerSeries>* series) -> Status {
    std::set<Recompute> out_of_memory;
    for (const int64_t mbs : mbs_list) {
      const LayerShape shape{mbs, seqlen, enc_dec ? dec_len : 0};
      PointInputs in = MakeInputs(probes.model, shape, kind, tokens, gen);
      for (const Recompute rc : levels) {
        advance(1);
        if (out_of_memory.count(rc) > 0) continue;
        SLUICE_ASSIGN_OR_RETURN(std::optional<PointResult> r,
                                MeasureLayer(chunk, in, rc, o, *counter));
        if (r.has_value()) {
          (*series)[rc].Add(key, mbs, *r);
        } else {
          out_of_memory.insert(rc);
        }
      }
    }
    return Status::Ok();
  };

  std::map<Recompute, LayerSeries> enc, moe, dec, head;
  for (const int64_t len : seqlens) {
    if (probes.encoder != nullptr) {
      SLUICE_RETURN_IF_ERROR(measure_row(probes.encoder_chunk(), ProbeKind::kEncoderLayer,
                                         {len, 0}, len, dec_seqlens.front(), o.recompute, &enc));
    }
    if (probes.moe != nullptr) {
      SLUICE_RETURN_IF_ERROR(measure_row(probes.moe_chunk(), ProbeKind::kEncoderLayer, {len, 0},
                                         len, dec_seqlens.front(), o.recompute, &moe));
    }
  }
  if (enc_dec) {
    for (const int64_t len : seqlens) {
      for (const int64_t dlen : dec_seqlens) {
        SLUICE_RETURN_IF_ERROR(measure_row(probes.decoder_chunk(), ProbeKind::kDecoderLayer,
                                           {len, dlen}, len, dlen, o.recompute, &dec));
      }
    }
  }
  // The head reads the decoder's output in encoder-decoder models: keyed by the decoder length
  // (the encoder output it is also given is not used, so its length does not matter).
  for (const int64_t len : enc_dec ? dec_seqlens : seqlens) {
    SLUICE_RETURN_IF_ERROR(measure_row(probes.head_chunk(), ProbeKind::kHead, {len, 0},
                                       enc_dec ? seqlens.front() : len, len, {Recompute::kNone},
                                       &head));
  }
  // MoE models: the MoE layer's parts, one by one, at every point (recompute does not apply).
  std::array<SeriesMap, kNumMoeParts> part_fwd, part_bwd;
  if (probes.moe != nullptr) {
    const MoeMlp* mlp = probes.moe_chunk().first_moe();
    SLUICE_CHECK(mlp != nullptr);
    for (const int64_t len : seqlens) {
      bool out_of_memory = false;  // a larger micro-batch cannot fit either
      for (const int64_t mbs : mbs_list) {
        advance(1);
        if (out_of_memory) continue;
        SLUICE_ASSIGN_OR_RETURN(
            std::optional<MoePartTimes> t,
            MeasureMoeParts(probes.model, *mlp, LayerShape{mbs, len, 0}, o, *counter, gen));
        if (!t.has_value()) {
          out_of_memory = true;
          continue;
        }
        for (size_t k = 0; k < static_cast<size_t>(kNumMoeParts); ++k) {
          part_fwd[k][{len, 0}][mbs] = std::max(t->forward[k].millis(), 1e-6);
          part_bwd[k][{len, 0}][mbs] = std::max(t->backward[k].millis(), 1e-6);
        }
      }
    }
  }
  const SeriesMap& head_fwd = head[Recompute::kNone].forward;
  const SeriesMap& head_bwd = head[Recompute::kNone].backward;

  LayerCostTable table;
  table.measured_on = fmt::format(
      "{}; sluice runtime models, per layer, median of {} runs after "
      "{} warm-up",
      DescribeCpu(o.threads), o.repeats, o.warmup);
  table.provenance = o.command.empty() ? std::string("sluice profile")
                                       : fmt::format("sluice profile: {}", o.command);
  table.layout =
      "tables[] per (tp, recompute), tp 1. time_ms: one layer's forward and backward (a "
      "recomputed forward counts in the backward) in ms, median of the timed runs; postprocess = "
      "final norm + output head + loss (a chunk with no layers); moe_encoder (MoE models) = a "
      "layer whose MLP is the MoE layer, all experts on one rank, encoder then = a dense layer. "
      "stored_activation_mb: bytes allocated by the forward and still live after it (saved "
      "tensors and the output), peak_activation_mb: highest live bytes during forward and "
      "backward, both relative to before the forward, in MB (10^6 bytes), counted at libtorch's "
      "CPU allocator. param_mb: the runtime's parameters of one layer (of the input embedding "
      "with its position table) at 2 bytes each. Absent points ran out of memory.";
  table.model.name = model.name;
  table.model.kind = model.kind;
  table.model.hidden = model.hidden;
  table.model.heads = model.heads;
  table.model.kv_channels = model.head_dim > 0 ? model.HeadDim() : 0;
  table.model.ffn_hidden = model.ffn_hidden;
  table.model.moe = model.moe;
  if (probes.encoder != nullptr) {
    table.model.profiled_stages.push_back(
        enc_dec ? "encoder = encoder layer"
        : model.moe.has_value()
            ? "encoder = decoder-only transformer layer with a dense MLP"
            : "encoder = decoder-only transformer layer");
  }
  if (model.moe.has_value()) {
    table.model.profiled_stages.push_back(
        "moe_encoder = decoder-only transformer layer with the MoE MLP (router, capacity, "
        "dropping, all experts on one rank, load-balancing loss)");
  }
  if (enc_dec) table.model.profiled_stages.push_back("decoder = decoder layer");
  table.model.profiled_stages.push_back("postprocess = final norm, output head, loss");

  const int e = static_cast<int>(TableStage::kEncoder);
  const int d = static_cast<int>(TableStage::kDecoder);
  const int p = static_cast<int>(TableStage::kPostprocess);
  const int me = static_cast<int>(TableStage::kMoeEncoder);
  const int64_t first_layer_params = Numel(probes.first_layer_chunk().parameters());
  const int64_t chunk0_params = Numel(probes.embedding->chunk(0).parameters());
  for (const Recompute rc : o.recompute) {
    TableConfig c;
    c.tp = 1;
    c.recompute = rc;
    auto fill = [&](int stage, const LayerSeries& ls, bool pair) {
      c.forward_ms[stage] = ToSeries(ls.forward, pair);
      c.backward_ms[stage] = ToSeries(ls.backward, pair);
      c.stored_activation_mb[stage] = ToSeries(ls.stored, pair);
      c.peak_activation_mb[stage] = ToSeries(ls.peak, pair);
    };
    if (probes.encoder != nullptr) {
      fill(e, enc[rc], false);
      c.param_mb[e] = Fp16Mb(Numel(probes.encoder_chunk().parameters()));
    }
    if (probes.moe != nullptr) {
      fill(me, moe[rc], false);
      c.param_mb[me] = Fp16Mb(Numel(probes.moe_chunk().parameters()));
    }
    if (enc_dec) {
      fill(d, dec[rc], true);
      c.param_mb[d] = Fp16Mb(Numel(probes.decoder_chunk().parameters()));
    }
    c.forward_ms[p] = ToSeries(head_fwd, false);
    c.backward_ms[p] = ToSeries(head_bwd, false);
    c.embedding_param_mb = Fp16Mb(chunk0_params - first_layer_params);
    const bool empty = (probes.encoder != nullptr && c.forward_ms[e].empty()) ||
                       (probes.moe != nullptr && c.forward_ms[me].empty()) ||
                       c.forward_ms[p].empty() || (enc_dec && c.forward_ms[d].empty());
    if (empty) {
      return FailedPreconditionError(fmt::format(
          "profile: at recompute {} no point of some layer kind fit --max-activation-mb or the "
          "machine's memory; try smaller --mbs or --seqlen values",
          RecomputeName(rc)));
    }
    table.configs.push_back(std::move(c));
  }
  if (probes.moe != nullptr && !part_fwd[0].empty()) {
    MoePartsTable parts;
    parts.slices = kProfileMoeSlices;
    for (size_t k = 0; k < static_cast<size_t>(kNumMoeParts); ++k) {
      parts.forward_ms[k] = ToSeries(part_fwd[k], false);
      parts.backward_ms[k] = ToSeries(part_bwd[k], false);
    }
    table.moe_parts = std::move(parts);
  }
  return table;
}

}  // namespace sluice::runtime
