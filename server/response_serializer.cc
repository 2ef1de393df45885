#include "server/response_serializer.h"

#include <climits>

#include "absl/strings/str_cat.h"
#include "grpcpp/impl/codegen/proto_utils.h"

namespace decoded::server {

absl::Status SerializeResponse(const google::protobuf::Message& message, grpc::ByteBuffer* wire) {
  // gRPC's serializer counts bytes in an int.
  if (message.ByteSizeLong() > static_cast<size_t>(INT_MAX)) {
    return absl::InternalError(absl::StrCat("cannot serialize ", message.GetDescriptor()->full_name(),
                                            ": larger than 2 GiB"));
  }
  bool own_buffer;  // required by the interface; we hand `wire` to gRPC either way
  const grpc::Status status =
      grpc::SerializationTraits<google::protobuf::Message>::Serialize(message, wire, &own_buffer);
  if (status.ok()) return absl::OkStatus();
  return absl::InternalError(
      absl::StrCat("cannot serialize ", message.GetDescriptor()->full_name(), ": ", status.error_message()));
}

}  // namespace decoded::server
