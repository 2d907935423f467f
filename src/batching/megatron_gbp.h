// Megatron-Core's global batch packing (GBP), the reference a Megatron user gets today for
// variable-length data: the whole global batch is packed into THD rows (per-sample attention,
// `cu_seqlens`) balanced by attention work, and the packs are spread over the data-parallel
// replicas (the dp x cp group's replicas) by their predicted time.
//
// Packing (the "gbp" MicroBatcher, used as global+gbp = the method `megatron-gbp`): a pack holds
// at most `cap` tokens (Megatron's max_seqlen_per_rank x cp). P = ceil(tokens / cap) packs,
// rounded up to a multiple of the replicas, are opened; samples, longest first (ties by id), go
// into the pack with the least work (sum of s^2, Megatron's s^2/cp estimate at one cp) that
// still has room; a sample that fits none opens `replicas` more packs. Empty packs are dropped.
// One pack is one micro-batch of one varlen row. The cap and one recompute level for the whole
// batch are searched per batch like the other baselines (baseline_search.h: the fastest predicted
// time that fits memory; cap from the longest padded sample to max_seqlen). The global assigner
// then splits the packs over replicas (karmarkar_karp.h), so replicas may run different numbers
// of micro-batches, as Megatron's hybrid-CP data schedule does.
//
// Not modelled (documented in docs/compare.md): Megatron-Core's dynamic cp per micro-batch
// (each sample's own cp = the next power of two of ceil(len / max_seqlen_per_rank), small
// samples on fewer devices): here every pack runs on the configuration's fixed cp.
// Decoder-only models only (THD packing with per-sample attention); an encoder-decoder model is an
// InvalidArgument (the method is then "unsupported").
//
// Thread safety: stateless.
#pragma once

#include <cstdint>
#include <memory>
#include <span>
#include <vector>

#include "batching/method.h"
#include "batching/stage_cost.h"
#include "data/sample.h"

namespace sluice {

std::unique_ptr<MicroBatcher> MakeGlobalBatchPackingBatcher();  // "gbp"

// The packs (sample ids, each pack in insertion order) of `samples` under `cap` tokens, opened in
// multiples of `replicas` (the rule above). REQUIRES: every sample's length <= cap, replicas >= 1.
std::vector<std::vector<int64_t>> BalancedGlobalPacks(std::span<const Sample> samples,
                                                      const StageCostEvaluator& eval, int64_t cap,
                                                      int64_t replicas);

}  // namespace sluice
