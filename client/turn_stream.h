// A client-side Generate stream: sends turns, delivers each turn's events to
// callbacks as they arrive, and returns the turn's end.
#ifndef DECODED_CLIENT_TURN_STREAM_H_
#define DECODED_CLIENT_TURN_STREAM_H_

#include <functional>
#include <memory>

#include "absl/status/statusor.h"
#include "grpcpp/grpcpp.h"
#include "proto/decoded.grpc.pb.h"

namespace decoded::client {

// Copies grpc status into absl (the codes are numbered alike).
absl::Status FromGrpc(const grpc::Status& status);

class TurnStream {
 public:
  // The stream opens with the first Run (a daemon ends streams that send no
  // turn for a while); `auth_token` non-empty adds a bearer token.
  TurnStream(v1::Decoder::Stub* stub, const std::string& auth_token);
  ~TurnStream();
  // Whether a turn was ever sent on this stream.
  bool opened() const { return stream_ != nullptr; }

  // Sends `turn` and reads until its TurnEnd, calling `on_token` per token.
  // A broken stream returns the status the server ended it with.
  absl::StatusOr<v1::TurnEnd> Run(const v1::Turn& turn,
                                  const std::function<void(const v1::TokenEvent&)>& on_token);

  // Half-closes and returns the stream's final status.
  absl::Status Close();

 private:
  v1::Decoder::Stub* const stub_;
  grpc::ClientContext context_;
  std::unique_ptr<grpc::ClientReaderWriter<v1::GenerateRequest, v1::GenerateResponse>> stream_;
  bool closed_ = false;
};

}  // namespace decoded::client

#endif  // DECODED_CLIENT_TURN_STREAM_H_
