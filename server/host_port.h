// "host:port" and "[v6 address]:port" listen addresses, split for
// getaddrinfo (the gRPC listener, the HTTP listener).
#ifndef DECODED_SERVER_HOST_PORT_H_
#define DECODED_SERVER_HOST_PORT_H_

#include <string>

#include "absl/status/statusor.h"

namespace decoded::server {

struct HostPort {
  std::string host;  // "" = every address
  std::string port;  // decimal, 0..65535
};

// INVALID_ARGUMENT naming `address` when it has no port, a bad port, or an
// unclosed '['.
absl::StatusOr<HostPort> SplitAddress(const std::string& address);

}  // namespace decoded::server

#endif  // DECODED_SERVER_HOST_PORT_H_
