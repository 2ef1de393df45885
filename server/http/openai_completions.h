// POST /v1/completions and /v1/chat/completions on the serving engine.
//
// An HTTP request is one turn of a session that lives as long as the
// request: the session opens when the request is parsed, the turn is
// submitted, and the session closes when the reply is complete (its KV
// blocks go back to the pool at once; with the prefix cache their full
// blocks stay cached, so a conversation sent again, longer, maps them:
// docs/serving.md). Nothing heavy runs on the HTTP io threads: parsing,
// tokenizing (SubmitTurn) and building the reply run on the daemon's turn
// pool (--turn_threads); a full pool answers 429.
//
// Status mapping (OpenAI's error object, server/http/openai_error.h):
//   400 invalid_request_error  malformed JSON, a field out of range (param
//                              names it), a prompt longer than the context
//   404 not_found_error        "model" is not the served model
//   429 rate_limit_error       max_sessions open, the turn queue or the
//                              turn pool full, the KV pool exhausted
//   500 server_error           a step failed (non-finite logits, ...)
//   503 server_error           loading, draining, the turn cut by shutdown
//
// The reply's "usage" has prompt_tokens, completion_tokens, total_tokens and
// prompt_tokens_details.cached_tokens (KV the prefix cache mapped). Log
// probabilities are natural logs at temperature 1 (the engine's); a token's
// text in them is the token detokenized alone (special tokens rendered), its
// "bytes" that text's UTF-8.
#ifndef DECODED_SERVER_HTTP_OPENAI_COMPLETIONS_H_
#define DECODED_SERVER_HTTP_OPENAI_COMPLETIONS_H_

#include <functional>
#include <memory>
#include <string>

#include "absl/functional/any_invocable.h"
#include "absl/status/status.h"
#include "absl/time/time.h"
#include "engine/serving/engine.h"
#include "server/http/http_types.h"
#include "server/http/openai_request.h"

namespace decoded::server::http {

struct CompletionsOptions {
  // The engine; null while the model loads (requests then get 503).
  std::function<serving::Engine*()> engine;
  // The id requests must name in "model".
  std::function<std::string()> served_model_name;
  // Runs a task off the io threads (the turn pool); RESOURCE_EXHAUSTED when
  // its queue is full (the request then gets 429).
  std::function<absl::Status(absl::AnyInvocable<void()>)> run;
  // Why the daemon does not serve now ("" while it serves): 503 naming it.
  std::function<std::string()> not_serving_reason;
  // The daemon's per-turn metrics, as the gRPC API records them (each may be
  // null): a token generated, the gap since the turn's previous token
  // (seconds), a turn's end, a request refused for want of room (429), a
  // session opened and closed, with its turn's finish reason (kError when
  // the turn was refused) (decoded_sessions_active counts HTTP sessions as
  // gRPC ones: the autoscaler reads it).
  std::function<void()> on_token;
  std::function<void(double)> on_inter_token;
  std::function<void(const serving::TurnEnd&)> on_turn_end;
  std::function<void()> on_rejected;
  std::function<void()> on_session_opened;
  // The turn's finish reason and, with kError, its error's code.
  std::function<void(serving::FinishReason, absl::StatusCode)> on_session_closed;
  // The client address's share of --max_sessions_per_peer (shared with its
  // gRPC sessions), held until the session closes; an error (429) when the
  // address holds its limit. `peer` is HttpRequest::peer. Unset: no limit.
  std::function<absl::StatusOr<std::shared_ptr<void>>(const std::string& peer)> acquire_peer_slot;
};

// The handler of both routes; `endpoint` picks which.
class OpenAiCompletions {
 public:
  explicit OpenAiCompletions(CompletionsOptions options);
  void Handle(std::shared_ptr<HttpExchange> exchange, OpenAiEndpoint endpoint) const;

  // Requests from Handle until their session is released (or they failed
  // before opening one). The daemon waits for none to be left before the
  // engine goes (after BeginShutdown has ended their turns).
  int in_flight() const;
  // True when none is left by `deadline`.
  bool WaitUntilIdle(absl::Time deadline) const;

  struct State;

 private:
  std::shared_ptr<State> state_;
};

// An engine status as OpenAI's error object with the matching HTTP status;
// "param" names the request field the parser or an engine check refused
// (engine/serving/turn_field.h), in `endpoint`'s names.
HttpResponse StatusToOpenAiError(const absl::Status& status, OpenAiEndpoint endpoint);

}  // namespace decoded::server::http

#endif  // DECODED_SERVER_HTTP_OPENAI_COMPLETIONS_H_
