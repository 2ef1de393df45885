#include "server/listener_probe.h"

#include <arpa/inet.h>
#include <netinet/in.h>
#include <poll.h>
#include <sys/socket.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <cstring>

#include "absl/cleanup/cleanup.h"
#include "absl/strings/str_cat.h"
#include "absl/time/clock.h"
#include "server/numeric_address.h"

namespace decoded::server {
namespace {

// RFC 9113 section 3.4.
constexpr char kPreface[] = "PRI * HTTP/2.0\r\n\r\nSM\r\n\r\n";

int RemainingMs(absl::Time deadline) {
  return static_cast<int>(std::max<int64_t>(0, absl::ToInt64Milliseconds(deadline - absl::Now())));
}

}  // namespace

absl::Status ProbeListener(const std::string& host, int port, absl::Duration timeout,
                           const std::function<void(int source_port)>& before_connect) {
  const absl::Time deadline = absl::Now() + timeout;
  const std::string where = absl::StrCat(host, ":", port);
  sockaddr_storage addr;
  socklen_t len;
  if (!NumericSocketAddress(host, port, &addr, &len)) {
    return absl::InvalidArgumentError(absl::StrCat("probe address ", host, " is not numeric"));
  }
  const int fd = socket(addr.ss_family, SOCK_STREAM | SOCK_NONBLOCK | SOCK_CLOEXEC, 0);
  if (fd < 0) return absl::UnavailableError(absl::StrCat("probe socket: ", std::strerror(errno)));
  absl::Cleanup closer = [fd] { close(fd); };
  if (before_connect) {
    // An ephemeral port of our own, known before the connection exists.
    sockaddr_storage local{};
    local.ss_family = addr.ss_family;
    const socklen_t local_len = addr.ss_family == AF_INET ? sizeof(sockaddr_in) : sizeof(sockaddr_in6);
    if (bind(fd, reinterpret_cast<sockaddr*>(&local), local_len) != 0) {
      return absl::UnavailableError(absl::StrCat("probe bind: ", std::strerror(errno)));
    }
    socklen_t got = sizeof(local);
    getsockname(fd, reinterpret_cast<sockaddr*>(&local), &got);
    before_connect(ntohs(local.ss_family == AF_INET ? reinterpret_cast<sockaddr_in*>(&local)->sin_port
                                                    : reinterpret_cast<sockaddr_in6*>(&local)->sin6_port));
  }

  if (connect(fd, reinterpret_cast<sockaddr*>(&addr), len) != 0 && errno != EINPROGRESS) {
    return absl::UnavailableError(absl::StrCat("connect to ", where, ": ", std::strerror(errno)));
  }
  pollfd p{fd, POLLOUT, 0};
  if (poll(&p, 1, RemainingMs(deadline)) <= 0) {
    return absl::UnavailableError(absl::StrCat("connect to ", where, " did not complete within ",
                                               absl::FormatDuration(timeout), " (the listen backlog is full)"));
  }
  int err = 0;
  socklen_t err_len = sizeof(err);
  getsockopt(fd, SOL_SOCKET, SO_ERROR, &err, &err_len);
  if (err != 0) return absl::UnavailableError(absl::StrCat("connect to ", where, ": ", std::strerror(err)));

  (void)!send(fd, kPreface, sizeof(kPreface) - 1, MSG_NOSIGNAL);
  p = pollfd{fd, POLLIN, 0};
  if (poll(&p, 1, RemainingMs(deadline)) <= 0) {
    return absl::UnavailableError(absl::StrCat(where, " took the connection into its backlog but did not accept it "
                                               "within ", absl::FormatDuration(timeout)));
  }
  // Data, end of stream or a reset: the server has the connection.
  return absl::OkStatus();
}

}  // namespace decoded::server
