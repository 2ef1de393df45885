// The OpenAI-compatible HTTP API's routes (issue 19), as vLLM and
// llama-server serve them, on server/http/http_server.h:
//
//   GET /health          200 {"status":"ok"} while the daemon serves (the
//                        gRPC health service's SERVING), else 503 with an
//                        OpenAI error naming why (loading, draining, ...).
//                        No token needed: it is what probes call.
//   GET /v1/models       the served model as an OpenAI model list:
//                        {"object":"list","data":[{"id","object":"model",
//                        "created","owned_by":"decoded","max_model_len"}]}.
//   GET /v1/models/{id}  that model, or 404 for another id.
//   GET /metrics         the daemon's Prometheus metrics (text format
//                        0.0.4), the same body as --metrics_listen's, on
//                        the API port as vLLM, SGLang and TGI serve them:
//                        what the Gateway API Inference Extension's
//                        endpoint picker scrapes by default. Bearer token:
//                        --metrics_auth_token, not --auth_token.
//   POST /v1/completions, POST /v1/chat/completions
//                        server/http/openai_completions.h.
//
// Errors are OpenAI's error object, {"error":{"message","type","param",
// "code"}}, with the HTTP status: 401 without the bearer token
// (--auth_token; type "authentication_error"), 404 for an unknown path or
// model, 405 for a known path with another method (with "Allow"), 503 while
// not serving.
#ifndef DECODED_SERVER_HTTP_OPENAI_ROUTES_H_
#define DECODED_SERVER_HTTP_OPENAI_ROUTES_H_

#include <cstdint>
#include <functional>
#include <memory>
#include <string>

#include "absl/functional/any_invocable.h"
#include "absl/status/status.h"
#include "server/http/http_types.h"
#include "server/http/openai_completions.h"

namespace decoded::server::http {

// Whether the daemon serves now, and if not why ("loading the model",
// "draining", ...): the gRPC health service's state.
struct ServingState {
  bool serving = false;
  std::string reason;
};

struct ServedModel {
  std::string id;                // what requests name in "model" (--served_model_name, or the GGUF file's stem)
  int64_t created = 0;           // Unix seconds: when the daemon loaded it
  int32_t max_model_len = 0;     // a session's context length, tokens
};

struct OpenAiRoutesOptions {
  std::string auth_token;  // non-empty: "Authorization: Bearer <token>" required on /v1/*
  std::function<ServingState()> serving_state;
  // The model once loaded; unset (or returning an empty id) while loading.
  std::function<ServedModel()> served_model;
  // The completion routes; null: they answer 404.
  std::shared_ptr<OpenAiCompletions> completions;
  // The body of GET /metrics; unset: 404. It runs through `run` (a scrape
  // serializes some 500 series, about 0.2 ms on a Zen 4 core: kept off the
  // io thread, which every open stream's chunks pass through; the daemon
  // gives it a pool of its own, not the turn pool); a refused submit
  // answers 503.
  std::function<std::string()> metrics_text;
  std::function<absl::Status(absl::AnyInvocable<void()>)> run;
  std::string metrics_auth_token;  // non-empty: "Authorization: Bearer <token>" required on /metrics
};

// The handler for HttpServer::Start.
HttpHandler OpenAiRoutes(OpenAiRoutesOptions options);

}  // namespace decoded::server::http

#endif  // DECODED_SERVER_HTTP_OPENAI_ROUTES_H_
