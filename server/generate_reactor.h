// The Generate stream: one callback reactor per stream, at most one decode
// session per reactor. The engine owns the session's turn state (running
// turn, a turn held behind a cancel, carry, credit); the reactor owns only the
// stream: its reads, its write queue, how it finishes, and when it has been
// idle too long.
//
// Life of a stream:
//   constructor   registers the stream (or finishes at once: UNAVAILABLE
//                 while loading or draining, RESOURCE_EXHAUSTED beyond
//                 --max_streams) and starts a read. No session yet: a stream
//                 takes a session slot (and its KV cache) with its first
//                 turn, so streams that never send one hold nothing.
//   OnReadDone    parses the request (ParseRequest: a malformed one, such
//                 as text that is not UTF-8, finishes the stream with
//                 INVALID_ARGUMENT naming the field). A cancel or an ack is
//                 handled here; a turn goes to the turn pool (RequestPool),
//                 whose thread opens the session on the first turn
//                 (RESOURCE_EXHAUSTED naming the limit: --max_sessions,
//                 --max_sessions_per_peer, the KV budget), tokenizes or renders
//                 the input and hands the turn to the engine (SubmitTurn). The
//                 next read starts when that is done; a refused turn finishes
//                 the stream with the engine's status. A half-close finishes
//                 the stream with OK once the submitted turns have ended.
//   OnToken/OnTurnEnd (engine worker threads, as the TurnSink) queue
//                 responses; one write is outstanding at a time.
//   OnWriteDone   tells the engine a token event was consumed (the session
//                 is stepped only while few of its events are unconsumed)
//                 and starts the next queued write, or the pending Finish.
//                 On a stream whose first turn set acknowledge_events, the
//                 client's Ack messages tell it instead.
//   ExpireIfIdle  (the server's watchdog, every half second) ends an idle
//                 stream: one that sent no turn within --first_turn_seconds
//                 of opening, or had no turn in flight for
//                 --idle_session_seconds (cancels and acks do not count: only
//                 turns are work) finishes with DEADLINE_EXCEEDED naming the
//                 flag, and its session is closed; one with a turn stalled on
//                 a client that has taken none of its events for
//                 --idle_session_seconds (a write outstanding, or events
//                 unacknowledged) has its call cancelled (a status could not
//                 reach a client that does not read).
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
// The reactor is deleted when gRPC (OnDone), the engine (the session's
// release: no sink call follows) and the turn pool (a queued turn's task)
// are all done with it; it stays in the StreamRegistry until then, so a drain
// that sees no stream has nothing left to release.
#ifndef DECODED_SERVER_GENERATE_REACTOR_H_
#define DECODED_SERVER_GENERATE_REACTOR_H_

#include <atomic>
#include <chrono>
#include <deque>
#include <optional>
#include <string>

#include "absl/base/thread_annotations.h"
#include "absl/status/status.h"
#include "absl/synchronization/mutex.h"
#include "engine/serving/engine.h"
#include "grpcpp/grpcpp.h"
#include "proto/decoded.grpc.pb.h"
#include "server/client_connections.h"
#include "server/metrics.h"
#include "server/peer_sessions.h"
#include "server/request_pool.h"
#include "server/reset_guard.h"
#include "server/stream_registry.h"

namespace decoded::server {

// What a stream uses of its server; all of it outlives every stream.
struct StreamServices {
  serving::Engine* engine = nullptr;
  ServerMetrics* metrics = nullptr;
  StreamRegistry* registry = nullptr;
  RequestPool* turn_pool = nullptr;  // opens sessions, tokenizes and submits turns
  PeerSessions* peers = nullptr;     // --max_sessions_per_peer
  ResetGuard* resets = nullptr;      // streams the client resets; may be null
  ClientConnections* progress = nullptr;  // calls started, messages read; may be null
};

// Reads and writes are raw: requests are parsed by ParseRequest, responses
// serialized by SerializeResponse.
class GenerateReactor final : public grpc::ServerBidiReactor<grpc::ByteBuffer, grpc::ByteBuffer>,
                              public serving::TurnSink,
                              public OpenStream {
 public:
  // `refuse` non-OK (or no engine): the stream finishes at once with it
  // (UNAVAILABLE while loading or draining, UNAUTHENTICATED).
  GenerateReactor(grpc::CallbackServerContext* context, const StreamServices& services, absl::Status refuse);

  // grpc reactions.
  void OnReadDone(bool ok) override;
  void OnWriteDone(bool ok) override;
  void OnCancel() override;
  void OnDone() override;

  // TurnSink: engine worker threads.
  void OnToken(const serving::TokenEvent& event) override;
  void OnTurnEnd(const serving::TurnEnd& end) override;

  // OpenStream.
  bool TryRef() override;
  void Unref() override;
  void StartDrain() override;
  void ExpireIfIdle(std::chrono::steady_clock::time_point now, const IdleTimeouts& timeouts) override;

 private:
  using Clock = std::chrono::steady_clock;

  // Unregisters from the registry: a stream counts as open until gRPC, the
  // engine and the turn pool are all done with it.
  ~GenerateReactor() override;
  // Another reference, taken while one is held.
  void Ref() { refs_.fetch_add(1); }

  void HandleRequest();
  // On the turn pool: opens the session at the first turn, converts and
  // submits the turn, then reads on (or refuses).
  void RunTurn();
  // The session, opened by the first turn. CANCELLED when the stream is
  // already ending; the admission errors of PeerSessions and the engine.
  absl::Status OpenSessionOnce() ABSL_LOCKS_EXCLUDED(mu_);
  std::optional<serving::SessionId> session() ABSL_LOCKS_EXCLUDED(mu_);
  // Counts the turn in flight and submits it to the engine (unlocked).
  absl::Status SubmitTurn(const serving::TurnRequest& turn) ABSL_LOCKS_EXCLUDED(mu_);
  // An Ack of `events` token events: returns their credit to the engine.
  // INVALID_ARGUMENT when the stream does not use acknowledgements or the
  // count is 0 or above the events not yet acknowledged.
  absl::Status Acknowledge(uint32_t events) ABSL_LOCKS_EXCLUDED(mu_);
  // Starts the next read unless the stream is finishing.
  void ContinueReading() ABSL_LOCKS_EXCLUDED(mu_);
  // Ends the stream with a refused request's status.
  void Refuse(const absl::Status& status) ABSL_LOCKS_EXCLUDED(mu_);
  // Closes the engine session once (and releases its peer slot); the
  // reactor stays alive until the engine has released it.
  void CloseSession() ABSL_LOCKS_EXCLUDED(mu_);
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

  grpc::CallbackServerContext* const context_;  // valid until OnDone (see cancel_mu_)
  const StreamServices services_;
  const std::string grpc_peer_;  // context_->peer(), read once: names the connection
  const std::string peer_;       // the client's (ClientConnections::ClientPeer): per-client limits
  bool registered_ = false;
  // One reference for gRPC (until OnDone), one for the engine session (until
  // its release), one for a queued turn task, and transient ones taken by the
  // registry.
  std::atomic<int> refs_{1};
  grpc::ByteBuffer read_;         // target of the single outstanding read
  v1::GenerateRequest request_;   // read_, parsed

  // Guards done_ only, so that TryCancel (from the watchdog) never touches a
  // context gRPC has freed after OnDone; never held with mu_.
  absl::Mutex cancel_mu_;
  bool done_ ABSL_GUARDED_BY(cancel_mu_) = false;

  absl::Mutex mu_;
  std::optional<serving::SessionId> session_ ABSL_GUARDED_BY(mu_);
  std::optional<PeerSessions::Slot> peer_slot_ ABSL_GUARDED_BY(mu_);
  std::optional<ActiveSessionGuard> active_ ABSL_GUARDED_BY(mu_);
  bool close_requested_ ABSL_GUARDED_BY(mu_) = false;
  std::deque<Outgoing> writes_ ABSL_GUARDED_BY(mu_);  // front is in flight when writing_
  bool writing_ ABSL_GUARDED_BY(mu_) = false;
  Clock::time_point write_started_ ABSL_GUARDED_BY(mu_);  // of the write in flight
  bool preparing_turn_ ABSL_GUARDED_BY(mu_) = false;       // a turn is on the turn pool
  int turns_in_flight_ ABSL_GUARDED_BY(mu_) = 0;  // submitted, TurnEnd not yet received (0..2)
  // Flow control chosen by the first turn (Turn.acknowledge_events): credit
  // comes back with the client's Acks rather than with the transport's writes.
  std::optional<bool> acknowledged_events_ ABSL_GUARDED_BY(mu_);
  int64_t unacknowledged_ ABSL_GUARDED_BY(mu_) = 0;  // token events sent, not yet acknowledged
  // Last time the client did something: a message, a write taken by the
  // transport (or, acknowledged, an Ack), the stream's start.
  Clock::time_point last_client_activity_ ABSL_GUARDED_BY(mu_);
  Clock::time_point last_turn_activity_ ABSL_GUARDED_BY(mu_);  // the stream's start, a turn, a token, a TurnEnd
  bool had_turn_ ABSL_GUARDED_BY(mu_) = false;                 // a turn was ever handed to the turn pool
  bool reads_done_ ABSL_GUARDED_BY(mu_) = false;
  bool draining_ ABSL_GUARDED_BY(mu_) = false;
  bool cancelled_ ABSL_GUARDED_BY(mu_) = false;  // OnCancel ran
  bool cut_by_shutdown_ ABSL_GUARDED_BY(mu_) = false;
  bool expired_ ABSL_GUARDED_BY(mu_) = false;    // ended by ExpireIfIdle
  std::optional<grpc::Status> finish_status_ ABSL_GUARDED_BY(mu_);
  bool finish_called_ ABSL_GUARDED_BY(mu_) = false;
  Clock::time_point last_token_ ABSL_GUARDED_BY(mu_);
  bool have_last_token_ ABSL_GUARDED_BY(mu_) = false;
};

}  // namespace decoded::server

#endif  // DECODED_SERVER_GENERATE_REACTOR_H_
