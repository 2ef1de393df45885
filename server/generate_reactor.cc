#include "server/generate_reactor.h"

#include <utility>

#include "server/proto_convert.h"
#include "server/status_map.h"

namespace decoded::server {

GenerateReactor::GenerateReactor(serving::Engine* engine, ServerMetrics* metrics, absl::Status refuse)
    : engine_(engine), metrics_(metrics) {
  if (engine_ == nullptr || !refuse.ok()) {
    RefuseAtOnce(ToGrpcStatus(refuse.ok() ? absl::UnavailableError("the model is not loaded") : refuse));
    return;
  }
  absl::StatusOr<serving::SessionId> session = engine_->OpenSession();
  if (!session.ok()) {
    if (absl::IsResourceExhausted(session.status())) metrics_->AdmissionRejected();
    RefuseAtOnce(ToGrpcStatus(session.status()));
    return;
  }
  session_ = *session;
  active_.emplace(metrics_);
  StartRead(&request_);
}

// Goes through the same once-only bookkeeping as every other finish, so a
// cancel or deadline that arrives after the refusal cannot Finish() again.
void GenerateReactor::RefuseAtOnce(const grpc::Status& status) {
  bool finish;
  {
    absl::MutexLock lock(&mu_);
    RequestFinishLocked(status);
    finish = TakeFinishLocked();
  }
  if (finish) Finish(status);
}

void GenerateReactor::OnReadDone(bool ok) {
  if (!ok) {
    // The client half-closed (or the call is being cancelled: OnCancel handles that).
    bool finish;
    std::optional<grpc::Status> status;
    {
      absl::MutexLock lock(&mu_);
      reads_done_ = true;
      if (!turn_running_) RequestFinishLocked(grpc::Status::OK);
      finish = TakeFinishLocked();
      status = finish_status_;
    }
    if (finish) Finish(*status);
    return;
  }
  HandleRequest();
}

void GenerateReactor::HandleRequest() {
  absl::Status status;
  if (request_.has_cancel()) {
    {
      absl::MutexLock lock(&mu_);
      if (turn_running_) cancel_requested_ = true;
    }
    status = engine_->CancelTurn(*session_);
  } else if (request_.has_turn()) {
    absl::StatusOr<serving::TurnRequest> turn = TurnFromProto(request_.turn());
    if (!turn.ok()) {
      status = turn.status();
    } else {
      {
        // A turn sent right after a cancel waits for the cancelled turn's
        // TurnEnd instead of being refused; reading pauses until then.
        absl::MutexLock lock(&mu_);
        if (turn_running_ && cancel_requested_ && !pending_turn_) {
          pending_turn_ = *std::move(turn);
          return;
        }
      }
      status = SubmitTurn(*std::move(turn));
    }
  } else {
    status = absl::InvalidArgumentError("a GenerateRequest must carry a turn or a cancel");
  }

  if (status.ok()) {
    StartRead(&request_);
    return;
  }
  Refuse(status);
}

absl::Status GenerateReactor::SubmitTurn(serving::TurnRequest turn) {
  bool was_running;
  {
    absl::MutexLock lock(&mu_);
    was_running = turn_running_;
    turn_running_ = true;  // before Submit: events may arrive before it returns
    cancel_requested_ = false;
    have_last_token_ = false;
  }
  absl::Status status = engine_->SubmitTurn(*session_, turn, this);
  if (!status.ok()) {
    absl::MutexLock lock(&mu_);
    turn_running_ = was_running;
  }
  return status;
}

void GenerateReactor::Refuse(const absl::Status& status) {
  if (absl::IsResourceExhausted(status)) metrics_->AdmissionRejected();
  // A refused request ends the stream with its status; the running turn (if
  // any) is cancelled by closing the session when the stream is done.
  engine_->CancelTurn(*session_).IgnoreError();
  bool finish;
  std::optional<grpc::Status> final_status;
  {
    absl::MutexLock lock(&mu_);
    RequestFinishLocked(ToGrpcStatus(status));
    finish = TakeFinishLocked();
    final_status = finish_status_;
  }
  if (finish) Finish(*final_status);
}

void GenerateReactor::OnToken(const serving::TokenEvent& event) {
  metrics_->TokenGenerated();
  v1::GenerateResponse response;
  TokenEventToProto(event, *engine_, response.mutable_token());
  const v1::GenerateResponse* write;
  {
    absl::MutexLock lock(&mu_);
    const auto now = std::chrono::steady_clock::now();
    if (have_last_token_) metrics_->InterToken(std::chrono::duration<double>(now - last_token_).count());
    last_token_ = now;
    have_last_token_ = true;
    write = QueueLocked(std::move(response));
  }
  if (write != nullptr) StartWrite(write);
}

void GenerateReactor::OnTurnEnd(const serving::TurnEnd& end) {
  metrics_->TurnEnded(end);
  std::optional<serving::TurnRequest> next;  // a turn that waited for this one's end
  const v1::GenerateResponse* write = nullptr;
  bool finish = false;
  std::optional<grpc::Status> status;
  {
    absl::MutexLock lock(&mu_);
    turn_running_ = false;
    cancel_requested_ = false;
    if (pending_turn_ && !finish_status_ && end.reason != serving::FinishReason::kError) {
      next = std::move(pending_turn_);
    }
    pending_turn_.reset();
    if (end.reason == serving::FinishReason::kError) {
      RequestFinishLocked(ToGrpcStatus(end.error));
    } else {
      v1::GenerateResponse response;
      TurnEndToProto(end, response.mutable_turn_end());
      write = QueueLocked(std::move(response));
      if (reads_done_) RequestFinishLocked(grpc::Status::OK);
    }
    finish = TakeFinishLocked();
    status = finish_status_;
  }
  if (write != nullptr) StartWrite(write);
  if (finish) {
    Finish(*status);
    return;
  }
  if (next) {
    const absl::Status submitted = SubmitTurn(*std::move(next));
    if (submitted.ok()) {
      StartRead(&request_);
    } else {
      Refuse(submitted);
    }
  }
}

void GenerateReactor::OnWriteDone(bool ok) {
  const v1::GenerateResponse* write = nullptr;
  bool finish;
  std::optional<grpc::Status> status;
  {
    absl::MutexLock lock(&mu_);
    writing_ = false;
    if (!writes_.empty()) writes_.pop_front();
    if (!ok) {
      // The stream is broken; OnCancel follows. Nothing more can be written.
      writes_.clear();
      RequestFinishLocked(grpc::Status(grpc::StatusCode::CANCELLED, "write failed"));
    } else if (!writes_.empty() && !finish_called_) {
      writing_ = true;
      write = &writes_.front();
    }
    finish = TakeFinishLocked();
    status = finish_status_;
  }
  if (write != nullptr) StartWrite(write);
  if (finish) Finish(*status);
}

void GenerateReactor::OnCancel() {
  // Free the session now rather than at OnDone: a queued turn must not run
  // and a running turn must stop after its current step.
  if (session_) engine_->CloseSession(*session_);
  if (active_) active_->set_outcome(SessionOutcome::kClientGone);
  bool finish;
  std::optional<grpc::Status> status;
  {
    absl::MutexLock lock(&mu_);
    RequestFinishLocked(grpc::Status::CANCELLED);
    finish = TakeFinishLocked();
    status = finish_status_;
  }
  if (finish) Finish(*status);
}

void GenerateReactor::OnDone() {
  // Waits for a step of this session still running on a worker, after which
  // the engine never calls this sink again.
  if (session_) engine_->CloseSession(*session_);
  {
    absl::MutexLock lock(&mu_);
    if (active_ && finish_status_ && !finish_status_->ok() &&
        finish_status_->error_code() != grpc::StatusCode::CANCELLED) {
      active_->set_outcome(SessionOutcome::kError);
    }
  }
  delete this;
}

const v1::GenerateResponse* GenerateReactor::QueueLocked(v1::GenerateResponse response) {
  if (finish_status_) return nullptr;  // finishing: nothing more goes out
  writes_.push_back(std::move(response));
  if (writing_) return nullptr;
  writing_ = true;
  return &writes_.front();
}

void GenerateReactor::RequestFinishLocked(const grpc::Status& status) {
  if (finish_status_) return;
  finish_status_ = status;
  if (!status.ok()) {
    // Unsent responses are dropped; the one in flight completes first.
    while (writes_.size() > (writing_ ? 1u : 0u)) writes_.pop_back();
  }
}

bool GenerateReactor::TakeFinishLocked() {
  if (!finish_status_ || finish_called_ || writing_) return false;
  finish_called_ = true;
  return true;
}

}  // namespace decoded::server
