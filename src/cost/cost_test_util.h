// Shared fixtures of the cost tests: ModelSpec literals of the profiled models, the A100 device
// and the paths of the shipped tables. Test-only.
#pragma once

#include <string>

#include "base/units.h"
#include "model/cluster_spec.h"
#include "model/model_spec.h"

namespace sluice::cost_test {

// GPT-3 6.7B as the GPT table profiles it.
inline ModelSpec Gpt67b() {
  ModelSpec m;
  m.name = "gpt-6.7b";
  m.kind = ModelKind::kDecoderOnly;
  m.layers = 32;
  m.hidden = 4096;
  m.heads = 32;
  m.kv_heads = 32;
  m.ffn_hidden = 16384;
  m.vocab = 50257;
  m.max_position = 8192;
  return m;
}

// T5-11B: 24 + 24 layers, d_model 1024, 128 heads of 128, d_ff 65536.
inline ModelSpec T511b() {
  ModelSpec m = Gpt67b();
  m.name = "t5-11b";
  m.kind = ModelKind::kEncoderDecoder;
  m.layers = 24;
  m.decoder_layers = 24;
  m.hidden = 1024;
  m.heads = 128;
  m.kv_heads = 128;
  m.head_dim = 128;
  m.ffn_hidden = 65536;
  m.vocab = 32128;
  return m;
}

inline DeviceSpec A100() { return DeviceSpec{"a100-40g", 312e12, Bytes::GiB(40), 1555e9}; }

inline std::string GptTablePath() {
  return std::string(SLUICE_TEST_SOURCE_DIR) + "/data/profiles/a100_gpt_6.7b.json";
}
inline std::string T5TablePath() {
  return std::string(SLUICE_TEST_SOURCE_DIR) + "/data/profiles/a100_t5_11b.json";
}

}  // namespace sluice::cost_test
