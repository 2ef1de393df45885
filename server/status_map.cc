#include "server/status_map.h"

#include <string>

namespace decoded::server {

grpc::Status ToGrpcStatus(const absl::Status& status) {
  if (status.ok()) return grpc::Status::OK;
  // Both enums number the 16 canonical codes identically (google.rpc.Code).
  static_assert(static_cast<int>(absl::StatusCode::kUnauthenticated) ==
                static_cast<int>(grpc::StatusCode::UNAUTHENTICATED));
  return grpc::Status(static_cast<grpc::StatusCode>(static_cast<int>(status.code())), std::string(status.message()));
}

}  // namespace decoded::server
