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
// The "gbpc" MicroBatcher (global+gbpc; the method alias `megatron-hybrid-cp`) packs the same way
// by cp class, as Megatron-Core's hybrid (dynamic) cp buckets samples by the cp each needs: with
// the configuration's cp C > 1, a sample of L tokens is of class min(C, the next power of two of
// ceil(L / (cap / C))) (cap / C: Megatron's max_seqlen_per_rank), and a pack only takes samples
// of the class of its first (longest) one; a sample that finds no pack of its class with room
// opens `replicas` more packs. Packs of short samples then hold no long one, so per-micro-batch
// cp (dynamic_cp.h, which the planner applies after batching) can run them on sub-groups of C /
// class devices. With C = 1 (or every sample of one class) it is "gbp".
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
std::unique_ptr<MicroBatcher> MakeCpClassPackingBatcher();      // "gbpc"

// The packs (sample ids, each pack in insertion order) of `samples` under `cap` tokens, opened in
// multiples of `replicas` (the rule above); `cp` > 1: packs by cp class ("gbpc"). REQUIRES: every
// sample's length <= cap, replicas >= 1, cp >= 1.
// A sample's cp class under `cap` tokens per pack at `cp`: min(cp, the next power of two of
// ceil(len / (cap / cp))); 1 when cp <= 1.
int64_t CpClass(int64_t len, int64_t cap, int64_t cp);

std::vector<std::vector<int64_t>> BalancedGlobalPacks(std::span<const Sample> samples,
                                                      const StageCostEvaluator& eval, int64_t cap,
                                                      int64_t replicas, int64_t cp = 1);

}  // namespace sluice
