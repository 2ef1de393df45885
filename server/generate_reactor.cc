#include "server/generate_reactor.h"

#include <utility>

#include "absl/strings/str_cat.h"

#include "server/proto_convert.h"
#include "server/request_parser.h"
#include "server/response_serializer.h"
#include "server/status_map.h"

namespace decoded::server {
namespace {

const char kShuttingDown[] = "the server is shutting down; continue the conversation on another replica";

}  // namespace

GenerateReactor::GenerateReactor(serving::Engine* engine, ServerMetrics* metrics, StreamRegistry* registry,
                                 absl::Status refuse)
    : engine_(engine), metrics_(metrics), registry_(registry) {
  if (engine_ == nullptr || !refuse.ok()) {
    Refuse(refuse.ok() ? absl::UnavailableError("the model is not loaded") : refuse);
    return;
  }
  absl::StatusOr<serving::SessionId> session = engine_->OpenSession();
  if (!session.ok()) {
    Refuse(session.status());
    return;
  }
  session_ = *session;
  active_.emplace(metrics_);
  if (!registry_->Add(this)) {
    // A drain began between the service's readiness check and here.
    Refuse(absl::UnavailableError(kShuttingDown));
    return;
  }
  StartRead(&read_);
}

GenerateReactor::~GenerateReactor() {
  active_.reset();  // the session's outcome is counted before the stream stops counting as open
  if (session_) registry_->Remove(this);
}

void GenerateReactor::OnReadDone(bool ok) {
  if (!ok) {
    // The client half-closed (or the call is being cancelled: OnCancel handles that).
    std::optional<grpc::Status> finish;
    {
      absl::MutexLock lock(&mu_);
      reads_done_ = true;
      FinishIfIdleLocked();
      finish = TakeFinishLocked();
    }
    FinishOutsideLock(finish);
    return;
  }
  HandleRequest();
}

void GenerateReactor::HandleRequest() {
  absl::Status status = ParseRequest(read_, &request_);
  if (!status.ok()) {
    // Not a GenerateRequest (e.g. text that is not UTF-8).
  } else if (request_.has_cancel()) {
    status = engine_->CancelTurn(*session_);
  } else if (request_.has_ack()) {
    status = Acknowledge(request_.ack().events());
  } else if (request_.has_turn()) {
    std::optional<grpc::Status> finish;
    bool draining;
    {
      absl::MutexLock lock(&mu_);
      draining = draining_;
      if (draining) {
        // The turn is refused by the stream ending UNAVAILABLE, but only once
        // the turn before it (if any) has sent its TurnEnd: no more reads.
        FinishIfIdleLocked();
        finish = TakeFinishLocked();
      }
    }
    if (draining) {
      FinishOutsideLock(finish);
      return;
    }
    absl::StatusOr<serving::TurnRequest> turn = TurnFromProto(request_.turn());
    status = turn.ok() ? SubmitTurn(*turn) : turn.status();
  } else {
    status = absl::InvalidArgumentError("a GenerateRequest must carry a turn or a cancel");
  }
  if (status.ok()) {
    StartRead(&read_);
    return;
  }
  Refuse(status);
}

absl::Status GenerateReactor::SubmitTurn(const serving::TurnRequest& turn) {
  {
    absl::MutexLock lock(&mu_);
    ++turns_in_flight_;  // before Submit: the turn may end before it returns
    have_last_token_ = false;
    if (!acknowledged_events_) acknowledged_events_ = request_.turn().acknowledge_events();
  }
  absl::Status status = engine_->SubmitTurn(*session_, turn, this);
  if (!status.ok()) {
    absl::MutexLock lock(&mu_);
    --turns_in_flight_;
  }
  return status;
}

absl::Status GenerateReactor::Acknowledge(uint32_t events) {
  {
    absl::MutexLock lock(&mu_);
    if (!acknowledged_events_.value_or(false)) {
      return absl::InvalidArgumentError("ack: this stream's first turn did not set acknowledge_events");
    }
    if (events == 0 || events > unacknowledged_) {
      return absl::InvalidArgumentError(absl::StrCat("ack.events = ", events, ": must be in [1, ", unacknowledged_,
                                                     "], the token events sent and not yet acknowledged"));
    }
    unacknowledged_ -= events;
  }
  engine_->EventsConsumed(*session_, static_cast<int>(events));
  return absl::OkStatus();
}

void GenerateReactor::Refuse(const absl::Status& status) {
  std::optional<grpc::Status> finish;
  {
    absl::MutexLock lock(&mu_);
    // After OnCancel the session is closed: NOT_FOUND and the like are
    // consequences of the client going away, not a refusal to report.
    if (cancelled_) return;
    if (absl::IsResourceExhausted(status)) metrics_->AdmissionRejected();
    RequestFinishLocked(ToGrpcStatus(status));
    finish = TakeFinishLocked();
  }
  // The running turn, if any, stops at its next step.
  if (session_) engine_->CancelTurn(*session_).IgnoreError();
  FinishOutsideLock(finish);
}

void GenerateReactor::OnToken(const serving::TokenEvent& event) {
  metrics_->TokenGenerated();
  v1::GenerateResponse response;
  TokenEventToProto(event, *engine_, response.mutable_token());
  Outgoing out = Serialize(response, /*token=*/true);
  const grpc::ByteBuffer* write;
  {
    absl::MutexLock lock(&mu_);
    const auto now = std::chrono::steady_clock::now();
    if (have_last_token_) metrics_->InterToken(std::chrono::duration<double>(now - last_token_).count());
    last_token_ = now;
    have_last_token_ = true;
    ++unacknowledged_;
    write = QueueLocked(std::move(out));
  }
  if (write != nullptr) StartWrite(write);
}

void GenerateReactor::OnTurnEnd(const serving::TurnEnd& end) {
  metrics_->TurnEnded(end);
  std::optional<Outgoing> out;
  if (end.reason != serving::FinishReason::kError) {
    v1::GenerateResponse response;
    TurnEndToProto(end, response.mutable_turn_end());
    out = Serialize(response, /*token=*/false);
  }
  const grpc::ByteBuffer* write = nullptr;
  std::optional<grpc::Status> finish;
  {
    absl::MutexLock lock(&mu_);
    --turns_in_flight_;
    if (!out) {
      RequestFinishLocked(ToGrpcStatus(end.error));
    } else {
      write = QueueLocked(*std::move(out));
      if (end.reason == serving::FinishReason::kShutdown) {
        // The TurnEnd (SHUTDOWN) goes out first, so the client can tell a
        // shutdown from a broken connection.
        cut_by_shutdown_ = true;
        RequestFinishLocked(grpc::Status(grpc::StatusCode::UNAVAILABLE, kShuttingDown), /*keep_unsent=*/true);
      } else {
        FinishIfIdleLocked();
      }
    }
    finish = TakeFinishLocked();
  }
  if (write != nullptr) StartWrite(write);
  FinishOutsideLock(finish);
}

void GenerateReactor::OnWriteDone(bool ok) {
  const grpc::ByteBuffer* write = nullptr;
  std::optional<grpc::Status> finish;
  bool consumed_token = false;
  {
    absl::MutexLock lock(&mu_);
    writing_ = false;
    if (!writes_.empty()) {
      // With acknowledgements, the client's Ack returns the credit instead.
      consumed_token = ok && writes_.front().token && !acknowledged_events_.value_or(false);
      writes_.pop_front();
    }
    if (!ok) {
      // The stream is broken; OnCancel follows. Nothing more can be written.
      writes_.clear();
      RequestFinishLocked(grpc::Status(grpc::StatusCode::CANCELLED, "write failed"));
    } else if (!writes_.empty() && !finish_called_) {
      writing_ = true;
      write = &writes_.front().wire;
    }
    finish = TakeFinishLocked();
  }
  // The transport took the event: the session may be stepped again.
  if (consumed_token) engine_->EventsConsumed(*session_, 1);
  if (write != nullptr) StartWrite(write);
  FinishOutsideLock(finish);
}

void GenerateReactor::StartDrain() {
  std::optional<grpc::Status> finish;
  {
    absl::MutexLock lock(&mu_);
    draining_ = true;
    FinishIfIdleLocked();
    finish = TakeFinishLocked();
  }
  FinishOutsideLock(finish);
}

void GenerateReactor::OnCancel() {
  std::optional<grpc::Status> finish;
  {
    absl::MutexLock lock(&mu_);
    cancelled_ = true;
    RequestFinishLocked(grpc::Status::CANCELLED);
    finish = TakeFinishLocked();
  }
  // Frees the session's slot now: its queued turn must not run and a running
  // turn must stop after its current step. Never blocks this gRPC thread.
  CloseSession();
  FinishOutsideLock(finish);
}

void GenerateReactor::OnDone() {
  CloseSession();
  {
    absl::MutexLock lock(&mu_);
    if (active_) {
      // Exactly one outcome per session: a stream the server ended because
      // it shuts down, one the client abandoned, one that ended normally, or
      // one that failed.
      SessionOutcome outcome = SessionOutcome::kError;
      const bool unavailable = finish_status_ && finish_status_->error_code() == grpc::StatusCode::UNAVAILABLE;
      if (cut_by_shutdown_ || (draining_ && unavailable) || (cancelled_ && registry_->cancelling_all())) {
        outcome = SessionOutcome::kShutdown;
      } else if (cancelled_ || (finish_status_ && finish_status_->error_code() == grpc::StatusCode::CANCELLED)) {
        outcome = SessionOutcome::kClientGone;
      } else if (finish_status_ && finish_status_->ok()) {
        outcome = SessionOutcome::kOk;
      }
      active_->set_outcome(outcome);
    }
  }
  Unref();
}

void GenerateReactor::CloseSession() {
  if (!session_ || close_requested_.exchange(true)) return;
  Ref();  // released by the engine once no sink call can follow
  engine_->CloseSession(*session_, [this] { Unref(); });
}

void GenerateReactor::Unref() {
  if (refs_.fetch_sub(1) == 1) delete this;
}

GenerateReactor::Outgoing GenerateReactor::Serialize(const v1::GenerateResponse& response, bool token) {
  Outgoing out{grpc::ByteBuffer(), token};
  // Fails only above protobuf's 2 GiB limit, which one event cannot reach.
  SerializeResponse(response, &out.wire).IgnoreError();
  return out;
}

const grpc::ByteBuffer* GenerateReactor::QueueLocked(Outgoing out) {
  if (finish_status_) return nullptr;  // finishing: nothing more goes out
  writes_.push_back(std::move(out));
  if (writing_) return nullptr;
  writing_ = true;
  return &writes_.front().wire;
}

void GenerateReactor::RequestFinishLocked(const grpc::Status& status, bool keep_unsent) {
  if (finish_status_) return;
  finish_status_ = status;
  if (!status.ok() && !keep_unsent) {
    // Unsent responses are dropped; the one in flight completes first.
    while (writes_.size() > (writing_ ? 1u : 0u)) writes_.pop_back();
  }
}

void GenerateReactor::FinishIfIdleLocked() {
  if (turns_in_flight_ > 0) return;
  if (draining_) {
    RequestFinishLocked(grpc::Status(grpc::StatusCode::UNAVAILABLE, kShuttingDown), /*keep_unsent=*/true);
  } else if (reads_done_) {
    RequestFinishLocked(grpc::Status::OK);
  }
}

std::optional<grpc::Status> GenerateReactor::TakeFinishLocked() {
  if (!finish_status_ || finish_called_ || writing_) return std::nullopt;
  finish_called_ = true;
  return finish_status_;
}

void GenerateReactor::FinishOutsideLock(std::optional<grpc::Status> status) {
  if (status) Finish(*status);
}

}  // namespace decoded::server
