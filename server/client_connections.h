// What the services learn from, and tell, the daemon's listener about the
// connection a call came on (server/listener.h): which client it is (a
// relayed connection reaches gRPC from loopback), and that it is doing real
// work (a call started on it, or a request message was read): a connection
// that receives many bytes without either is closed.
#ifndef DECODED_SERVER_CLIENT_CONNECTIONS_H_
#define DECODED_SERVER_CLIENT_CONNECTIONS_H_

#include <string>

namespace decoded::server {

class ClientConnections {
 public:
  virtual ~ClientConnections() = default;
  // `grpc_peer`: grpc::ServerContextBase::peer() of the call. Thread-safe.
  virtual void NoteProgress(const std::string& grpc_peer) = 0;
  // The client's own peer string ("ipv4:10.0.0.7:51234") for gRPC's; the
  // same string for a connection gRPC took from the client directly.
  virtual std::string ClientPeer(const std::string& grpc_peer) const = 0;
};

}  // namespace decoded::server

#endif  // DECODED_SERVER_CLIENT_CONNECTIONS_H_
