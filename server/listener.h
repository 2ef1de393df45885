// The daemon's listening socket: accepted here, served by gRPC.
//
// gRPC 1.51 (Debian 12) owns nothing here. Its own acceptor stops for good
// after one failed accept4 (EMFILE: out of file descriptors; the log says
// "Failed accept4: Too many open files" and no connection is accepted again),
// and it has no connection limit. So the daemon binds the address itself,
// accepts on one thread of its own, and hands each connection to gRPC through
// ServerBuilder's external connection acceptor, which runs the same HTTP/2
// (and TLS) handshake as a port gRPC listens on.
//
// What the accept thread guarantees:
//   - At most `max_connections` accepted connections are open at a time, and
//     at most `max_connections_per_peer` of one client address; one more is
//     closed at once (the client sees the connection reset or closed and
//     retries with backoff) and counted in Stats().refused_total.
//   - Out of file descriptors (EMFILE/ENFILE) the listener keeps going: it
//     gives up a spare descriptor it holds for the purpose, accepts and
//     closes the waiting connection (so the client is told at once instead of
//     hanging in the backlog), takes the spare again and backs off for 50 ms.
//     Other transient errors (ENOBUFS, ENOMEM, ...) back off the same way.
//   - A listening socket that can no longer accept (it was shut down or
//     closed, EBADF/EINVAL/ENOTSOCK) is reported once to `on_failure`; the
//     accept thread then stops.
//
//   - With a guard (plaintext), every connection is relayed through it
//     (server/http2_guard.h), which bounds header blocks and resets at the
//     frame level.
//   - Without one (TLS: frames unreadable), a connection that sends more than
//     kMaxBytesWithoutProgress bytes without progress is closed (shutdown(2);
//     gRPC sees it end). The bytes
//     are the kernel's count (TCP_INFO tcpi_bytes_received); progress is
//     reported by the services (NoteProgress) at each call they start and
//     each message they read. This bounds what gRPC 1.51 does with a header
//     block that never ends (a CONTINUATION flood): it keeps every byte
//     (1.8x) and never closes the connection, and it re-copies a header value
//     longer than a frame at every frame, so the work grows with the square
//     of the block. While a header block is open HTTP/2 allows no other frame
//     on the connection, so no progress can happen on it; a client doing real
//     work reports progress at least once per request message (at most 4 MiB,
//     gRPC's limit). The memory such a connection held goes back to the
//     system once gRPC has let go of it (malloc_trim a second later).
//
// Open connections are counted by the socket inodes this listener accepted
// that are still open in the process (gRPC closes a connection's descriptor
// when it ends and tells no one), checked with fstat at most every 50 ms when
// the limit is reached and every 250 ms with the progress budgets.
//
// Thread-safety: Bind/Start/Stop from one thread; Stats and port from any.
#ifndef DECODED_SERVER_LISTENER_H_
#define DECODED_SERVER_LISTENER_H_

#include <sys/types.h>

#include <atomic>
#include <cstdint>
#include <functional>
#include <memory>
#include <string>
#include <thread>
#include <utility>
#include <vector>

#include "absl/base/thread_annotations.h"
#include "absl/container/flat_hash_map.h"
#include "absl/container/flat_hash_set.h"
#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/synchronization/mutex.h"
#include "absl/time/time.h"
#include "grpcpp/server_builder.h"
#include "server/client_connections.h"
#include "server/http2_guard.h"

namespace decoded::server {

struct ListenerOptions {
  // "host:port", "[v6 address]:port" or ":port" (every address); port 0
  // picks a free port. A host name binds every address it resolves to.
  std::string address = "127.0.0.1:50051";
  int max_connections = 1024;  // >= 1
  // Connections of one client address (IP, any port); 0: no limit. Behind a
  // proxy all connections come from the proxy, which keeps few (one per
  // worker thread in Envoy's HTTP/2 pool).
  int max_connections_per_peer = 0;
  // Relays every connection through this guard (plaintext only: it reads
  // frame headers), which must outlive the listener. Null: gRPC gets the
  // client's socket itself (TLS).
  Http2Guard* guard = nullptr;
  int backlog = 1024;          // listen(2) backlog
};

// Bytes a connection may receive between two reports of progress: four
// times gRPC's largest request message (GRPC_ARG_MAX_RECEIVE_MESSAGE_LENGTH's
// default, 4 MiB), so requests arriving interleaved on one connection fit.
inline constexpr int64_t kMaxBytesWithoutProgress = int64_t{16} << 20;


struct ListenerStats {
  int64_t open_connections = 0;  // accepted and not yet closed by gRPC
  int64_t accepted_total = 0;    // handed to gRPC
  int64_t refused_total = 0;     // closed at once: max_connections were open
  int64_t accept_errors_total = 0;  // failed accept4 calls (out of descriptors, ...)
  int64_t closed_without_progress_total = 0;  // kMaxBytesWithoutProgress exceeded
};

class Listener final : public ClientConnections {
 public:
  // Binds and listens (SO_REUSEADDR, never SO_REUSEPORT: a second daemon on
  // the same port must fail). UNAVAILABLE when the address is in use or
  // cannot be bound, INVALID_ARGUMENT when it does not parse or resolve.
  static absl::StatusOr<std::unique_ptr<Listener>> Bind(const ListenerOptions& options);
  ~Listener() override;  // Stop()
  Listener(const Listener&) = delete;
  Listener& operator=(const Listener&) = delete;

  // The bound port (the one picked for port 0).
  int port() const { return port_; }
  // An address that reaches this listener from the same host ("127.0.0.1"
  // for the IPv4 wildcard, "::1" for the IPv6 one, else the bound host).
  const std::string& local_host() const { return local_host_; }

  // Starts the accept thread: each connection goes to `acceptor` (owned by
  // the gRPC server, which must outlive Stop). `on_failure` is called once,
  // on the accept thread, if the listening socket stops accepting for good.
  void Start(grpc::experimental::ExternalConnectionAcceptor* acceptor,
             std::function<void(const absl::Status&)> on_failure);
  // Stops accepting and closes the listening sockets; returns once the accept
  // thread is gone. Connections already handed to gRPC stay open. Idempotent.
  void Stop();

  ListenerStats Stats() ABSL_LOCKS_EXCLUDED(mu_);

  // Closes the accepted connection whose peer is `grpc_peer` (gRPC's
  // spelling, "ipv4:10.0.0.7:51234" or "ipv6:[::1]:40000"): shutdown(2) of its
  // socket, so gRPC sees it end and tears it down with all its streams. False
  // when no open connection of this listener has that peer.
  bool CloseConnection(const std::string& grpc_peer) ABSL_LOCKS_EXCLUDED(mu_);

  // The next connection from this host's port `source_port` is the
  // watchdog's probe: it is closed at accept instead of going to gRPC, so
  // the probe sees this listener accept, whatever gRPC is busy with.
  void ExpectProbe(int source_port) ABSL_LOCKS_EXCLUDED(mu_);

  // A call started, or a request message was read, on the connection of
  // `grpc_peer`: its progress budget starts again from the bytes received so
  // far. Unknown peers are ignored. Any thread.
  void NoteProgress(const std::string& grpc_peer) override ABSL_LOCKS_EXCLUDED(mu_);
  std::string ClientPeer(const std::string& grpc_peer) const override;

 private:
  Listener() = default;
  void AcceptLoop();
  // Accepts what is waiting on `fd`; false when the socket failed for good.
  bool AcceptReady(int fd);
  // Forgets tracked connections gRPC has closed. `force`: even if the last
  // refresh was less than 50 ms ago.
  void RefreshOpenLocked(bool force) ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  // Closes the connections over their progress budget (every 250 ms).
  void CheckProgressLocked() ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);

  void LogThrottled(const std::string& message);

  std::vector<int> fds_;  // listening sockets
  int wake_fd_ = -1;      // eventfd: Stop() wakes the accept thread
  int spare_fd_ = -1;     // given up when out of descriptors (see the file comment)
  int port_ = 0;
  std::string local_host_;
  int max_connections_ = 0;
  int max_connections_per_peer_ = 0;
  Http2Guard* guard_ = nullptr;
  grpc::experimental::ExternalConnectionAcceptor* acceptor_ = nullptr;
  std::function<void(const absl::Status&)> on_failure_;
  std::thread thread_;
  std::atomic<bool> stopping_{false};

  absl::Mutex mu_;
  struct Connection {
    dev_t dev;  // the socket's identity: the descriptor may be reused once gRPC closes it
    ino_t ino;
    std::string peer;               // what gRPC reports as the peer (loopback when relayed)
    std::string address;            // the client's address, without its port
    bool relayed = false;           // through the guard, which bounds header blocks itself
    uint64_t progress_bytes = 0;    // tcpi_bytes_received at the last progress
    bool closing = false;           // shut down for want of progress
  };
  // Drops a connection gRPC has closed from every table.
  void ForgetLocked(absl::flat_hash_map<int, Connection>::iterator it) ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  // Accepted descriptor -> its connection, while open; and peer -> descriptor.
  absl::flat_hash_map<int, Connection> open_ ABSL_GUARDED_BY(mu_);
  absl::flat_hash_map<std::string, int> by_peer_ ABSL_GUARDED_BY(mu_);
  // Client address (no port) -> open connections.
  absl::flat_hash_map<std::string, int> per_address_ ABSL_GUARDED_BY(mu_);
  absl::Time last_refresh_ ABSL_GUARDED_BY(mu_) = absl::InfinitePast();
  absl::Time last_progress_check_ ABSL_GUARDED_BY(mu_) = absl::InfinitePast();
  int64_t closed_without_progress_total_ ABSL_GUARDED_BY(mu_) = 0;
  absl::Time trim_at_ ABSL_GUARDED_BY(mu_) = absl::InfiniteFuture();  // heap trim after such a close
  absl::flat_hash_set<int> probe_ports_ ABSL_GUARDED_BY(mu_);  // ExpectProbe
  int64_t accepted_total_ ABSL_GUARDED_BY(mu_) = 0;
  int64_t refused_total_ ABSL_GUARDED_BY(mu_) = 0;
  int64_t accept_errors_total_ ABSL_GUARDED_BY(mu_) = 0;
  absl::Time last_log_ = absl::InfinitePast();  // accept thread only
};

}  // namespace decoded::server

#endif  // DECODED_SERVER_LISTENER_H_
