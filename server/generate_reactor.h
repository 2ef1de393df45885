// The Generate stream: one callback reactor per stream, one decode session
// per reactor.
//
// Life of a stream:
//   constructor   opens the engine session (or finishes at once with its
//                 status: RESOURCE_EXHAUSTED, UNAVAILABLE) and starts a read.
//   OnReadDone    hands a turn to the engine (SubmitTurn) or cancels the
//                 running turn, then reads on; a refused turn finishes the
//                 stream with the engine's status. A half-close finishes the
//                 stream with OK once the running turn has ended.
//   OnToken/OnTurnEnd (engine worker threads, as the TurnSink) queue
//                 responses; one write is outstanding at a time.
//   OnWriteDone   starts the next queued write, or the pending Finish.
//   OnCancel      (client gone, deadline, server shutdown) closes the engine
//                 session at once: a queued turn never runs and the KV cache
//                 is freed.
//   OnDone        closes the session (waiting for a running step, so no sink
//                 call can outlive this object) and deletes the reactor.
// After Finish, events from the engine are dropped.
#ifndef DECODED_SERVER_GENERATE_REACTOR_H_
#define DECODED_SERVER_GENERATE_REACTOR_H_

#include <chrono>
#include <deque>
#include <optional>

#include "absl/base/thread_annotations.h"
#include "absl/status/status.h"
#include "absl/synchronization/mutex.h"
#include "engine/serving/engine.h"
#include "grpcpp/grpcpp.h"
#include "proto/decoded.grpc.pb.h"
#include "server/metrics.h"

namespace decoded::server {

class GenerateReactor final : public grpc::ServerBidiReactor<v1::GenerateRequest, v1::GenerateResponse>,
                              public serving::TurnSink {
 public:
  // `engine` null or `refuse` non-OK: the stream finishes at once with
  // `refuse` (UNAVAILABLE while loading or draining). Both pointers must
  // outlive the reactor.
  GenerateReactor(serving::Engine* engine, ServerMetrics* metrics, absl::Status refuse);

  // grpc reactions.
  void OnReadDone(bool ok) override;
  void OnWriteDone(bool ok) override;
  void OnCancel() override;
  void OnDone() override;

  // TurnSink: engine worker threads.
  void OnToken(const serving::TokenEvent& event) override;
  void OnTurnEnd(const serving::TurnEnd& end) override;

 private:
  ~GenerateReactor() override = default;

  void HandleRequest();
  // Marks a turn running and submits it to the engine (unlocked).
  absl::Status SubmitTurn(serving::TurnRequest turn) ABSL_LOCKS_EXCLUDED(mu_);
  // Ends the stream with a refused request's status.
  void Refuse(const absl::Status& status) ABSL_LOCKS_EXCLUDED(mu_);
  // Queues `response` and returns the message to write now, if any.
  const v1::GenerateResponse* QueueLocked(v1::GenerateResponse response) ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  // Records the final status (the first one wins); drops unsent responses
  // when it is an error.
  // Finishes a stream refused in the constructor (no session opened).
  void RefuseAtOnce(const grpc::Status& status);
  void RequestFinishLocked(const grpc::Status& status) ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  // True when Finish is to be called now (by the caller, after unlocking).
  bool TakeFinishLocked() ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);

  serving::Engine* const engine_;
  ServerMetrics* const metrics_;
  std::optional<ActiveSessionGuard> active_;
  std::optional<serving::SessionId> session_;
  v1::GenerateRequest request_;  // target of the single outstanding read

  absl::Mutex mu_;
  std::deque<v1::GenerateResponse> writes_ ABSL_GUARDED_BY(mu_);  // front is in flight when writing_
  bool writing_ ABSL_GUARDED_BY(mu_) = false;
  bool turn_running_ ABSL_GUARDED_BY(mu_) = false;
  bool cancel_requested_ ABSL_GUARDED_BY(mu_) = false;  // for the running turn
  // A turn received after a cancel, submitted when the cancelled turn ends.
  std::optional<serving::TurnRequest> pending_turn_ ABSL_GUARDED_BY(mu_);
  bool reads_done_ ABSL_GUARDED_BY(mu_) = false;
  std::optional<grpc::Status> finish_status_ ABSL_GUARDED_BY(mu_);
  bool finish_called_ ABSL_GUARDED_BY(mu_) = false;
  std::chrono::steady_clock::time_point last_token_ ABSL_GUARDED_BY(mu_);
  bool have_last_token_ ABSL_GUARDED_BY(mu_) = false;
};

}  // namespace decoded::server

#endif  // DECODED_SERVER_GENERATE_REACTOR_H_
