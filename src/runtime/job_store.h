// The job's key-value store: a small TCP server (rank 0 serves it) and a client whose every
// operation is bounded by a deadline. It replaces c10d::TCPStore, which in libtorch 1.13
// listens on every interface (TCPStoreOptions has no bind address) and whose add / set / check
// / delete wait for the server's reply without a timeout (a stopped rank 0 froze every rank).
//
// - StoreServer binds exactly one address (MASTER_ADDR resolved, e.g. 10.0.0.1:29500, never
//   0.0.0.0) and serves one job: the first bytes of every connection are a hello carrying the
//   run id, and a client of another run is answered with an error naming both ids, so a second
//   job started on the same MASTER_PORT fails fast and never touches the first job's keys.
// - StoreConnection is one client connection. Connect retries until its deadline (rank 0 may
//   start later than the others). Every operation sends its request and waits for the reply
//   with poll() up to the connection's timeout; get and wait wait (server side) for their keys
//   for at most that long. A timed-out or failed connection is closed and every later
//   operation fails at once (a late reply would desynchronise it). Keys are prefixed with
//   "<run id>/" on the client, so the run id scopes every key.
//
// Wire format (both directions): frames of a little-endian u32 length and a payload. Request:
// u8 op, then the op's fields (strings and byte values as u32 length + bytes, integers as i64
// little-endian). Reply: u8 status (0 ok, 1 error with a message string), then the op's result.
//
// Thread safety: a StoreConnection serialises its operations with a mutex (each is bounded by the
// timeout, so a waiter waits at most a few timeouts). The server runs one thread of its own.
#pragma once

#include <chrono>
#include <cstdint>
#include <memory>
#include <mutex>
#include <string>
#include <thread>
#include <vector>

#include "base/status.h"

namespace sluice::runtime {

class StoreServer {
 public:
  // Binds `address` (a numeric IPv4/IPv6 address or a host name; its first address is used)
  // on `port` and starts serving the run `run_id`. The error names the address and port (e.g.
  // "Address already in use": another job or a stale process holds MASTER_PORT).
  static StatusOr<std::unique_ptr<StoreServer>> Start(const std::string& address, int port,
                                                      const std::string& run_id);
  ~StoreServer();
  StoreServer(const StoreServer&) = delete;
  StoreServer& operator=(const StoreServer&) = delete;

  // "10.0.0.1:29500" (what the socket is bound to).
  const std::string& bound() const { return bound_; }

 private:
  StoreServer() = default;
  void Loop();

  int listen_fd_ = -1;
  int wake_[2] = {-1, -1};  // a pipe: the destructor writes to stop the thread
  std::string run_id_, bound_;
  std::thread thread_;
};

class StoreConnection {
 public:
  // Connects to host:port, retrying refused connections until `connect_deadline` passes, and
  // says hello with `run_id`. `timeout` bounds every later operation.
  static StatusOr<std::unique_ptr<StoreConnection>> Connect(
      const std::string& host, int port, const std::string& run_id,
      std::chrono::milliseconds timeout, std::chrono::steady_clock::time_point connect_deadline);
  ~StoreConnection();
  StoreConnection(const StoreConnection&) = delete;
  StoreConnection& operator=(const StoreConnection&) = delete;

  Status Set(const std::string& key, const std::vector<uint8_t>& value);
  // Waits (up to `timeout`, default the connection's) for the key to be set.
  StatusOr<std::vector<uint8_t>> Get(const std::string& key);
  StatusOr<std::vector<uint8_t>> Get(const std::string& key, std::chrono::milliseconds timeout);
  // Adds `delta` to the integer at `key` (absent: 0); returns the new value.
  StatusOr<int64_t> Add(const std::string& key, int64_t delta);
  StatusOr<bool> Check(const std::vector<std::string>& keys);
  StatusOr<bool> Delete(const std::string& key);
  StatusOr<int64_t> NumKeys();
  // Waits until every key is set, up to `timeout`.
  Status Wait(const std::vector<std::string>& keys, std::chrono::milliseconds timeout);
  // Sets `key` to `desired` if its value is `expected` (or it is absent and `expected` is
  // empty); returns the value after the operation.
  StatusOr<std::vector<uint8_t>> CompareSet(const std::string& key,
                                            const std::vector<uint8_t>& expected,
                                            const std::vector<uint8_t>& desired);

  std::chrono::milliseconds timeout() const { return timeout_; }
  const std::string& where() const { return where_; }

 private:
  StoreConnection(int fd, std::string where, std::string prefix, std::chrono::milliseconds timeout)
      : fd_(fd), where_(std::move(where)), prefix_(std::move(prefix)), timeout_(timeout) {}
  // Sends `request`, waits up to `wait` for the reply payload (after the status byte).
  StatusOr<std::string> Call(const std::string& request, std::chrono::milliseconds wait,
                             const std::string& what);

  std::mutex mu_;
  int fd_;              // guarded by mu_; -1 once broken
  std::string broken_;  // guarded by mu_: why the connection was closed
  std::string where_, prefix_;
  std::chrono::milliseconds timeout_;
};

}  // namespace sluice::runtime
