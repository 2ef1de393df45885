// Does a listening address still accept? Asked the way a client would: a new
// TCP connection.
//
// A connect() alone proves nothing: the kernel completes the handshake into
// the listen backlog whether or not the server ever accepts. So the probe
// sends HTTP/2's client connection preface and waits for the server to do
// anything with the connection: answer (a plaintext gRPC server sends its
// SETTINGS), or close or reset it (a TLS server rejects the bytes as a TLS
// record; a server at its connection limit closes new connections at once).
// Each of those means the connection was accepted. Silence until the timeout,
// a refused connect or a connect that does not complete means it was not.
//
// Thread-safety: a free function, safe from any thread.
#ifndef DECODED_SERVER_LISTENER_PROBE_H_
#define DECODED_SERVER_LISTENER_PROBE_H_

#include <functional>
#include <string>

#include "absl/status/status.h"
#include "absl/time/time.h"

namespace decoded::server {

// OK when `host`:`port` (a numeric IPv4 or IPv6 address) accepted a new
// connection within `timeout`; UNAVAILABLE saying what happened otherwise.
// `before_connect`, if set, is told the probe's own (ephemeral) port before it
// connects: a listener that knows it can close the probe at accept, so the
// probe measures accepting alone, not how busy the server behind it is.
absl::Status ProbeListener(const std::string& host, int port, absl::Duration timeout,
                           const std::function<void(int source_port)>& before_connect = nullptr);

}  // namespace decoded::server

#endif  // DECODED_SERVER_LISTENER_PROBE_H_
