#include "runtime/comm.h"

#include <fmt/core.h>
#include <fmt/ranges.h>
#include <netdb.h>
#include <sys/socket.h>
#include <unistd.h>

#include <cstdio>
#include <deque>
#include <stdexcept>

#ifdef USE_C10D_NCCL
#include <torch/csrc/distributed/c10d/ProcessGroupNCCL.hpp>
#endif

namespace sluice::runtime {
namespace {

double Seconds(std::chrono::steady_clock::duration d) {
  return std::chrono::duration<double>(d).count();
}

// The c10d view of a StoreConnection, for ProcessGroupGloo's rendezvous (set, get, wait). Errors
// are thrown as c10::Error, as c10d stores do; waits are capped at the connection's timeout.
class C10dStore : public c10d::Store {
 public:
  explicit C10dStore(std::shared_ptr<StoreConnection> conn)
      : c10d::Store(conn->timeout()), conn_(std::move(conn)) {}
  void set(const std::string& key, const std::vector<uint8_t>& value) override {
    Check(conn_->Set(key, value));
  }
  std::vector<uint8_t> compareSet(const std::string& key, const std::vector<uint8_t>& expected,
                                  const std::vector<uint8_t>& desired) override {
    return Value(conn_->CompareSet(key, expected, desired));
  }
  std::vector<uint8_t> get(const std::string& key) override { return Value(conn_->Get(key)); }
  int64_t add(const std::string& key, int64_t value) override {
    return Value(conn_->Add(key, value));
  }
  bool deleteKey(const std::string& key) override { return Value(conn_->Delete(key)); }
  bool check(const std::vector<std::string>& keys) override { return Value(conn_->Check(keys)); }
  int64_t getNumKeys() override { return Value(conn_->NumKeys()); }
  void wait(const std::vector<std::string>& keys) override {
    Check(conn_->Wait(keys, conn_->timeout()));
  }
  void wait(const std::vector<std::string>& keys,
            const std::chrono::milliseconds& timeout) override {
    const auto cap = conn_->timeout();
    Check(conn_->Wait(keys, timeout.count() <= 0 ? cap : std::min(timeout, cap)));
  }

 private:
  static void Check(const Status& s) { TORCH_CHECK(s.ok(), s.message()); }
  template <typename T>
  static T Value(StatusOr<T> v) {
    TORCH_CHECK(v.ok(), v.status().message());
    return std::move(*v);
  }
  std::shared_ptr<StoreConnection> conn_;
};

// This rank's address for the Gloo devices when neither an interface nor --bind is given: the
// local address the kernel routes `master` through (a UDP connect sends nothing). On one host
// that is 127.0.0.1; across hosts, the address on the interface facing rank 0.
StatusOr<std::string> RouteAddressTo(const std::string& master, int port) {
  addrinfo hints{};
  hints.ai_family = AF_UNSPEC;
  hints.ai_socktype = SOCK_DGRAM;
  addrinfo* res = nullptr;
  if (const int rc = getaddrinfo(master.c_str(), std::to_string(port).c_str(), &hints, &res);
      rc != 0 || res == nullptr) {
    return InvalidArgumentError(
        fmt::format("cannot resolve MASTER_ADDR '{}': {}", master, gai_strerror(rc)));
  }
  std::unique_ptr<addrinfo, decltype(&freeaddrinfo)> guard(res, freeaddrinfo);
  const int fd = socket(res->ai_family, SOCK_DGRAM | SOCK_CLOEXEC, 0);
  sockaddr_storage local{};
  socklen_t len = sizeof local;
  const bool ok = fd >= 0 && connect(fd, res->ai_addr, res->ai_addrlen) == 0 &&
                  getsockname(fd, reinterpret_cast<sockaddr*>(&local), &len) == 0;
  const int err = errno;
  if (fd >= 0) close(fd);
  if (!ok) {
    return FailedPreconditionError(fmt::format(
        "no route to MASTER_ADDR '{}' ({}); give the Gloo address with --bind or the interface "
        "with GLOO_SOCKET_IFNAME / --iface",
        master, std::strerror(err)));
  }
  char host[NI_MAXHOST];
  if (getnameinfo(reinterpret_cast<sockaddr*>(&local), len, host, sizeof host, nullptr, 0,
                  NI_NUMERICHOST) != 0) {
    return FailedPreconditionError("cannot print the local address");
  }
  return std::string(host);
}

c10::intrusive_ptr<c10d::ProcessGroup> MakeGroup(const c10::intrusive_ptr<c10d::Store>& store,
                                                 const std::string& name, int64_t rank,
                                                 int64_t size, Backend backend,
                                                 const std::string& iface,
                                                 const std::string& address,
                                                 std::chrono::milliseconds timeout) {
  auto prefixed = c10::make_intrusive<c10d::PrefixStore>("sluice/pg/" + name, store);
#ifdef USE_C10D_NCCL
  if (backend == Backend::kNccl) {
    auto opts = c10d::ProcessGroupNCCL::Options::create();
    opts->timeout = timeout;
    return c10::make_intrusive<c10d::ProcessGroupNCCL>(prefixed, static_cast<int>(rank),
                                                       static_cast<int>(size), opts);
  }
#endif
  (void)backend;
  auto opts = c10d::ProcessGroupGloo::Options::create(timeout);
  opts->devices.push_back(iface.empty() ? c10d::ProcessGroupGloo::createDeviceForHostname(address)
                                        : c10d::ProcessGroupGloo::createDeviceForInterface(iface));
  return c10::make_intrusive<c10d::ProcessGroupGloo>(prefixed, static_cast<int>(rank),
                                                     static_cast<int>(size), opts);
}

}  // namespace

// ---- StoreClient ----

StatusOr<std::unique_ptr<StoreClient>> StoreClient::Connect(const DistEnv& env,
                                                            std::chrono::milliseconds timeout) {
  StatusOr<std::unique_ptr<StoreConnection>> c =
      StoreConnection::Connect(env.master_addr, env.master_port, env.run_id, timeout,
                               std::chrono::steady_clock::now() + timeout);
  if (!c.ok()) {
    return FailedPreconditionError(fmt::format("rank {}: {}", env.rank, c.status().message()));
  }
  return std::unique_ptr<StoreClient>(
      new StoreClient(std::shared_ptr<StoreConnection>(std::move(*c)), env.rank));
}

Status StoreClient::Error(const Status& s) const {
  return FailedPreconditionError(
      fmt::format("{}; the store at {} is served by rank 0 (did rank 0 die, stop or hang?)",
                  s.message(), conn_->where()));
}

c10::intrusive_ptr<c10d::Store> StoreClient::AsC10dStore() {
  return c10::make_intrusive<C10dStore>(conn_);
}

Status StoreClient::Set(const std::string& key, const std::vector<uint8_t>& value) {
  Status s = conn_->Set(key, value);
  return s.ok() ? s : Error(s);
}

Status StoreClient::SetString(const std::string& key, const std::string& value) {
  return Set(key, std::vector<uint8_t>(value.begin(), value.end()));
}

StatusOr<std::vector<uint8_t>> StoreClient::Get(const std::string& key) {
  StatusOr<std::vector<uint8_t>> v = conn_->Get(key);
  if (!v.ok()) return Error(v.status());
  return v;
}

StatusOr<std::string> StoreClient::GetString(const std::string& key) {
  SLUICE_ASSIGN_OR_RETURN(std::vector<uint8_t> v, Get(key));
  return std::string(v.begin(), v.end());
}

StatusOr<int64_t> StoreClient::Add(const std::string& key, int64_t delta) {
  StatusOr<int64_t> v = conn_->Add(key, delta);
  if (!v.ok()) return Error(v.status());
  return v;
}

StatusOr<bool> StoreClient::Check(const std::string& key) {
  StatusOr<bool> v = conn_->Check({key});
  if (!v.ok()) return Error(v.status());
  return v;
}

Status StoreClient::Delete(const std::string& key) {
  StatusOr<bool> v = conn_->Delete(key);
  return v.ok() ? Status::Ok() : Error(v.status());
}

// ---- Communicator ----

StatusOr<std::unique_ptr<Communicator>> Communicator::Create(
    const DistEnv& env, const ParallelConfig& par, const std::vector<int64_t>& embedding_ranks,
    Backend backend, std::chrono::milliseconds timeout, RankPlacement placement) {
#ifndef USE_C10D_NCCL
  if (backend == Backend::kNccl) {
    return InvalidArgumentError(
        "--backend nccl: this build's libtorch has no NCCL (USE_C10D_NCCL is not defined); use "
        "--backend gloo or build against a CUDA libtorch");
  }
#endif
  if (par.tp != 1) return InvalidArgumentError("the runtime supports tp = 1 only");
  if (par.ep < 1 || par.dp % par.ep != 0) {
    return InvalidArgumentError(fmt::format(
        "--parallel: ep = {} must divide dp = {} (an expert-parallel group is ep data-parallel "
        "replicas)",
        par.ep, par.dp));
  }
  if (par.cp < 1 || (par.cp > 1 && par.ep != 1)) {
    return InvalidArgumentError(fmt::format(
        "--parallel: cp = {} with ep = {}: the runtime runs context parallelism without expert "
        "parallelism only (allowed: cp >= 1 with ep = 1, or cp = 1)",
        par.cp, par.ep));
  }
  const int64_t processes = par.dp * par.pp * par.cp;
  const bool whole_job = placement.offset == 0 && placement.prefix.empty();
  if (whole_job ? env.world_size != processes
                : placement.offset < 0 || placement.offset + processes > env.world_size) {
    return InvalidArgumentError(fmt::format(
        "--parallel dp={} x pp={} x cp={} needs {} processes{}, but WORLD_SIZE is {}", par.dp,
        par.pp, par.cp, processes,
        whole_job ? "" : fmt::format(" from process {}", placement.offset), env.world_size));
  }
  std::unique_ptr<Communicator> c(new Communicator());
  c->env_ = env;
  c->par_ = par;
  c->placement_ = placement;
  c->backend_ = backend;
  using Clock = std::chrono::steady_clock;
  const Clock::time_point start = Clock::now();
  if (env.rank == 0) {
    StatusOr<std::unique_ptr<StoreServer>> server =
        StoreServer::Start(env.master_addr, env.master_port, env.run_id);
    if (!server.ok()) {
      return FailedPreconditionError(fmt::format("rank 0: {}", server.status().message()));
    }
    c->server_ = std::move(*server);
  }
  SLUICE_ASSIGN_OR_RETURN(c->store_, StoreClient::Connect(env, timeout));
  StoreClient& st = *c->store_;
  // Rendezvous: every rank registers; a second process with this RANK (or another job with this
  // run id on the port) finds its key taken.
  SLUICE_ASSIGN_OR_RETURN(const int64_t mine, st.Add(fmt::format("sluice/join/{}", env.rank), 1));
  if (mine != 1) {
    return FailedPreconditionError(fmt::format(
        "rank {}: another process already joined the store at {}:{} as rank {} of run '{}': two "
        "processes were given RANK={}, or another job with the same run id uses this "
        "MASTER_PORT (give each job its own port or --run-id)",
        env.rank, env.master_addr, env.master_port, env.rank, env.run_id, env.rank));
  }
  SLUICE_RETURN_IF_ERROR(st.Add("sluice/join/count", 1).status());
  for (;;) {
    SLUICE_ASSIGN_OR_RETURN(const int64_t joined, st.Add("sluice/join/count", 0));
    if (joined >= env.world_size) break;
    if (Clock::now() - start > timeout) {
      std::vector<int64_t> missing;
      for (int64_t r = 0; r < env.world_size; ++r) {
        SLUICE_ASSIGN_OR_RETURN(const bool has, st.Check(fmt::format("sluice/join/{}", r)));
        if (!has) missing.push_back(r);
      }
      return FailedPreconditionError(fmt::format(
          "rank {}: rendezvous at {}:{} timed out after {:.0f} s (--timeout): rank{} {} did not "
          "join ({} of WORLD_SIZE={} ranks did, run id '{}')",
          env.rank, env.master_addr, env.master_port, Seconds(Clock::now() - start),
          missing.size() == 1 ? "" : "s", fmt::join(missing, ", "), joined, env.world_size,
          env.run_id));
    }
    std::this_thread::sleep_for(std::chrono::milliseconds(50));
  }
  std::string address = env.bind_addr;
  if (env.gloo_iface.empty() && address.empty()) {
    SLUICE_ASSIGN_OR_RETURN(address, RouteAddressTo(env.master_addr, env.master_port));
  }
  // Gloo's own timeout stays above the watchdog's: a timed-out Gloo pair aborts the process
  // without a message, the watchdog names the rank. Creating the groups (Gloo's pair connects
  // take Gloo's timeout) is bounded by a deadline instead.
  const std::chrono::milliseconds pg_timeout = timeout * 2 + std::chrono::seconds(60);
  c->address_ = address;
  c->pg_timeout_ = pg_timeout;
  const c10::intrusive_ptr<c10d::Store> store = st.AsC10dStore();
  const int64_t d = c->dp_index(), p = c->pp_index();
  // In a replica group every process is placed (the caller checked this one is inside it).
  const bool member = env.rank >= placement.offset && env.rank < placement.offset + processes;
  if (!member) return InternalError("the process is not in the communicator's placement");
  const int64_t cp = par.cp, ci = c->cp_index(), off = placement.offset;
  const std::string& pre = placement.prefix;
  DeadlineGuard deadline(
      env.rank, timeout + std::chrono::seconds(2),
      fmt::format("creating the process groups (Gloo on {}) failed: a rank died, stopped or "
                  "cannot be reached at its Gloo address",
                  env.gloo_iface.empty() ? address : "interface " + env.gloo_iface));
  try {
    c->world_ = MakeGroup(store, "world", env.rank, env.world_size, backend, env.gloo_iface,
                          address, pg_timeout);
    if (par.dp * cp > 1) {  // dp x cp copies of pipeline rank p, rank k * cp + j
      c->dp_ = MakeGroup(store, fmt::format("{}dp{}", pre, p), d * cp + ci, par.dp * cp, backend,
                         env.gloo_iface, address, pg_timeout);
      for (int64_t k = 0; k < par.dp; ++k) {
        for (int64_t j = 0; j < cp; ++j) {
          const int64_t r = off + (k * par.pp + p) * cp + j;
          if (r != env.rank) c->dp_peers_.push_back(r);
        }
      }
    }
    if (par.ep > 1) {
      const int64_t g = d / par.ep, k = d % par.ep;
      c->ep_ = MakeGroup(store, fmt::format("{}ep{}_{}", pre, p, g), k, par.ep, backend,
                         env.gloo_iface, address, pg_timeout);
      for (int64_t j = 0; j < par.ep; ++j) {
        c->ep_group_.push_back(off + (g * par.ep + j) * par.pp + p);
      }
      if (par.dp > par.ep) {
        c->edp_ = MakeGroup(store, fmt::format("{}edp{}_{}", pre, p, k), g, par.dp / par.ep,
                            backend, env.gloo_iface, address, pg_timeout);
        for (int64_t q = 0; q < par.dp / par.ep; ++q) {
          if (q != g) c->edp_peers_.push_back(off + (q * par.ep + k) * par.pp + p);
        }
      }
    }
    const auto it = std::find(embedding_ranks.begin(), embedding_ranks.end(), p);
    if (embedding_ranks.size() > 1 && it != embedding_ranks.end()) {
      c->emb_ = MakeGroup(store, fmt::format("{}emb{}_{}", pre, d, ci),
                          it - embedding_ranks.begin(),
                          static_cast<int64_t>(embedding_ranks.size()), backend, env.gloo_iface,
                          address, pg_timeout);
      for (const int64_t q : embedding_ranks) {
        if (q != p) c->emb_peers_.push_back(off + (d * par.pp + q) * cp + ci);
      }
    }
    if (cp > 1) {
      c->cp_ = MakeGroup(store, fmt::format("{}cp{}", pre, c->plan_rank()), ci, cp, backend,
                         env.gloo_iface, address, pg_timeout);
      for (int64_t j = 0; j < cp; ++j) {
        const int64_t r = off + c->plan_rank() * cp + j;
        if (r != env.rank) c->cp_peers_.push_back(r);
      }
    }
  } catch (const std::exception& e) {
    return FailedPreconditionError(
        fmt::format("rank {}: creating the process groups failed: {}", env.rank, e.what()));
  }
  return c;
}

// ---- Link delay ----

bool DelayedSend::wait(std::chrono::milliseconds timeout) {
  c10::intrusive_ptr<c10d::Work> inner;
  {
    std::unique_lock<std::mutex> lock(mutex_);
    if (timeout == kNoTimeout) {
      cv_.wait(lock, [&] { return handed_; });
    } else if (!cv_.wait_for(lock, timeout, [&] { return handed_; })) {
      TORCH_CHECK(false, "delayed send: not handed to c10d within the timeout");
    }
    if (error_) std::rethrow_exception(error_);
    inner = inner_;
  }
  return inner->wait(timeout);
}

bool DelayedSend::isCompleted() {
  std::lock_guard<std::mutex> lock(mutex_);
  return handed_ && (error_ != nullptr || inner_->isCompleted());
}

void DelayedSend::Handed(c10::intrusive_ptr<c10d::Work> inner, std::exception_ptr error) {
  {
    std::lock_guard<std::mutex> lock(mutex_);
    inner_ = std::move(inner);
    error_ = error;
    handed_at_ = std::chrono::steady_clock::now();
    handed_ = true;
  }
  cv_.notify_all();
}

// The helper thread of SetLinkDelay: posts each queued send on `group` once its time has come,
// in queue order (every send waits the same delay, so that is also the order of their times).
class LinkDelay {
 public:
  LinkDelay(c10::intrusive_ptr<c10d::ProcessGroup> group, std::mutex* group_mu)
      : group_(std::move(group)), group_mu_(group_mu), thread_([this] { Loop(); }) {}
  ~LinkDelay() {
    {
      std::lock_guard<std::mutex> lock(mu_);
      stop_ = true;
    }
    cv_.notify_all();
    thread_.join();
  }

  void Post(std::chrono::steady_clock::time_point due, at::Tensor t, int64_t peer, int64_t tag,
            c10::intrusive_ptr<DelayedSend> work) {
    {
      std::lock_guard<std::mutex> lock(mu_);
      queue_.push_back({due, std::move(t), peer, tag, std::move(work)});
    }
    cv_.notify_all();
  }

 private:
  struct Entry {
    std::chrono::steady_clock::time_point due;
    at::Tensor tensor;
    int64_t peer, tag;
    c10::intrusive_ptr<DelayedSend> work;
  };

  void Loop() {
    std::unique_lock<std::mutex> lock(mu_);
    for (;;) {
      cv_.wait(lock, [&] { return stop_ || !queue_.empty(); });
      if (queue_.empty()) return;  // stopping, nothing left
      const auto due = queue_.front().due;
      if (cv_.wait_until(lock, due, [&] { return stop_; })) {
        // Closing with sends queued (a failed run): they fail (their waits rethrow).
        for (Entry& e : queue_) {
          e.work->Handed({}, std::make_exception_ptr(std::runtime_error(
                                 "the communicator closed before the delayed send was posted")));
        }
        return;
      }
      Entry e = std::move(queue_.front());
      queue_.pop_front();
      lock.unlock();
      c10::intrusive_ptr<c10d::Work> inner;
      std::exception_ptr error;
      try {
        std::vector<at::Tensor> v{e.tensor};
        std::lock_guard<std::mutex> group_lock(*group_mu_);
        inner = group_->send(v, static_cast<int>(e.peer), static_cast<int>(e.tag));
      } catch (...) {
        error = std::current_exception();
      }
      e.work->Handed(std::move(inner), error);
      lock.lock();
    }
  }

  c10::intrusive_ptr<c10d::ProcessGroup> group_;
  std::mutex* group_mu_;
  std::mutex mu_;
  std::condition_variable cv_;
  std::deque<Entry> queue_;  // guarded by mu_
  bool stop_ = false;        // guarded by mu_
  std::thread thread_;
};

Communicator::~Communicator() = default;

void Communicator::SetLinkDelay(std::chrono::nanoseconds delay) {
  link_delay_ = delay;
  delay_.reset();
  if (delay.count() > 0) delay_ = std::make_unique<LinkDelay>(world_, &world_mu_);
}

StatusOr<Communicator::Handle> Communicator::Send(const at::Tensor& t, int64_t peer, int64_t tag) {
  try {
    if (delay_) {
      auto work = c10::make_intrusive<DelayedSend>();
      delay_->Post(std::chrono::steady_clock::now() + link_delay_, t, peer, tag, work);
      return Handle(work);
    }
    std::vector<at::Tensor> v{t};
    std::lock_guard<std::mutex> lock(world_mu_);
    return world_->send(v, static_cast<int>(peer), static_cast<int>(tag));
  } catch (const std::exception& e) {
    return FailedPreconditionError(fmt::format("send to rank {} failed: {}", peer, e.what()));
  }
}

StatusOr<Communicator::Handle> Communicator::Recv(const at::Tensor& t, int64_t peer, int64_t tag) {
  try {
    std::vector<at::Tensor> v{t};
    std::lock_guard<std::mutex> lock(world_mu_);
    return world_->recv(v, static_cast<int>(peer), static_cast<int>(tag));
  } catch (const std::exception& e) {
    return FailedPreconditionError(fmt::format("receive from rank {} failed: {}", peer, e.what()));
  }
}

StatusOr<Communicator::Handle> Communicator::AllReduceDp(const at::Tensor& t) {
  if (!dp_) return InternalError("no data-parallel group (dp = 1)");
  try {
    std::vector<at::Tensor> v{t};
    return dp_->allreduce(v);
  } catch (const std::exception& e) {
    return FailedPreconditionError(fmt::format("data-parallel all-reduce failed: {}", e.what()));
  }
}

StatusOr<Communicator::Handle> Communicator::AllReduceEmbedding(const at::Tensor& t) {
  if (!emb_) return InternalError("no embedding group");
  try {
    std::vector<at::Tensor> v{t};
    return emb_->allreduce(v);
  } catch (const std::exception& e) {
    return FailedPreconditionError(fmt::format("embedding all-reduce failed: {}", e.what()));
  }
}

StatusOr<Communicator::Handle> Communicator::AllToAllEp(const at::Tensor& recv,
                                                        const at::Tensor& send,
                                                        std::vector<int64_t> recv_splits,
                                                        std::vector<int64_t> send_splits) {
  if (!ep_) return InternalError("no expert-parallel group (ep = 1)");
  try {
    at::Tensor out = recv, in = send;
    return ep_->alltoall_base(out, in, recv_splits, send_splits);
  } catch (const std::exception& e) {
    return FailedPreconditionError(fmt::format("expert-parallel all-to-all failed: {}", e.what()));
  }
}

StatusOr<Communicator::Handle> Communicator::AllReduceExpertDp(const at::Tensor& t) {
  if (!edp_) return InternalError("no expert data-parallel group");
  try {
    std::vector<at::Tensor> v{t};
    return edp_->allreduce(v);
  } catch (const std::exception& e) {
    return FailedPreconditionError(
        fmt::format("expert data-parallel all-reduce failed: {}", e.what()));
  }
}

StatusOr<Communicator::Handle> Communicator::AllGatherCp(std::vector<at::Tensor>& out,
                                                         const at::Tensor& t) {
  if (!cp_) return InternalError("no context-parallel group (cp = 1)");
  try {
    std::vector<std::vector<at::Tensor>> outs{out};
    std::vector<at::Tensor> in{t};
    Handle h = cp_->allgather(outs, in);
    return h;
  } catch (const std::exception& e) {
    return FailedPreconditionError(fmt::format("context-parallel all-gather failed: {}", e.what()));
  }
}

StatusOr<Communicator::Handle> Communicator::AllReduceCp(const at::Tensor& t) {
  if (!cp_) return InternalError("no context-parallel group (cp = 1)");
  try {
    std::vector<at::Tensor> v{t};
    return cp_->allreduce(v);
  } catch (const std::exception& e) {
    return FailedPreconditionError(fmt::format("context-parallel all-reduce failed: {}", e.what()));
  }
}

StatusOr<c10::intrusive_ptr<c10d::ProcessGroup>> Communicator::MakeSubgroup(
    const std::string& name, const std::vector<int64_t>& members) {
  const auto it = std::find(members.begin(), members.end(), env_.rank);
  if (it == members.end()) {
    return InternalError(fmt::format("rank {} is not a member of group {}", env_.rank, name));
  }
  DeadlineGuard deadline(env_.rank, pg_timeout_,
                         fmt::format("creating the process group {} failed: a member died, "
                                     "stopped or cannot be reached",
                                     name));
  try {
    return MakeGroup(store_->AsC10dStore(), name, it - members.begin(),
                     static_cast<int64_t>(members.size()), backend_, env_.gloo_iface, address_,
                     pg_timeout_);
  } catch (const std::exception& e) {
    return FailedPreconditionError(
        fmt::format("rank {}: creating the process group {} failed: {}", env_.rank, name,
                    e.what()));
  }
}

Status Communicator::Wait(const Handle& h) {
  try {
    h->wait();
    return Status::Ok();
  } catch (const std::exception& e) {
    return FailedPreconditionError(e.what());
  }
}

}  // namespace sluice::runtime
