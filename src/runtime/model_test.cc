// The split backward (WeightGradTape): input gradients and then weight gradients from the
// recorded op inputs equal one autograd backward, on every kind of chunk: the embedding chunk,
// middle chunks, a T5 chunk holding the encoder's end and the decoder's start, the head chunk,
// and MoE chunks (the load-balancing loss differentiated with the outputs). The MoE layer
// (moe.h) against a per-token loop that follows its documented routing and dropping order.
#include "runtime/model.h"

#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <ostream>
#include <string>
#include <vector>

#include "model/chunk_cut.h"
#include "plan/execution_plan.h"
#include "runtime/moe.h"

namespace sluice::runtime {
namespace {

// A configuration of `pp` pipeline chunks (the even cut).
ParallelConfig Pipeline(int64_t pp) {
  ParallelConfig p;
  p.pp = pp;
  return p;
}

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
    for (const TensorShape& s :
         BoundaryShapes(c.model, mb.shape, c.chunk - 1, Pipeline(c.chunks))) {
      inputs.push_back(torch::empty(s, torch::kFloat32).normal_(0, 1, gen));
    }
  }
  std::vector<at::Tensor> grad_outputs;
  if (!last) {
    for (const TensorShape& s : BoundaryShapes(c.model, mb.shape, c.chunk, Pipeline(c.chunks))) {
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
  MoeContext moe1, moe2;
  std::vector<at::Tensor> out1 =
      chunk.Forward(x1, mb.labels, mb, c.selective, nullptr, chunk.has_moe() ? &moe1 : nullptr);
  if (last) grad_outputs = {torch::ones_like(out1[0])};
  EXPECT_EQ(chunk.has_moe(), c.model.moe.has_value());
  if (moe1.aux_loss.defined()) {
    out1.push_back(moe1.aux_loss);
    grad_outputs.push_back(torch::ones_like(moe1.aux_loss));
  }
  std::vector<at::Tensor> targets = c.chunk == 0 ? std::vector<at::Tensor>{} : x1;
  for (const at::Tensor& p : chunk.parameters()) targets.push_back(p);
  torch::autograd::backward(out1, grad_outputs, false, false, targets);
  const std::vector<at::Tensor> want = take_grads();

  // Split, as the executor runs it: input gradients (the untaped parameters' gradients taken
  // along), then the recorded layers' weights from the tape.
  WeightGradTape tape;
  std::vector<at::Tensor> x2 = leaves();
  std::vector<at::Tensor> out2 =
      chunk.Forward(x2, mb.labels, mb, c.selective, &tape, chunk.has_moe() ? &moe2 : nullptr);
  if (moe2.aux_loss.defined()) out2.push_back(moe2.aux_loss);
  EXPECT_EQ(moe1.dropped, moe2.dropped);
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
  const ModelSpec gpt_moe = Model("gpt-tiny-moe", 6);
  ModelSpec t5_moe = t5;
  t5_moe.moe = MoeSpec{.experts = 4, .top_k = 1, .capacity_factor = 1.0, .layer_interval = 1};
  return {{"gpt_moe_first", gpt_moe, 3, 0, false},
          {"gpt_moe_head", gpt_moe, 3, 2, false},
          {"t5_moe_spanning", t5_moe, 3, 1, false},
          {"gpt_first", gpt, 3, 0, false},
          {"gpt_middle", gpt, 3, 1, false},
          {"gpt_head_tied", gpt, 3, 2, false},
          {"gpt_head_untied", untied, 3, 2, false},
          {"gpt_selective", gpt, 3, 1, true},
          {"gpt_swiglu", swiglu, 3, 1, false},
          {"gpt_whole", gpt, 1, 0, false},
          {"t5_first", t5, 3, 0, false},
          {"t5_spanning", t5, 3, 1, false},
          {"t5_decoder_head", t5, 3, 2, false},
          {"t5_whole", t5, 1, 0, true}};
}

INSTANTIATE_TEST_SUITE_P(Chunks, WeightGradTapeTest, ::testing::ValuesIn(Cases()),
                         [](const auto& info) { return info.param.name; });

// The segmented weight pass (a segmented backward-weight piece, executor.cc): two chunks recorded
// into one tape as segments 0 and 1; after the input-gradient pass, AccumulateWeightGrads(1)
// adds exactly segment 1's weight gradients, then (0) the rest, and together they equal one
// autograd backward.
TEST(WeightGradTapeSegmentTest, PerSegmentWeightPassEqualsOneBackward) {
  const ModelSpec m = Model("gpt-tiny", 4);
  StatusOr<std::unique_ptr<ModelShard>> s0 = ModelShard::Create(m, 2, 1, 0, kSeed);
  StatusOr<std::unique_ptr<ModelShard>> s1 = ModelShard::Create(m, 2, 1, 1, kSeed);
  ASSERT_TRUE(s0.ok() && s1.ok());
  const Chunk& a = (*s0)->chunk(0);
  const Chunk& b = (*s1)->chunk(1);
  const MicroBatchInputs mb = Inputs(m);
  std::vector<at::Tensor> params = a.parameters();
  params.insert(params.end(), b.parameters().begin(), b.parameters().end());
  auto take_grads = [&] {
    std::vector<at::Tensor> out;
    for (const at::Tensor& p : params) {
      out.push_back(p.grad().defined() ? p.grad().clone() : torch::zeros_like(p));
      p.mutable_grad() = at::Tensor();
    }
    return out;
  };
  // One backward through both chunks.
  std::vector<at::Tensor> loss1 =
      b.Forward(a.Forward({mb.tokens}, {}, mb, false), mb.labels, mb, false);
  torch::autograd::backward(loss1, {torch::ones_like(loss1[0])}, false, false, params);
  const std::vector<at::Tensor> want = take_grads();

  WeightGradTape tape;
  const std::vector<at::Tensor> mid = a.Forward({mb.tokens}, {}, mb, false, &tape);
  tape.set_segment(1);
  const std::vector<at::Tensor> loss2 = b.Forward(mid, mb.labels, mb, false, &tape);
  int64_t in_segment1 = 0;
  for (const WeightGradTape::Entry& e : tape.entries()) in_segment1 += e.segment == 1 ? 1 : 0;
  ASSERT_GT(in_segment1, 0);
  ASSERT_LT(in_segment1, static_cast<int64_t>(tape.entries().size()));
  tape.InputGradients(loss2, {torch::ones_like(loss2[0])}, {}, params);
  tape.AccumulateWeightGrads(1);
  EXPECT_TRUE(tape.pending());
  for (const WeightGradTape::Entry& e : tape.entries()) {
    EXPECT_EQ(e.weight.grad().defined(), e.segment == 1) << "segment " << e.segment;
  }
  tape.AccumulateWeightGrads(0);
  EXPECT_FALSE(tape.pending());
  const std::vector<at::Tensor> got = take_grads();
  ASSERT_EQ(got.size(), want.size());
  for (size_t i = 0; i < got.size(); ++i) {
    EXPECT_LE(RelativeError(got[i], want[i]), 1e-5) << "parameter " << i;
  }
}

// The MoE layer (ep = 1) against a per-token loop over moe.h's rules: slots choice by choice,
// then by position (or token by token, MoeDropPolicy kPosition); dropped assignments add
// nothing; the output is the router probability times the expert's MLP; padding is not routed;
// Switch's auxiliary loss.
class MoeLayerTest : public ::testing::TestWithParam<MoeDropPolicy> {};

TEST_P(MoeLayerTest, MatchesAPerTokenLoopOfTheDocumentedRules) {
  const MoeDropPolicy policy = GetParam();
  ModelSpec m = *ModelPreset("gpt-tiny-moe");
  m.moe->drop_policy = policy;
  m.moe->top_k = 2;
  m.moe->capacity_factor = 0.6;  // C = ceil(0.6 * 12 * 2 / 4) = 4 of 2 x 10 real assignments
  const int64_t experts = m.moe->experts, k = m.moe->top_k, h = m.hidden, ffn = m.ffn_hidden;
  at::Generator gen = at::make_generator<at::CPUGeneratorImpl>(kSeed);
  auto normal = [&](std::vector<int64_t> shape, double std) {
    return torch::empty(shape, torch::kFloat32).normal_(0, std, gen);
  };
  MoeMlp moe;
  moe.layer = 0;
  moe.router.weight = normal({experts, h}, 0.5);
  for (int64_t e = 0; e < experts; ++e) {
    Expert x;
    x.index = e;
    x.fc1 = {normal({ffn, h}, 0.05), normal({ffn}, 0.05)};
    x.fc2 = {normal({h, ffn}, 0.05), normal({h}, 0.05)};
    moe.experts.push_back(x);
  }
  const int64_t b = 2, t = 6, n = b * t;
  const at::Tensor x = normal({b, t, h}, 1.0);
  at::Tensor real = torch::ones({b, t}, torch::kBool);
  real[1][4] = false;  // two padding positions
  real[1][5] = false;
  const double scale = 0.25;
  MoeContext ctx;
  const at::Tensor y = MoeForward(m, moe, ExpertShard{}, x, real, scale, nullptr, &ctx);

  const int64_t capacity = 4;
  const at::Tensor xf = x.reshape({n, h});
  const at::Tensor p = at::softmax(at::linear(xf, moe.router.weight), -1);
  at::Tensor want = torch::zeros({n, h});
  std::vector<int64_t> used(experts, 0), assigned(experts, 0);
  int64_t dropped = 0, real_tokens = 0;
  auto visit = [&](int64_t i, int64_t c) {
    if (!real.reshape({n})[i].item<bool>()) return;
    real_tokens += c == 0 ? 1 : 0;
    const int64_t e = p[i].argsort(0, /*descending=*/true)[c].item<int64_t>();
    ++assigned[e];
    if (used[e]++ >= capacity) {
      ++dropped;
      return;
    }
    const Expert& ex = moe.experts[e];
    const at::Tensor out = at::linear(at::gelu(at::linear(xf[i], ex.fc1.weight, ex.fc1.bias)),
                                      ex.fc2.weight, ex.fc2.bias);
    want[i] += p[i][e] * out;
  };
  for (int64_t a = 0; a < (policy == MoeDropPolicy::kPosition ? n : k); ++a) {
    for (int64_t b2 = 0; b2 < (policy == MoeDropPolicy::kPosition ? k : n); ++b2) {
      policy == MoeDropPolicy::kPosition ? visit(a, b2) : visit(b2, a);
    }
  }
  EXPECT_EQ(ctx.assignments, 2 * 10);
  EXPECT_EQ(ctx.dropped, dropped);
  EXPECT_GT(dropped, 0);
  EXPECT_LE(RelativeError(y.reshape({n, h}), want), 1e-5);
  EXPECT_EQ(y[1][4].abs().max().item<float>(), 0.0f) << "a padding token was routed";
  double aux = 0;
  for (int64_t e = 0; e < experts; ++e) {
    double mean_p = 0;
    for (int64_t i = 0; i < n; ++i) {
      if (real.reshape({n})[i].item<bool>()) mean_p += p[i][e].item<double>();
    }
    mean_p /= static_cast<double>(real_tokens);
    aux += static_cast<double>(assigned[e]) / static_cast<double>(real_tokens * k) * mean_p;
  }
  aux *= kMoeAuxLossCoef * static_cast<double>(experts) * static_cast<double>(real_tokens) * scale;
  ASSERT_TRUE(ctx.aux_loss.defined());
  EXPECT_NEAR(ctx.aux_loss.item<double>(), aux, 1e-6 * aux);
}

INSTANTIATE_TEST_SUITE_P(DropPolicies, MoeLayerTest,
                         ::testing::Values(MoeDropPolicy::kChoice, MoeDropPolicy::kPosition),
                         [](const auto& info) {
                           return std::string(MoeDropPolicyName(info.param));
                         });

}  // namespace
}  // namespace sluice::runtime
