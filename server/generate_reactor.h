// The Generate stream: one callback reactor per stream, one decode session
// per reactor. The engine owns the session's turn state (running turn, a turn
// held behind a cancel, carry, credit); the reactor owns only the stream:
// its reads, its write queue and how it finishes.
//
// Life of a stream:
//   constructor   opens the engine session (or finishes at once with its
//                 status: RESOURCE_EXHAUSTED, UNAVAILABLE) and starts a read.
//   OnReadDone    parses the request (ParseRequest: a malformed one, such
//                 as text that is not UTF-8, finishes the stream with
//                 INVALID_ARGUMENT naming the field), hands a turn to the
//                 engine (SubmitTurn) or cancels the running turn, then reads
//                 on; a refused turn finishes the stream with the engine's
//                 status. A half-close finishes the stream with OK once the
//                 submitted turns have ended.
//   OnToken/OnTurnEnd (engine worker threads, as the TurnSink) queue
//                 responses; one write is outstanding at a time.
//   OnWriteDone   tells the engine a token event was consumed (the session
//                 is stepped only while few of its events are unconsumed)
//                 and starts the next queued write, or the pending Finish.
//                 On a stream whose first turn set acknowledge_events, the
//                 client's Ack messages tell it instead.
//   StartDrain    (server drain) refuses new turns; finishes an idle stream
//                 at once with UNAVAILABLE, else right after its turn's
//                 TurnEnd (a turn cut by shutdown ends with SHUTDOWN first).
//                 A turn sent during the drain stops the reads; it is
//                 refused by that same UNAVAILABLE, after the TurnEnd of the
//                 turn before it.
//   OnCancel      (client gone, deadline, server shutdown) closes the engine
//                 session without waiting: its queued turn never runs, its
//                 slot is free at once, its KV cache goes after any running
//                 step.
//   OnDone        closes the session if not yet done.
// The reactor is deleted when both gRPC (OnDone) and the engine (the
// session's release: no sink call follows) are done with it; it stays in the
// StreamRegistry until then, so a drain that sees no stream has nothing left
// to release.
#ifndef DECODED_SERVER_GENERATE_REACTOR_H_
#define DECODED_SERVER_GENERATE_REACTOR_H_

#include <atomic>
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
#include "server/stream_registry.h"

namespace decoded::server {

// Reads and writes are raw: requests are parsed by ParseRequest, responses
// serialized by SerializeResponse.
class GenerateReactor final : public grpc::ServerBidiReactor<grpc::ByteBuffer, grpc::ByteBuffer>,
                              public serving::TurnSink,
                              public DrainableStream {
 public:
  // `engine` null or `refuse` non-OK: the stream finishes at once with
  // `refuse` (UNAVAILABLE while loading or draining). The pointers must
  // outlive the reactor.
  GenerateReactor(serving::Engine* engine, ServerMetrics* metrics, StreamRegistry* registry, absl::Status refuse);

  // grpc reactions.
  void OnReadDone(bool ok) override;
  void OnWriteDone(bool ok) override;
  void OnCancel() override;
  void OnDone() override;

  // TurnSink: engine worker threads.
  void OnToken(const serving::TokenEvent& event) override;
  void OnTurnEnd(const serving::TurnEnd& end) override;

  // DrainableStream.
  void Ref() override { refs_.fetch_add(1); }
  void Unref() override;
  void StartDrain() override;

 private:
  // Unregisters from the drain's registry: a stream counts as open until
  // both gRPC and the engine are done with it.
  ~GenerateReactor() override;

  void HandleRequest();
  // Counts the turn in flight and submits it to the engine (unlocked).
  absl::Status SubmitTurn(const serving::TurnRequest& turn) ABSL_LOCKS_EXCLUDED(mu_);
  // An Ack of `events` token events: returns their credit to the engine.
  // INVALID_ARGUMENT when the stream does not use acknowledgements or the
  // count is 0 or above the events not yet acknowledged.
  absl::Status Acknowledge(uint32_t events) ABSL_LOCKS_EXCLUDED(mu_);
  // Ends the stream with a refused request's status.
  void Refuse(const absl::Status& status) ABSL_LOCKS_EXCLUDED(mu_);
  // Closes the engine session once; the reactor stays alive until the
  // engine has released it.
  void CloseSession();
  // A serialized response waiting for, or in, its write.
  struct Outgoing {
    grpc::ByteBuffer wire;
    bool token;  // a TokenEvent: its write consumes one event of the session's credit
  };
  // Serializes `response` (outside any lock) for QueueLocked.
  static Outgoing Serialize(const v1::GenerateResponse& response, bool token);
  // Queues `out` and returns the buffer to write now, if any.
  const grpc::ByteBuffer* QueueLocked(Outgoing out) ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  // Records the final status (the first one wins). An error drops the
  // responses not yet written, unless `keep_unsent` (a TurnEnd that must
  // reach the client before the status).
  void RequestFinishLocked(const grpc::Status& status, bool keep_unsent = false) ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  // Finishes the stream when it is due and no write is in flight; returns
  // the status to call Finish with (by the caller, after unlocking).
  std::optional<grpc::Status> TakeFinishLocked() ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  // The stream's last word once nothing more is owed to the client.
  void FinishIfIdleLocked() ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  void FinishOutsideLock(std::optional<grpc::Status> status) ABSL_LOCKS_EXCLUDED(mu_);

  serving::Engine* const engine_;
  ServerMetrics* const metrics_;
  StreamRegistry* const registry_;
  std::optional<ActiveSessionGuard> active_;
  std::optional<serving::SessionId> session_;
  std::atomic<bool> close_requested_{false};
  // One reference for gRPC (until OnDone), one for the engine session (until
  // its release), and transient ones taken by a drain.
  std::atomic<int> refs_{1};
  grpc::ByteBuffer read_;         // target of the single outstanding read
  v1::GenerateRequest request_;   // read_, parsed

  absl::Mutex mu_;
  std::deque<Outgoing> writes_ ABSL_GUARDED_BY(mu_);  // front is in flight when writing_
  bool writing_ ABSL_GUARDED_BY(mu_) = false;
  int turns_in_flight_ ABSL_GUARDED_BY(mu_) = 0;  // submitted, TurnEnd not yet received (0..2)
  // Flow control chosen by the first turn (Turn.acknowledge_events): credit
  // comes back with the client's Acks rather than with the transport's writes.
  std::optional<bool> acknowledged_events_ ABSL_GUARDED_BY(mu_);
  int64_t unacknowledged_ ABSL_GUARDED_BY(mu_) = 0;  // token events sent, not yet acknowledged
  bool reads_done_ ABSL_GUARDED_BY(mu_) = false;
  bool draining_ ABSL_GUARDED_BY(mu_) = false;
  bool cancelled_ ABSL_GUARDED_BY(mu_) = false;  // OnCancel ran
  bool cut_by_shutdown_ ABSL_GUARDED_BY(mu_) = false;
  std::optional<grpc::Status> finish_status_ ABSL_GUARDED_BY(mu_);
  bool finish_called_ ABSL_GUARDED_BY(mu_) = false;
  std::chrono::steady_clock::time_point last_token_ ABSL_GUARDED_BY(mu_);
  bool have_last_token_ ABSL_GUARDED_BY(mu_) = false;
};

}  // namespace decoded::server

#endif  // DECODED_SERVER_GENERATE_REACTOR_H_
