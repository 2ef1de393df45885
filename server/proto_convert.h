// Conversions between decoded.v1 messages and the engine's serving types.
#ifndef DECODED_SERVER_PROTO_CONVERT_H_
#define DECODED_SERVER_PROTO_CONVERT_H_

#include "absl/status/statusor.h"
#include "engine/serving/engine.h"
#include "proto/decoded.pb.h"

namespace decoded::server {

// INVALID_ARGUMENT when no input is set. Defaults of unset fields are those
// documented in decoded.proto. Range checks are the engine's.
absl::StatusOr<serving::TurnRequest> TurnFromProto(const v1::Turn& turn);

// `engine` spells the top-logprob alternatives' text.
void TokenEventToProto(const serving::TokenEvent& event, const serving::Engine& engine, v1::TokenEvent* out);
void TurnEndToProto(const serving::TurnEnd& end, v1::TurnEnd* out);

}  // namespace decoded::server

#endif  // DECODED_SERVER_PROTO_CONVERT_H_
