#include "server/generate_reactor.h"

#include <algorithm>
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

GenerateReactor::GenerateReactor(grpc::CallbackServerContext* context, const StreamServices& services,
                                 absl::Status refuse)
    : context_(context),
      services_(services),
      grpc_peer_(context->peer()),
      peer_(services.progress != nullptr ? services.progress->ClientPeer(grpc_peer_) : grpc_peer_) {
  if (services_.progress != nullptr) services_.progress->NoteProgress(grpc_peer_);
  if (services_.engine == nullptr || !refuse.ok()) {
    Refuse(refuse.ok() ? absl::UnavailableError("the model is not loaded") : refuse);
    return;
  }
  if (absl::Status added = services_.registry->Add(this, peer_); !added.ok()) {
    // A drain began after the service's readiness check, or --max_streams.
    Refuse(absl::IsUnavailable(added) ? absl::UnavailableError(kShuttingDown) : added);
    return;
  }
  registered_ = true;
  {
    absl::MutexLock lock(&mu_);
    last_client_activity_ = last_turn_activity_ = Clock::now();
  }
  StartRead(&read_);
}

GenerateReactor::~GenerateReactor() {
  {
    // The session's outcome is counted before the stream stops counting as open.
    absl::MutexLock lock(&mu_);
    active_.reset();
    peer_slot_.reset();
  }
  if (registered_) services_.registry->Remove(this);
}

void GenerateReactor::OnReadDone(bool ok) {
  if (!ok) {
    // The client half-closed (or the call is being cancelled: OnCancel handles that).
    std::optional<grpc::Status> finish;
    {
      absl::MutexLock lock(&mu_);
      reads_done_ = true;
      last_client_activity_ = Clock::now();
      FinishIfIdleLocked();
      finish = TakeFinishLocked();
    }
    FinishOutsideLock(finish);
    return;
  }
  {
    absl::MutexLock lock(&mu_);
    last_client_activity_ = Clock::now();
  }
  if (services_.progress != nullptr) services_.progress->NoteProgress(grpc_peer_);
  HandleRequest();
}

void GenerateReactor::HandleRequest() {
  absl::Status status = ParseRequest(read_, &request_);
  if (!status.ok()) {
    // Not a GenerateRequest (e.g. text that is not UTF-8).
  } else if (request_.has_cancel()) {
    // Before the first turn there is nothing to cancel.
    if (std::optional<serving::SessionId> id = session()) status = services_.engine->CancelTurn(*id);
  } else if (request_.has_ack()) {
    status = Acknowledge(request_.ack().events());
  } else if (request_.has_turn()) {
    std::optional<grpc::Status> finish;
    // The drain may have begun without reaching this stream yet (it visits
    // the streams one by one): a turn read after it began is refused too.
    const bool server_draining = services_.registry->draining();
    bool draining;
    {
      absl::MutexLock lock(&mu_);
      if (server_draining) draining_ = true;
      draining = draining_;
      if (draining) {
        // The turn is refused by the stream ending UNAVAILABLE, but only once
        // the turn before it (if any) has sent its TurnEnd: no more reads.
        FinishIfIdleLocked();
        finish = TakeFinishLocked();
      } else {
        preparing_turn_ = true;
        had_turn_ = true;
      }
    }
    if (draining) {
      FinishOutsideLock(finish);
      return;
    }
    // Tokenizing, rendering a conversation and allocating a KV cache take
    // time that grows with the request: not on this gRPC thread.
    Ref();
    status = services_.turn_pool->Submit([this] {
      RunTurn();
      Unref();
    });
    if (status.ok()) return;  // RunTurn reads on
    Unref();
    absl::MutexLock lock(&mu_);
    preparing_turn_ = false;
  } else {
    status = absl::InvalidArgumentError("a GenerateRequest must carry a turn or a cancel");
  }
  if (status.ok()) {
    ContinueReading();
    return;
  }
  Refuse(status);
}

void GenerateReactor::RunTurn() {
  absl::Status status = OpenSessionOnce();
  if (status.ok()) {
    absl::StatusOr<serving::TurnRequest> turn = TurnFromProto(request_.turn());
    status = turn.ok() ? SubmitTurn(*turn) : turn.status();
  }
  if (!status.ok()) {
    {
      absl::MutexLock lock(&mu_);
      preparing_turn_ = false;
    }
    Refuse(status);
    return;
  }
  std::optional<grpc::Status> finish;
  {
    absl::MutexLock lock(&mu_);
    preparing_turn_ = false;
    last_turn_activity_ = Clock::now();
    // A drain that began meanwhile, with this turn ended already, finishes
    // the stream now (its StartDrain and TurnEnd waited for this).
    FinishIfIdleLocked();
    finish = TakeFinishLocked();
    // As ContinueReading: under the lock, never after Finish.
    if (!finish_status_) StartRead(&read_);
  }
  FinishOutsideLock(finish);
}

absl::Status GenerateReactor::OpenSessionOnce() {
  {
    absl::MutexLock lock(&mu_);
    if (session_) return absl::OkStatus();
    if (close_requested_ || finish_status_) return absl::CancelledError("the stream is ending");
  }
  absl::StatusOr<PeerSessions::Slot> slot = services_.peers->Acquire(peer_);
  if (!slot.ok()) return slot.status();
  absl::StatusOr<serving::SessionId> id = services_.engine->OpenSession();
  if (!id.ok()) return id.status();
  {
    absl::MutexLock lock(&mu_);
    if (!close_requested_) {
      session_ = *id;
      peer_slot_.emplace(*std::move(slot));
      active_.emplace(services_.metrics);
      return absl::OkStatus();
    }
  }
  // The client went while the session opened: no sink was ever given to it.
  services_.engine->CloseSession(*id);
  return absl::CancelledError("the stream is ending");
}

std::optional<serving::SessionId> GenerateReactor::session() {
  absl::MutexLock lock(&mu_);
  return session_;
}

absl::Status GenerateReactor::SubmitTurn(const serving::TurnRequest& turn) {
  serving::SessionId id;
  {
    absl::MutexLock lock(&mu_);
    id = *session_;
    ++turns_in_flight_;  // before Submit: the turn may end before it returns
    have_last_token_ = false;
    if (!acknowledged_events_) acknowledged_events_ = request_.turn().acknowledge_events();
  }
  absl::Status status = services_.engine->SubmitTurn(id, turn, this);
  if (!status.ok()) {
    absl::MutexLock lock(&mu_);
    --turns_in_flight_;
  }
  return status;
}

absl::Status GenerateReactor::Acknowledge(uint32_t events) {
  serving::SessionId id;
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
    id = *session_;
  }
  services_.engine->EventsConsumed(id, static_cast<int>(events));
  return absl::OkStatus();
}

void GenerateReactor::ContinueReading() {
  // Under the lock: Finish (called after finish_called_ is set under it)
  // cannot come first, and no operation may start after Finish.
  absl::MutexLock lock(&mu_);
  if (!finish_called_ && !finish_status_) StartRead(&read_);
}

void GenerateReactor::Refuse(const absl::Status& status) {
  std::optional<grpc::Status> finish;
  std::optional<serving::SessionId> id;
  {
    absl::MutexLock lock(&mu_);
    // After OnCancel the session is closed: NOT_FOUND and the like are
    // consequences of the client going away, not a refusal to report.
    if (cancelled_) return;
    if (absl::IsResourceExhausted(status)) services_.metrics->AdmissionRejected();
    RequestFinishLocked(ToGrpcStatus(status));
    finish = TakeFinishLocked();
    id = session_;
  }
  // The running turn, if any, stops at its next step.
  if (id) services_.engine->CancelTurn(*id).IgnoreError();
  FinishOutsideLock(finish);
}

void GenerateReactor::OnToken(const serving::TokenEvent& event) {
  services_.metrics->TokenGenerated();
  v1::GenerateResponse response;
  TokenEventToProto(event, *services_.engine, response.mutable_token());
  Outgoing out = Serialize(response, /*token=*/true);
  const grpc::ByteBuffer* write;
  {
    absl::MutexLock lock(&mu_);
    const auto now = Clock::now();
    if (have_last_token_) services_.metrics->InterToken(std::chrono::duration<double>(now - last_token_).count());
    last_token_ = last_turn_activity_ = now;
    have_last_token_ = true;
    ++unacknowledged_;
    write = QueueLocked(std::move(out));
  }
  if (write != nullptr) StartWrite(write);
}

void GenerateReactor::OnTurnEnd(const serving::TurnEnd& end) {
  services_.metrics->TurnEnded(end);
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
    last_turn_activity_ = Clock::now();
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
  std::optional<serving::SessionId> id;
  {
    absl::MutexLock lock(&mu_);
    writing_ = false;
    id = session_;
    if (!writes_.empty()) {
      // With acknowledgements, the client's Ack returns the credit instead.
      consumed_token = ok && writes_.front().token && !acknowledged_events_.value_or(false);
      writes_.pop_front();
    }
    if (!ok) {
      // The stream is broken; OnCancel follows. Nothing more can be written.
      writes_.clear();
      RequestFinishLocked(grpc::Status(grpc::StatusCode::CANCELLED, "write failed"));
    } else {
      if (!acknowledged_events_.value_or(false)) last_client_activity_ = Clock::now();
      if (!writes_.empty() && !finish_called_) {
        writing_ = true;
        write_started_ = Clock::now();
        write = &writes_.front().wire;
      }
    }
    finish = TakeFinishLocked();
  }
  // The transport took the event: the session may be stepped again.
  if (consumed_token && id) services_.engine->EventsConsumed(*id, 1);
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

void GenerateReactor::ExpireIfIdle(Clock::time_point now, const IdleTimeouts& timeouts) {
  std::optional<grpc::Status> finish;
  bool idle = false;
  bool stalled = false;
  {
    absl::MutexLock lock(&mu_);
    if (finish_status_ || draining_ || cancelled_) return;
    const std::chrono::nanoseconds timeout = had_turn_ ? timeouts.idle_session : timeouts.first_turn;
    if (turns_in_flight_ == 0 && !preparing_turn_) {
      // Only turns are work: a client that sends cancels or acks and nothing
      // else is idle all the same. A write still outstanding this long after
      // the last turn ended is one the client does not take (its last events
      // filled the transport's window before the turn could park): a status
      // cannot reach it either, so it is cancelled below as a stalled turn
      // is (else the call stayed open, its outcome uncounted, until the
      // client went: a flaky HardeningTest on a loaded run).
      idle = now - last_turn_activity_ >= timeout;
      stalled = idle && writing_;
      idle = idle && !stalled;
    } else if (turns_in_flight_ > 0) {
      // A turn parked on a client that takes none of its events.
      const bool write_stuck = writing_ && now - write_started_ >= timeout;
      const bool unacknowledged = acknowledged_events_.value_or(false) && unacknowledged_ > 0 &&
                                  now - last_client_activity_ >= timeout && now - last_turn_activity_ >= timeout;
      stalled = write_stuck || unacknowledged;
    }
    if (!idle && !stalled) return;
    expired_ = true;
    const std::string seconds = absl::StrCat(std::chrono::duration_cast<std::chrono::seconds>(timeout).count());
    if (idle) {
      RequestFinishLocked(grpc::Status(
          grpc::StatusCode::DEADLINE_EXCEEDED,
          had_turn_ ? absl::StrCat("the stream had no turn for ", seconds,
                                   " s (--idle_session_seconds); its session is closed: open a new stream to continue")
                    : absl::StrCat("the stream sent no turn within ", seconds, " s of opening (--first_turn_seconds)")));
      finish = TakeFinishLocked();
    } else {
      RequestFinishLocked(grpc::Status(
          grpc::StatusCode::CANCELLED,
          absl::StrCat("the client took none of its turn's events for ", seconds, " s (--idle_session_seconds)")));
    }
  }
  CloseSession();
  if (stalled) {
    // A status cannot reach a client that does not read: cancel the call
    // (RST_STREAM); its outstanding write fails and OnCancel follows.
    absl::MutexLock lock(&cancel_mu_);
    if (!done_) context_->TryCancel();
  }
  FinishOutsideLock(finish);
}

void GenerateReactor::OnCancel() {
  if (registered_) services_.registry->StopCounting(this);
  std::optional<grpc::Status> finish;
  bool reset_by_client;
  {
    absl::MutexLock lock(&mu_);
    // Not the server's own doing (an idle stream it cancelled, a drain).
    reset_by_client = !expired_ && !services_.registry->cancelling_all();
    cancelled_ = true;
    RequestFinishLocked(grpc::Status::CANCELLED);
    finish = TakeFinishLocked();
  }
  // Frees the session's slot now: its queued turn must not run and a running
  // turn must stop after its current step. Never blocks this gRPC thread.
  CloseSession();
  FinishOutsideLock(finish);
  if (reset_by_client && registered_ && services_.resets != nullptr) services_.resets->StreamReset(grpc_peer_);
}

void GenerateReactor::OnDone() {
  {
    absl::MutexLock lock(&cancel_mu_);
    done_ = true;
  }
  CloseSession();
  {
    absl::MutexLock lock(&mu_);
    {
      // Exactly one outcome per stream (and its session, if it opened one): a
      // stream the server ended because it shuts down, one ended for idling,
      // one the client abandoned, one that ended normally, or one that failed.
      SessionOutcome outcome = SessionOutcome::kError;
      const bool unavailable = finish_status_ && finish_status_->error_code() == grpc::StatusCode::UNAVAILABLE;
      if (cut_by_shutdown_ || (draining_ && unavailable) ||
          (cancelled_ && !expired_ && services_.registry->cancelling_all())) {
        outcome = SessionOutcome::kShutdown;
      } else if (expired_) {
        outcome = SessionOutcome::kIdle;
      } else if (cancelled_ || (finish_status_ && finish_status_->error_code() == grpc::StatusCode::CANCELLED)) {
        outcome = SessionOutcome::kClientGone;
      } else if (finish_status_ && finish_status_->ok()) {
        outcome = SessionOutcome::kOk;
      } else if (finish_status_) {
        outcome = OutcomeOfError(static_cast<absl::StatusCode>(finish_status_->error_code()));
      }
      services_.metrics->StreamEnded(outcome);
      if (active_) active_->set_outcome(outcome);
    }
  }
  Unref();
}

void GenerateReactor::CloseSession() {
  std::optional<serving::SessionId> id;
  {
    absl::MutexLock lock(&mu_);
    if (close_requested_) return;
    close_requested_ = true;
    id = session_;
    // The peer's slot is free once the engine's is.
    if (id) peer_slot_.reset();
  }
  if (!id) return;
  Ref();  // released by the engine once no sink call can follow
  services_.engine->CloseSession(*id, [this] { Unref(); });
}

bool GenerateReactor::TryRef() {
  int refs = refs_.load();
  while (refs > 0) {
    if (refs_.compare_exchange_weak(refs, refs + 1)) return true;
  }
  return false;
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
  write_started_ = Clock::now();
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
  if (turns_in_flight_ > 0 || preparing_turn_) return;
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
  if (!status) return;
  if (registered_) services_.registry->StopCounting(this);
  Finish(*status);
}

}  // namespace decoded::server
