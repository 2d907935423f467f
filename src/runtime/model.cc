#include "runtime/model.h"

#include <fmt/core.h>
#include <fmt/format.h>

#include <algorithm>
#include <cmath>
#include <limits>

#include "base/rng.h"
#include "model/chunk_cut.h"
#include "runtime/moe.h"

namespace sluice::runtime {
namespace {

// Parameter groups, each seeded separately so that init never depends on the cut.
enum class Group : uint64_t {
  kWordEmbedding = 1,
  kPositions,
  kDecPositions,
  kEncoderLayer,
  kDecoderLayer,
  kHead,
  kExpert
};
constexpr double kInitStd = 0.02;

at::Generator GroupGenerator(uint64_t seed, Group g, int64_t index) {
  Rng rng = Rng(seed).Fork(static_cast<uint64_t>(g) * 1000003ULL + static_cast<uint64_t>(index));
  return at::make_generator<at::CPUGeneratorImpl>(rng.NextU64());
}

at::Tensor Normal(std::vector<int64_t> shape, double std, at::Generator& gen) {
  return torch::empty(shape, torch::kFloat32).normal_(0.0, std, gen).requires_grad_(true);
}
at::Tensor Filled(std::vector<int64_t> shape, float value) {
  return torch::full(shape, value, torch::kFloat32).requires_grad_(true);
}

// Collects parameters with their global names.
class Registry {
 public:
  explicit Registry(std::vector<std::pair<std::string, at::Tensor>>* named) : named_(named) {}
  at::Tensor Add(std::string name, at::Tensor t, std::vector<at::Tensor>* owner) {
    named_->emplace_back(std::move(name), t);
    owner->push_back(t);
    return t;
  }
  Linear AddLinear(const std::string& name, int64_t out, int64_t in, double std, bool bias,
                   at::Generator& gen, std::vector<at::Tensor>* owner) {
    Linear l;
    l.weight = Add(name + ".weight", Normal({out, in}, std, gen), owner);
    if (bias) l.bias = Add(name + ".bias", Filled({out}, 0.0f), owner);
    return l;
  }
  Norm AddNorm(const std::string& name, int64_t hidden, std::vector<at::Tensor>* owner) {
    return Norm{Add(name + ".weight", Filled({hidden}, 1.0f), owner),
                Add(name + ".bias", Filled({hidden}, 0.0f), owner)};
  }

 private:
  std::vector<std::pair<std::string, at::Tensor>>* named_;
};

// The MLP of an MoE layer: the router from the layer's generator, each expert from its own
// (seeded by layer and expert), so that any expert sharding starts from the same weights.
MoeMlp MakeMoe(const ModelSpec& m, int64_t layer, const std::string& prefix, uint64_t seed,
               const ExpertShard& shard, at::Generator& gen, Registry* reg,
               std::vector<at::Tensor>* owner, std::vector<at::Tensor>* expert_owner) {
  const int64_t h = m.hidden;
  const int64_t ffn = m.moe->expert_ffn_hidden > 0 ? m.moe->expert_ffn_hidden : m.ffn_hidden;
  const double out_std = kInitStd / std::sqrt(2.0 * static_cast<double>(m.TotalLayers()));
  MoeMlp moe;
  moe.layer = layer;
  moe.router =
      reg->AddLinear(prefix + ".moe.router", m.moe->experts, h, kInitStd, false, gen, owner);
  const int64_t local = m.moe->experts / shard.ep;
  for (int64_t e = shard.index * local; e < (shard.index + 1) * local; ++e) {
    at::Generator eg = GroupGenerator(seed, Group::kExpert, layer * 65537 + e);
    const std::string name = fmt::format("{}.moe.experts.{}", prefix, e);
    Expert x;
    x.index = e;
    if (m.mlp == MlpKind::kSwiGlu) {
      x.gate = reg->AddLinear(name + ".gate", ffn, h, kInitStd, false, eg, expert_owner);
      x.fc1 = reg->AddLinear(name + ".up", ffn, h, kInitStd, false, eg, expert_owner);
      x.fc2 = reg->AddLinear(name + ".down", h, ffn, out_std, false, eg, expert_owner);
    } else {
      x.fc1 = reg->AddLinear(name + ".fc1", ffn, h, kInitStd, true, eg, expert_owner);
      x.fc2 = reg->AddLinear(name + ".fc2", h, ffn, out_std, true, eg, expert_owner);
    }
    moe.experts.push_back(std::move(x));
  }
  return moe;
}

// `moe_layer`: the layer's id in the stack [encoder; decoder] when it is an MoE layer, else -1.
// Expert parameters go to `expert_owner` (the same list as `owner` at ep = 1).
Block MakeBlock(const ModelSpec& m, bool decoder, const std::string& prefix, at::Generator& gen,
                Registry* reg, std::vector<at::Tensor>* owner, int64_t moe_layer, uint64_t seed,
                const ExpertShard& shard, std::vector<at::Tensor>* expert_owner) {
  const int64_t h = m.hidden, hd = m.HeadDim(), q = m.heads * hd, kv = m.kv_heads * hd;
  const double out_std = kInitStd / std::sqrt(2.0 * static_cast<double>(m.TotalLayers()));
  Block b;
  b.decoder = decoder;
  b.ln1 = reg->AddNorm(prefix + ".ln1", h, owner);
  b.qkv = reg->AddLinear(prefix + ".attn.qkv", q + 2 * kv, h, kInitStd, true, gen, owner);
  b.proj = reg->AddLinear(prefix + ".attn.proj", h, q, out_std, true, gen, owner);
  b.ln2 = reg->AddNorm(prefix + ".ln2", h, owner);
  if (decoder) {
    b.cross_q = reg->AddLinear(prefix + ".cross.q", q, h, kInitStd, true, gen, owner);
    b.cross_kv = reg->AddLinear(prefix + ".cross.kv", 2 * kv, h, kInitStd, true, gen, owner);
    b.cross_proj = reg->AddLinear(prefix + ".cross.proj", h, q, out_std, true, gen, owner);
    b.ln3 = reg->AddNorm(prefix + ".ln3", h, owner);
  }
  if (moe_layer >= 0) {
    b.moe = MakeMoe(m, moe_layer, prefix, seed, shard, gen, reg, owner, expert_owner);
  } else if (m.mlp == MlpKind::kSwiGlu) {
    b.gate = reg->AddLinear(prefix + ".mlp.gate", m.ffn_hidden, h, kInitStd, false, gen, owner);
    b.fc1 = reg->AddLinear(prefix + ".mlp.up", m.ffn_hidden, h, kInitStd, false, gen, owner);
    b.fc2 = reg->AddLinear(prefix + ".mlp.down", h, m.ffn_hidden, out_std, false, gen, owner);
  } else {
    b.fc1 = reg->AddLinear(prefix + ".mlp.fc1", m.ffn_hidden, h, kInitStd, true, gen, owner);
    b.fc2 = reg->AddLinear(prefix + ".mlp.fc2", h, m.ffn_hidden, out_std, true, gen, owner);
  }
  return b;
}

// x W^T + b, recorded on `tape` when there is one.
at::Tensor Apply(const Linear& l, const at::Tensor& x, WeightGradTape* tape) {
  at::Tensor y = at::linear(x, l.weight, l.bias);
  if (tape != nullptr) tape->Add({x, y, l.weight, l.bias});
  return y;
}
at::Tensor Apply(const Norm& n, const at::Tensor& x) {
  return at::layer_norm(x, {x.size(-1)}, n.weight, n.bias, 1e-5);
}

// softmax(q k^T / sqrt(d) masked) v on [B, H, T, d] x [B, H, S, d] with mask [B, 1, T, S].
at::Tensor AttentionCore(const at::Tensor& q, const at::Tensor& k, const at::Tensor& v,
                         const at::Tensor& mask) {
  const double scale = 1.0 / std::sqrt(static_cast<double>(q.size(-1)));
  at::Tensor scores = at::matmul(q, k.transpose(-2, -1)) * scale;
  scores = scores.masked_fill(mask, -std::numeric_limits<float>::infinity());
  return at::matmul(at::softmax(scores, -1), v);
}

// The attention core without stored scores: the backward recomputes them.
struct RecomputedCore : torch::autograd::Function<RecomputedCore> {
  static at::Tensor forward(torch::autograd::AutogradContext* ctx, const at::Tensor& q,
                            const at::Tensor& k, const at::Tensor& v, const at::Tensor& mask) {
    ctx->save_for_backward({q, k, v, mask});
    return AttentionCore(q, k, v, mask);
  }
  static torch::autograd::variable_list backward(torch::autograd::AutogradContext* ctx,
                                                 torch::autograd::variable_list grads) {
    const auto saved = ctx->get_saved_variables();
    torch::AutoGradMode enable(true);
    const at::Tensor q = saved[0].detach().requires_grad_(true);
    const at::Tensor k = saved[1].detach().requires_grad_(true);
    const at::Tensor v = saved[2].detach().requires_grad_(true);
    const at::Tensor out = AttentionCore(q, k, v, saved[3]);
    auto g = torch::autograd::grad({out}, {q, k, v}, {grads[0]});
    return {g[0], g[1], g[2], at::Tensor()};
  }
};

// Multi-head (or grouped-query) attention of q [B, T, H*d] over k, v [B, S, KV*d].
at::Tensor Attend(const ModelSpec& m, const at::Tensor& q, const at::Tensor& k,
                  const at::Tensor& v, const at::Tensor& mask, bool selective) {
  const int64_t b = q.size(0), t = q.size(1), s = k.size(1), hd = m.HeadDim();
  at::Tensor qh = q.reshape({b, t, m.heads, hd}).transpose(1, 2);
  at::Tensor kh = k.reshape({b, s, m.kv_heads, hd}).transpose(1, 2);
  at::Tensor vh = v.reshape({b, s, m.kv_heads, hd}).transpose(1, 2);
  if (m.kv_heads != m.heads) {
    kh = kh.repeat_interleave(m.heads / m.kv_heads, 1);
    vh = vh.repeat_interleave(m.heads / m.kv_heads, 1);
  }
  at::Tensor ctx = selective ? RecomputedCore::apply(qh, kh, vh, mask)
                             : AttentionCore(qh, kh, vh, mask);
  return ctx.transpose(1, 2).reshape({b, t, m.heads * hd});
}

at::Tensor Mlp(const ModelSpec& m, const Block& b, const at::Tensor& x, WeightGradTape* tape) {
  if (m.mlp == MlpKind::kSwiGlu) {
    return Apply(b.fc2, at::silu(Apply(b.gate, x, tape)) * Apply(b.fc1, x, tape), tape);
  }
  return Apply(b.fc2, at::gelu(Apply(b.fc1, x, tape)), tape);
}

// true where query q may not attend key k: different segments, or a query position that is
// padding; `causal` also masks k > q. A query with no allowed key (padding) may attend to every
// key, so its softmax stays finite; nothing real ever reads it.
at::Tensor MakeMask(const at::Tensor& seg_q, const at::Tensor& seg_k, bool causal) {
  at::Tensor allowed = seg_q.unsqueeze(2).eq(seg_k.unsqueeze(1)) & seg_q.ge(0).unsqueeze(2);
  if (causal) {
    const int64_t t = seg_q.size(1);
    allowed = allowed & torch::ones({t, t}, torch::kBool).tril().unsqueeze(0);
  }
  const at::Tensor none = allowed.any(-1, /*keepdim=*/true).logical_not();
  allowed = allowed | none;
  return allowed.logical_not().unsqueeze(1).contiguous();
}

at::Tensor FromVector(const std::vector<int64_t>& v, int64_t rows, int64_t cols) {
  return torch::from_blob(const_cast<int64_t*>(v.data()), {rows, cols}, torch::kInt64).clone();
}

}  // namespace

MicroBatchInputs BuildMicroBatchInputs(const ModelSpec& model, const MicroBatchLayout& layout,
                                       const TokenSource& source, double loss_scale) {
  const bool enc_dec = model.is_encoder_decoder();
  const int64_t b = layout.shape.mbs, t = layout.shape.seqlen;
  const int64_t d = enc_dec ? layout.shape.dec_seqlen : 0;
  std::vector<int64_t> tok(b * t, 0), pos(b * t, 0), seg(b * t, -1);
  std::vector<int64_t> dtok(b * d, 0), dpos(b * d, 0), dseg(b * d, -1);
  std::vector<int64_t> lab(b * (enc_dec ? d : t), kIgnoreLabel);
  for (int64_t r = 0; r < b; ++r) {
    for (size_t k = 0; k < layout.rows[r].size(); ++k) {
      const RowSegment& s = layout.rows[r][k];
      // Varlen rows: each sample its own segment, positions from 0. Otherwise the row is one
      // sequence (packed samples attend across it, positions run on).
      const int64_t segment = layout.varlen ? static_cast<int64_t>(k) : 0;
      const int64_t pos0 = layout.varlen ? 0 : s.begin, dpos0 = layout.varlen ? 0 : s.dec_begin;
      if (!enc_dec) {
        const std::vector<int64_t> stream = source.Tokens(s.sample_id, s.length + 1);
        for (int64_t i = 0; i < s.length; ++i) {
          const int64_t at = r * t + s.begin + i;
          tok[at] = stream[i];
          lab[at] = stream[i + 1];
          pos[at] = pos0 + i;
          seg[at] = segment;
        }
        continue;
      }
      const std::vector<int64_t> stream = source.Tokens(s.sample_id, s.length + s.dec_length);
      for (int64_t i = 0; i < s.length; ++i) {
        const int64_t at = r * t + s.begin + i;
        tok[at] = stream[i];
        pos[at] = pos0 + i;
        seg[at] = segment;
      }
      // The decoder reads the target shifted right, starting from the input's last token.
      for (int64_t j = 0; j < s.dec_length; ++j) {
        const int64_t at = r * d + s.dec_begin + j;
        const int64_t prev = s.length + j - 1;
        dtok[at] = prev >= 0 ? stream[prev] : 0;
        lab[at] = stream[s.length + j];
        dpos[at] = dpos0 + j;
        dseg[at] = segment;
      }
    }
  }
  MicroBatchInputs in;
  in.shape = layout.shape;
  in.loss_scale = loss_scale;
  in.tokens = FromVector(tok, b, t);
  in.positions = FromVector(pos, b, t);
  const at::Tensor seg_t = FromVector(seg, b, t);
  in.real = seg_t.ge(0);
  if (!enc_dec) {
    in.labels = FromVector(lab, b, t);
    in.self_mask = MakeMask(seg_t, seg_t, /*causal=*/true);
    return in;
  }
  in.labels = FromVector(lab, b, d);
  in.dec_tokens = FromVector(dtok, b, d);
  in.dec_positions = FromVector(dpos, b, d);
  const at::Tensor dseg_t = FromVector(dseg, b, d);
  in.dec_real = dseg_t.ge(0);
  in.self_mask = MakeMask(seg_t, seg_t, /*causal=*/false);
  in.dec_self_mask = MakeMask(dseg_t, dseg_t, /*causal=*/true);
  in.cross_mask = MakeMask(dseg_t, seg_t, /*causal=*/false);
  return in;
}

MicroBatchInputs SliceRows(const MicroBatchInputs& mb, int64_t start, int64_t rows) {
  auto cut = [&](const at::Tensor& t) { return t.defined() ? t.narrow(0, start, rows) : t; };
  MicroBatchInputs out = mb;
  out.shape.mbs = rows;
  for (at::Tensor* t : {&out.tokens, &out.dec_tokens, &out.labels, &out.positions,
                        &out.dec_positions, &out.self_mask, &out.dec_self_mask, &out.cross_mask,
                        &out.real, &out.dec_real}) {
    *t = cut(*t);
  }
  return out;
}

at::Tensor Chunk::RunBlock(const Block& b, const at::Tensor& x, const at::Tensor& mask,
                           const at::Tensor& enc_out, const at::Tensor& cross_mask,
                           const at::Tensor& real, double loss_scale, bool selective,
                           WeightGradTape* tape, MoeContext* moe,
                           const SequenceGather* gather) const {
  const ModelSpec& m = *model_;
  const int64_t q = m.heads * m.HeadDim(), kv = m.kv_heads * m.HeadDim();
  const at::Tensor qkv = Apply(b.qkv, Apply(b.ln1, x), tape);
  auto parts = qkv.split_with_sizes({q, kv, kv}, -1);
  if (gather != nullptr) {  // context parallelism: every key and value of the micro-batch
    const at::Tensor all = gather->Gather(qkv.narrow(-1, q, 2 * kv));
    parts[1] = all.narrow(-1, 0, kv);
    parts[2] = all.narrow(-1, kv, kv);
  }
  at::Tensor h =
      x + Apply(b.proj, Attend(m, parts[0], parts[1], parts[2], mask, selective), tape);
  if (b.decoder) {
    const at::Tensor cq = Apply(b.cross_q, Apply(b.ln2, h), tape);
    const auto ckv = Apply(b.cross_kv, enc_out, tape).split_with_sizes({kv, kv}, -1);
    h = h + Apply(b.cross_proj, Attend(m, cq, ckv[0], ckv[1], cross_mask, selective), tape);
  }
  const at::Tensor y = Apply(b.decoder ? b.ln3 : b.ln2, h);
  if (b.moe.has_value()) {
    SLUICE_CHECK(moe != nullptr);
    return h + MoeForward(m, *b.moe, experts_, y, real, loss_scale, tape, moe);
  }
  return h + Mlp(m, b, y, tape);
}

bool Chunk::has_moe() const { return first_moe() != nullptr; }

const MoeMlp* Chunk::first_moe() const {
  for (const auto* stack : {&encoder_, &decoder_}) {
    for (const Block& b : *stack) {
      if (b.moe.has_value()) return &*b.moe;
    }
  }
  return nullptr;
}

std::vector<at::Tensor> Chunk::Forward(const std::vector<at::Tensor>& inputs,
                                       const at::Tensor& labels, const MicroBatchInputs& mb,
                                       bool selective, WeightGradTape* tape,
                                       MoeContext* moe) const {
  const ModelSpec& m = *model_;
  const bool enc_dec = m.is_encoder_decoder();
  at::Tensor h, enc_out, dec;
  bool in_decoder = false;
  bool enc_out_is_input = false;
  if (spec_.layers.embedding) {
    h = at::embedding(wte_, inputs.at(0)) + at::embedding(wpe_, mb.positions);
  } else if (!enc_dec || inputs.size() == 1) {
    h = inputs.at(0);
  } else {
    enc_out = inputs.at(0);
    dec = inputs.at(1);
    in_decoder = true;
    enc_out_is_input = true;
  }
  for (const Block& b : encoder_) {
    h = RunBlock(b, h, mb.self_mask, {}, {}, mb.real, mb.loss_scale, selective, tape, moe,
                 mb.cp);
  }
  if (spec_.ends_encoder) {
    enc_out = Apply(enc_ln_, h);
    // Chunk 0 of a one-chunk model got the decoder tokens from LoadInput; the last encoder chunk
    // of a longer pipeline materialises them (they are a function of the samples).
    const at::Tensor& dec_tokens =
        spec_.layers.embedding && inputs.size() >= 2 ? inputs[1] : mb.dec_tokens;
    dec = at::embedding(wte_, dec_tokens) + at::embedding(dec_wpe_, mb.dec_positions);
    in_decoder = true;
  }
  for (const Block& b : decoder_) {
    dec = RunBlock(b, dec, mb.dec_self_mask, enc_out, mb.cross_mask, mb.dec_real, mb.loss_scale,
                   selective, tape, moe);
  }
  if (spec_.layers.output_head) {
    const at::Tensor y = Apply(final_ln_, in_decoder ? dec : h);
    const at::Tensor logits = at::linear(y, m.tied_embeddings ? wte_ : head_);
    const at::Tensor loss = torch::nn::functional::cross_entropy(
        logits.reshape({-1, m.vocab}), labels.reshape({-1}),
        torch::nn::functional::CrossEntropyFuncOptions()
            .reduction(torch::kSum)
            .ignore_index(kIgnoreLabel));
    return {loss * mb.loss_scale};
  }
  if (in_decoder) {
    // The encoder output passes through decoder chunks; an alias keeps its gradient path.
    return {enc_out_is_input ? enc_out.view_as(enc_out) : enc_out, dec};
  }
  return {h};
}

StatusOr<std::unique_ptr<ModelShard>> ModelShard::Create(const ModelSpec& model, int64_t pp,
                                                         int64_t vpp, int64_t pp_index,
                                                         uint64_t seed, ExpertShard experts,
                                                         std::vector<int64_t> layer_cut) {
  if (experts.ep < 1 || experts.index < 0 || experts.index >= experts.ep) {
    return InvalidArgumentError(
        fmt::format("model shard: expert group {} of ep {}", experts.index, experts.ep));
  }
  if (experts.ep > 1 && !model.moe.has_value()) {
    return InvalidArgumentError(fmt::format(
        "--parallel: ep = {} needs an MoE model, but model '{}' is dense (no 'moe' field)",
        experts.ep, model.name));
  }
  if (model.moe.has_value() && model.moe->experts % experts.ep != 0) {
    return InvalidArgumentError(fmt::format(
        "--parallel: ep = {} does not divide model '{}''s {} experts (moe.experts); the runtime "
        "gives every rank of an expert-parallel group the same number of experts (allowed ep: "
        "divisors of {})",
        experts.ep, model.name, model.moe->experts, model.moe->experts));
  }
  const int64_t chunks = pp * vpp;
  const bool enc_dec = model.is_encoder_decoder();
  if (pp < 1 || vpp < 1 || pp_index < 0 || pp_index >= pp) {
    return InvalidArgumentError(fmt::format("model shard: pipeline rank {} of pp {} x vpp {}",
                                            pp_index, pp, vpp));
  }
  if (!layer_cut.empty()) {
    ParallelConfig par;
    par.pp = pp;
    par.vpp = vpp;
    par.layer_cut = layer_cut;
    SLUICE_RETURN_IF_ERROR(CheckParallelFits(par, model, nullptr, "model shard"));
  } else if (!ChunksFit(model, chunks)) {
    return InvalidArgumentError(fmt::format(
        "model '{}' ({} + {} layers) cannot be cut into pp * vpp = {} chunks (allowed: {})",
        model.name, model.layers, model.decoder_layers, chunks,
        fmt::join(AllowedChunkCounts(model), ", ")));
  }
  std::unique_ptr<ModelShard> shard(new ModelShard());
  shard->model_ = model;
  shard->pp_ = pp;
  shard->experts_ = experts;
  const ModelSpec& m = shard->model_;
  Registry reg(&shard->named_);
  std::vector<ChunkSpec> layout = ChunkLayout(m, chunks, layer_cut);
  bool wte_assigned = false;
  for (const ChunkSpec& spec : layout) {
    if (spec.index % pp != pp_index) continue;
    auto chunk = std::unique_ptr<Chunk>(new Chunk());
    chunk->model_ = &shard->model_;
    chunk->spec_ = spec;
    chunk->experts_ = experts;
    std::vector<at::Tensor> owned;  // parameters whose reductions this stage carries
    // Expert parameters: reduced with the stage's at ep = 1, over their own group at ep > 1.
    std::vector<at::Tensor> expert_owned;
    std::vector<at::Tensor>* expert_owner = experts.ep > 1 ? &expert_owned : &owned;
    if (ChunkNeedsWordEmbedding(m, spec)) {
      if (!shard->wte_.defined()) {
        at::Generator gen = GroupGenerator(seed, Group::kWordEmbedding, 0);
        shard->wte_ = Normal({m.vocab, m.hidden}, kInitStd, gen);
        shard->named_.emplace_back("wte", shard->wte_);
      }
      chunk->wte_ = shard->wte_;
      chunk->params_.push_back(shard->wte_);
      if (!wte_assigned) owned.push_back(shard->wte_);
      wte_assigned = true;
    }
    if (spec.layers.embedding) {
      at::Generator gen = GroupGenerator(seed, Group::kPositions, 0);
      chunk->wpe_ = reg.Add("wpe", Normal({m.max_position, m.hidden}, kInitStd / 2, gen), &owned);
    }
    const bool decoder_only = !enc_dec;
    for (int64_t i = 0; i < spec.layers.encoder_layers; ++i) {
      const int64_t index = spec.first_encoder_layer + i;
      at::Generator gen = GroupGenerator(seed, Group::kEncoderLayer, index);
      const std::string prefix =
          decoder_only ? fmt::format("layers.{}", index) : fmt::format("encoder.{}", index);
      chunk->encoder_.push_back(MakeBlock(m, false, prefix, gen, &reg, &owned,
                                          m.IsMoeLayer(index) ? index : -1, seed, experts,
                                          expert_owner));
    }
    if (spec.ends_encoder) {
      chunk->enc_ln_ = reg.AddNorm("encoder.final_ln", m.hidden, &owned);
      at::Generator gen = GroupGenerator(seed, Group::kDecPositions, 0);
      chunk->dec_wpe_ =
          reg.Add("decoder.wpe", Normal({m.max_position, m.hidden}, kInitStd / 2, gen), &owned);
    }
    for (int64_t i = 0; i < spec.layers.decoder_layers; ++i) {
      const int64_t index = spec.first_decoder_layer + i;
      at::Generator gen = GroupGenerator(seed, Group::kDecoderLayer, index);
      chunk->decoder_.push_back(MakeBlock(m, true, fmt::format("decoder.{}", index), gen, &reg,
                                          &owned, m.IsMoeLayer(index) ? m.layers + index : -1, seed,
                                          experts, expert_owner));
    }
    if (spec.layers.output_head) {
      chunk->final_ln_ = reg.AddNorm("final_ln", m.hidden, &owned);
      if (!m.tied_embeddings) {
        at::Generator gen = GroupGenerator(seed, Group::kHead, 0);
        chunk->head_ = reg.Add("head", Normal({m.vocab, m.hidden}, kInitStd, gen), &owned);
      }
    }
    for (const at::Tensor& t : owned) {
      if (!t.is_same(shard->wte_)) chunk->params_.push_back(t);
    }
    for (const at::Tensor& t : expert_owned) {
      chunk->params_.push_back(t);
      shard->expert_params_.push_back(t);
    }
    shard->stage_params_.push_back(std::move(owned));
    shard->chunks_.push_back(std::move(chunk));
  }
  return shard;
}

bool ModelShard::HasChunk(int64_t stage) const {
  const int64_t i = stage / pp_;
  return stage >= 0 && i < static_cast<int64_t>(chunks_.size()) &&
         chunks_[i]->spec().index == stage;
}

const Chunk& ModelShard::chunk(int64_t stage) const {
  SLUICE_CHECK(HasChunk(stage));
  return *chunks_[stage / pp_];
}

const std::vector<at::Tensor>& ModelShard::StageParameters(int64_t stage) const {
  SLUICE_CHECK(HasChunk(stage));
  return stage_params_[stage / pp_];
}

std::vector<at::Tensor> ModelShard::Parameters() const {
  std::vector<at::Tensor> out;
  for (const auto& [name, t] : named_) out.push_back(t);
  return out;
}

int64_t ModelShard::NumParameters() const {
  int64_t n = 0;
  for (const auto& [name, t] : named_) n += t.numel();
  return n;
}

}  // namespace sluice::runtime
