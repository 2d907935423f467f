// The split backward (WeightGradTape): input gradients and then weight gradients from the
// recorded op inputs equal one autograd backward, on every kind of chunk: the embedding chunk,
// middle chunks, a T5 chunk holding the encoder's end and the decoder's start, the head chunk.
#include "runtime/model.h"

#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <ostream>
#include <string>
#include <vector>

#include "model/chunk_cut.h"
#include "plan/execution_plan.h"

namespace sluice::runtime {
namespace {

constexpr uint64_t kSeed = 7;

ModelSpec Model(const std::string& preset, int64_t layers) {
  ModelSpec m = *ModelPreset(preset);
  m.layers = layers;
  if (m.is_encoder_decoder()) m.decoder_layers = layers;
  return m;
}

// Two rows: a packed row of two samples and a padded row of one.
MicroBatchInputs Inputs(const ModelSpec& m) {
  MicroBatchLayout layout;
  const bool ed = m.is_encoder_decoder();
  layout.shape = {2, 16, ed ? 8 : 0};
  layout.rows = {{{1, 0, 9, 0, ed ? 5 : 0}, {2, 9, 7, ed ? 5 : 0, ed ? 3 : 0}},
                 {{3, 0, 11, 0, ed ? 6 : 0}}};
  const TokenSource tokens(m.vocab, kSeed);
  return BuildMicroBatchInputs(m, layout, tokens, 1.0 / 32);
}

double RelativeError(const at::Tensor& got, const at::Tensor& want) {
  const double scale = want.abs().max().item<double>();
  const double diff = (got - want).abs().max().item<double>();
  return scale > 0 ? diff / scale : diff;
}

struct Case {
  std::string name;
  ModelSpec model;
  int64_t chunks, chunk;
  bool selective;
};

void PrintTo(const Case& c, std::ostream* os) { *os << c.name; }

class WeightGradTapeTest : public ::testing::TestWithParam<Case> {};

TEST_P(WeightGradTapeTest, SplitBackwardEqualsOneBackward) {
  const Case& c = GetParam();
  StatusOr<std::unique_ptr<ModelShard>> shard =
      ModelShard::Create(c.model, c.chunks, 1, c.chunk, kSeed);
  ASSERT_TRUE(shard.ok()) << shard.status().message();
  const Chunk& chunk = (*shard)->chunk(c.chunk);
  const MicroBatchInputs mb = Inputs(c.model);
  const bool last = c.chunk == c.chunks - 1;

  at::Generator gen = at::make_generator<at::CPUGeneratorImpl>(kSeed);
  std::vector<at::Tensor> inputs;
  if (c.chunk == 0) {
    inputs.push_back(mb.tokens);
    if (c.model.is_encoder_decoder()) inputs.push_back(mb.dec_tokens);
  } else {
    for (const TensorShape& s : BoundaryShapes(c.model, mb.shape, c.chunk - 1, c.chunks)) {
      inputs.push_back(torch::empty(s, torch::kFloat32).normal_(0, 1, gen));
    }
  }
  std::vector<at::Tensor> grad_outputs;
  if (!last) {
    for (const TensorShape& s : BoundaryShapes(c.model, mb.shape, c.chunk, c.chunks)) {
      grad_outputs.push_back(torch::empty(s, torch::kFloat32).normal_(0, 1, gen));
    }
  }
  auto leaves = [&] {
    std::vector<at::Tensor> out;
    for (const at::Tensor& t : inputs) {
      out.push_back(c.chunk == 0 ? t : t.detach().clone().requires_grad_(true));
    }
    return out;
  };
  auto take_grads = [&] {
    std::vector<at::Tensor> out;
    for (const at::Tensor& p : chunk.parameters()) {
      out.push_back(p.grad().defined() ? p.grad().clone() : torch::zeros_like(p));
      p.mutable_grad() = at::Tensor();
    }
    return out;
  };

  // One backward.
  std::vector<at::Tensor> x1 = leaves();
  std::vector<at::Tensor> out1 = chunk.Forward(x1, mb.labels, mb, c.selective);
  if (last) grad_outputs = {torch::ones_like(out1[0])};
  std::vector<at::Tensor> targets = c.chunk == 0 ? std::vector<at::Tensor>{} : x1;
  for (const at::Tensor& p : chunk.parameters()) targets.push_back(p);
  torch::autograd::backward(out1, grad_outputs, false, false, targets);
  const std::vector<at::Tensor> want = take_grads();

  // Split, as the executor runs it: input gradients (the untaped parameters' gradients taken
  // along), then the recorded layers' weights from the tape.
  WeightGradTape tape;
  std::vector<at::Tensor> x2 = leaves();
  std::vector<at::Tensor> out2 = chunk.Forward(x2, mb.labels, mb, c.selective, &tape);
  const std::vector<at::Tensor> untaped = tape.Untaped(chunk.parameters());
  size_t taped = 0;
  for (const WeightGradTape::Entry& e : tape.entries()) taped += e.bias.defined() ? 2 : 1;
  EXPECT_EQ(untaped.size() + taped, chunk.parameters().size()) << "a parameter taped twice";
  EXPECT_GT(tape.entries().size(), 0u);
  const std::vector<at::Tensor> x2_leaves = c.chunk == 0 ? std::vector<at::Tensor>{} : x2;
  const std::vector<at::Tensor> grads =
      tape.InputGradients(out2, grad_outputs, x2_leaves, chunk.parameters());
  const size_t n_inputs = x2_leaves.size();
  ASSERT_EQ(grads.size(), n_inputs);
  for (const WeightGradTape::Entry& e : tape.entries()) {
    EXPECT_FALSE(e.weight.grad().defined()) << "the input-gradient pass touched a recorded weight";
  }
  ASSERT_TRUE(tape.pending());
  tape.AccumulateWeightGrads();
  EXPECT_FALSE(tape.pending()) << "an output gradient was kept";
  const std::vector<at::Tensor> got = take_grads();

  ASSERT_EQ(got.size(), want.size());
  for (size_t i = 0; i < got.size(); ++i) {
    EXPECT_LE(RelativeError(got[i], want[i]), 1e-5) << "parameter " << i;
  }
  for (size_t i = 0; i < n_inputs; ++i) {
    EXPECT_LE(RelativeError(grads[i], x1[i].grad()), 1e-5) << "input " << i;
  }
}

std::vector<Case> Cases() {
  const ModelSpec gpt = Model("gpt-tiny", 6), t5 = Model("t5-tiny", 3);
  ModelSpec untied = gpt;
  untied.tied_embeddings = false;
  ModelSpec swiglu = gpt;
  swiglu.mlp = MlpKind::kSwiGlu;
  return {{"gpt_first", gpt, 3, 0, false},     {"gpt_middle", gpt, 3, 1, false},
          {"gpt_head_tied", gpt, 3, 2, false}, {"gpt_head_untied", untied, 3, 2, false},
          {"gpt_selective", gpt, 3, 1, true},  {"gpt_swiglu", swiglu, 3, 1, false},
          {"gpt_whole", gpt, 1, 0, false},     {"t5_first", t5, 3, 0, false},
          {"t5_spanning", t5, 3, 1, false},    {"t5_decoder_head", t5, 3, 2, false},
          {"t5_whole", t5, 1, 0, true}};
}

INSTANTIATE_TEST_SUITE_P(Chunks, WeightGradTapeTest, ::testing::ValuesIn(Cases()),
                         [](const auto& info) { return info.param.name; });

}  // namespace
}  // namespace sluice::runtime
