#include "runtime/job_store.h"

#include <arpa/inet.h>
#include <fcntl.h>
#include <fmt/core.h>
#include <netdb.h>
#include <netinet/in.h>
#include <netinet/tcp.h>
#include <poll.h>
#include <sys/socket.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <cstring>
#include <map>
#include <unordered_map>

namespace sluice::runtime {
namespace {

using Clock = std::chrono::steady_clock;

enum class Op : uint8_t {
  kHello = 1,
  kSet,
  kGet,
  kAdd,
  kCheck,
  kDelete,
  kNumKeys,
  kWait,
  kCompareSet,
};
constexpr uint32_t kMaxFrame = 1u << 30;  // 1 GiB: larger frames are a protocol error

void PutU32(std::string* s, uint32_t v) {
  for (int i = 0; i < 4; ++i) s->push_back(static_cast<char>((v >> (8 * i)) & 0xff));
}
void PutI64(std::string* s, int64_t v) {
  const auto u = static_cast<uint64_t>(v);
  for (int i = 0; i < 8; ++i) s->push_back(static_cast<char>((u >> (8 * i)) & 0xff));
}
void PutStr(std::string* s, std::string_view v) {
  PutU32(s, static_cast<uint32_t>(v.size()));
  s->append(v);
}
std::string Frame(const std::string& payload) {
  std::string out;
  PutU32(&out, static_cast<uint32_t>(payload.size()));
  return out + payload;
}
uint32_t ReadU32(const char* p) {
  uint32_t v = 0;
  for (int i = 0; i < 4; ++i) v |= static_cast<uint32_t>(static_cast<uint8_t>(p[i])) << (8 * i);
  return v;
}

// Reads fields from a payload; every getter fails (returns false) past the end.
class Reader {
 public:
  explicit Reader(std::string_view s) : s_(s) {}
  bool U8(uint8_t* v) {
    if (s_.size() < 1) return false;
    *v = static_cast<uint8_t>(s_[0]);
    s_.remove_prefix(1);
    return true;
  }
  bool U32(uint32_t* v) {
    if (s_.size() < 4) return false;
    *v = ReadU32(s_.data());
    s_.remove_prefix(4);
    return true;
  }
  bool I64(int64_t* v) {
    if (s_.size() < 8) return false;
    uint64_t u = 0;
    for (int i = 0; i < 8; ++i) u |= static_cast<uint64_t>(static_cast<uint8_t>(s_[i])) << (8 * i);
    *v = static_cast<int64_t>(u);
    s_.remove_prefix(8);
    return true;
  }
  bool Str(std::string* v) {
    uint32_t n = 0;
    if (!U32(&n) || s_.size() < n) return false;
    v->assign(s_.data(), n);
    s_.remove_prefix(n);
    return true;
  }
  bool done() const { return s_.empty(); }

 private:
  std::string_view s_;
};

std::string AddrText(const sockaddr* a) {
  char host[NI_MAXHOST] = "?", serv[NI_MAXSERV] = "?";
  const socklen_t len = a->sa_family == AF_INET6 ? sizeof(sockaddr_in6) : sizeof(sockaddr_in);
  getnameinfo(a, len, host, sizeof host, serv, sizeof serv, NI_NUMERICHOST | NI_NUMERICSERV);
  return a->sa_family == AF_INET6 ? fmt::format("[{}]:{}", host, serv)
                                  : fmt::format("{}:{}", host, serv);
}

StatusOr<addrinfo*> Resolve(const std::string& host, int port, bool passive) {
  addrinfo hints{};
  hints.ai_family = AF_UNSPEC;
  hints.ai_socktype = SOCK_STREAM;
  hints.ai_flags = passive ? AI_PASSIVE : 0;
  addrinfo* res = nullptr;
  const std::string service = std::to_string(port);
  const int rc = getaddrinfo(host.c_str(), service.c_str(), &hints, &res);
  if (rc != 0 || res == nullptr) {
    return InvalidArgumentError(
        fmt::format("cannot resolve '{}' (MASTER_ADDR): {}", host, gai_strerror(rc)));
  }
  return res;
}

void SetNonBlocking(int fd) { fcntl(fd, F_SETFL, fcntl(fd, F_GETFL) | O_NONBLOCK); }

std::string Secs(std::chrono::milliseconds d) {
  return fmt::format("{:g} s", static_cast<double>(d.count()) / 1000.0);
}

// ---- server side ----

struct Client {
  int fd = -1;
  bool hello = false;
  std::string in, out;
  // A get or wait the client is blocked in, until its keys exist.
  bool waiting = false;
  Op wait_op = Op::kGet;
  std::vector<std::string> wait_keys;
  bool closing = false;  // close once `out` is flushed
};

std::string Ok(const std::string& result = {}) { return std::string(1, '\0') + result; }
std::string Err(const std::string& message) {
  std::string s(1, '\1');
  PutStr(&s, message);
  return s;
}

class ServerState {
 public:
  explicit ServerState(std::string run_id) : run_id_(std::move(run_id)) {}

  // Handles one request; returns false when the reply is pending (a get or wait).
  bool Handle(Client& c, const std::string& payload, std::string* reply) {
    Reader r(payload);
    uint8_t op8 = 0;
    if (!r.U8(&op8)) return Protocol(c, reply);
    const Op op = static_cast<Op>(op8);
    if (!c.hello) {
      std::string run;
      if (op != Op::kHello || !r.Str(&run)) return Protocol(c, reply);
      if (run != run_id_) {
        *reply = Err(fmt::format("this store serves run id '{}', not '{}'", run_id_, run));
        c.closing = true;
        return true;
      }
      c.hello = true;
      *reply = Ok();
      return true;
    }
    std::string key, value, expected;
    switch (op) {
      case Op::kSet:
        if (!r.Str(&key) || !r.Str(&value)) return Protocol(c, reply);
        kv_[key] = std::move(value);
        *reply = Ok();
        return true;
      case Op::kGet:
        if (!r.Str(&key)) return Protocol(c, reply);
        c.waiting = true;
        c.wait_op = Op::kGet;
        c.wait_keys = {key};
        return TryWake(c, reply);
      case Op::kWait: {
        uint32_t n = 0;
        if (!r.U32(&n)) return Protocol(c, reply);
        std::vector<std::string> keys(n);
        for (std::string& k : keys) {
          if (!r.Str(&k)) return Protocol(c, reply);
        }
        c.waiting = true;
        c.wait_op = Op::kWait;
        c.wait_keys = std::move(keys);
        return TryWake(c, reply);
      }
      case Op::kAdd: {
        int64_t delta = 0;
        if (!r.Str(&key) || !r.I64(&delta)) return Protocol(c, reply);
        int64_t v = 0;
        if (const auto it = kv_.find(key); it != kv_.end()) v = std::atoll(it->second.c_str());
        v += delta;
        kv_[key] = std::to_string(v);
        std::string out;
        PutI64(&out, v);
        *reply = Ok(out);
        return true;
      }
      case Op::kCheck: {
        uint32_t n = 0;
        if (!r.U32(&n)) return Protocol(c, reply);
        bool all = true;
        for (uint32_t i = 0; i < n; ++i) {
          if (!r.Str(&key)) return Protocol(c, reply);
          all = all && kv_.count(key) > 0;
        }
        *reply = Ok(std::string(1, all ? '\1' : '\0'));
        return true;
      }
      case Op::kDelete:
        if (!r.Str(&key)) return Protocol(c, reply);
        *reply = Ok(std::string(1, kv_.erase(key) > 0 ? '\1' : '\0'));
        return true;
      case Op::kNumKeys: {
        std::string out;
        PutI64(&out, static_cast<int64_t>(kv_.size()));
        *reply = Ok(out);
        return true;
      }
      case Op::kCompareSet: {
        if (!r.Str(&key) || !r.Str(&expected) || !r.Str(&value)) return Protocol(c, reply);
        const auto it = kv_.find(key);
        std::string out;
        if ((it == kv_.end() && expected.empty()) || (it != kv_.end() && it->second == expected)) {
          kv_[key] = value;
          PutStr(&out, value);
        } else {
          PutStr(&out, it == kv_.end() ? expected : it->second);
        }
        *reply = Ok(out);
        return true;
      }
      case Op::kHello:
        break;
    }
    return Protocol(c, reply);
  }

  // Completes `c`'s pending get or wait if its keys are all set.
  bool TryWake(Client& c, std::string* reply) {
    for (const std::string& k : c.wait_keys) {
      if (kv_.count(k) == 0) return false;
    }
    c.waiting = false;
    if (c.wait_op == Op::kGet) {
      std::string out;
      PutStr(&out, kv_[c.wait_keys[0]]);
      *reply = Ok(out);
    } else {
      *reply = Ok();
    }
    return true;
  }

 private:
  bool Protocol(Client& c, std::string* reply) {
    *reply = Err("malformed request (not a sluice store client?)");
    c.closing = true;
    return true;
  }

  std::string run_id_;
  std::unordered_map<std::string, std::string> kv_;
};

}  // namespace

// ---- StoreServer ----

StatusOr<std::unique_ptr<StoreServer>> StoreServer::Start(const std::string& address, int port,
                                                          const std::string& run_id) {
  SLUICE_ASSIGN_OR_RETURN(addrinfo * res, Resolve(address, port, /*passive=*/false));
  std::unique_ptr<addrinfo, decltype(&freeaddrinfo)> guard(res, freeaddrinfo);
  const std::string where = AddrText(res->ai_addr);
  const int fd = socket(res->ai_family, SOCK_STREAM | SOCK_CLOEXEC, 0);
  if (fd < 0) return IoError(fmt::format("store: socket(): {}", std::strerror(errno)));
  const int one = 1;
  setsockopt(fd, SOL_SOCKET, SO_REUSEADDR, &one, sizeof one);
  if (res->ai_family == AF_INET6) setsockopt(fd, IPPROTO_IPV6, IPV6_V6ONLY, &one, sizeof one);
  if (bind(fd, res->ai_addr, res->ai_addrlen) != 0 || listen(fd, 1024) != 0) {
    const int err = errno;
    close(fd);
    return FailedPreconditionError(fmt::format(
        "cannot serve the store on {} (MASTER_ADDR:MASTER_PORT): {}{}", where, std::strerror(err),
        err == EADDRINUSE      ? " (another job, or a process of an earlier one, uses MASTER_PORT; "
                                 "give each job its own port)"
        : err == EADDRNOTAVAIL ? " (MASTER_ADDR is not an address of this host: rank 0 must "
                                 "run where MASTER_ADDR points)"
                               : ""));
  }
  SetNonBlocking(fd);
  std::unique_ptr<StoreServer> s(new StoreServer());
  s->listen_fd_ = fd;
  s->run_id_ = run_id;
  s->bound_ = where;
  if (pipe2(s->wake_, O_CLOEXEC) != 0) {
    return IoError(fmt::format("store: pipe(): {}", std::strerror(errno)));
  }
  s->thread_ = std::thread([p = s.get()] { p->Loop(); });
  return s;
}

StoreServer::~StoreServer() {
  if (thread_.joinable()) {
    const char x = 1;
    (void)!write(wake_[1], &x, 1);
    thread_.join();
  }
  for (int fd : {listen_fd_, wake_[0], wake_[1]}) {
    if (fd >= 0) close(fd);
  }
}

void StoreServer::Loop() {
  ServerState state(run_id_);
  std::map<int, Client> clients;
  std::vector<pollfd> fds;
  char buf[65536];
  for (;;) {
    fds.clear();
    fds.push_back({wake_[0], POLLIN, 0});
    fds.push_back({listen_fd_, POLLIN, 0});
    for (const auto& [fd, c] : clients) {
      fds.push_back({fd, static_cast<short>(POLLIN | (c.out.empty() ? 0 : POLLOUT)), 0});
    }
    if (poll(fds.data(), fds.size(), -1) < 0) {
      if (errno == EINTR) continue;
      return;
    }
    if (fds[0].revents != 0) break;
    if (fds[1].revents & POLLIN) {
      for (;;) {
        const int fd = accept4(listen_fd_, nullptr, nullptr, SOCK_NONBLOCK | SOCK_CLOEXEC);
        if (fd < 0) break;
        const int one = 1;
        setsockopt(fd, IPPROTO_TCP, TCP_NODELAY, &one, sizeof one);
        clients[fd].fd = fd;
      }
    }
    bool changed = false;  // a key was written: pending waits may complete
    std::vector<int> drop;
    for (size_t i = 2; i < fds.size(); ++i) {
      Client& c = clients[fds[i].fd];
      if (fds[i].revents & POLLOUT) {
        const ssize_t n = send(c.fd, c.out.data(), c.out.size(), MSG_NOSIGNAL);
        if (n > 0) c.out.erase(0, static_cast<size_t>(n));
        if (n < 0 && errno != EAGAIN && errno != EINTR) {
          drop.push_back(c.fd);
          continue;
        }
        if (c.closing && c.out.empty()) {
          drop.push_back(c.fd);
          continue;
        }
      }
      if (fds[i].revents & (POLLIN | POLLHUP | POLLERR)) {
        const ssize_t n = recv(c.fd, buf, sizeof buf, 0);
        if (n == 0 || (n < 0 && errno != EAGAIN && errno != EINTR)) {
          drop.push_back(c.fd);
          continue;
        }
        if (n > 0) c.in.append(buf, static_cast<size_t>(n));
      }
      // Serve complete requests in order; a pending get/wait holds the rest back.
      while (!c.waiting && !c.closing && c.in.size() >= 4) {
        const uint32_t len = ReadU32(c.in.data());
        if (len > kMaxFrame) {
          drop.push_back(c.fd);
          break;
        }
        if (c.in.size() < 4 + static_cast<size_t>(len)) break;
        const std::string payload = c.in.substr(4, len);
        c.in.erase(0, 4 + static_cast<size_t>(len));
        std::string reply;
        const uint8_t op = payload.empty() ? 0 : static_cast<uint8_t>(payload[0]);
        if (state.Handle(c, payload, &reply)) c.out += Frame(reply);
        changed = changed || op == static_cast<uint8_t>(Op::kSet) ||
                  op == static_cast<uint8_t>(Op::kAdd) ||
                  op == static_cast<uint8_t>(Op::kCompareSet);
      }
    }
    for (const int fd : drop) {
      close(fd);
      clients.erase(fd);
    }
    if (changed) {
      for (auto& [fd, c] : clients) {
        std::string reply;
        if (c.waiting && state.TryWake(c, &reply)) c.out += Frame(reply);
      }
    }
  }
  for (const auto& [fd, c] : clients) close(fd);
}

// ---- StoreConnection ----

namespace {

// Connects one address with a deadline; returns the fd or -1 with errno set.
int ConnectOnce(const addrinfo* a, Clock::time_point deadline) {
  const int fd = socket(a->ai_family, SOCK_STREAM | SOCK_CLOEXEC | SOCK_NONBLOCK, 0);
  if (fd < 0) return -1;
  if (connect(fd, a->ai_addr, a->ai_addrlen) != 0) {
    if (errno != EINPROGRESS) {
      const int err = errno;
      close(fd);
      errno = err;
      return -1;
    }
    pollfd p{fd, POLLOUT, 0};
    const auto left =
        std::chrono::duration_cast<std::chrono::milliseconds>(deadline - Clock::now());
    const int rc = poll(&p, 1, static_cast<int>(std::max<int64_t>(0, left.count())));
    int err = 0;
    socklen_t len = sizeof err;
    if (rc <= 0) {
      err = ETIMEDOUT;
    } else {
      getsockopt(fd, SOL_SOCKET, SO_ERROR, &err, &len);
    }
    if (err != 0) {
      close(fd);
      errno = err;
      return -1;
    }
  }
  const int one = 1;
  setsockopt(fd, IPPROTO_TCP, TCP_NODELAY, &one, sizeof one);
  return fd;
}

}  // namespace

StatusOr<std::unique_ptr<StoreConnection>> StoreConnection::Connect(
    const std::string& host, int port, const std::string& run_id, std::chrono::milliseconds timeout,
    Clock::time_point connect_deadline) {
  SLUICE_ASSIGN_OR_RETURN(addrinfo * res, Resolve(host, port, /*passive=*/false));
  std::unique_ptr<addrinfo, decltype(&freeaddrinfo)> guard(res, freeaddrinfo);
  const std::string where = fmt::format("{}:{}", host, port);
  int last_err = 0;
  const Clock::time_point start = Clock::now();
  for (;;) {
    for (const addrinfo* a = res; a != nullptr; a = a->ai_next) {
      const int fd = ConnectOnce(a, std::max(connect_deadline, Clock::now() + timeout));
      if (fd < 0) {
        last_err = errno;
        continue;
      }
      std::unique_ptr<StoreConnection> c(new StoreConnection(fd, where, run_id + "/", timeout));
      std::string hello(1, static_cast<char>(Op::kHello));
      PutStr(&hello, run_id);
      StatusOr<std::string> r = c->Call(hello, timeout, "hello");
      if (!r.ok()) {
        return FailedPreconditionError(fmt::format(
            "the store at {} (MASTER_ADDR:MASTER_PORT) refused this job (run id '{}'): {}{}", where,
            run_id, r.status().message(),
            r.status().message().find("serves run id") != std::string::npos
                ? "; another job uses this MASTER_PORT: give each job its own port or the same "
                  "--run-id to all its ranks"
                : ""));
      }
      return c;
    }
    if (Clock::now() >= connect_deadline) break;
    std::this_thread::sleep_for(std::chrono::milliseconds(100));
  }
  return FailedPreconditionError(fmt::format(
      "could not reach the store at {} (MASTER_ADDR:MASTER_PORT) within {}: {}; rank 0, which "
      "serves it, has not started or has exited, or the address is wrong",
      where, Secs(std::chrono::duration_cast<std::chrono::milliseconds>(Clock::now() - start)),
      std::strerror(last_err)));
}

StoreConnection::~StoreConnection() {
  if (fd_ >= 0) close(fd_);
}

StatusOr<std::string> StoreConnection::Call(const std::string& request,
                                            std::chrono::milliseconds wait,
                                            const std::string& what) {
  std::lock_guard<std::mutex> lock(mu_);
  if (fd_ < 0) {
    return FailedPreconditionError(fmt::format(
        "store {}: the connection to {} was closed earlier: {}", what, where_, broken_));
  }
  const Clock::time_point deadline = Clock::now() + wait;
  const auto fail = [&](const std::string& why) -> Status {
    close(fd_);
    fd_ = -1;
    broken_ = why;
    return FailedPreconditionError(fmt::format("store {}: {}", what, why));
  };
  const auto left_ms = [&] {
    return static_cast<int>(std::clamp<int64_t>(
        std::chrono::duration_cast<std::chrono::milliseconds>(deadline - Clock::now()).count(), 0,
        INT32_MAX));
  };
  const std::string frame = Frame(request);
  size_t sent = 0;
  while (sent < frame.size()) {
    pollfd p{fd_, POLLOUT, 0};
    const int rc = poll(&p, 1, left_ms());
    if (rc < 0 && errno == EINTR) continue;
    if (rc == 0) {
      return fail(
          fmt::format("{} did not take the request within {} (the process serving it "
                      "is stopped or hung, or the network failed)",
                      where_, Secs(wait)));
    }
    const ssize_t n = send(fd_, frame.data() + sent, frame.size() - sent, MSG_NOSIGNAL);
    if (n < 0) {
      if (errno == EAGAIN || errno == EINTR) continue;
      return fail(fmt::format("lost the connection to {}: {}", where_, std::strerror(errno)));
    }
    sent += static_cast<size_t>(n);
  }
  std::string in;
  size_t need = 4;
  bool have_len = false;
  char buf[65536];
  while (in.size() < need) {
    pollfd p{fd_, POLLIN, 0};
    const int rc = poll(&p, 1, left_ms());
    if (rc < 0 && errno == EINTR) continue;
    if (rc == 0) {
      const bool waits = what.rfind("get ", 0) == 0 || what.rfind("wait ", 0) == 0;
      return fail(
          waits ? fmt::format("not set within {} (or {} stopped answering)", Secs(wait), where_)
                : fmt::format("no answer from {} within {}", where_, Secs(wait)));
    }
    const ssize_t n = recv(fd_, buf, std::min(sizeof buf, need - in.size()), 0);
    if (n == 0) return fail(fmt::format("{} closed the connection", where_));
    if (n < 0) {
      if (errno == EAGAIN || errno == EINTR) continue;
      return fail(fmt::format("lost the connection to {}: {}", where_, std::strerror(errno)));
    }
    in.append(buf, static_cast<size_t>(n));
    if (!have_len && in.size() == 4) {
      const uint32_t len = ReadU32(in.data());
      if (len == 0 || len > kMaxFrame) return fail("malformed reply");
      need = 4 + len;
      have_len = true;
    }
  }
  if (in[4] != '\0') {
    Reader r(std::string_view(in).substr(5));
    std::string message;
    r.Str(&message);
    (void)fail(message);
    return FailedPreconditionError(message);
  }
  return in.substr(5);
}

Status StoreConnection::Set(const std::string& key, const std::vector<uint8_t>& value) {
  std::string q(1, static_cast<char>(Op::kSet));
  PutStr(&q, prefix_ + key);
  PutStr(&q, std::string_view(reinterpret_cast<const char*>(value.data()), value.size()));
  return Call(q, timeout_, fmt::format("set of '{}'", key)).status();
}

StatusOr<std::vector<uint8_t>> StoreConnection::Get(const std::string& key) {
  return Get(key, timeout_);
}

StatusOr<std::vector<uint8_t>> StoreConnection::Get(const std::string& key,
                                                    std::chrono::milliseconds timeout) {
  std::string q(1, static_cast<char>(Op::kGet));
  PutStr(&q, prefix_ + key);
  StatusOr<std::string> r = Call(q, timeout, fmt::format("get of '{}'", key));
  if (!r.ok()) return r.status();
  Reader rd(*r);
  std::string v;
  if (!rd.Str(&v)) return FailedPreconditionError("store get: malformed reply");
  return std::vector<uint8_t>(v.begin(), v.end());
}

StatusOr<int64_t> StoreConnection::Add(const std::string& key, int64_t delta) {
  std::string q(1, static_cast<char>(Op::kAdd));
  PutStr(&q, prefix_ + key);
  PutI64(&q, delta);
  StatusOr<std::string> r = Call(q, timeout_, fmt::format("add to '{}'", key));
  if (!r.ok()) return r.status();
  Reader rd(*r);
  int64_t v = 0;
  if (!rd.I64(&v)) return FailedPreconditionError("store add: malformed reply");
  return v;
}

StatusOr<bool> StoreConnection::Check(const std::vector<std::string>& keys) {
  std::string q(1, static_cast<char>(Op::kCheck));
  PutU32(&q, static_cast<uint32_t>(keys.size()));
  for (const std::string& k : keys) PutStr(&q, prefix_ + k);
  StatusOr<std::string> r = Call(q, timeout_, "check");
  if (!r.ok()) return r.status();
  return !r->empty() && (*r)[0] == '\1';
}

StatusOr<bool> StoreConnection::Delete(const std::string& key) {
  std::string q(1, static_cast<char>(Op::kDelete));
  PutStr(&q, prefix_ + key);
  StatusOr<std::string> r = Call(q, timeout_, fmt::format("delete of '{}'", key));
  if (!r.ok()) return r.status();
  return !r->empty() && (*r)[0] == '\1';
}

StatusOr<int64_t> StoreConnection::NumKeys() {
  StatusOr<std::string> r =
      Call(std::string(1, static_cast<char>(Op::kNumKeys)), timeout_, "key count");
  if (!r.ok()) return r.status();
  Reader rd(*r);
  int64_t v = 0;
  if (!rd.I64(&v)) return FailedPreconditionError("store key count: malformed reply");
  return v;
}

Status StoreConnection::Wait(const std::vector<std::string>& keys,
                             std::chrono::milliseconds timeout) {
  std::string q(1, static_cast<char>(Op::kWait));
  PutU32(&q, static_cast<uint32_t>(keys.size()));
  for (const std::string& k : keys) PutStr(&q, prefix_ + k);
  std::string names;
  for (const std::string& k : keys) names += (names.empty() ? "'" : ", '") + k + "'";
  return Call(q, timeout, fmt::format("wait for {}", names)).status();
}

StatusOr<std::vector<uint8_t>> StoreConnection::CompareSet(const std::string& key,
                                                           const std::vector<uint8_t>& expected,
                                                           const std::vector<uint8_t>& desired) {
  std::string q(1, static_cast<char>(Op::kCompareSet));
  PutStr(&q, prefix_ + key);
  PutStr(&q, std::string_view(reinterpret_cast<const char*>(expected.data()), expected.size()));
  PutStr(&q, std::string_view(reinterpret_cast<const char*>(desired.data()), desired.size()));
  StatusOr<std::string> r = Call(q, timeout_, fmt::format("compare-set of '{}'", key));
  if (!r.ok()) return r.status();
  Reader rd(*r);
  std::string v;
  if (!rd.Str(&v)) return FailedPreconditionError("store compare-set: malformed reply");
  return std::vector<uint8_t>(v.begin(), v.end());
}

}  // namespace sluice::runtime
