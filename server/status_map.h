// absl::Status -> grpc::Status. The canonical codes are the same numbering on
// both sides (both follow google.rpc.Code), so the mapping is 1:1 by value.
#ifndef DECODED_SERVER_STATUS_MAP_H_
#define DECODED_SERVER_STATUS_MAP_H_

#include "absl/status/status.h"
#include "grpcpp/support/status.h"

namespace decoded::server {

grpc::Status ToGrpcStatus(const absl::Status& status);

}  // namespace decoded::server

#endif  // DECODED_SERVER_STATUS_MAP_H_
