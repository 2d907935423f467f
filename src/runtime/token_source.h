// TokenSource: the training data's token ids, a deterministic function of (seed, sample id).
//
// Datasets give sluice only lengths, so the runtime needs tokens to train on. They come from a
// seeded first-order Markov chain over the model's vocabulary: every token has four successors
// (drawn once from a Zipf(1.1) distribution over the vocabulary) taken with probabilities 0.45,
// 0.225, 0.135 and 0.09, and with probability 0.1 the chain restarts at a Zipf-distributed token.
// The next-token entropy is about 1.9 nats against ln(V) for uniform guessing (9.0 for V = 8192),
// so a model that learns the table shows a falling loss curve. Sample `id` is the chain started
// from its own seeded generator, so any rank can materialise any sample, and the first n tokens
// of a sample do not depend on how many are asked for (clipping truncates).
//
// Thread safety: immutable after construction; Tokens() may run concurrently.
#pragma once

#include <cstdint>
#include <vector>

namespace sluice::runtime {

class TokenSource {
 public:
  // REQUIRES: vocab >= 2.
  TokenSource(int64_t vocab, uint64_t seed);

  int64_t vocab() const { return vocab_; }
  // The first `n` tokens of sample `id`, each in [0, vocab).
  std::vector<int64_t> Tokens(int64_t id, int64_t n) const;
  // Entropy of the next token given the current one, in nats (what a perfect model's loss
  // approaches), averaged over the chain's stationary use of the table (estimated by sampling).
  double ConditionalEntropy() const;

 private:
  int64_t Zipf(double u) const;

  int64_t vocab_;
  uint64_t seed_;
  std::vector<double> zipf_cdf_;      // [vocab]
  std::vector<int64_t> successors_;   // [vocab * kSuccessors]
};

}  // namespace sluice::runtime
