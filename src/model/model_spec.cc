#include "model/model_spec.h"

#include <fmt/core.h>

#include <cmath>
#include <utility>

#include "base/json_util.h"
#include "base/paths.h"
#include "model/moe_json.h"
#include "model/spec_util.h"

namespace sluice {
namespace {

using model_internal::CheckIntRange;
using model_internal::FieldError;
using model_internal::JoinNames;

// Upper bounds on the fields, far above any real model; they keep products of fields (parameter
// counts, FLOPs) inside int64 and double range. docs/formats.md lists them.
constexpr int64_t kMaxLayers = 10000;
constexpr int64_t kMaxHidden = int64_t{1} << 20;
constexpr int64_t kMaxHeads = int64_t{1} << 16;
constexpr int64_t kMaxHeadDim = int64_t{1} << 16;
constexpr int64_t kMaxFfnHidden = int64_t{1} << 24;
constexpr int64_t kMaxVocab = int64_t{1} << 24;
constexpr int64_t kMaxPosition = int64_t{1} << 24;
constexpr int64_t kMaxExperts = int64_t{1} << 16;
constexpr double kMaxCapacityFactor = 1000;

constexpr std::string_view kKindNames[] = {"decoder-only", "encoder-decoder"};
constexpr std::string_view kMlpNames[] = {"gelu", "swiglu"};
constexpr std::string_view kDropPolicyNames[] = {"choice", "position"};

Status ValidateMoe(const MoeSpec& moe, int64_t layers, std::string_view source) {
  SLUICE_RETURN_IF_ERROR(CheckIntRange(source, "moe.experts", moe.experts, 2, kMaxExperts));
  SLUICE_RETURN_IF_ERROR(CheckIntRange(source, "moe.top_k", moe.top_k, 1, moe.experts));
  SLUICE_RETURN_IF_ERROR(model_internal::CheckPositive(source, "moe.capacity_factor",
                                                       moe.capacity_factor, kMaxCapacityFactor));
  if (moe.layer_interval < 1 || moe.layer_interval > layers) {
    return FieldError(source, "moe.layer_interval",
                      fmt::format("must be an integer in [1, {}] (the layers; a larger interval "
                                  "leaves no MoE layer), got {}",
                                  layers, moe.layer_interval));
  }
  return CheckIntRange(source, "moe.expert_ffn_hidden", moe.expert_ffn_hidden, 0, kMaxFfnHidden);
}

// A dense model with multi-head attention, GELU MLP and tied embeddings; presets adjust the rest.
ModelSpec Dense(std::string name, int64_t layers, int64_t hidden, int64_t heads, int64_t ffn_hidden,
                int64_t vocab, int64_t max_position) {
  ModelSpec spec;
  spec.name = std::move(name);
  spec.layers = layers;
  spec.hidden = hidden;
  spec.heads = heads;
  spec.kv_heads = heads;
  spec.ffn_hidden = ffn_hidden;
  spec.vocab = vocab;
  spec.max_position = max_position;
  return spec;
}

ModelSpec EncoderDecoder(ModelSpec spec, int64_t decoder_layers) {
  spec.kind = ModelKind::kEncoderDecoder;
  spec.decoder_layers = decoder_layers;
  return spec;
}

std::vector<ModelSpec> Presets() {
  std::vector<ModelSpec> presets;
  // GPT-3 6.7B (Brown et al. 2020, Table 2.1): 32 layers, d_model 4096, 32 heads x 128, ffn
  // 4 x d_model, GPT-2 BPE vocab 50257; context 8192 (paper: 2048) to span the A100 profile tables.
  presets.push_back(Dense("gpt-6.7b", 32, 4096, 32, 16384, 50257, 8192));
  // GPT-3 13B (Brown et al. 2020, Table 2.1): 40 layers, 40 heads x 128 -> hidden 5120 (the
  // table's "5140" is not 40 x 128; Megatron-LM's 13B uses 5120), ffn 4 x 5120; context as
  // gpt-6.7b.
  presets.push_back(Dense("gpt-13b", 40, 5120, 40, 20480, 50257, 8192));
  // T5-11B (Raffel et al. 2020, Sec. 3.7; HF t5-11b config.json): 24+24 layers, d_model 1024,
  // 128 heads x d_kv 128, d_ff 65536 (ReLU: two matrices, modelled as kGelu), vocab 32128, tied.
  // Relative positions have no hard limit; 8192 spans the A100 profile tables.
  ModelSpec t5 = EncoderDecoder(Dense("t5-11b", 24, 1024, 128, 65536, 32128, 8192), 24);
  t5.head_dim = 128;
  presets.push_back(t5);
  // LLaMA 7B (Touvron et al. 2023; HF Llama-2-7b-hf config.json): 32 layers, 4096, 32 heads (MHA),
  // SwiGLU ffn 11008, vocab 32000, untied head; 4096 positions is LLaMA-2's (LLaMA-1: 2048).
  ModelSpec llama = Dense("llama-7b", 32, 4096, 32, 11008, 32000, 4096);
  llama.mlp = MlpKind::kSwiGlu;
  llama.tied_embeddings = false;
  presets.push_back(llama);
  // sluice's own CPU test model: small enough to train with libtorch on 2 CPU cores.
  presets.push_back(Dense("gpt-tiny", 4, 128, 4, 512, 8192, 4096));
  // sluice's own CPU test model: T5 layout (2 encoder + 2 decoder layers) at gpt-tiny's width.
  presets.push_back(EncoderDecoder(Dense("t5-tiny", 2, 128, 4, 512, 8192, 4096), 2));
  // sluice's own CPU test model: gpt-tiny with every MLP replaced by 4 experts, top-2 routing.
  ModelSpec moe = Dense("gpt-tiny-moe", 4, 128, 4, 512, 8192, 4096);
  moe.moe = MoeSpec{.experts = 4,
                    .top_k = 2,
                    .capacity_factor = 1.25,
                    .layer_interval = 1,
                    .expert_ffn_hidden = 0};
  presets.push_back(moe);
  return presets;
}

}  // namespace

StatusOr<MoeSpec> MoeSpecFromJson(const nlohmann::json& j, std::string_view source,
                                  std::string_view path) {
  JsonObjectReader r(j, std::string(source), std::string(path));
  SLUICE_RETURN_IF_ERROR(r.status());
  MoeSpec moe;
  SLUICE_RETURN_IF_ERROR(r.Int("experts", &moe.experts, 2, kMaxExperts));
  SLUICE_RETURN_IF_ERROR(r.OptionalInt("top_k", &moe.top_k, 1, moe.experts));
  SLUICE_RETURN_IF_ERROR(model_internal::ReadPositive(r, "capacity_factor", /*required=*/false,
                                                      kMaxCapacityFactor, &moe.capacity_factor));
  SLUICE_RETURN_IF_ERROR(r.OptionalInt("layer_interval", &moe.layer_interval, 1, kMaxLayers));
  SLUICE_RETURN_IF_ERROR(
      r.OptionalInt("expert_ffn_hidden", &moe.expert_ffn_hidden, 0, kMaxFfnHidden));
  std::string policy(kDropPolicyNames[0]);
  SLUICE_RETURN_IF_ERROR(r.OptionalEnum("drop_policy", &policy, kDropPolicyNames));
  moe.drop_policy = policy == kDropPolicyNames[1] ? MoeDropPolicy::kPosition : MoeDropPolicy::kChoice;
  SLUICE_RETURN_IF_ERROR(r.Finish());
  return moe;
}

nlohmann::json MoeSpecToJson(const MoeSpec& moe) {
  nlohmann::json j = {
      {"experts", moe.experts},
      {"top_k", moe.top_k},
      {"capacity_factor", model_internal::NumberJson(moe.capacity_factor)},
      {"layer_interval", moe.layer_interval},
      {"expert_ffn_hidden", moe.expert_ffn_hidden},
  };
  // Written only when not the default, so that every other model reads and writes as before.
  if (moe.drop_policy != MoeDropPolicy::kChoice) {
    j["drop_policy"] = MoeDropPolicyName(moe.drop_policy);
  }
  return j;
}

std::string_view MoeDropPolicyName(MoeDropPolicy policy) {
  return kDropPolicyNames[policy == MoeDropPolicy::kPosition ? 1 : 0];
}

std::string_view ModelKindName(ModelKind kind) {
  return kind == ModelKind::kEncoderDecoder ? kKindNames[1] : kKindNames[0];
}

std::string_view MlpKindName(MlpKind kind) {
  return kind == MlpKind::kSwiGlu ? kMlpNames[1] : kMlpNames[0];
}

bool ModelSpec::IsMoeLayer(int64_t i) const {
  if (!moe.has_value() || moe->layer_interval < 1 || i < 0) return false;
  return (i + 1) % moe->layer_interval == 0;
}

Status ValidateModelSpec(const ModelSpec& spec, std::string_view source) {
  SLUICE_RETURN_IF_ERROR(CheckIntRange(source, "layers", spec.layers, 1, kMaxLayers));
  if (spec.is_encoder_decoder()) {
    if (spec.decoder_layers < 1 || spec.decoder_layers > kMaxLayers) {
      return FieldError(source, "decoder_layers",
                        fmt::format("must be an integer in [1, {}] for an encoder-decoder model, "
                                    "got {}",
                                    kMaxLayers, spec.decoder_layers));
    }
  } else if (spec.decoder_layers != 0) {
    return FieldError(source, "decoder_layers",
                      fmt::format("must be 0 or absent for a decoder-only model, got {} (set kind "
                                  "to 'encoder-decoder' for a model with a decoder stack)",
                                  spec.decoder_layers));
  }
  SLUICE_RETURN_IF_ERROR(CheckIntRange(source, "hidden", spec.hidden, 1, kMaxHidden));
  SLUICE_RETURN_IF_ERROR(CheckIntRange(source, "heads", spec.heads, 1, kMaxHeads));
  SLUICE_RETURN_IF_ERROR(CheckIntRange(source, "kv_heads", spec.kv_heads, 1, spec.heads));
  if (spec.heads % spec.kv_heads != 0) {
    return FieldError(
        source, "kv_heads",
        fmt::format("must divide heads = {} (allowed: {}), got {}", spec.heads,
                    model_internal::JoinInts(model_internal::Divisors(spec.heads)), spec.kv_heads));
  }
  SLUICE_RETURN_IF_ERROR(CheckIntRange(source, "head_dim", spec.head_dim, 0, kMaxHeadDim));
  if (spec.head_dim == 0 && spec.hidden % spec.heads != 0) {
    return FieldError(source, "heads",
                      fmt::format("must divide hidden = {} when head_dim is absent, got {} (set "
                                  "head_dim, or pick heads that divide hidden)",
                                  spec.hidden, spec.heads));
  }
  SLUICE_RETURN_IF_ERROR(CheckIntRange(source, "ffn_hidden", spec.ffn_hidden, 1, kMaxFfnHidden));
  SLUICE_RETURN_IF_ERROR(CheckIntRange(source, "vocab", spec.vocab, 1, kMaxVocab));
  SLUICE_RETURN_IF_ERROR(CheckIntRange(source, "max_position", spec.max_position, 1, kMaxPosition));
  if (spec.moe.has_value()) SLUICE_RETURN_IF_ERROR(ValidateMoe(*spec.moe, spec.layers, source));
  return Status::Ok();
}

StatusOr<ModelSpec> ModelSpecFromJson(const nlohmann::json& j, std::string_view source) {
  JsonObjectReader r(j, std::string(source));
  SLUICE_RETURN_IF_ERROR(r.status());
  ModelSpec spec;
  SLUICE_RETURN_IF_ERROR(r.String("name", &spec.name));
  std::string kind(kKindNames[0]);
  SLUICE_RETURN_IF_ERROR(r.OptionalEnum("kind", &kind, kKindNames));
  spec.kind = kind == kKindNames[1] ? ModelKind::kEncoderDecoder : ModelKind::kDecoderOnly;
  SLUICE_RETURN_IF_ERROR(r.Int("layers", &spec.layers, 1, kMaxLayers));
  SLUICE_RETURN_IF_ERROR(r.OptionalInt("decoder_layers", &spec.decoder_layers, 0, kMaxLayers));
  SLUICE_RETURN_IF_ERROR(r.Int("hidden", &spec.hidden, 1, kMaxHidden));
  SLUICE_RETURN_IF_ERROR(r.Int("heads", &spec.heads, 1, kMaxHeads));
  spec.kv_heads = spec.heads;
  SLUICE_RETURN_IF_ERROR(r.OptionalInt("kv_heads", &spec.kv_heads, 1, spec.heads));
  SLUICE_RETURN_IF_ERROR(r.OptionalInt("head_dim", &spec.head_dim, 0, kMaxHeadDim));
  SLUICE_RETURN_IF_ERROR(r.Int("ffn_hidden", &spec.ffn_hidden, 1, kMaxFfnHidden));
  SLUICE_RETURN_IF_ERROR(r.Int("vocab", &spec.vocab, 1, kMaxVocab));
  SLUICE_RETURN_IF_ERROR(r.Int("max_position", &spec.max_position, 1, kMaxPosition));
  std::string mlp(kMlpNames[0]);
  SLUICE_RETURN_IF_ERROR(r.OptionalEnum("mlp", &mlp, kMlpNames));
  spec.mlp = mlp == kMlpNames[1] ? MlpKind::kSwiGlu : MlpKind::kGelu;
  SLUICE_RETURN_IF_ERROR(r.OptionalBool("tied_embeddings", &spec.tied_embeddings));
  if (const nlohmann::json* moe = r.Child("moe")) {
    SLUICE_ASSIGN_OR_RETURN(spec.moe, MoeSpecFromJson(*moe, source, "moe"));
  }
  SLUICE_RETURN_IF_ERROR(r.Finish());
  SLUICE_RETURN_IF_ERROR(ValidateModelSpec(spec, source));
  return spec;
}

nlohmann::json ModelSpecToJson(const ModelSpec& spec) {
  nlohmann::json j = {
      {"name", spec.name},
      {"kind", ModelKindName(spec.kind)},
      {"layers", spec.layers},
      {"hidden", spec.hidden},
      {"heads", spec.heads},
      {"kv_heads", spec.kv_heads},
      {"ffn_hidden", spec.ffn_hidden},
      {"vocab", spec.vocab},
      {"max_position", spec.max_position},
      {"mlp", MlpKindName(spec.mlp)},
      {"tied_embeddings", spec.tied_embeddings},
  };
  if (spec.decoder_layers != 0) j["decoder_layers"] = spec.decoder_layers;
  if (spec.head_dim != 0) j["head_dim"] = spec.head_dim;
  if (spec.moe.has_value()) j["moe"] = MoeSpecToJson(*spec.moe);
  return j;
}

std::vector<std::string> ModelPresetNames() {
  std::vector<std::string> names;
  for (const ModelSpec& spec : Presets()) names.push_back(spec.name);
  return names;
}

StatusOr<ModelSpec> ModelPreset(std::string_view name) {
  for (ModelSpec& spec : Presets()) {
    if (spec.name == name) return std::move(spec);
  }
  return NotFoundError(
      fmt::format("unknown model preset '{}' (presets: {})", name, JoinNames(ModelPresetNames())));
}

StatusOr<ModelSpec> ResolveModel(std::string_view name_or_file) {
  for (ModelSpec& spec : Presets()) {
    if (spec.name == name_or_file) return std::move(spec);
  }
  const std::string path(name_or_file);
  if (!FileExists(path)) {
    return NotFoundError(fmt::format(
        "--model '{}': not a model preset and no such file (presets: {}; or a JSON ModelSpec "
        "file, see docs/formats.md)",
        name_or_file, JoinNames(ModelPresetNames())));
  }
  SLUICE_ASSIGN_OR_RETURN(nlohmann::json j, ReadJsonFile(path));
  return ModelSpecFromJson(j, path);
}

}  // namespace sluice
