// gRPC server reflection (https://github.com/grpc/grpc/blob/master/doc/server-reflection.md),
// served as both grpc.reflection.v1 and grpc.reflection.v1alpha.
//
// gRPC 1.51's reflection plugin serves v1alpha only (v1 answers
// UNIMPLEMENTED, and current grpcurl and grpcio tools ask for v1 first), and
// it cannot ask for the bearer token. Both versions carry the same messages
// under two package names, so one template serves them. Descriptors come
// from the process's generated pool (every .proto linked into the daemon).
//
// With a token (`auth_token`), a stream without it ends UNAUTHENTICATED: the
// descriptors describe the API, so they are the API's to guard. Health stays
// open for probes (server/health_service.h).
//
// Thread-safety: gRPC calls the services on its threads concurrently.
#ifndef DECODED_SERVER_REFLECTION_SERVICE_H_
#define DECODED_SERVER_REFLECTION_SERVICE_H_

#include <functional>
#include <memory>
#include <string>
#include <vector>

#include "grpc/reflection/v1/reflection.grpc.pb.h"
#include "grpc/reflection/v1alpha/reflection.grpc.pb.h"
#include "grpcpp/grpcpp.h"
#include "server/client_connections.h"

namespace decoded::server {

// Whether a call may use reflection (the server's bearer-token check).
using ReflectionAuthorizer = std::function<bool(const grpc::CallbackServerContext&)>;

class ReflectionV1Service final : public grpc::reflection::v1::ServerReflection::CallbackService {
 public:
  // `services`: the full names list_services answers with. `progress` (may
  // be null) is told of every call and request.
  ReflectionV1Service(std::vector<std::string> services, ReflectionAuthorizer authorized,
                      ClientConnections* progress)
      : services_(std::move(services)), authorized_(std::move(authorized)), progress_(progress) {}
  grpc::ServerBidiReactor<grpc::reflection::v1::ServerReflectionRequest, grpc::reflection::v1::ServerReflectionResponse>*
  ServerReflectionInfo(grpc::CallbackServerContext* context) override;

 private:
  const std::vector<std::string> services_;
  const ReflectionAuthorizer authorized_;
  ClientConnections* const progress_;
};

class ReflectionV1AlphaService final : public grpc::reflection::v1alpha::ServerReflection::CallbackService {
 public:
  ReflectionV1AlphaService(std::vector<std::string> services, ReflectionAuthorizer authorized,
                           ClientConnections* progress)
      : services_(std::move(services)), authorized_(std::move(authorized)), progress_(progress) {}
  grpc::ServerBidiReactor<grpc::reflection::v1alpha::ServerReflectionRequest,
                          grpc::reflection::v1alpha::ServerReflectionResponse>*
  ServerReflectionInfo(grpc::CallbackServerContext* context) override;

 private:
  const std::vector<std::string> services_;
  const ReflectionAuthorizer authorized_;
  ClientConnections* const progress_;
};

}  // namespace decoded::server

#endif  // DECODED_SERVER_REFLECTION_SERVICE_H_
