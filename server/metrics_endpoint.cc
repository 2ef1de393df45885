#include "server/metrics_endpoint.h"

#include <arpa/inet.h>
#include <netinet/in.h>
#include <sys/socket.h>
#include <unistd.h>

#include <atomic>
#include <exception>
#include <thread>

#include "absl/strings/str_cat.h"
#include "absl/time/clock.h"
#include "absl/time/time.h"

namespace decoded::server {
namespace {

// The host part of "host:port" / "[v6]:port"; a wildcard address is reached
// through loopback.
std::string WakeHost(const std::string& address) {
  std::string host = address.substr(0, address.rfind(':'));
  if (host.size() >= 2 && host.front() == '[') host = host.substr(1, host.size() - 2);
  if (host.empty() || host == "0.0.0.0" || host == "localhost") return "127.0.0.1";
  if (host == "::") return "::1";
  return host;
}

// Opens and closes one TCP connection to host:port; errors are ignored (the
// stop then just takes civetweb's poll quantum).
void Poke(const std::string& host, int port) {
  sockaddr_storage addr{};
  socklen_t len = 0;
  auto* v4 = reinterpret_cast<sockaddr_in*>(&addr);
  auto* v6 = reinterpret_cast<sockaddr_in6*>(&addr);
  if (inet_pton(AF_INET, host.c_str(), &v4->sin_addr) == 1) {
    v4->sin_family = AF_INET;
    v4->sin_port = htons(static_cast<uint16_t>(port));
    len = sizeof(*v4);
  } else if (inet_pton(AF_INET6, host.c_str(), &v6->sin6_addr) == 1) {
    v6->sin6_family = AF_INET6;
    v6->sin6_port = htons(static_cast<uint16_t>(port));
    len = sizeof(*v6);
  } else {
    return;
  }
  const int fd = socket(addr.ss_family, SOCK_STREAM | SOCK_CLOEXEC, 0);
  if (fd < 0) return;
  (void)connect(fd, reinterpret_cast<sockaddr*>(&addr), len);
  close(fd);
}

}  // namespace

absl::StatusOr<std::unique_ptr<MetricsEndpoint>> MetricsEndpoint::Start(
    const std::string& address, const std::vector<std::shared_ptr<prometheus::Collectable>>& collectables) {
  std::unique_ptr<prometheus::Exposer> exposer;
  try {
    exposer = std::make_unique<prometheus::Exposer>(address);
  } catch (const std::exception& e) {
    return absl::InvalidArgumentError(absl::StrCat("cannot serve metrics on ", address, ": ", e.what()));
  }
  for (const auto& c : collectables) exposer->RegisterCollectable(c);
  return std::unique_ptr<MetricsEndpoint>(new MetricsEndpoint(std::move(exposer), WakeHost(address)));
}

int MetricsEndpoint::port() const {
  std::vector<int> ports = exposer_->GetListeningPorts();
  return ports.empty() ? 0 : ports.front();
}

MetricsEndpoint::~MetricsEndpoint() {
  // The Exposer's destructor sets civetweb's stop flag and then waits for the
  // accept loop; pokes until it returns make that loop wake and see the flag.
  const int port = this->port();
  std::atomic<bool> stopped{false};
  std::thread waker([&stopped, host = host_, port] {
    while (port > 0 && !stopped.load()) {
      absl::SleepFor(absl::Milliseconds(10));
      if (!stopped.load()) Poke(host, port);
    }
  });
  exposer_.reset();
  stopped = true;
  waker.join();
}

}  // namespace decoded::server
