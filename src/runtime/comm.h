// Communication for the runtime on PyTorch's distributed engine (c10d): the rendezvous store,
// the process groups a plan needs, and the watchdog that turns a dead or hung rank into every
// rank exiting non-zero with a message naming it.
//
// Rendezvous: rank 0 serves the job's store (job_store.h: bound to MASTER_ADDR only, one run id,
// every operation bounded by the timeout) at MASTER_ADDR:MASTER_PORT; every rank connects,
// registers under "sluice/join/R" and waits until all WORLD_SIZE ranks have, within the timeout
// (a missing rank is named: "rank 1 did not join"). Each process group's Gloo device binds this
// rank's address: GLOO_SOCKET_IFNAME / --iface (an interface), else --bind (an address), else
// the local address the kernel routes MASTER_ADDR through (127.0.0.1 on one host). Process groups
// (ProcessGroupGloo on CPU; ProcessGroupNCCL when libtorch was built with it, USE_C10D_NCCL, and
// --backend nccl is asked for):
//   - "world": all ranks, for the plan's point-to-point transfers (peers are global rank ids,
//     tags are the plan's MessageTag values);
//   - "dp<p>": the data-parallel replicas of pipeline rank p (dp > 1), for gradient buckets;
//   - "emb<d>": the pipeline ranks of replica d that hold a copy of the word embedding, when
//     more than one does (layout.h), for summing its gradient before the step;
//   - "ep<p>_<g>" (ep > 1): expert-parallel group g of pipeline rank p, the replicas
//     g*ep .. g*ep+ep-1 (the plan's EpGroupOf), for the MoE all-to-alls (alltoall_base with the
//     plan's split sizes);
//   - "edp<p>_<k>" (ep > 1, dp > ep): the replicas d with d % ep == k of pipeline rank p, which
//     hold the same experts, for summing the expert gradients (dense gradients use "dp<p>").
//   - "cp<r>" (cp > 1): the cp processes of plan rank r, for the K/V all-gathers of context
//     parallelism (context_parallel.h) and their backward all-reduces.
// Only tp = 1 is supported (the caller rejects other plans).
//
// Processes and plan ranks: a plan rank (dp_index * pp + pp_index) is run by cp processes,
// process = offset + plan_rank * cp + cp_index, where `offset` is 0 except for a replica group
// of a heterogeneous job (hetero_train.h), whose processes follow the groups before it. The
// plan's peers are plan ranks of the same group: Send/Recv go to the process of the same cp
// index (ProcessRank). The data-parallel group "dp<p>" holds the dp x cp processes of pipeline
// rank p (the plan reduces gradients over dp x cp, plan/lower.h); the embedding group the
// ranks of one replica and cp index. Group names carry the placement's prefix.
//
// Failure handling (Watchdog): every rank runs a thread with its own store connections that
// beats a heartbeat counter, watches the other ranks' counters and an abort key, and watches the
// main thread's current blocking wait (BeginWait/EndWait). A rank that stops beating for the
// timeout, a wait longer than the timeout (naming the awaited rank), a lost store (rank 0 gone)
// (rank 0 gone, or a store operation unanswered for the timeout: rank 0 stopped or hung) or any
// rank posting an abort makes the watchdog print "sluice: rank R: ..." and _exit(1). The
// first cause posted wins: a rank that detects a failure posts it and lingers (kLinger) with its
// connections open, so that ranks which would otherwise only see it vanish read the cause. Gloo
// p2p waits carry no timeout of their own (a timed-out Gloo pair aborts the process), so the
// watchdog owns every timeout.
//
// Link delay (a testing aid, `sluice train --link-delay-ms`): with SetLinkDelay(d) > 0 every
// point-to-point send is handed to c10d by a helper thread d after Send() was called, in the
// order the sends were posted (so c10d pairs them as before); Send() returns at once with a
// DelayedSend handle whose wait() waits for the hand-over, then for the send. The sender's compute
// goes on; the message leaves (and the receive completes) d later, as on a link with d more
// latency. Collectives are not delayed.
//
// Thread safety: a Communicator and the StoreClient it hands out belong to the main thread (the
// link-delay helper thread posts sends under the Communicator's own lock); Watchdog methods may
// be called from any thread.
#pragma once

#include <atomic>
#include <chrono>
#include <condition_variable>
#include <cstdint>
#include <memory>
#include <mutex>
#include <optional>
#include <string>
#include <thread>
#include <vector>

#include "base/status.h"
#include "model/parallel_config.h"
#include "runtime/job_store.h"
#include "runtime/launcher.h"
#include "runtime/torch_pch.h"

namespace sluice::runtime {

// One connection to the job's store (job_store.h), with Status errors. Every operation is
// bounded by the timeout; blocking reads wait up to it.
class StoreClient {
 public:
  // Connects, retrying until `timeout` passes (rank 0 may start after the others).
  static StatusOr<std::unique_ptr<StoreClient>> Connect(const DistEnv& env,
                                                        std::chrono::milliseconds timeout);
  Status Set(const std::string& key, const std::vector<uint8_t>& value);
  Status SetString(const std::string& key, const std::string& value);
  StatusOr<std::vector<uint8_t>> Get(const std::string& key);
  StatusOr<std::string> GetString(const std::string& key);
  StatusOr<int64_t> Add(const std::string& key, int64_t delta);
  StatusOr<bool> Check(const std::string& key);
  Status Delete(const std::string& key);
  // The same connection as a c10d::Store, for the process groups (its waits are capped at the
  // timeout whatever the caller asks).
  c10::intrusive_ptr<c10d::Store> AsC10dStore();

 private:
  StoreClient(std::shared_ptr<StoreConnection> conn, int64_t rank)
      : conn_(std::move(conn)), rank_(rank) {}
  Status Error(const Status& s) const;

  std::shared_ptr<StoreConnection> conn_;
  int64_t rank_;
};

// Exits the process (status 1, "sluice: rank R: <message>") unless destroyed within `limit`:
// for waits whose library calls cannot be bounded otherwise (c10d process-group creation).
class DeadlineGuard {
 public:
  DeadlineGuard(int64_t rank, std::chrono::milliseconds limit, std::string message);
  ~DeadlineGuard();
  DeadlineGuard(const DeadlineGuard&) = delete;
  DeadlineGuard& operator=(const DeadlineGuard&) = delete;

 private:
  std::mutex mu_;
  std::condition_variable cv_;
  bool done_ = false;  // guarded by mu_
  std::thread thread_;
};

class Watchdog {
 public:
  static StatusOr<std::unique_ptr<Watchdog>> Start(const DistEnv& env,
                                                   std::chrono::milliseconds timeout);
  ~Watchdog();
  Watchdog(const Watchdog&) = delete;
  Watchdog& operator=(const Watchdog&) = delete;

  // The main thread is about to block on `what`, waiting for rank `peer`, or for the ranks
  // `peers` of a collective (it names the one that does not arrive when the wait times out).
  void BeginWait(std::string what, int64_t peer);
  void BeginWait(std::string what, std::vector<int64_t> peers);
  void EndWait();
  // The main thread's position, published with the heartbeat (for Blame).
  void SetProgress(int64_t iteration, int64_t instruction) {
    progress_.store((iteration << 32) | (instruction & 0xffffffff));
  }
  // Which of `peers` keeps the main thread's current collective `what` from completing: ranks
  // whose heartbeat stopped (dead or stopped; watched for a second), else ranks that are not
  // waiting in `what` themselves (hung elsewhere), as text ("rank 1 is dead or stopped (no
  // heartbeat)"); "" when every peer looks fine.
  std::string Blame(const std::vector<int64_t>& peers, const std::string& what);
  // Follows single-peer waits from rank `peer`: ", which waits for rank 0; rank 0 is not waiting
  // for anyone (...): it is the one that hangs"; "; rank 2 is not waiting ..." when `peer` itself
  // is not waiting; "" when nothing is known.
  std::string Chain(int64_t peer);
  // Posts `message` ("rank R: ...") for every rank and returns whether the store took it; the
  // caller then exits non-zero after lingering (kLinger) so that the others read the cause
  // before its connections close (pointless when the store is unreachable).
  bool Abort(const std::string& message);
  // The failure another rank posted first, if any (a rank that fails because a peer went away
  // reports the peer's posted cause instead of blaming the peer it lost); an error when the
  // store does not answer (rank 0, which serves it, died or stopped).
  StatusOr<std::optional<std::string>> ReadPostedFailure();
  // ReadPostedFailure, with an unreachable store read as "nothing posted".
  std::optional<std::string> PostedFailure();
  // How long a failing rank keeps its connections (and rank 0 the store) open before exiting.
  static constexpr std::chrono::milliseconds kLinger{3000};
  // This rank has finished: its heartbeat no longer counts; the threads stop.
  void Finish();
  // Stops watching (after this rank posted or read a failure); the heartbeat goes on until the
  // process exits, so that lingering is not mistaken for dying.
  void Stop();

 private:
  Watchdog(const DistEnv& env, std::chrono::milliseconds timeout,
           std::unique_ptr<StoreClient> store, std::unique_ptr<StoreClient> beat_store);
  void Loop();      // watches peers, the abort key and the main thread's wait
  void BeatLoop();  // beats the heartbeat and publishes the main thread's position
  [[noreturn]] void Die(const std::string& message);

  DistEnv env_;
  std::chrono::milliseconds timeout_;
  std::unique_ptr<StoreClient> store_;
  std::unique_ptr<StoreClient> beat_store_;  // the heartbeat thread's own connection
  std::mutex mu_;
  std::string wait_what_;  // guarded by mu_; empty: not waiting
  std::vector<int64_t> wait_peers_;  // guarded by mu_
  std::chrono::steady_clock::time_point wait_since_;
  std::atomic<bool> stop_{false}, stop_beat_{false};
  std::atomic<int64_t> progress_{0};  // iteration << 32 | instruction
  std::thread thread_, beat_thread_;
};

enum class Backend { kGloo, kNccl };

class LinkDelay;

// The handle of a send posted under a link delay: done once the helper thread handed it to c10d
// (handed_at()) and c10d's send completed. wait() rethrows a failed hand-over.
class DelayedSend : public c10d::Work {
 public:
  DelayedSend() : c10d::Work(-1, c10d::OpType::SEND) {}
  bool wait(std::chrono::milliseconds timeout = kNoTimeout) override;
  bool isCompleted() override;
  // When the helper thread handed the send to c10d. REQUIRES: wait() returned.
  std::chrono::steady_clock::time_point handed_at() const { return handed_at_; }

 private:
  friend class LinkDelay;
  // Called by the helper thread once: the posted send (or the error posting it).
  void Handed(c10::intrusive_ptr<c10d::Work> inner, std::exception_ptr error);

  c10::intrusive_ptr<c10d::Work> inner_;  // guarded by mutex_ until handed_
  std::exception_ptr error_;              // guarded by mutex_
  bool handed_ = false;                   // guarded by mutex_
  std::chrono::steady_clock::time_point handed_at_;
};

// Where a communicator's plan ranks live among the job's processes (see the file comment).
struct RankPlacement {
  int64_t offset = 0;  // the process of plan rank 0, cp index 0
  std::string prefix;  // prepended to the names of the groups (unique per replica group)
};

class Communicator {
 public:
  using Handle = c10::intrusive_ptr<c10d::Work>;

  // Joins the rendezvous and builds the process groups for `par` (tp = 1) with the word
  // embedding held by the pipeline ranks `embedding_ranks` (WordEmbeddingRanks).
  static StatusOr<std::unique_ptr<Communicator>> Create(const DistEnv& env,
                                                        const ParallelConfig& par,
                                                        const std::vector<int64_t>& embedding_ranks,
                                                        Backend backend,
                                                        std::chrono::milliseconds timeout,
                                                        RankPlacement placement = {});

  const DistEnv& env() const { return env_; }
  // This process (global rank) and the plan rank it runs.
  int64_t rank() const { return env_.rank; }
  int64_t plan_rank() const { return (env_.rank - placement_.offset) / par_.cp; }
  int64_t cp_index() const { return (env_.rank - placement_.offset) % par_.cp; }
  int64_t cp() const { return par_.cp; }
  int64_t dp_index() const { return plan_rank() / par_.pp; }
  int64_t pp_index() const { return plan_rank() % par_.pp; }
  // The process of plan rank `plan_rank` with this process's cp index.
  int64_t ProcessRank(int64_t plan_rank) const {
    return placement_.offset + plan_rank * par_.cp + cp_index();
  }
  // The other processes of this plan rank's cp group (empty at cp = 1).
  const std::vector<int64_t>& cp_peers() const { return cp_peers_; }
  StoreClient& store() { return *store_; }
  bool has_embedding_group() const { return emb_ != nullptr; }
  // Global ranks of this rank's data-parallel and embedding groups (itself excluded).
  const std::vector<int64_t>& dp_peers() const { return dp_peers_; }
  const std::vector<int64_t>& embedding_peers() const { return emb_peers_; }
  // Expert parallelism: this rank's index in its ep group, the group's global ranks (itself
  // included, group order), and the peers holding the same experts (itself excluded).
  int64_t ep_index() const { return dp_index() % par_.ep; }
  const std::vector<int64_t>& ep_group() const { return ep_group_; }
  const std::vector<int64_t>& expert_dp_peers() const { return edp_peers_; }
  bool has_expert_dp_group() const { return edp_ != nullptr; }

  // Post a transfer or a sum over a group; the tensor must stay alive until Wait returns.
  StatusOr<Handle> Send(const at::Tensor& t, int64_t peer, int64_t tag);
  StatusOr<Handle> Recv(const at::Tensor& t, int64_t peer, int64_t tag);
  StatusOr<Handle> AllReduceDp(const at::Tensor& t);
  StatusOr<Handle> AllReduceEmbedding(const at::Tensor& t);
  // All-to-all over the ep group: `send` rows [sum(send_splits), ...] go send_splits[j] to
  // member j; `recv` [sum(recv_splits), ...] gets recv_splits[j] from member j. REQUIRES ep > 1.
  StatusOr<Handle> AllToAllEp(const at::Tensor& recv, const at::Tensor& send,
                              std::vector<int64_t> recv_splits, std::vector<int64_t> send_splits);
  // Sum over the replicas holding the same experts. REQUIRES: has_expert_dp_group().
  StatusOr<Handle> AllReduceExpertDp(const at::Tensor& t);
  // cp > 1: all-gather of `t` over the cp group into `out` (one tensor per cp index), and a sum
  // over it.
  StatusOr<Handle> AllGatherCp(std::vector<at::Tensor>& out, const at::Tensor& t);
  StatusOr<Handle> AllReduceCp(const at::Tensor& t);
  // A process group over `members` (global ranks, ascending; this process among them) named
  // `name`: every member must call it with the same arguments, and all members must create
  // their groups in the same order (Gloo connects the members while creating it).
  StatusOr<c10::intrusive_ptr<c10d::ProcessGroup>> MakeSubgroup(
      const std::string& name, const std::vector<int64_t>& members);
  // Blocks until `h` completes; the error carries c10d's message.
  Status Wait(const Handle& h);
  // Delays every later Send by `delay` (see the file comment); 0 = none. Call once, before the
  // first Send. REQUIRES: delay >= 0.
  void SetLinkDelay(std::chrono::nanoseconds delay);
  std::chrono::nanoseconds link_delay() const { return link_delay_; }

  ~Communicator();
  Communicator(const Communicator&) = delete;
  Communicator& operator=(const Communicator&) = delete;

 private:
  Communicator() = default;

  DistEnv env_;
  ParallelConfig par_;
  RankPlacement placement_;
  Backend backend_ = Backend::kGloo;
  std::string address_;  // the Gloo address (when no interface is given)
  std::chrono::milliseconds pg_timeout_{0};
  std::unique_ptr<StoreServer> server_;  // rank 0
  std::unique_ptr<StoreClient> store_;
  c10::intrusive_ptr<c10d::ProcessGroup> world_, dp_, emb_, ep_, edp_, cp_;
  std::vector<int64_t> dp_peers_, emb_peers_, ep_group_, edp_peers_, cp_peers_;
  std::mutex world_mu_;  // serialises posts on world_ (main thread and the link-delay thread)
  std::chrono::nanoseconds link_delay_{0};
  std::unique_ptr<LinkDelay> delay_;
};

}  // namespace sluice::runtime
