// Generated response messages -> raw response bytes, for raw (ByteBuffer)
// gRPC methods: the counterpart of ParseRequest (server/request_parser.h).
//
// Thread-safety: safe from any thread for distinct `wire` buffers.
#ifndef DECODED_SERVER_RESPONSE_SERIALIZER_H_
#define DECODED_SERVER_RESPONSE_SERIALIZER_H_

#include "absl/status/status.h"
#include "google/protobuf/message.h"
#include "grpcpp/support/byte_buffer.h"

namespace decoded::server {

// Replaces the contents of `wire` (not owned) with `message`'s wire format,
// the way gRPC serializes typed responses. INTERNAL when protobuf cannot
// serialize it (larger than 2 GiB).
absl::Status SerializeResponse(const google::protobuf::Message& message, grpc::ByteBuffer* wire);

}  // namespace decoded::server

#endif  // DECODED_SERVER_RESPONSE_SERIALIZER_H_
