// Raw request bytes -> generated request messages, with errors a client can
// act on.
//
// gRPC's own deserializer turns any parse failure into a failed read (the
// stream ends with OK, a unary call with UNIMPLEMENTED and no message), so a
// proto3 `string` that is not valid UTF-8 never reaches our code. Raw
// (ByteBuffer) methods parse with ParseRequest instead and answer the status
// it returns. Clients keep their generated `string` types.
//
// Thread-safety: safe from any thread for distinct `out` messages.
#ifndef DECODED_SERVER_REQUEST_PARSER_H_
#define DECODED_SERVER_REQUEST_PARSER_H_

#include "absl/status/status.h"
#include "google/protobuf/message.h"
#include "grpcpp/support/byte_buffer.h"

namespace decoded::server {

// Parses `wire` into `out` (cleared first; not owned). A ByteBuffer with no
// payload (not Valid()) is the empty message.
//
// The fast path is protobuf's normal parse. Only when it fails, a second pass
// walks the wire format against out's Descriptor (tags, wire types, lengths,
// sub-messages) without enforcing UTF-8, to say what is wrong:
//   INVALID_ARGUMENT "<path> is not valid UTF-8: byte B (0xXX) of N <defect>
//       (RFC 3629)": the first proto3 `string` field whose bytes are not
//       well-formed UTF-8 (engine/utf8_validation.h). <path> uses proto
//       field names, and indices for repeated fields:
//       "turn.messages.messages[1].content", "turn.stopping.stop_sequences[0]".
//       B counts from 0 within the field.
//   INVALID_ARGUMENT "malformed <message full name>: <what>" for any other
//       defect (truncated varint, length past the end, bad wire type for
//       field N, ...), "the message does not parse" when the pass cannot tell.
// On error `out` holds unspecified partial content.
absl::Status ParseRequest(const grpc::ByteBuffer& wire, google::protobuf::Message* out);

}  // namespace decoded::server

#endif  // DECODED_SERVER_REQUEST_PARSER_H_
