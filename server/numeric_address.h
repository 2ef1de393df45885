// A numeric IPv4 or IPv6 host and a port as a socket address, for the
// connections the daemon makes to itself (the listener probe, the /metrics
// wake-up).
#ifndef DECODED_SERVER_NUMERIC_ADDRESS_H_
#define DECODED_SERVER_NUMERIC_ADDRESS_H_

#include <arpa/inet.h>
#include <netinet/in.h>
#include <sys/socket.h>

#include <cstdint>
#include <string>

namespace decoded::server {

// Fills `addr` and `len`; false when `host` is neither a numeric IPv4 nor a
// numeric IPv6 address (no name lookup).
inline bool NumericSocketAddress(const std::string& host, int port, sockaddr_storage* addr, socklen_t* len) {
  *addr = {};
  auto* v4 = reinterpret_cast<sockaddr_in*>(addr);
  auto* v6 = reinterpret_cast<sockaddr_in6*>(addr);
  if (inet_pton(AF_INET, host.c_str(), &v4->sin_addr) == 1) {
    v4->sin_family = AF_INET;
    v4->sin_port = htons(static_cast<uint16_t>(port));
    *len = sizeof(*v4);
    return true;
  }
  if (inet_pton(AF_INET6, host.c_str(), &v6->sin6_addr) == 1) {
    v6->sin6_family = AF_INET6;
    v6->sin6_port = htons(static_cast<uint16_t>(port));
    *len = sizeof(*v6);
    return true;
  }
  return false;
}

}  // namespace decoded::server

#endif  // DECODED_SERVER_NUMERIC_ADDRESS_H_
