#include "server/http/openai_routes.h"

#include "absl/strings/string_view.h"
#include <optional>
#include <utility>

#include "absl/strings/ascii.h"
#include "absl/strings/match.h"
#include "absl/strings/str_cat.h"
#include "nlohmann/json.hpp"
#include "server/bearer_token.h"
#include "server/http/openai_error.h"

namespace decoded::server::http {
namespace {

using nlohmann::json;

HttpResponse Json(int status, const json& body) {
  HttpResponse r;
  r.status = status;
  r.body = body.dump(-1, ' ', false, json::error_handler_t::replace);
  return r;
}

json ModelObject(const ServedModel& m) {
  return {{"id", m.id}, {"object", "model"}, {"created", m.created}, {"owned_by", "decoded"},
          {"max_model_len", m.max_model_len}};
}

class Routes {
 public:
  explicit Routes(OpenAiRoutesOptions options) : options_(std::move(options)) {}

  // The reply, or nullopt when a completion route took the exchange.
  std::optional<HttpResponse> Handle(const std::shared_ptr<HttpExchange>& exchange) const {
    const HttpRequest& req = exchange->request();
    // One trailing slash is the route without it ("/v1/models/" lists the
    // models, as FastAPI servers such as vLLM answer it after a redirect):
    // an id's own '/' arrives percent-encoded, so none ends a path.
    absl::string_view path = req.path;
    if (path.size() > 1 && absl::EndsWith(path, "/")) path.remove_suffix(1);
    if (path == "/health") {
      if (req.method != "GET" && req.method != "HEAD") return MethodNotAllowed(req, "GET, HEAD");
      const ServingState s = options_.serving_state();
      if (!s.serving) return OpenAiError(503, "server_error", absl::StrCat("not serving: ", s.reason), "", "unavailable");
      return Json(200, {{"status", "ok"}});
    }
    if (path == "/metrics" && options_.metrics_text) {
      if (req.method != "GET" && req.method != "HEAD") return MethodNotAllowed(req, "GET, HEAD");
      if (!options_.metrics_auth_token.empty() &&
          !BearerTokenMatches(req.header("authorization"), options_.metrics_auth_token)) {
        return Unauthorized(
            "missing or wrong token: send \"Authorization: Bearer <token>\" (the daemon's --metrics_auth_token)");
      }
      const absl::Status submitted = options_.run([exchange, text = options_.metrics_text] {
        HttpResponse r;
        r.content_type = "text/plain; version=0.0.4; charset=utf-8";
        r.body = text();  // HEAD too: the server sends its length, not its bytes
        exchange->Respond(std::move(r));
      });
      if (submitted.ok()) return std::nullopt;
      return OpenAiError(503, "server_error", absl::StrCat("metrics not rendered: ", submitted.message()), "",
                         "unavailable");
    }
    if (!absl::StartsWith(path, "/v1/")) return NotFound(req);
    if (!options_.auth_token.empty() && !BearerTokenMatches(req.header("authorization"), options_.auth_token)) {
      return Unauthorized("missing or wrong API key: send \"Authorization: Bearer <token>\" (the daemon's --auth_token)");
    }
    if (options_.completions != nullptr && (path == "/v1/completions" || path == "/v1/chat/completions")) {
      if (req.method != "POST") return MethodNotAllowed(req, "POST");
      options_.completions->Handle(exchange, path == "/v1/completions" ? OpenAiEndpoint::kCompletions
                                                                       : OpenAiEndpoint::kChatCompletions);
      return std::nullopt;
    }
    if (path == "/v1/models" || absl::StartsWith(path, "/v1/models/")) {
      if (req.method != "GET" && req.method != "HEAD") return MethodNotAllowed(req, "GET, HEAD");
      const ServedModel m = options_.served_model ? options_.served_model() : ServedModel{};
      if (m.id.empty()) {
        const ServingState s = options_.serving_state();
        return OpenAiError(503, "server_error", absl::StrCat("no model yet: ", s.reason), "", "unavailable");
      }
      if (path == "/v1/models") return Json(200, {{"object", "list"}, {"data", json::array({ModelObject(m)})}});
      // Percent-encoded as clients send an id with '/' or ' ' in it.
      const std::string id = PercentDecoded(absl::string_view(path).substr(absl::string_view("/v1/models/").size()));
      if (id != m.id) {
        return OpenAiError(404, "not_found_error", absl::StrCat("the model '", id, "' does not exist; this server serves '",
                                                                m.id, "'"),
                           "model", "model_not_found");
      }
      return Json(200, ModelObject(m));
    }
    return NotFound(req);
  }

 private:
  // RFC 6750: a 401 names the scheme it wants.
  static HttpResponse Unauthorized(absl::string_view message) {
    HttpResponse r = OpenAiError(401, "authentication_error", message, "", "invalid_api_key");
    r.headers.emplace_back("WWW-Authenticate", "Bearer");
    return r;
  }
  // "%2F" -> "/", "%20" -> " "; a malformed escape is kept as it is.
  static std::string PercentDecoded(absl::string_view s) {
    std::string out;
    for (size_t i = 0; i < s.size(); ++i) {
      int hi = 0, lo = 0;
      if (s[i] == '%' && i + 2 < s.size() && Hex(s[i + 1], &hi) && Hex(s[i + 2], &lo)) {
        out.push_back(static_cast<char>(hi * 16 + lo));
        i += 2;
      } else {
        out.push_back(s[i]);
      }
    }
    return out;
  }
  static bool Hex(char c, int* v) {
    if (c >= '0' && c <= '9') {
      *v = c - '0';
    } else if (absl::ascii_isxdigit(c)) {
      *v = absl::ascii_tolower(c) - 'a' + 10;
    } else {
      return false;
    }
    return true;
  }
  static HttpResponse NotFound(const HttpRequest& req) {
    return OpenAiError(404, "not_found_error", absl::StrCat("no route for ", req.method, " ", req.path), "",
                       "not_found");
  }
  static HttpResponse MethodNotAllowed(const HttpRequest& req, absl::string_view allow) {
    HttpResponse r = OpenAiError(405, "invalid_request_error",
                                 absl::StrCat(req.method, " is not allowed on ", req.path, " (allowed: ", allow, ")"), "",
                                 "method_not_allowed");
    r.headers.emplace_back("Allow", std::string(allow));
    return r;
  }

  OpenAiRoutesOptions options_;
};

}  // namespace

HttpHandler OpenAiRoutes(OpenAiRoutesOptions options) {
  auto routes = std::make_shared<const Routes>(std::move(options));
  return [routes](std::shared_ptr<HttpExchange> exchange) {
    std::optional<HttpResponse> r = routes->Handle(exchange);
    if (!r.has_value()) return;
    // HEAD: the server writes the GET reply's headers and no body.
    exchange->Respond(*std::move(r));
  };
}

}  // namespace decoded::server::http
