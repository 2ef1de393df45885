#include "server/http/openai_completions.h"

#include <chrono>
#include <random>
#include <utility>
#include <vector>

#include "absl/strings/str_cat.h"
#include "absl/synchronization/mutex.h"
#include "absl/time/clock.h"
#include "nlohmann/json.hpp"
#include "engine/serving/turn_field.h"
#include "server/http/openai_error.h"

namespace decoded::server::http {

struct OpenAiCompletions::State {
  explicit State(CompletionsOptions o) : options(std::move(o)) {}
  const CompletionsOptions options;
  mutable absl::Mutex mu;
  int in_flight ABSL_GUARDED_BY(mu) = 0;
};

namespace {

// Counts one request in flight while any copy is held (the pool task, then
// the turn's sink until the engine released its session).
class InFlight {
 public:
  explicit InFlight(std::shared_ptr<OpenAiCompletions::State> state) : state_(std::move(state)) {
    absl::MutexLock lock(&state_->mu);
    ++state_->in_flight;
  }
  ~InFlight() {
    absl::MutexLock lock(&state_->mu);
    --state_->in_flight;
  }
  InFlight(const InFlight&) = delete;
  InFlight& operator=(const InFlight&) = delete;

 private:
  std::shared_ptr<OpenAiCompletions::State> state_;
};

using nlohmann::json;
using serving::FinishReason;

std::string RandomId(absl::string_view prefix) {
  static constexpr char kHex[] = "0123456789abcdef";
  thread_local std::mt19937_64 rng(std::random_device{}());
  std::string id(prefix);
  uint64_t a = rng(), b = rng();
  for (int i = 0; i < 16; ++i, a >>= 4) id.push_back(kHex[a & 15]);
  for (int i = 0; i < 8; ++i, b >>= 4) id.push_back(kHex[b & 15]);
  return id;
}

HttpResponse JsonReply(const json& body) {
  HttpResponse r;
  r.body = body.dump(-1, ' ', false, json::error_handler_t::replace);
  return r;
}

const char* FinishReasonName(FinishReason reason) {
  switch (reason) {
    case FinishReason::kStopToken:
    case FinishReason::kStopSequence:
      return "stop";
    case FinishReason::kLength:
    case FinishReason::kContextFull:
      return "length";
    default:
      return "abort";  // vLLM's name for a turn ended from outside
  }
}

json Usage(const serving::TurnUsage& u) {
  return {{"prompt_tokens", u.prompt_tokens},
          {"completion_tokens", u.generated_tokens},
          {"total_tokens", u.prompt_tokens + u.generated_tokens},
          {"prompt_tokens_details", {{"cached_tokens", u.cached_tokens}}}};
}

// Characters (code points) of valid UTF-8: its bytes less continuation
// bytes. OpenAI's text_offset counts characters of the text.
size_t CodePoints(absl::string_view utf8) {
  size_t n = 0;
  for (const char c : utf8) n += (static_cast<unsigned char>(c) & 0xC0) != 0x80;
  return n;
}

// A token's text alone (special tokens rendered), for log probabilities.
std::string TokenText(const serving::Engine& engine, int32_t id) {
  absl::StatusOr<std::string> t = engine.Detokenize({id}, /*render_special=*/true);
  return t.ok() ? *std::move(t) : std::string();
}

json Bytes(const std::string& s) {
  json b = json::array();
  for (unsigned char c : s) b.push_back(static_cast<int>(c));
  return b;
}

// One turn of an HTTP request: collects its events, answers at its end,
// and closes the session.
class HttpTurn : public serving::TurnSink, public std::enable_shared_from_this<HttpTurn> {
 public:
  HttpTurn(const CompletionsOptions* options, std::shared_ptr<InFlight> in_flight,
           std::shared_ptr<HttpExchange> exchange, serving::Engine* engine, serving::SessionId session,
           OpenAiRequest request, std::string model, std::string echo_text, std::vector<int32_t> prompt_ids,
           std::shared_ptr<void> peer_slot)
      : options_(options),
        peer_slot_(std::move(peer_slot)),
        in_flight_(std::move(in_flight)),
        exchange_(std::move(exchange)),
        engine_(engine),
        session_(session),
        request_(std::move(request)),
        model_(std::move(model)),
        echo_text_(std::move(echo_text)),
        prompt_ids_(std::move(prompt_ids)),
        id_(RandomId(request_.endpoint == OpenAiEndpoint::kChatCompletions ? "chatcmpl-" : "cmpl-")),
        created_(absl::ToUnixSeconds(absl::Now())) {}

  // Called once SubmitTurn accepted the turn: the sink owns itself until the
  // engine releases its session (Finish hands that to CloseSession).
  void KeepAlive() { self_ = shared_from_this(); }
  void Release() { self_.reset(); }

  // A streamed reply: its headers, the chat role's first chunk, and a
  // client that goes away cancels the turn.
  void BeginStream() {
    streamed_chars_ = CodePoints(echo_text_);  // the echoed prompt comes first
    exchange_->StartStream(200, "text/event-stream");
    if (request_.endpoint == OpenAiEndpoint::kChatCompletions) {
      json choice = {{"index", 0}, {"delta", {{"role", "assistant"}, {"content", ""}}}, {"logprobs", nullptr},
                     {"finish_reason", nullptr}};
      exchange_->Write(Event(Chunk(std::move(choice))));
    } else if (request_.echo) {
      exchange_->Write(Event(Chunk(CompletionChoice(echo_text_, json(nullptr), json(nullptr)))));
    }
  }

  // After SubmitTurn accepted the turn: events that came before go out now.
  void StreamAccepted() {
    bool ended;
    {
      absl::MutexLock lock(&mu_);
      BeginStream();
      started_ = true;
      for (const serving::TokenEvent& e : pending_) StreamToken(e);
      pending_.clear();
      ended = end_pending_;
    }
    if (ended) ScheduleFinish();
  }

  void OnToken(const serving::TokenEvent& event) override {
    // Calls for one session never overlap: last_token_ needs no lock.
    const auto now = std::chrono::steady_clock::now();
    if (options_->on_token) options_->on_token();
    if (options_->on_inter_token && have_last_token_) {
      options_->on_inter_token(std::chrono::duration<double>(now - last_token_).count());
    }
    last_token_ = now;
    have_last_token_ = true;
    if (!request_.stream) {
      text_ += event.text;
      if (request_.logprobs) events_.push_back(event);
      engine_->EventsConsumed(session_, 1);  // a whole reply: nothing to pace
      return;
    }
    absl::MutexLock lock(&mu_);
    if (!started_) {
      pending_.push_back(event);
      return;
    }
    StreamToken(event);
  }

  void StreamToken(const serving::TokenEvent& event) ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_) {
    if (event.text.empty() && !request_.logprobs) {
      engine_->EventsConsumed(session_, 1);
      return;
    }
    // The engine steps this session again once the socket took the chunk
    // (or the connection ended): a client that reads slowly is parked after
    // --max_unconsumed_events chunks instead of buffering without bound.
    serving::Engine* engine = engine_;
    const serving::SessionId session = session_;
    exchange_->Write(Event(Chunk(TokenChoice(event))), [engine, session](bool) { engine->EventsConsumed(session, 1); });
  }

  void OnTurnEnd(const serving::TurnEnd& end) override {
    if (options_->on_turn_end) options_->on_turn_end(end);
    {
      absl::MutexLock lock(&mu_);
      end_ = end;
      if (!request_.stream) text_ += end.text;
      if (request_.stream && !started_) {
        end_pending_ = true;  // StreamAccepted finishes it
        return;
      }
    }
    ScheduleFinish();
  }

  // The reply (detokenizing log probabilities, the JSON) is built on the
  // turn pool, not on the engine's worker.
  void ScheduleFinish() {
    std::shared_ptr<HttpTurn> self = shared_from_this();
    absl::Status queued = options_->run([self] { self->Finish(); });
    if (!queued.ok()) Finish();
  }

 private:
  void Finish() {
    // The session stops counting against --max_sessions and the address's
    // share before the client can see its reply end: a client that sends
    // its next request the moment it has this reply must find room (it got
    // 429 now and then when the reply went first). The sink lives on until
    // the engine released the session; `this` is held by Finish's caller.
    if (options_->on_session_closed) options_->on_session_closed(end_.reason, end_.error.code());
    peer_slot_.reset();
    engine_->CloseSession(session_, [self = std::move(self_)] {});
    if (request_.stream) {
      FinishStream();
    } else {
      exchange_->Respond(Reply());
    }
  }

  // The stream's last events: the finish reason (with any text the turn
  // held back), an error event for a failed turn (vLLM's form), the usage
  // chunk when asked (choices empty), then [DONE].
  void FinishStream() {
    if (end_.reason == FinishReason::kError) {
      const HttpResponse error =
          StatusToOpenAiError(end_.error.ok() ? absl::InternalError("the turn failed") : end_.error, request_.endpoint);
      exchange_->Write(absl::StrCat("data: ", error.body, "\n\n"));
    }
    json choice;
    if (request_.endpoint == OpenAiEndpoint::kChatCompletions) {
      json delta = json::object();
      if (!end_.text.empty()) delta["content"] = end_.text;
      choice = {{"index", 0}, {"delta", std::move(delta)}, {"logprobs", nullptr}};
    } else {
      choice = CompletionChoice(end_.text, json(nullptr), json(nullptr));
    }
    choice["finish_reason"] = FinishReasonName(end_.reason);
    exchange_->Write(Event(Chunk(std::move(choice))));
    if (request_.include_usage) {
      json usage_chunk = Chunk(json(nullptr));
      usage_chunk["choices"] = json::array();
      usage_chunk["usage"] = Usage(end_.usage);
      exchange_->Write(Event(usage_chunk));
    }
    exchange_->Write("data: [DONE]\n\n");
    exchange_->EndStream();
  }

  static std::string Event(const json& chunk) {
    return absl::StrCat("data: ", chunk.dump(-1, ' ', false, json::error_handler_t::replace), "\n\n");
  }

  // A streamed chunk around `choice` (none: null); "usage": null on every
  // chunk but the last when include_usage, as OpenAI sends them.
  json Chunk(json choice) const {
    json chunk = {{"id", id_},
                  {"object", request_.endpoint == OpenAiEndpoint::kChatCompletions ? "chat.completion.chunk"
                                                                                      : "text_completion"},
                  {"created", created_},
                  {"model", model_},
                  {"choices", choice.is_null() ? json::array() : json::array({std::move(choice)})}};
    if (request_.include_usage) chunk["usage"] = nullptr;
    return chunk;
  }

  static json CompletionChoice(const std::string& text, json logprobs, json finish_reason) {
    return {{"index", 0}, {"text", text}, {"logprobs", std::move(logprobs)}, {"finish_reason", std::move(finish_reason)}};
  }

  // One token's streamed choice, with its log probabilities when asked.
  json TokenChoice(const serving::TokenEvent& e) const {
    if (request_.endpoint == OpenAiEndpoint::kChatCompletions) {
      return {{"index", 0},
              {"delta", {{"content", e.text}}},
              {"logprobs", request_.logprobs ? json{{"content", json::array({ChatTokenLogprob(e)})}} : json(nullptr)},
              {"finish_reason", nullptr}};
    }
    json lp = nullptr;
    if (request_.logprobs) {
      json top = json::object();
      for (const TokenLogprob& alt : e.top) top[TokenText(*engine_, alt.id)] = alt.logprob;
      lp = {{"tokens", json::array({TokenText(*engine_, e.id)})},
            {"token_logprobs", json::array({e.logprob})},
            {"top_logprobs", json::array({std::move(top)})},
            {"text_offset", json::array({streamed_chars_})}};
    }
    streamed_chars_ += CodePoints(e.text);
    return CompletionChoice(e.text, std::move(lp), json(nullptr));
  }

  json ChatTokenLogprob(const serving::TokenEvent& e) const {
    const std::string t = TokenText(*engine_, e.id);
    json top = json::array();
    for (const TokenLogprob& alt : e.top) {
      const std::string at = TokenText(*engine_, alt.id);
      top.push_back({{"token", at}, {"logprob", alt.logprob}, {"bytes", Bytes(at)}});
    }
    return {{"token", t}, {"logprob", e.logprob}, {"bytes", Bytes(t)}, {"top_logprobs", std::move(top)}};
  }

  HttpResponse Reply() const {
    switch (end_.reason) {
      case FinishReason::kError:
        return StatusToOpenAiError(end_.error.ok() ? absl::InternalError("the turn failed") : end_.error,
                                   request_.endpoint);
      case FinishReason::kShutdown:
        return OpenAiError(503, "server_error", "the server is shutting down: the turn was cut short", "",
                           "unavailable");
      case FinishReason::kCancelled:
        return OpenAiError(503, "server_error", "the turn was cancelled", "", "cancelled");
      default:
        break;
    }
    json choice = {{"index", 0}, {"finish_reason", FinishReasonName(end_.reason)}};
    if (request_.endpoint == OpenAiEndpoint::kChatCompletions) {
      choice["message"] = {{"role", "assistant"}, {"content", text_}};
      choice["logprobs"] = request_.logprobs ? ChatLogprobs() : json(nullptr);
    } else {
      choice["text"] = request_.echo ? echo_text_ + text_ : text_;
      choice["logprobs"] = request_.logprobs ? CompletionLogprobs() : json(nullptr);
    }
    return JsonReply({{"id", id_},
                      {"object", request_.endpoint == OpenAiEndpoint::kChatCompletions ? "chat.completion"
                                                                                          : "text_completion"},
                      {"created", created_},
                      {"model", model_},
                      {"choices", json::array({std::move(choice)})},
                      {"usage", Usage(end_.usage)}});
  }

  // Chat: {"content": [{"token", "logprob", "bytes", "top_logprobs": [...]}]}.
  json ChatLogprobs() const {
    json content = json::array();
    for (const serving::TokenEvent& e : events_) content.push_back(ChatTokenLogprob(e));
    return {{"content", std::move(content)}};
  }

  // Completions (the legacy format): tokens, token_logprobs, top_logprobs
  // (a token -> logprob map per position) and text_offset; with echo the
  // prompt's tokens first (the first has no logprob: null; the prompt's
  // positions have no alternatives: top_logprobs null).
  json CompletionLogprobs() const {
    json tokens = json::array(), token_logprobs = json::array(), top_logprobs = json::array(),
         offsets = json::array();
    // text_offset: where in the reply's text (in characters) each token's
    // text starts; a byte of a character that a later token completes is at
    // that character's place. Special tokens render nothing in the text
    // (their names are in "tokens").
    std::vector<int32_t> ids;
    if (request_.echo) ids = prompt_ids_;
    for (const serving::TokenEvent& e : events_) ids.push_back(e.id);
    absl::StatusOr<std::vector<std::string>> pieces = engine_->DetokenizePieces(ids);
    size_t offset = 0;
    size_t at = 0;
    auto add = [&](int32_t id, json logprob, json top) {
      tokens.push_back(TokenText(*engine_, id));
      token_logprobs.push_back(std::move(logprob));
      top_logprobs.push_back(std::move(top));
      offsets.push_back(offset);
      if (pieces.ok() && at < pieces->size()) offset += CodePoints((*pieces)[at]);
      ++at;
    };
    if (request_.echo) {
      for (size_t i = 0; i < prompt_ids_.size(); ++i) {
        json lp = i == 0 || i - 1 >= end_.prompt_logprobs.size() ? json(nullptr) : json(end_.prompt_logprobs[i - 1]);
        add(prompt_ids_[i], std::move(lp), json(nullptr));
      }
      // The reply's text starts with the prompt as sent, which the
      // generated tokens follow.
      offset = CodePoints(echo_text_);
    }
    for (const serving::TokenEvent& e : events_) {
      json top = json::object();
      for (const TokenLogprob& alt : e.top) top[TokenText(*engine_, alt.id)] = alt.logprob;
      add(e.id, e.logprob, std::move(top));
    }
    return {{"tokens", std::move(tokens)},
            {"token_logprobs", std::move(token_logprobs)},
            {"top_logprobs", std::move(top_logprobs)},
            {"text_offset", std::move(offsets)}};
  }

  const CompletionsOptions* const options_;  // outlived: in_flight_ holds the state that owns it
  std::shared_ptr<void> peer_slot_;  // the client address's session count, until the session goes
  const std::shared_ptr<InFlight> in_flight_;
  const std::shared_ptr<HttpExchange> exchange_;
  serving::Engine* const engine_;
  const serving::SessionId session_;
  const OpenAiRequest request_;
  const std::string model_;
  const std::string echo_text_;
  const std::vector<int32_t> prompt_ids_;
  const std::string id_;
  const int64_t created_;
  std::string text_;
  std::vector<serving::TokenEvent> events_;
  serving::TurnEnd end_;
  std::shared_ptr<HttpTurn> self_;
  std::chrono::steady_clock::time_point last_token_;
  bool have_last_token_ = false;
  mutable size_t streamed_chars_ = 0;  // completions' text_offset when streaming (after any echo)
  // Streaming: events before StreamAccepted wait here (the turn may run
  // before the stream's headers are queued).
  absl::Mutex mu_;
  bool started_ ABSL_GUARDED_BY(mu_) = false;
  bool end_pending_ ABSL_GUARDED_BY(mu_) = false;
  std::vector<serving::TokenEvent> pending_ ABSL_GUARDED_BY(mu_);
};

// The request field an engine check refused, in the API's names (the chat
// endpoint's input is its messages, the completions endpoint's its prompt).
std::string EngineParam(const absl::Status& status, OpenAiEndpoint endpoint) {
  const std::optional<serving::TurnField> field = serving::TurnFieldOf(status);
  if (!field) return "";
  switch (*field) {
    case serving::TurnField::kInput:
      return endpoint == OpenAiEndpoint::kChatCompletions ? "messages" : "prompt";
    case serving::TurnField::kStopSequences:
      return "stop";
    case serving::TurnField::kStopTokenIds:
      return "stop_token_ids";
    case serving::TurnField::kMaxNewTokens:
      return endpoint == OpenAiEndpoint::kChatCompletions ? "max_completion_tokens" : "max_tokens";
    case serving::TurnField::kLogitBias:
      return "logit_bias";
  }
  return "";
}

}  // namespace

HttpResponse StatusToOpenAiError(const absl::Status& status, OpenAiEndpoint endpoint) {
  const std::string message(status.message());
  std::string param = ErrorParam(status);
  if (param.empty()) param = EngineParam(status, endpoint);
  switch (status.code()) {
    case absl::StatusCode::kInvalidArgument:
    case absl::StatusCode::kOutOfRange:
      return OpenAiError(400, "invalid_request_error", message, param);
    case absl::StatusCode::kFailedPrecondition:
      return OpenAiError(400, "invalid_request_error", message, param, "failed_precondition");
    case absl::StatusCode::kNotFound:
      return OpenAiError(404, "not_found_error", message, param);
    case absl::StatusCode::kResourceExhausted:
      return OpenAiError(429, "rate_limit_error", message, "", "resource_exhausted");
    case absl::StatusCode::kUnauthenticated:
      return OpenAiError(401, "authentication_error", message, "", "invalid_api_key");
    case absl::StatusCode::kUnavailable:
      return OpenAiError(503, "server_error", message, "", "unavailable");
    default:
      return OpenAiError(500, "server_error", message);
  }
}

namespace {

// On the turn pool: parse, open a session, submit the turn.
void Start(const std::shared_ptr<OpenAiCompletions::State>& state, std::shared_ptr<InFlight> in_flight,
           std::shared_ptr<HttpExchange> exchange, OpenAiEndpoint endpoint) {
  const CompletionsOptions& options = state->options;
  absl::StatusOr<OpenAiRequest> parsed = ParseOpenAiRequest(exchange->request().body, endpoint);
  if (!parsed.ok()) return exchange->Respond(StatusToOpenAiError(parsed.status(), endpoint));
  OpenAiRequest& req = *parsed;
  const std::string model = options.served_model_name();
  if (req.model != model) {
    return exchange->Respond(OpenAiError(404, "not_found_error",
                                         absl::StrCat("the model '", req.model,
                                                      "' does not exist; this server serves '", model, "'"),
                                         "model", "model_not_found"));
  }
  serving::Engine* engine = options.engine();
  if (engine == nullptr) {
    return exchange->Respond(OpenAiError(503, "server_error", "not serving: loading the model", "", "unavailable"));
  }
  ResolveMaxTokens(req, engine->ModelInfo().session_context_length);

  // Echo needs the prompt's text; with log probabilities also its token ids
  // (a text prompt is tokenized here as the engine would: BOS first, as the
  // session is new, special tokens parsed).
  std::string echo_text;
  std::vector<int32_t> prompt_ids;
  serving::TurnRequest& turn = req.turn;
  if (req.echo) {
    if (turn.kind == serving::TurnRequest::InputKind::kTokens) {
      absl::StatusOr<std::string> text = engine->Detokenize(turn.tokens, /*render_special=*/false);
      if (!text.ok()) return exchange->Respond(StatusToOpenAiError(text.status(), endpoint));
      echo_text = *std::move(text);
      prompt_ids = turn.tokens;
    } else {
      echo_text = turn.text;
      if (req.logprobs) {
        absl::StatusOr<std::vector<int32_t>> ids = engine->Tokenize(turn.text, /*add_bos=*/true, /*parse_special=*/true);
        if (!ids.ok()) return exchange->Respond(StatusToOpenAiError(ids.status(), endpoint));
        turn.kind = serving::TurnRequest::InputKind::kTokens;
        turn.tokens = *std::move(ids);
        turn.text.clear();
        prompt_ids = turn.tokens;
      }
    }
  }

  auto refused = [&](const absl::Status& s) {
    if (absl::IsResourceExhausted(s) && options.on_rejected) options.on_rejected();
    exchange->Respond(StatusToOpenAiError(s, endpoint));
  };
  std::shared_ptr<void> peer_slot;
  if (options.acquire_peer_slot) {
    absl::StatusOr<std::shared_ptr<void>> slot = options.acquire_peer_slot(exchange->request().peer);
    if (!slot.ok()) return refused(slot.status());
    peer_slot = *std::move(slot);
  }
  absl::StatusOr<serving::SessionId> session = engine->OpenSession();
  if (!session.ok()) return refused(session.status());
  // Counted from here, as the gRPC API counts a session from OpenSession.
  if (options.on_session_opened) options.on_session_opened();
  auto sink = std::make_shared<HttpTurn>(&options, std::move(in_flight), exchange, engine, *session, req, model,
                                         std::move(echo_text), std::move(prompt_ids), std::move(peer_slot));
  sink->KeepAlive();
  if (absl::Status s = engine->SubmitTurn(*session, req.turn, sink.get()); !s.ok()) {
    sink->Release();
    if (options.on_session_closed) options.on_session_closed(serving::FinishReason::kError, s.code());
    engine->CloseSession(*session, [sink] {});
    return refused(s);
  }
  // A client that goes away cancels the turn (streamed or not: a whole
  // reply nobody waits for would still run to max_tokens).
  exchange->OnClientGone([engine, session = *session] { (void)engine->CancelTurn(session); });
  // Streaming starts once the turn is accepted, so a refused one is still a
  // plain error reply.
  if (req.stream) sink->StreamAccepted();
}

}  // namespace

OpenAiCompletions::OpenAiCompletions(CompletionsOptions options)
    : state_(std::make_shared<State>(std::move(options))) {}

void OpenAiCompletions::Handle(std::shared_ptr<HttpExchange> exchange, OpenAiEndpoint endpoint) const {
  if (const std::string why = state_->options.not_serving_reason(); !why.empty()) {
    exchange->Respond(OpenAiError(503, "server_error", absl::StrCat("not serving: ", why), "", "unavailable"));
    return;
  }
  auto in_flight = std::make_shared<InFlight>(state_);
  std::shared_ptr<HttpExchange> held = exchange;
  absl::Status queued = state_->options.run(
      [state = state_, in_flight = std::move(in_flight), exchange = std::move(held), endpoint]() mutable {
        Start(state, std::move(in_flight), std::move(exchange), endpoint);
      });
  if (!queued.ok()) {
    if (state_->options.on_rejected) state_->options.on_rejected();
    exchange->Respond(StatusToOpenAiError(queued, endpoint));
  }
}

int OpenAiCompletions::in_flight() const {
  absl::MutexLock lock(&state_->mu);
  return state_->in_flight;
}

bool OpenAiCompletions::WaitUntilIdle(absl::Time deadline) const {
  absl::MutexLock lock(&state_->mu);
  return state_->mu.AwaitWithDeadline(absl::Condition(+[](int* n) { return *n == 0; }, &state_->in_flight), deadline);
}

}  // namespace decoded::server::http
