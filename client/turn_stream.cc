#include "client/turn_stream.h"

#include <string>

namespace decoded::client {

absl::Status FromGrpc(const grpc::Status& status) {
  if (status.ok()) return absl::OkStatus();
  return absl::Status(static_cast<absl::StatusCode>(static_cast<int>(status.error_code())), status.error_message());
}

TurnStream::TurnStream(v1::Decoder::Stub* stub, const std::string& auth_token) : stub_(stub) {
  if (!auth_token.empty()) context_.AddMetadata("authorization", "Bearer " + auth_token);
}

TurnStream::~TurnStream() {
  if (stream_ != nullptr && !closed_) {
    context_.TryCancel();
    (void)stream_->Finish();
  }
}

absl::StatusOr<v1::TurnEnd> TurnStream::Run(const v1::Turn& turn,
                                            const std::function<void(const v1::TokenEvent&)>& on_token) {
  v1::GenerateRequest request;
  *request.mutable_turn() = turn;
  // Every event is acknowledged once handled, so the server generates only a
  // few events ahead of what this client has printed (a paused terminal
  // pauses generation).
  request.mutable_turn()->set_acknowledge_events(true);
  if (stream_ == nullptr) stream_ = stub_->Generate(&context_);
  bool sent = stream_->Write(request);
  v1::GenerateRequest ack;
  ack.mutable_ack()->set_events(1);
  v1::GenerateResponse response;
  while (sent && stream_->Read(&response)) {
    if (response.has_token()) {
      on_token(response.token());
      // A failed write means the stream is ending: the next Read says how.
      stream_->Write(ack);
    } else if (response.has_turn_end()) {
      return response.turn_end();
    }
  }
  closed_ = true;
  absl::Status status = FromGrpc(stream_->Finish());
  if (status.ok()) status = absl::UnavailableError("the server ended the stream before the turn's end");
  return status;
}

absl::Status TurnStream::Close() {
  if (closed_ || stream_ == nullptr) return absl::OkStatus();
  closed_ = true;
  stream_->WritesDone();
  return FromGrpc(stream_->Finish());
}

}  // namespace decoded::client
