// ModelSpec: the shape of the transformer being trained.
//
// Two families: decoder-only (GPT, LLaMA: `layers` self-attention layers with a causal mask)
// and encoder-decoder (T5: `layers` encoder layers, then `decoder_layers` decoder layers with
// self- and cross-attention). Optional MoE fields turn every `moe->layer_interval`-th layer's
// MLP into `moe->experts` experts of which each token uses `moe->top_k`.
//
// A ModelSpec is a plain value. Use ValidateModelSpec (or the JSON reader, which calls it)
// before trusting one that came from a user.
//
// Thread safety: value type.
#pragma once

#include <nlohmann/json.hpp>

#include <cstdint>
#include <optional>
#include <string>
#include <string_view>
#include <vector>

#include "base/status.h"

namespace sluice {

enum class ModelKind { kDecoderOnly, kEncoderDecoder };
// MLP form: kGelu has two matrices (h→f→h), kSwiGlu three (gate, up, down), as in LLaMA.
enum class MlpKind { kGelu, kSwiGlu };

std::string_view ModelKindName(ModelKind kind);  // "decoder-only" | "encoder-decoder"
std::string_view MlpKindName(MlpKind kind);      // "gelu" | "swiglu"

// Which assignments an expert over capacity drops (the runtime's router, runtime/moe.h):
// kChoice gives every token's first choice a slot before any second choice (GShard, Switch);
// kPosition gives slots token by token in position order, each token's choices in turn
// (Megatron-Core's --moe-token-drop-policy position), which a forward cut into token slices
// reproduces exactly for any top_k.
enum class MoeDropPolicy { kChoice, kPosition };
std::string_view MoeDropPolicyName(MoeDropPolicy policy);  // "choice" | "position"

struct MoeSpec {
  int64_t experts = 8;             // experts per MoE layer
  int64_t top_k = 2;               // experts each token is routed to
  double capacity_factor = 1.25;   // expert capacity = factor * tokens * top_k / experts
  int64_t layer_interval = 1;      // every k-th layer is MoE (1 = all layers)
  int64_t expert_ffn_hidden = 0;   // MLP width of one expert; 0 = the model's ffn_hidden
  MoeDropPolicy drop_policy = MoeDropPolicy::kChoice;  // no effect on cost, only on routing

  friend bool operator==(const MoeSpec&, const MoeSpec&) = default;
};

struct ModelSpec {
  std::string name;                     // preset name or user label, e.g. "gpt-6.7b"
  ModelKind kind = ModelKind::kDecoderOnly;
  int64_t layers = 0;                   // decoder-only: all layers; encoder-decoder: encoder layers
  int64_t decoder_layers = 0;           // encoder-decoder only; 0 for decoder-only
  int64_t hidden = 0;                   // model width h
  int64_t heads = 0;                    // attention heads a
  int64_t kv_heads = 0;                 // key/value heads (GQA); == heads for multi-head attention
  int64_t head_dim = 0;                 // per-head width; 0 means hidden / heads (T5-11B uses 128)
  int64_t ffn_hidden = 0;               // MLP inner width f
  int64_t vocab = 0;                    // vocabulary size V
  int64_t max_position = 0;             // longest sequence the model accepts (tokens)
  MlpKind mlp = MlpKind::kGelu;
  bool tied_embeddings = true;          // output head shares the input embedding matrix
  std::optional<MoeSpec> moe;           // absent = dense model

  // Per-head width actually used (head_dim, or hidden / heads when head_dim is 0).
  int64_t HeadDim() const { return head_dim > 0 ? head_dim : hidden / heads; }
  // Encoder + decoder layers.
  int64_t TotalLayers() const { return layers + decoder_layers; }
  bool is_encoder_decoder() const { return kind == ModelKind::kEncoderDecoder; }
  // Whether layer `i` (0-based within its stack) has an MoE MLP: false for a dense model, else
  // every `moe->layer_interval`-th layer counting from 1, i.e. (i + 1) % layer_interval == 0
  // (interval 2: layers 1, 3, 5, ... as in GShard and Switch).
  bool IsMoeLayer(int64_t i) const;

  friend bool operator==(const ModelSpec&, const ModelSpec&) = default;
};

// Checks every field and their relations (heads divide hidden unless head_dim is set, kv_heads
// divides heads, decoder_layers > 0 exactly for encoder-decoder models, MoE experts >= 2,
// 1 <= top_k <= experts, capacity_factor > 0, 1 <= layer_interval <= layers). The ranges are
// listed in docs/formats.md. `source` names the file or flag for the message.
Status ValidateModelSpec(const ModelSpec& spec, std::string_view source);

// JSON form (docs/formats.md, "ModelSpec"). Unknown keys, wrong types and impossible
// values are errors naming `source` and the field. FromJson(ToJson(spec)) == spec for every valid
// spec.
StatusOr<ModelSpec> ModelSpecFromJson(const nlohmann::json& j, std::string_view source);
nlohmann::json ModelSpecToJson(const ModelSpec& spec);

// Named presets: gpt-6.7b, gpt-13b, t5-11b, llama-7b, gpt-tiny, t5-tiny, gpt-tiny-moe (the
// numbers and their sources: docs/formats.md). Every preset passes ValidateModelSpec.
std::vector<std::string> ModelPresetNames();
// The preset called `name`; NotFound listing the presets otherwise.
StatusOr<ModelSpec> ModelPreset(std::string_view name);
// `--model NAME|FILE`: a preset name, else a JSON file path. The error lists the presets.
StatusOr<ModelSpec> ResolveModel(std::string_view name_or_file);

}  // namespace sluice
