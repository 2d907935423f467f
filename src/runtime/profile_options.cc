// The options of `sluice profile`'s layer measurement (runtime/profiler.h): their checks, the
// work they make, and the description of this CPU for the table's `measured_on`.
#include <fmt/core.h>

#include <fstream>
#include <set>
#include <string>
#include <thread>
#include <vector>

#include "runtime/profiler.h"
#include "runtime/torch_pch.h"

namespace sluice::runtime {
namespace {

constexpr int64_t kMaxMbs = 1 << 20;  // --mbs

Status CheckList(const std::vector<int64_t>& values, std::string_view flag, int64_t lo, int64_t hi,
                 std::string_view what, std::string_view hi_note = "") {
  if (values.empty())
    return InvalidArgumentError(fmt::format("{}: give at least one {}", flag, what));
  std::set<int64_t> seen;
  for (const int64_t v : values) {
    if (v < lo || v > hi) {
      return InvalidArgumentError(fmt::format("{}: {} {} is out of range (allowed: {} to {}{})",
                                              flag, what, v, lo, hi, hi_note));
    }
    if (!seen.insert(v).second) {
      return InvalidArgumentError(fmt::format("{}: {} {} is given twice", flag, what, v));
    }
  }
  return Status::Ok();
}

std::string ReadCpuModel() {
  std::ifstream in("/proc/cpuinfo");
  std::string line;
  while (std::getline(in, line)) {
    if (line.rfind("model name", 0) == 0) {
      const size_t colon = line.find(':');
      if (colon != std::string::npos) {
        std::string name = line.substr(colon + 1);
        name.erase(0, name.find_first_not_of(' '));
        return name;
      }
    }
  }
  return "unknown CPU";
}

}  // namespace

std::string DescribeCpu(int64_t threads) {
  return fmt::format("CPU {} ({} logical cores), {} intra-op thread{}, libtorch {} fp32",
                     ReadCpuModel(), std::thread::hardware_concurrency(), threads,
                     threads == 1 ? "" : "s", TORCH_VERSION);
}

Status ValidateProfileOptions(const ModelSpec& model, const ProfileOptions& o) {
  if (model.moe.has_value() && model.is_encoder_decoder()) {
    return InvalidArgumentError(fmt::format(
        "--model: '{}' is an encoder-decoder model with MoE layers; layer-cost-table/1 describes "
        "the MoE layers of decoder-only models only",
        model.name));
  }
  const int64_t kv = model.kv_heads > 0 ? model.kv_heads : model.heads;
  if (kv != model.heads) {
    return InvalidArgumentError(
        fmt::format("--model: '{}' uses grouped-query attention ({} kv heads for {} heads); "
                    "layer-cost-table/1 describes multi-head attention only",
                    model.name, kv, model.heads));
  }
  if (model.mlp != MlpKind::kGelu) {
    return InvalidArgumentError(fmt::format(
        "--model: '{}' has a SwiGLU MLP; layer-cost-table/1 describes two-matrix (GELU) MLPs only",
        model.name));
  }
  SLUICE_RETURN_IF_ERROR(CheckList(o.mbs, "--mbs", 1, kMaxMbs, "micro-batch size"));
  SLUICE_RETURN_IF_ERROR(CheckList(o.seqlens, "--seqlen", 1, model.max_position, "sequence length",
                                   ", the model's max_position"));
  if (!o.dec_seqlens.empty()) {
    if (!model.is_encoder_decoder()) {
      return InvalidArgumentError(fmt::format(
          "--dec-seqlen: model '{}' is decoder-only; decoder lengths apply to encoder-decoder "
          "models only",
          model.name));
    }
    SLUICE_RETURN_IF_ERROR(CheckList(o.dec_seqlens, "--dec-seqlen", 1, model.max_position,
                                     "decoder length", ", the model's max_position"));
  }
  if (o.recompute.empty()) {
    return InvalidArgumentError("--recompute: give at least one of none, selective, full");
  }
  std::set<Recompute> levels;
  for (const Recompute rc : o.recompute) {
    if (!levels.insert(rc).second) {
      return InvalidArgumentError(
          fmt::format("--recompute: '{}' is given twice", RecomputeName(rc)));
    }
  }
  if (o.repeats < 1 || o.repeats > 1000) {
    return InvalidArgumentError(
        fmt::format("--repeats: {} is out of range (allowed: 1 to 1000)", o.repeats));
  }
  if (o.warmup < 0 || o.warmup > 1000) {
    return InvalidArgumentError(
        fmt::format("--warmup: {} is out of range (allowed: 0 to 1000)", o.warmup));
  }
  if (o.threads < 1 || o.threads > 1024) {
    return InvalidArgumentError(
        fmt::format("--threads: {} is out of range (allowed: 1 to 1024)", o.threads));
  }
  if (o.activation_limit.has_value() && o.activation_limit->count() <= 0) {
    return InvalidArgumentError("--max-activation-mb: must be positive");
  }
  return Status::Ok();
}

int64_t ProfileWorkUnits(const ModelSpec& model, const ProfileOptions& o) {
  const int64_t m = static_cast<int64_t>(o.mbs.size());
  const int64_t s = static_cast<int64_t>(o.seqlens.size());
  const int64_t r = static_cast<int64_t>(o.recompute.size());
  if (!model.is_encoder_decoder()) {
    // layer rows (a dense and an MoE row for an MoE model with dense layers), heads
    const int64_t rows = !model.moe.has_value() ? 1 : model.moe->layer_interval >= 2 ? 2 : 1;
    // MoE models: the MoE layer's parts at every point (one unit each).
    return s * m * (rows * r + 1 + (model.moe.has_value() ? 1 : 0));
  }
  const int64_t d =
      static_cast<int64_t>(o.dec_seqlens.empty() ? o.seqlens.size() : o.dec_seqlens.size());
  // encoder layers, decoder layers, heads (one per decoder length)
  return s * m * r + s * d * m * r + d * m;
}

}  // namespace sluice::runtime
