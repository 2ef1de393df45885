#include "server/listener.h"

#include <arpa/inet.h>
#include <fcntl.h>
#include <malloc.h>
#include <netdb.h>
#include <netinet/in.h>
#include <linux/tcp.h>  // TCP_INFO with tcpi_bytes_received
#include <poll.h>
#include <sys/eventfd.h>
#include <sys/socket.h>
#include <sys/stat.h>
#include <unistd.h>

#include <cerrno>
#include <cstring>
#include <iostream>
#include <utility>

#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "absl/time/clock.h"
#include "server/host_port.h"
#include "server/peer_sessions.h"

namespace decoded::server {
namespace {

constexpr absl::Duration kBackoff = absl::Milliseconds(50);
constexpr absl::Duration kLimitRefresh = absl::Milliseconds(50);
constexpr absl::Duration kStatsRefresh = absl::Seconds(1);
constexpr absl::Duration kLogInterval = absl::Seconds(10);

bool IsWildcard(const sockaddr* addr) {
  if (addr->sa_family == AF_INET) {
    return reinterpret_cast<const sockaddr_in*>(addr)->sin_addr.s_addr == htonl(INADDR_ANY);
  }
  if (addr->sa_family == AF_INET6) {
    return IN6_IS_ADDR_UNSPECIFIED(&reinterpret_cast<const sockaddr_in6*>(addr)->sin6_addr);
  }
  return false;
}

std::string NumericHost(const sockaddr* addr, socklen_t len) {
  char host[NI_MAXHOST] = {0};
  if (getnameinfo(addr, len, host, sizeof(host), nullptr, 0, NI_NUMERICHOST) != 0) return "127.0.0.1";
  return host;
}

void SetPort(sockaddr* addr, int port) {
  if (addr->sa_family == AF_INET) reinterpret_cast<sockaddr_in*>(addr)->sin_port = htons(port);
  if (addr->sa_family == AF_INET6) reinterpret_cast<sockaddr_in6*>(addr)->sin6_port = htons(port);
}

int BoundPort(int fd) {
  sockaddr_storage addr{};
  socklen_t len = sizeof(addr);
  if (getsockname(fd, reinterpret_cast<sockaddr*>(&addr), &len) != 0) return 0;
  if (addr.ss_family == AF_INET) return ntohs(reinterpret_cast<sockaddr_in*>(&addr)->sin_port);
  if (addr.ss_family == AF_INET6) return ntohs(reinterpret_cast<sockaddr_in6*>(&addr)->sin6_port);
  return 0;
}

std::string ErrnoText(int err) { return std::strerror(err); }

// gRPC's spelling of a socket's peer address: "ipv4:10.0.0.7:51234",
// "ipv6:[::1]:40000"; "" when it cannot be read.
std::string GrpcPeer(int fd) {
  sockaddr_storage addr{};
  socklen_t len = sizeof(addr);
  if (getpeername(fd, reinterpret_cast<sockaddr*>(&addr), &len) != 0) return "";
  char host[NI_MAXHOST] = {0};
  char serv[NI_MAXSERV] = {0};
  if (getnameinfo(reinterpret_cast<sockaddr*>(&addr), len, host, sizeof(host), serv, sizeof(serv),
                  NI_NUMERICHOST | NI_NUMERICSERV) != 0) {
    return "";
  }
  return addr.ss_family == AF_INET6 ? absl::StrCat("ipv6:[", host, "]:", serv) : absl::StrCat("ipv4:", host, ":", serv);
}

// Bytes the kernel has received on a TCP socket so far (0 if unknown).
uint64_t BytesReceived(int fd) {
  tcp_info info{};
  socklen_t len = sizeof(info);
  if (getsockopt(fd, IPPROTO_TCP, TCP_INFO, &info, &len) != 0) return 0;
  return info.tcpi_bytes_received;
}

constexpr absl::Duration kProgressCheck = absl::Milliseconds(250);

}  // namespace

absl::StatusOr<std::unique_ptr<Listener>> Listener::Bind(const ListenerOptions& options) {
  if (options.max_connections < 1) return absl::InvalidArgumentError("max_connections must be >= 1");
  absl::StatusOr<HostPort> hp = SplitAddress(options.address);
  if (!hp.ok()) return hp.status();
  addrinfo hints{};
  hints.ai_family = AF_UNSPEC;
  hints.ai_socktype = SOCK_STREAM;
  hints.ai_flags = AI_PASSIVE | AI_NUMERICSERV;
  addrinfo* found = nullptr;
  if (int err = getaddrinfo(hp->host.empty() ? nullptr : hp->host.c_str(), hp->port.c_str(), &hints, &found);
      err != 0) {
    return absl::InvalidArgumentError(
        absl::StrCat("listen address \"", options.address, "\" does not resolve: ", gai_strerror(err)));
  }
  std::vector<addrinfo*> addrs;
  for (addrinfo* a = found; a != nullptr; a = a->ai_next) {
    if (a->ai_family == AF_INET || a->ai_family == AF_INET6) addrs.push_back(a);
  }

  std::unique_ptr<Listener> listener(new Listener());
  listener->max_connections_ = options.max_connections;
  listener->max_connections_per_peer_ = options.max_connections_per_peer;
  listener->guard_ = options.guard;
  absl::Status failed;
  int port = 0;
  for (addrinfo* a : addrs) {
    sockaddr_storage addr{};
    std::memcpy(&addr, a->ai_addr, a->ai_addrlen);
    // Port 0 with several addresses: every socket gets the port the first got.
    if (port != 0) SetPort(reinterpret_cast<sockaddr*>(&addr), port);
    const int fd = socket(a->ai_family, SOCK_STREAM | SOCK_NONBLOCK | SOCK_CLOEXEC, 0);
    if (fd < 0) {
      failed = absl::UnavailableError(absl::StrCat("socket: ", ErrnoText(errno)));
      continue;
    }
    const int one = 1;
    setsockopt(fd, SOL_SOCKET, SO_REUSEADDR, &one, sizeof(one));
    setsockopt(fd, IPPROTO_TCP, TCP_NODELAY, &one, sizeof(one));
    if (a->ai_family == AF_INET6) {
      // Alone, an IPv6 address serves IPv4 clients too (as gRPC's own
      // "[::]:port" does); beside an IPv4 one, each socket keeps its family.
      const int v6only = addrs.size() > 1 ? 1 : 0;
      setsockopt(fd, IPPROTO_IPV6, IPV6_V6ONLY, &v6only, sizeof(v6only));
    }
    if (bind(fd, reinterpret_cast<sockaddr*>(&addr), a->ai_addrlen) != 0 || listen(fd, options.backlog) != 0) {
      failed = absl::UnavailableError(absl::StrCat("cannot listen on ", NumericHost(a->ai_addr, a->ai_addrlen), ":",
                                                   hp->port, ": ", ErrnoText(errno)));
      close(fd);
      continue;
    }
    if (port == 0) {
      port = BoundPort(fd);
      listener->local_host_ = IsWildcard(a->ai_addr) ? (a->ai_family == AF_INET6 ? "::1" : "127.0.0.1")
                                                     : NumericHost(a->ai_addr, a->ai_addrlen);
    }
    if (IsWildcard(a->ai_addr) && a->ai_family == AF_INET) listener->local_host_ = "127.0.0.1";
    listener->fds_.push_back(fd);
  }
  freeaddrinfo(found);
  // Every resolved address must be served: a port taken on one of them means
  // another server answers there.
  if (!failed.ok()) return failed;
  if (listener->fds_.empty()) {
    return absl::InvalidArgumentError(absl::StrCat("listen address \"", options.address, "\" has no IP address"));
  }
  listener->port_ = port;
  listener->wake_fd_ = eventfd(0, EFD_CLOEXEC | EFD_NONBLOCK);
  listener->spare_fd_ = open("/dev/null", O_RDONLY | O_CLOEXEC);
  if (listener->wake_fd_ < 0) return absl::InternalError(absl::StrCat("eventfd: ", ErrnoText(errno)));
  return listener;
}

Listener::~Listener() {
  Stop();
  for (int fd : fds_) close(fd);
  if (wake_fd_ >= 0) close(wake_fd_);
  if (spare_fd_ >= 0) close(spare_fd_);
}

void Listener::Start(grpc::experimental::ExternalConnectionAcceptor* acceptor,
                     std::function<void(const absl::Status&)> on_failure) {
  acceptor_ = acceptor;
  on_failure_ = std::move(on_failure);
  thread_ = std::thread([this] { AcceptLoop(); });
}

void Listener::Stop() {
  if (stopping_.exchange(true)) return;
  if (thread_.joinable()) {
    const uint64_t one = 1;
    (void)!write(wake_fd_, &one, sizeof(one));
    thread_.join();
  }
  for (int fd : fds_) close(fd);
  fds_.clear();
}

void Listener::AcceptLoop() {
  std::vector<pollfd> polled;
  for (int fd : fds_) polled.push_back(pollfd{fd, POLLIN, 0});
  polled.push_back(pollfd{wake_fd_, POLLIN, 0});
  while (!stopping_.load()) {
    for (pollfd& p : polled) p.revents = 0;
    if (poll(polled.data(), polled.size(), static_cast<int>(absl::ToInt64Milliseconds(kProgressCheck))) < 0 &&
        errno != EINTR) {
      absl::SleepFor(kBackoff);
      continue;
    }
    if (polled.back().revents != 0) return;  // Stop()
    {
      absl::MutexLock lock(&mu_);
      if (absl::Now() - last_progress_check_ >= kProgressCheck) CheckProgressLocked();
    }
    for (size_t i = 0; i + 1 < polled.size(); ++i) {
      if (polled[i].revents == 0) continue;
      if (!AcceptReady(polled[i].fd)) return;
    }
  }
}

bool Listener::AcceptReady(int fd) {
  for (;;) {
    const int conn = accept4(fd, nullptr, nullptr, SOCK_NONBLOCK | SOCK_CLOEXEC);
    if (conn < 0) {
      const int err = errno;
      switch (err) {
        case EAGAIN:
          return true;
        // accept(2): Linux passes the new connection's pending network
        // errors up; they concern that connection only.
        case EINTR:
        case ECONNABORTED:
        case EPROTO:
        case EPERM:
        case ENETDOWN:
        case ENOPROTOOPT:
        case EHOSTDOWN:
        case ENONET:
        case EHOSTUNREACH:
        case ENETUNREACH:
        case ETIMEDOUT:
          continue;
        case EMFILE:
        case ENFILE: {
          {
            absl::MutexLock lock(&mu_);
            ++accept_errors_total_;
          }
          // Tell the waiting client now rather than leave it in the backlog.
          if (spare_fd_ >= 0) {
            close(spare_fd_);
            const int waiting = accept4(fd, nullptr, nullptr, SOCK_CLOEXEC);
            if (waiting >= 0) close(waiting);
            spare_fd_ = open("/dev/null", O_RDONLY | O_CLOEXEC);
          }
          LogThrottled(absl::StrCat("accept4: ", ErrnoText(err),
                                    "; closing new connections until descriptors are free again"));
          poll(nullptr, 0, static_cast<int>(absl::ToInt64Milliseconds(kBackoff)));
          return true;
        }
        case ENOBUFS:
        case ENOMEM: {
          {
            absl::MutexLock lock(&mu_);
            ++accept_errors_total_;
          }
          LogThrottled(absl::StrCat("accept4: ", ErrnoText(err), "; backing off"));
          poll(nullptr, 0, static_cast<int>(absl::ToInt64Milliseconds(kBackoff)));
          return true;
        }
        default:
          if (stopping_.load()) return false;
          if (on_failure_) {
            on_failure_(absl::UnavailableError(
                absl::StrCat("the listening socket on port ", port_, " failed: accept4: ", ErrnoText(err))));
          }
          return false;
      }
    }

    bool refuse = false;
    bool probe = false;
    std::string refusal;
    const std::string peer = GrpcPeer(conn);
    const std::string address = PeerSessions::PeerAddress(peer);
    {
      absl::MutexLock lock(&mu_);
      if (!probe_ports_.empty()) {
        sockaddr_storage from{};
        socklen_t len = sizeof(from);
        if (getpeername(conn, reinterpret_cast<sockaddr*>(&from), &len) == 0) {
          const int port = ntohs(from.ss_family == AF_INET ? reinterpret_cast<sockaddr_in*>(&from)->sin_port
                                                           : reinterpret_cast<sockaddr_in6*>(&from)->sin6_port);
          probe = probe_ports_.erase(port) > 0;
        }
      }
      auto held_by_address = [&] {
        auto it = per_address_.find(address);
        return it == per_address_.end() ? 0 : it->second;
      };
      if (!probe && static_cast<int>(open_.size()) >= max_connections_) RefreshOpenLocked(/*force=*/false);
      if (!probe && max_connections_per_peer_ > 0 && held_by_address() >= max_connections_per_peer_) {
        RefreshOpenLocked(/*force=*/false);
      }
      if (probe) {
        // Closed below: the prober sees the accept.
      } else if (static_cast<int>(open_.size()) >= max_connections_) {
        refuse = true;
        ++refused_total_;
        refusal = absl::StrCat(max_connections_, " connections are open (--max_connections)");
      } else if (max_connections_per_peer_ > 0 && held_by_address() >= max_connections_per_peer_) {
        refuse = true;
        ++refused_total_;
        refusal = absl::StrCat(address, " holds ", max_connections_per_peer_,
                               " connections (--max_connections_per_peer)");
      } else {
        ++per_address_[address];  // taken now: the guard's pair is made outside the lock
        ++accepted_total_;
      }
    }
    if (probe) {
      close(conn);
      continue;
    }
    if (refuse) {
      close(conn);
      LogThrottled(absl::StrCat("closing new connections: ", refusal));
      continue;
    }
    const int one = 1;
    setsockopt(conn, IPPROTO_TCP, TCP_NODELAY, &one, sizeof(one));
    // What gRPC gets: the client's socket, or the guard's end of its relay.
    int handed = conn;
    std::string grpc_peer = peer;
    if (guard_ != nullptr) {
      absl::StatusOr<int> relayed = guard_->Adopt(conn, peer);  // owns `conn` from here
      if (!relayed.ok()) {
        {
          absl::MutexLock lock(&mu_);
          if (auto a = per_address_.find(address); a != per_address_.end() && --a->second <= 0) per_address_.erase(a);
          ++accept_errors_total_;
        }
        LogThrottled(std::string(relayed.status().message()));
        continue;
      }
      handed = *relayed;
      grpc_peer = guard_->GrpcPeerOf(handed);
    }
    {
      absl::MutexLock lock(&mu_);
      struct stat st{};
      fstat(handed, &st);
      if (auto old = open_.find(handed); old != open_.end()) ForgetLocked(old);
      by_peer_[grpc_peer] = handed;
      Connection c;
      c.dev = st.st_dev;
      c.ino = st.st_ino;
      c.peer = grpc_peer;
      c.address = address;
      c.relayed = guard_ != nullptr;
      open_[handed] = std::move(c);
    }
    grpc::experimental::ExternalConnectionAcceptor::NewConnectionParameters params;
    params.listener_fd = fd;
    params.fd = handed;
    acceptor_->HandleNewConnection(&params);  // owns `handed` from here
  }
}

void Listener::RefreshOpenLocked(bool force) {
  const absl::Time now = absl::Now();
  if (!force && now - last_refresh_ < kLimitRefresh) return;
  last_refresh_ = now;
  for (auto it = open_.begin(); it != open_.end();) {
    struct stat st{};
    // Closed by gRPC, or the number now names another file.
    if (fstat(it->first, &st) != 0 || st.st_dev != it->second.dev || st.st_ino != it->second.ino) {
      ForgetLocked(it++);
    } else {
      ++it;
    }
  }
}

void Listener::ForgetLocked(absl::flat_hash_map<int, Connection>::iterator it) {
  if (auto p = by_peer_.find(it->second.peer); p != by_peer_.end() && p->second == it->first) by_peer_.erase(p);
  if (auto a = per_address_.find(it->second.address); a != per_address_.end() && --a->second <= 0) {
    per_address_.erase(a);
  }
  open_.erase(it);
}

std::string Listener::ClientPeer(const std::string& grpc_peer) const {
  return guard_ == nullptr ? grpc_peer : guard_->ClientPeer(grpc_peer);
}

void Listener::CheckProgressLocked() {
  const absl::Time now = absl::Now();
  last_progress_check_ = now;
  RefreshOpenLocked(/*force=*/true);
  if (now >= trim_at_) {
    // What gRPC buffered for a connection closed here is freed once it has
    // torn the connection down; malloc keeps large freed blocks in its heap
    // (its mmap threshold rises after such frees) unless asked to give them
    // back.
    malloc_trim(0);
    trim_at_ = absl::InfiniteFuture();
  }
  for (auto& [fd, c] : open_) {
    if (c.closing || c.relayed) continue;
    const uint64_t received = BytesReceived(fd);
    const uint64_t without_progress = received - std::min(received, c.progress_bytes);
    if (without_progress <= static_cast<uint64_t>(kMaxBytesWithoutProgress)) continue;
    c.closing = true;
    ++closed_without_progress_total_;
    shutdown(fd, SHUT_RDWR);
    trim_at_ = now + absl::Seconds(1);
    LogThrottled(absl::StrCat("closed the connection of ", c.peer, ": it sent ", without_progress,
                              " bytes that started no call and carried no message (a header block that never "
                              "ends?)"));
  }
}

void Listener::ExpectProbe(int source_port) {
  absl::MutexLock lock(&mu_);
  // One probe at a time; a stale port (its probe never got through) goes.
  probe_ports_.clear();
  probe_ports_.insert(source_port);
}

void Listener::NoteProgress(const std::string& grpc_peer) {
  absl::MutexLock lock(&mu_);
  auto p = by_peer_.find(grpc_peer);
  if (p == by_peer_.end()) return;
  auto it = open_.find(p->second);
  if (it == open_.end()) return;
  it->second.progress_bytes = BytesReceived(p->second);
}

ListenerStats Listener::Stats() {
  absl::MutexLock lock(&mu_);
  if (absl::Now() - last_refresh_ >= kStatsRefresh) RefreshOpenLocked(/*force=*/true);
  ListenerStats stats;
  stats.open_connections = static_cast<int64_t>(open_.size());
  stats.accepted_total = accepted_total_;
  stats.refused_total = refused_total_;
  stats.accept_errors_total = accept_errors_total_;
  stats.closed_without_progress_total = closed_without_progress_total_;
  return stats;
}

bool Listener::CloseConnection(const std::string& grpc_peer) {
  absl::MutexLock lock(&mu_);
  RefreshOpenLocked(/*force=*/true);
  auto p = by_peer_.find(grpc_peer);
  if (p == by_peer_.end()) return false;
  shutdown(p->second, SHUT_RDWR);
  return true;
}

void Listener::LogThrottled(const std::string& message) {
  const absl::Time now = absl::Now();
  if (now - last_log_ < kLogInterval) return;
  last_log_ = now;
  std::cerr << "decoded: " << message << " (logged at most every " << absl::FormatDuration(kLogInterval) << ")\n";
}

}  // namespace decoded::server
