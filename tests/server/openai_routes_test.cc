// server/http/openai_routes.h without sockets: /health while loading and
// serving, /v1/models and /v1/models/{id}, OpenAI's error object with its
// status for 401 / 404 / 405 / 503, the bearer token on /v1/* only, and
// /metrics behind its own token.
#include "server/http/openai_routes.h"

#include <functional>
#include <memory>
#include <string>

#include "gtest/gtest.h"
#include "nlohmann/json.hpp"

namespace decoded::server::http {
namespace {

using nlohmann::json;

class FakeExchange : public HttpExchange {
 public:
  explicit FakeExchange(HttpRequest r) : req_(std::move(r)) {}
  const HttpRequest& request() const override { return req_; }
  void Respond(HttpResponse r) override {
    ++replies;
    response = std::move(r);
  }
  // These routes answer whole replies only.
  void StartStream(int, std::string) override { ADD_FAILURE() << "unexpected stream"; }
  void Write(std::string, std::function<void(bool)>) override { ADD_FAILURE() << "unexpected stream"; }
  void EndStream() override {}
  void OnClientGone(std::function<void()>) override {}
  int replies = 0;
  HttpResponse response;

 private:
  HttpRequest req_;
};

struct Fixture {
  ServingState state{false, "loading the model"};
  ServedModel model;
  std::string token;
  std::string metrics_token;
  std::function<std::string()> metrics_text;
  bool pool_full = false;  // `run` refuses, as a full turn pool does

  HttpResponse Call(const std::string& method, const std::string& path, const std::string& auth = "") {
    OpenAiRoutesOptions o;
    o.auth_token = token;
    o.serving_state = [this] { return state; };
    o.served_model = [this] { return model; };
    o.metrics_text = metrics_text;
    o.metrics_auth_token = metrics_token;
    o.run = [this](absl::AnyInvocable<void()> task) {
      if (pool_full) return absl::ResourceExhaustedError("turn queue full");
      task();  // at once: these tests have no pool
      return absl::OkStatus();
    };
    HttpHandler handler = OpenAiRoutes(std::move(o));
    HttpRequest r;
    r.method = method;
    r.path = path;
    if (!auth.empty()) r.headers["authorization"] = auth;
    auto ex = std::make_shared<FakeExchange>(std::move(r));
    handler(ex);
    EXPECT_EQ(ex->replies, 1);
    return ex->response;
  }
  void Serve() {
    state = {true, ""};
    model = {"gemma-3-270m-q4_k_m", 1700000000, 2048};
  }
};

// The error object OpenAI's SDKs parse: message, type, param, code.
json ErrorOf(const HttpResponse& r) {
  const json j = json::parse(r.body);
  EXPECT_TRUE(j.contains("error")) << r.body;
  const json& e = j["error"];
  EXPECT_TRUE(e["message"].is_string()) << r.body;
  EXPECT_TRUE(e["type"].is_string()) << r.body;
  EXPECT_TRUE(e.contains("param")) << r.body;
  EXPECT_TRUE(e.contains("code")) << r.body;
  return e;
}

TEST(OpenAiRoutesTest, HealthIs503WhileLoadingAnd200Serving) {
  Fixture f;
  HttpResponse r = f.Call("GET", "/health");
  EXPECT_EQ(r.status, 503);
  EXPECT_NE(ErrorOf(r)["message"].get<std::string>().find("loading the model"), std::string::npos);
  EXPECT_EQ(f.Call("GET", "/v1/models").status, 503);
  f.Serve();
  r = f.Call("GET", "/health");
  EXPECT_EQ(r.status, 200);
  EXPECT_EQ(json::parse(r.body)["status"], "ok");
  // HEAD: the GET reply, whose length the server sends without its bytes
  // (http_server_test).
  r = f.Call("HEAD", "/health");
  EXPECT_EQ(r.status, 200);
  EXPECT_EQ(json::parse(r.body)["status"], "ok");
  f.state = {false, "draining (shutting down)"};
  EXPECT_EQ(f.Call("GET", "/health").status, 503);
}

TEST(OpenAiRoutesTest, ModelsListsTheServedModel) {
  Fixture f;
  f.Serve();
  HttpResponse r = f.Call("GET", "/v1/models");
  ASSERT_EQ(r.status, 200);
  const json j = json::parse(r.body);
  EXPECT_EQ(j["object"], "list");
  ASSERT_EQ(j["data"].size(), 1u);
  EXPECT_EQ(j["data"][0]["id"], "gemma-3-270m-q4_k_m");
  EXPECT_EQ(j["data"][0]["object"], "model");
  EXPECT_EQ(j["data"][0]["created"], 1700000000);
  EXPECT_EQ(j["data"][0]["owned_by"], "decoded");
  EXPECT_EQ(j["data"][0]["max_model_len"], 2048);
  r = f.Call("GET", "/v1/models/gemma-3-270m-q4_k_m");
  ASSERT_EQ(r.status, 200);
  EXPECT_EQ(json::parse(r.body)["id"], "gemma-3-270m-q4_k_m");
  // A trailing slash is the route without it (an outside tester's
  // "/v1/models/" got "the model '' does not exist").
  r = f.Call("GET", "/v1/models/");
  ASSERT_EQ(r.status, 200) << r.body;
  EXPECT_EQ(json::parse(r.body)["object"], "list");
  EXPECT_EQ(json::parse(f.Call("GET", "/v1/models/gemma-3-270m-q4_k_m/").body)["id"], "gemma-3-270m-q4_k_m");
  EXPECT_EQ(f.Call("GET", "/health/").status, 200);
  // An id is matched percent-decoded (the SDKs encode '/' and ' ').
  f.model.id = "org/My Model";
  EXPECT_EQ(f.Call("GET", "/v1/models/org%2FMy%20Model").status, 200);
  EXPECT_EQ(f.Call("GET", "/v1/models/org%2fMy%20Model").status, 200);
  EXPECT_EQ(f.Call("GET", "/v1/models/org%2FMy%2").status, 404);  // a cut escape stays as it is
  f.Serve();
  r = f.Call("GET", "/v1/models/gpt-4o");
  EXPECT_EQ(r.status, 404);
  EXPECT_EQ(ErrorOf(r)["code"], "model_not_found");
  EXPECT_EQ(ErrorOf(r)["param"], "model");
}

TEST(OpenAiRoutesTest, UnknownPathsAndMethods) {
  Fixture f;
  f.Serve();
  HttpResponse r = f.Call("GET", "/v2/anything");
  EXPECT_EQ(r.status, 404);
  EXPECT_EQ(ErrorOf(r)["type"], "not_found_error");
  EXPECT_EQ(f.Call("GET", "/v1/nothing").status, 404);
  r = f.Call("DELETE", "/v1/models");
  EXPECT_EQ(r.status, 405);
  ASSERT_EQ(r.headers.size(), 1u);
  EXPECT_EQ(r.headers[0].first, "Allow");
  EXPECT_EQ(r.headers[0].second, "GET, HEAD");
  EXPECT_EQ(f.Call("HEAD", "/v1/models").status, 200);  // wherever GET works (RFC 9110)
  EXPECT_EQ(f.Call("POST", "/health").status, 405);
}

TEST(OpenAiRoutesTest, BearerTokenGuardsTheApiNotHealth) {
  Fixture f;
  f.Serve();
  f.token = "s3cret";
  HttpResponse r = f.Call("GET", "/v1/models");
  EXPECT_EQ(r.status, 401);
  EXPECT_EQ(ErrorOf(r)["type"], "authentication_error");
  ASSERT_EQ(r.headers.size(), 1u);
  EXPECT_EQ(r.headers[0].first, "WWW-Authenticate");
  EXPECT_EQ(r.headers[0].second, "Bearer");
  EXPECT_EQ(f.Call("GET", "/v1/models", "Bearer wrong").status, 401);
  EXPECT_EQ(f.Call("GET", "/v1/models", "Basic s3cret").status, 401);
  EXPECT_EQ(f.Call("GET", "/v1/models", "Bearer s3cret").status, 200);
  EXPECT_EQ(f.Call("GET", "/v1/models", "bearer s3cret").status, 200);  // the scheme in any case
  EXPECT_EQ(f.Call("GET", "/health").status, 200);
  // Unknown API paths need the token too (no probing without it).
  EXPECT_EQ(f.Call("GET", "/v1/secret").status, 401);
}

TEST(OpenAiRoutesTest, MetricsAreServedBehindTheirOwnToken) {
  Fixture f;
  EXPECT_EQ(f.Call("GET", "/metrics").status, 404);  // no metrics callback: no route
  int scrapes = 0;
  f.metrics_text = [&scrapes] {
    ++scrapes;
    return std::string("decoded_requests_waiting 3\n");
  };
  HttpResponse r = f.Call("GET", "/metrics");  // served while loading too: the gauges say why
  EXPECT_EQ(r.status, 200);
  EXPECT_EQ(r.body, "decoded_requests_waiting 3\n");
  EXPECT_EQ(r.content_type, "text/plain; version=0.0.4; charset=utf-8");
  EXPECT_EQ(f.Call("HEAD", "/metrics").body, "decoded_requests_waiting 3\n");
  EXPECT_EQ(f.Call("POST", "/metrics").status, 405);
  // The API's token does not guard it; --metrics_auth_token does, before
  // anything is collected.
  f.token = "api";
  EXPECT_EQ(f.Call("GET", "/metrics").status, 200);
  f.metrics_token = "scrape";
  const int before = scrapes;
  EXPECT_EQ(f.Call("GET", "/metrics").status, 401);
  EXPECT_EQ(f.Call("GET", "/metrics", "Bearer api").status, 401);
  EXPECT_EQ(scrapes, before);
  EXPECT_EQ(f.Call("GET", "/metrics", "Bearer scrape").status, 200);
  f.pool_full = true;
  r = f.Call("GET", "/metrics", "Bearer scrape");
  EXPECT_EQ(r.status, 503);
  EXPECT_NE(ErrorOf(r)["message"].get<std::string>().find("turn queue full"), std::string::npos);
}

}  // namespace
}  // namespace decoded::server::http
