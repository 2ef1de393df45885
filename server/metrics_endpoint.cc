#include "server/metrics_endpoint.h"

#include <arpa/inet.h>
#include <netinet/in.h>
#include <sys/socket.h>
#include <unistd.h>

#include <atomic>
#include <exception>
#include <sstream>
#include <thread>

#include "absl/container/flat_hash_map.h"
#include "absl/strings/str_cat.h"
#include "absl/synchronization/mutex.h"
#include "absl/time/clock.h"
#include "absl/time/time.h"
#include "CivetServer.h"
#include "civetweb.h"
#include "server/bearer_token.h"
#include "prometheus/metric_family.h"
#include "prometheus/text_serializer.h"
#include "server/numeric_address.h"

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
  sockaddr_storage addr;
  socklen_t len;
  if (!NumericSocketAddress(host, port, &addr, &len)) return;
  const int fd = socket(addr.ss_family, SOCK_STREAM | SOCK_CLOEXEC, 0);
  if (fd < 0) return;
  (void)connect(fd, reinterpret_cast<sockaddr*>(&addr), len);
  close(fd);
}

absl::Mutex& TokensMutex() {
  static absl::Mutex* mu = new absl::Mutex();
  return *mu;
}

// Listening port -> bearer token, for the endpoints started with one.
absl::flat_hash_map<int, std::string>& TokensByPort() ABSL_EXCLUSIVE_LOCKS_REQUIRED(TokensMutex()) {
  static auto* tokens = new absl::flat_hash_map<int, std::string>();
  return *tokens;
}

}  // namespace

// GET /metrics: every live collectable's families, in the text format.
class MetricsEndpoint::Handler final : public CivetHandler {
 public:
  explicit Handler(const std::vector<std::shared_ptr<prometheus::Collectable>>& collectables)
      : collectables_(collectables.begin(), collectables.end()) {}

  bool handleGet(CivetServer*, mg_connection* conn) override {
    std::vector<prometheus::MetricFamily> families;
    for (const std::weak_ptr<prometheus::Collectable>& weak : collectables_) {
      std::shared_ptr<prometheus::Collectable> collectable = weak.lock();
      if (collectable == nullptr) continue;
      for (prometheus::MetricFamily& f : collectable->Collect()) families.push_back(std::move(f));
    }
    std::ostringstream body;
    prometheus::TextSerializer().Serialize(body, families);
    const std::string text = body.str();
    mg_printf(conn,
              "HTTP/1.1 200 OK\r\nContent-Type: text/plain; version=0.0.4; charset=utf-8\r\n"
              "Content-Length: %zu\r\n\r\n",
              text.size());
    mg_write(conn, text.data(), text.size());
    return true;
  }

 private:
  const std::vector<std::weak_ptr<prometheus::Collectable>> collectables_;  // set once, read by every thread
};

absl::StatusOr<std::unique_ptr<MetricsEndpoint>> MetricsEndpoint::Start(
    const std::string& address, const std::vector<std::shared_ptr<prometheus::Collectable>>& collectables,
    const std::string& auth_token) {
  std::unique_ptr<MetricsEndpoint> endpoint(new MetricsEndpoint());
  endpoint->auth_token_ = auth_token;
  endpoint->host_ = WakeHost(address);
  const CivetCallbacks* callbacks = nullptr;
  if (!auth_token.empty()) {
    endpoint->callbacks_ = std::make_unique<CivetCallbacks>();
    endpoint->callbacks_->begin_request = &MetricsEndpoint::CheckToken;
    callbacks = endpoint->callbacks_.get();
  }
  // The request timeout bounds the whole request read (civetweb measures it
  // from the request's start), not each read, so a client trickling bytes is
  // dropped after it too.
  std::vector<std::string> options = {
      "listening_ports", address,
      "num_threads", std::to_string(kMetricsThreads),
      "request_timeout_ms", std::to_string(absl::ToInt64Milliseconds(kMetricsRequestTimeout)),
  };
  endpoint->handler_ = std::make_unique<Handler>(collectables);
  try {
    endpoint->server_ = std::make_unique<CivetServer>(std::move(options), callbacks);
  } catch (const std::exception& e) {
    return absl::InvalidArgumentError(absl::StrCat("cannot serve metrics on ", address, ": ", e.what()));
  }
  if (callbacks != nullptr) {
    // begin_request sees only the connection: the token is found by the
    // listening port it came in on.
    absl::MutexLock lock(&TokensMutex());
    TokensByPort()[endpoint->port()] = auth_token;
  }
  endpoint->server_->addHandler("/metrics", endpoint->handler_.get());
  return endpoint;
}

int MetricsEndpoint::CheckToken(mg_connection* conn) {
  const mg_request_info* info = mg_get_request_info(conn);
  const char* header = mg_get_header(conn, "Authorization");
  bool ok = false;
  if (info != nullptr && header != nullptr) {
    absl::MutexLock lock(&TokensMutex());
    auto it = TokensByPort().find(info->server_port);
    // No entry yet (a request in the instant before Start registered it): refused.
    ok = it != TokensByPort().end() && BearerTokenMatches(header, it->second);
  }
  if (ok) return 0;
  mg_printf(conn,
            "HTTP/1.1 401 Unauthorized\r\nWWW-Authenticate: Bearer realm=\"decoded metrics\"\r\n"
            "Content-Type: text/plain\r\nContent-Length: 37\r\nConnection: close\r\n\r\n"
            "missing or wrong bearer token (401)\r\n");
  return 401;  // handled: civetweb sends nothing more
}

int MetricsEndpoint::port() const {
  if (server_ == nullptr) return 0;  // Start failed
  std::vector<int> ports = server_->getListeningPorts();
  return ports.empty() ? 0 : ports.front();
}

MetricsEndpoint::~MetricsEndpoint() {
  if (server_ == nullptr) return;  // Start failed: nothing listens
  if (!auth_token_.empty()) {
    absl::MutexLock lock(&TokensMutex());
    TokensByPort().erase(port());
  }
  // CivetServer's close() sets civetweb's stop flag and then waits for the
  // accept loop; pokes until it returns make that loop wake and see the flag.
  const int port = this->port();
  std::atomic<bool> stopped{false};
  std::thread waker([&stopped, host = host_, port] {
    while (port > 0 && !stopped.load()) {
      absl::SleepFor(absl::Milliseconds(10));
      if (!stopped.load()) Poke(host, port);
    }
  });
  server_->close();
  stopped = true;
  waker.join();
}

}  // namespace decoded::server
