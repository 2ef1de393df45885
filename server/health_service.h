// grpc.health.v1.Health (https://github.com/grpc/grpc/blob/master/doc/health-checking.md),
// served by the daemon itself rather than gRPC's default service, whose
// Shutdown() only marks every service NOT_SERVING and leaves Watch calls open
// until the server cancels all calls. Load balancers keep a Watch open, so a
// drain would hold it until its cut point; this one ends them.
//
// Services: "" (the whole server) and the names given to the constructor;
// all share one status. Check of another name is NOT_FOUND; Watch of another
// name gets SERVICE_UNKNOWN and stays open, as the protocol says.
// Shutdown: every watcher is sent NOT_SERVING, then its call ends with
// UNAVAILABLE (clients retry with backoff, e.g. against another replica);
// later Watch calls get NOT_SERVING and end the same way; the status stays
// NOT_SERVING.
//
// Thread-safety: every method may be called from any thread.
#ifndef DECODED_SERVER_HEALTH_SERVICE_H_
#define DECODED_SERVER_HEALTH_SERVICE_H_

#include <functional>
#include <string>
#include <vector>

#include "absl/base/thread_annotations.h"
#include "absl/container/flat_hash_set.h"
#include "absl/synchronization/mutex.h"
#include "grpc/health/v1/health.grpc.pb.h"

namespace decoded::server {

class HealthService final : public grpc::health::v1::Health::CallbackService {
 public:
  using ServingStatus = grpc::health::v1::HealthCheckResponse::ServingStatus;

  // Starts NOT_SERVING. `on_call`, if set, is told the peer of every call
  // (the listener's connection progress, server/client_connections.h).
  explicit HealthService(std::vector<std::string> services,
                         std::function<void(const std::string& grpc_peer)> on_call = nullptr);
  // The server must have been shut down (no call left) before.
  ~HealthService() override;

  // Sets the status of every service and tells each watcher. Ignored after
  // Shutdown.
  void SetServing(bool serving);
  // See the file comment. Returns at once; idempotent.
  void Shutdown();

  grpc::ServerUnaryReactor* Check(grpc::CallbackServerContext* context,
                                  const grpc::health::v1::HealthCheckRequest* request,
                                  grpc::health::v1::HealthCheckResponse* response) override;
  grpc::ServerWriteReactor<grpc::health::v1::HealthCheckResponse>* Watch(
      grpc::CallbackServerContext* context, const grpc::health::v1::HealthCheckRequest* request) override;

 private:
  class Watcher;
  friend class Watcher;
  bool Known(const std::string& service) const;
  void Forget(Watcher* watcher);

  const std::vector<std::string> services_;
  const std::function<void(const std::string&)> on_call_;
  absl::Mutex mu_;
  ServingStatus status_ ABSL_GUARDED_BY(mu_);
  bool shut_down_ ABSL_GUARDED_BY(mu_) = false;
  absl::flat_hash_set<Watcher*> watchers_ ABSL_GUARDED_BY(mu_);
};

}  // namespace decoded::server

#endif  // DECODED_SERVER_HEALTH_SERVICE_H_
