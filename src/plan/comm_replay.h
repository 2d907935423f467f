// Static replay of the communication of several ranks: the deadlock checker behind ValidatePlan
// and the PyTorch CSV importer (DynaPipe's check_deadlock, PyTorch's _simulate_comms_compute).
//
// Each rank is a list of CommOps. kPost posts a non-blocking point-to-point send or receive;
// between two ranks the k-th message one posts to the other must be the k-th the other posts
// back: complementary (send/receive), the same tag and the same shapes (NCCL matches p2p ops
// between a pair in posting order). kWait blocks until the message posted by an earlier kPost of
// the same rank has been posted by its peer too. kCollective posts a collective of a group; every
// member must post the same collectives in the same order (a rank may be in several groups: each
// group's collectives are matched and counted apart). A blocking kCollective (an all-to-all)
// posts, then blocks until every member has posted it. kWaitCollectives blocks until every
// member of its group has posted all the collectives this rank has posted in that group. Other
// ops never block.
//
// CheckComms first matches the messages of every pair and the collectives of every group, then
// replays all ranks until each finishes or none can move (a deadlock), and reports the first
// problem with the rank and op index it concerns.
//
// Thread safety: pure functions.
#pragma once

#include <array>
#include <cstdint>
#include <functional>
#include <optional>
#include <string>
#include <vector>

#include "plan/instruction.h"

namespace sluice {

struct CommOp {
  enum class Kind : uint8_t { kNone, kPost, kWait, kCollective, kWaitCollectives };
  Kind kind = Kind::kNone;
  bool send = false;  // kPost: a send (else a receive)
  int64_t peer = -1;  // kPost: the other rank, in [0, ranks) and not this rank
  int64_t tag = -1;   // kPost
  const std::vector<TensorShape>* shapes = nullptr;  // kPost: compared when both sides give them
  int64_t wait_for = -1;                   // kWait: index of the kPost on this rank it waits for
  int64_t group = -1;                      // kCollective, kWaitCollectives: index into the groups
  std::array<int64_t, 3> collective = {};  // kCollective: identity compared across members
  bool blocking = false;                   // kCollective: waits for every member to post it
};

struct CommProblem {
  int64_t rank = -1;
  int64_t index = -1;  // the op on `rank` the problem is about
  std::string message;
};

// `groups[g]` lists the member ranks of collective group g; `text(rank, index)` describes an op
// in messages. Returns nullopt when every message matches and the replay finishes.
std::optional<CommProblem> CheckComms(
    const std::vector<std::vector<CommOp>>& ranks, const std::vector<std::vector<int64_t>>& groups,
    const std::function<std::string(int64_t rank, int64_t index)>& text);

// "[2, 128, 4096]" or "[1, 64, 1024] + [1, 16, 1024]".
std::string ShapesText(const std::vector<TensorShape>& shapes);

}  // namespace sluice
