// A bounded load test of the daemon: N concurrent Generate streams of M turns
// each, with random prompt lengths, random cancels and random client
// disconnects, checked afterwards.
//
// Every turn is a token-id turn (the first one of a stream opens with BOS)
// with greedy sampling, ignore_eos and a fixed max_new_tokens, so a turn's
// output is a function of its context alone. The run has three phases:
//   1. load: all streams at once, each on its own thread, within a deadline;
//   2. solo: each stream replayed alone, one at a time, up to the turn it
//      dropped (see ReplayTurn below for what a cancelled turn replays as);
//   3. checks, after each phase the daemon's gauges are scraped.
// Violations (each one named in LoadReport::violations):
//   - a turn that ended with neither a TurnEnd nor a gRPC status, or with an
//     error status the client did not cause (a disconnect's CANCELLED is
//     expected; DEADLINE_EXCEEDED means the daemon did not finish in time);
//   - a TurnEnd whose Usage breaks the protocol's accounting: generated
//     tokens != token events received, context != cached + prompt +
//     generated (a turn cut during prefill: context within [cached, cached +
//     prompt]), cached != the previous turn's context, a normal turn that
//     did not end with LENGTH after max_new_tokens;
//   - a turn whose greedy ids differ from the solo replay of the same
//     context (the context carries every earlier turn of its stream, as the
//     load run built it);
//   - decoded_sessions_active, decoded_bound_nodes, decoded_kv_bytes,
//     decoded_sessions_queued or decoded_workers_busy not back to 0 within
//     `settle_seconds` after the streams of a phase are gone, or
//     decoded_sessions_total{outcome="error"} grown over the run.
#ifndef DECODED_CLIENT_LOAD_GENERATOR_H_
#define DECODED_CLIENT_LOAD_GENERATOR_H_

#include <cstdint>
#include <string>
#include <vector>

#include "absl/status/statusor.h"
#include "proto/decoded.grpc.pb.h"

namespace decoded::client {

struct LoadOptions {
  int streams = 8;
  int turns = 3;                  // per stream
  int min_prompt_tokens = 4;      // per turn, uniform in [min, max]
  int max_prompt_tokens = 48;
  int max_new_tokens = 16;        // every turn
  double cancel_probability = 0.15;      // per turn: send Cancel mid-turn
  double disconnect_probability = 0.05;  // per turn: drop the stream mid-turn
  // Fraction of streams that use acknowledge_events flow control.
  double acknowledge_fraction = 0.5;
  uint64_t seed = 1;
  double deadline_seconds = 120;  // of each phase's streams
  double settle_seconds = 10;     // for the gauges to reach 0 after a phase
  std::string metrics_address;    // host:port of /metrics; empty: gauges not checked
  // Testing control: alters one expected id of the solo replay, so the run
  // must report a mismatch (shows that the comparison can fail).
  bool corrupt_reference_for_testing = false;
};

struct LoadReport {
  int streams = 0;
  int turns_sent = 0;
  int turns_completed = 0;   // ended with LENGTH (or STOP_TOKEN)
  int turns_cancelled = 0;   // ended with CANCELLED
  int cancels_sent = 0;
  int disconnects = 0;
  int turns_compared = 0;    // against their solo replay
  int64_t tokens = 0;        // token events received in the load phase
  double load_seconds = 0;
  double solo_seconds = 0;
  double tokens_per_second = 0;  // tokens / load_seconds
  double inter_token_ms_p50 = 0, inter_token_ms_p99 = 0;  // client-side arrival gaps within turns
  double ttft_ms_p50 = 0, ttft_ms_p99 = 0;                // turn sent -> first token event
  bool gauges_checked = false;
  std::vector<std::string> violations;

  std::string ToJson() const;
};

// Runs the test against the daemon behind `channel`. A non-OK status means the
// test could not run (daemon unreachable, options that do not fit the
// session's context); violations found by a run are in the report.
absl::StatusOr<LoadReport> RunLoadTest(const std::shared_ptr<grpc::Channel>& channel, const LoadOptions& options);

}  // namespace decoded::client

#endif  // DECODED_CLIENT_LOAD_GENERATOR_H_
