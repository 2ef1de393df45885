#include "client/metrics_scrape.h"

#include <netdb.h>
#include <sys/socket.h>
#include <sys/time.h>
#include <unistd.h>

#include <cstdlib>

#include "absl/strings/match.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_split.h"

namespace decoded::client {

absl::StatusOr<std::string> ScrapeMetrics(const std::string& address) {
  const size_t colon = address.rfind(':');
  if (colon == std::string::npos || colon + 1 == address.size()) {
    return absl::InvalidArgumentError(absl::StrCat("metrics address \"", address, "\" is not host:port"));
  }
  const std::string host = address.substr(0, colon), port = address.substr(colon + 1);
  addrinfo hints{};
  hints.ai_family = AF_UNSPEC;
  hints.ai_socktype = SOCK_STREAM;
  addrinfo* found = nullptr;
  if (int rc = getaddrinfo(host.c_str(), port.c_str(), &hints, &found); rc != 0) {
    return absl::UnavailableError(absl::StrCat("cannot resolve ", address, ": ", gai_strerror(rc)));
  }
  int fd = -1;
  for (addrinfo* a = found; a != nullptr && fd < 0; a = a->ai_next) {
    fd = socket(a->ai_family, a->ai_socktype, a->ai_protocol);
    if (fd < 0) continue;
    // A stuck endpoint must not hang the caller: 10 s per read or write.
    timeval timeout{10, 0};
    setsockopt(fd, SOL_SOCKET, SO_RCVTIMEO, &timeout, sizeof(timeout));
    setsockopt(fd, SOL_SOCKET, SO_SNDTIMEO, &timeout, sizeof(timeout));
    if (connect(fd, a->ai_addr, a->ai_addrlen) != 0) {
      close(fd);
      fd = -1;
    }
  }
  freeaddrinfo(found);
  if (fd < 0) return absl::UnavailableError(absl::StrCat("cannot connect to ", address));
  const std::string request = absl::StrCat("GET /metrics HTTP/1.0\r\nHost: ", host, "\r\n\r\n");
  if (write(fd, request.data(), request.size()) != static_cast<ssize_t>(request.size())) {
    close(fd);
    return absl::UnavailableError(absl::StrCat("cannot send the request to ", address));
  }
  std::string reply;
  char buf[8192];
  for (ssize_t n; (n = read(fd, buf, sizeof(buf))) > 0;) reply.append(buf, static_cast<size_t>(n));
  close(fd);
  const size_t body = reply.find("\r\n\r\n");
  if (!absl::StartsWith(reply, "HTTP/1.") || reply.size() < 12 || reply.compare(9, 3, "200") != 0 ||
      body == std::string::npos) {
    return absl::UnavailableError(
        absl::StrCat("GET /metrics on ", address, " answered \"", reply.substr(0, reply.find('\r')), "\""));
  }
  return reply.substr(body + 4);
}

std::optional<double> MetricSample(absl::string_view body, absl::string_view series) {
  for (absl::string_view line : absl::StrSplit(body, '\n')) {
    if (line.size() > series.size() && absl::StartsWith(line, series) && line[series.size()] == ' ') {
      const std::string value(line.substr(series.size() + 1));
      char* end = nullptr;
      const double v = std::strtod(value.c_str(), &end);
      if (end != value.c_str()) return v;
    }
  }
  return std::nullopt;
}

}  // namespace decoded::client
