#include "server/health_service.h"

#include <algorithm>
#include <optional>
#include <utility>

namespace decoded::server {

using grpc::health::v1::HealthCheckRequest;
using grpc::health::v1::HealthCheckResponse;

// One Watch call. Sends the latest status whenever it differs from the last
// one sent (intermediate flips may be skipped, as the protocol allows), one
// write at a time; after the last update (shutdown) it ends the call once the
// final status is out.
class HealthService::Watcher final : public grpc::ServerWriteReactor<HealthCheckResponse> {
 public:
  Watcher(HealthService* service, bool known) : service_(service), known_(known) {}

  // Called with service_->mu_ held, so the watcher is alive (registered).
  void Update(ServingStatus status, bool last) {
    absl::MutexLock lock(&mu_);
    want_ = known_ ? status : HealthCheckResponse::SERVICE_UNKNOWN;
    last_ = last_ || last;
    PumpLocked();
  }

  void OnWriteDone(bool ok) override {
    absl::MutexLock lock(&mu_);
    writing_ = false;
    if (ok) {
      sent_ = response_.status();
    } else {
      broken_ = true;  // the client is gone; OnCancel follows
    }
    PumpLocked();
  }

  void OnCancel() override {
    absl::MutexLock lock(&mu_);
    broken_ = true;
    PumpLocked();
  }

  void OnDone() override {
    service_->Forget(this);
    delete this;
  }

 private:
  void PumpLocked() ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_) {
    if (writing_ || finished_) return;
    if (broken_) {
      finished_ = true;
      Finish(grpc::Status::CANCELLED);
      return;
    }
    if (!sent_ || *sent_ != want_) {
      response_.set_status(want_);
      writing_ = true;
      StartWrite(&response_);
      return;
    }
    if (last_) {
      finished_ = true;
      Finish(grpc::Status(grpc::StatusCode::UNAVAILABLE, "the server is shutting down"));
    }
  }

  HealthService* const service_;
  const bool known_;
  absl::Mutex mu_;
  HealthCheckResponse response_ ABSL_GUARDED_BY(mu_);  // the write in flight
  ServingStatus want_ ABSL_GUARDED_BY(mu_) = HealthCheckResponse::UNKNOWN;
  std::optional<ServingStatus> sent_ ABSL_GUARDED_BY(mu_);
  bool last_ ABSL_GUARDED_BY(mu_) = false;
  bool writing_ ABSL_GUARDED_BY(mu_) = false;
  bool broken_ ABSL_GUARDED_BY(mu_) = false;
  bool finished_ ABSL_GUARDED_BY(mu_) = false;
};

HealthService::HealthService(std::vector<std::string> services, std::function<void(const std::string&)> on_call)
    : services_(std::move(services)), on_call_(std::move(on_call)), status_(HealthCheckResponse::NOT_SERVING) {}

HealthService::~HealthService() = default;

bool HealthService::Known(const std::string& service) const {
  return service.empty() || std::find(services_.begin(), services_.end(), service) != services_.end();
}

void HealthService::SetServing(bool serving) {
  absl::MutexLock lock(&mu_);
  if (shut_down_) return;
  status_ = serving ? HealthCheckResponse::SERVING : HealthCheckResponse::NOT_SERVING;
  for (Watcher* w : watchers_) w->Update(status_, /*last=*/false);
}

void HealthService::Shutdown() {
  absl::MutexLock lock(&mu_);
  if (shut_down_) return;
  shut_down_ = true;
  status_ = HealthCheckResponse::NOT_SERVING;
  for (Watcher* w : watchers_) w->Update(status_, /*last=*/true);
}

void HealthService::Forget(Watcher* watcher) {
  absl::MutexLock lock(&mu_);
  watchers_.erase(watcher);
}

grpc::ServerUnaryReactor* HealthService::Check(grpc::CallbackServerContext* context,
                                               const HealthCheckRequest* request, HealthCheckResponse* response) {
  if (on_call_) on_call_(context->peer());
  grpc::ServerUnaryReactor* reactor = context->DefaultReactor();
  if (!Known(request->service())) {
    reactor->Finish(grpc::Status(grpc::StatusCode::NOT_FOUND, "unknown service"));
    return reactor;
  }
  {
    absl::MutexLock lock(&mu_);
    response->set_status(status_);
  }
  reactor->Finish(grpc::Status::OK);
  return reactor;
}

grpc::ServerWriteReactor<HealthCheckResponse>* HealthService::Watch(grpc::CallbackServerContext* context,
                                                                    const HealthCheckRequest* request) {
  if (on_call_) on_call_(context->peer());
  auto* watcher = new Watcher(this, Known(request->service()));
  absl::MutexLock lock(&mu_);
  watchers_.insert(watcher);
  watcher->Update(status_, /*last=*/shut_down_);
  return watcher;
}

}  // namespace decoded::server
