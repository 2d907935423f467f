// The job store's server (StoreServer, job_store.h): one thread, poll() over its clients.
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

#include "runtime/job_store.h"
#include "runtime/job_store_wire.h"

namespace sluice::runtime {
namespace {

using namespace store_wire;  // NOLINT: the wire helpers of this file's protocol

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

}  // namespace sluice::runtime
