// Where the services report that a connection is doing real work: a call
// started on it, or a request message was read (see Listener: a connection
// that receives many bytes without either is closed).
#ifndef DECODED_SERVER_CONNECTION_PROGRESS_H_
#define DECODED_SERVER_CONNECTION_PROGRESS_H_

#include <string>

namespace decoded::server {

class ConnectionProgress {
 public:
  virtual ~ConnectionProgress() = default;
  // `grpc_peer`: grpc::ServerContextBase::peer() of the call. Thread-safe.
  virtual void NoteProgress(const std::string& grpc_peer) = 0;
};

}  // namespace decoded::server

#endif  // DECODED_SERVER_CONNECTION_PROGRESS_H_
