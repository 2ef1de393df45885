// The OpenAI API over HTTP on the real server in-process (issue 19): a
// completion is the same turn as the gRPC API's (tokens, text, logprobs),
// streamed and whole replies agree, chat goes through the template, the
// errors carry their HTTP status and OpenAI's error object, a full server
// answers 429, and a client that disconnects mid-stream has its turn
// cancelled and its session released.
#include <arpa/inet.h>
#include <netinet/in.h>
#include <sys/socket.h>
#include <unistd.h>

#include <memory>
#include <random>
#include <string>
#include <thread>
#include <vector>

#include "absl/strings/escaping.h"
#include "absl/strings/match.h"
#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_split.h"
#include "absl/time/clock.h"
#include "absl/time/time.h"
#include "gtest/gtest.h"
#include "nlohmann/json.hpp"
#include "proto/decoded.grpc.pb.h"
#include "server/server.h"
#include "tests/common/model_path.h"
#include "tests/server/e2e_support.h"

namespace decoded::server {
namespace {

using nlohmann::json;

constexpr char kModel[] = "tiny";
// A minimal template (the fixtures have none): the engine renders it as it
// would a model file's.
constexpr char kTemplate[] =
    "{% for m in messages %}<|{{ m.role }}|>{{ m.content }}\n{% endfor %}"
    "{% if add_generation_prompt %}<|assistant|>{% endif %}";

int Connect(int port) {
  const int fd = socket(AF_INET, SOCK_STREAM, 0);
  sockaddr_in addr{};
  addr.sin_family = AF_INET;
  addr.sin_port = htons(static_cast<uint16_t>(port));
  addr.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
  if (connect(fd, reinterpret_cast<sockaddr*>(&addr), sizeof(addr)) != 0) {
    close(fd);
    return -1;
  }
  return fd;
}

std::string Request(const std::string& path, const std::string& body, const std::string& extra = "") {
  return absl::StrCat("POST ", path, " HTTP/1.1\r\nHost: x\r\nConnection: close\r\nContent-Type: application/json\r\n",
                      extra, "Content-Length: ", body.size(), "\r\n\r\n", body);
}

struct Reply {
  int status = 0;
  std::string head;
  std::string body;  // de-chunked
};

// Sends one raw request, reads to EOF, undoes chunked framing.
Reply Send(int port, const std::string& req) {
  Reply r;
  const int fd = Connect(port);
  if (fd < 0) return r;
  if (write(fd, req.data(), req.size()) != static_cast<ssize_t>(req.size())) {
    close(fd);
    return r;
  }
  std::string raw;
  char buf[8192];
  for (ssize_t n; (n = read(fd, buf, sizeof(buf))) > 0;) raw.append(buf, static_cast<size_t>(n));
  close(fd);
  const size_t end = raw.find("\r\n\r\n");
  if (end == std::string::npos) return r;
  r.head = raw.substr(0, end);
  (void)absl::SimpleAtoi(r.head.substr(9, 3), &r.status);
  std::string rest = raw.substr(end + 4);
  if (!absl::StrContains(r.head, "Transfer-Encoding: chunked")) {
    r.body = rest;
    return r;
  }
  size_t pos = 0;
  while (pos < rest.size()) {
    const size_t eol = rest.find("\r\n", pos);
    if (eol == std::string::npos) break;
    size_t n = 0;
    if (!absl::SimpleHexAtoi(rest.substr(pos, eol - pos), &n) || n == 0) break;
    r.body += rest.substr(eol + 2, n);
    pos = eol + 2 + n + 2;
  }
  return r;
}

Reply Post(int port, const std::string& path, const json& body, const std::string& extra = "") {
  return Send(port, Request(path, body.dump(), extra));
}

// The "data: ..." payloads of an SSE body, in order.
std::vector<std::string> Events(const std::string& body) {
  std::vector<std::string> out;
  for (absl::string_view block : absl::StrSplit(body, "\n\n", absl::SkipEmpty())) {
    if (absl::ConsumePrefix(&block, "data: ")) out.emplace_back(block);
  }
  return out;
}

const std::vector<int32_t> kPrompt = {2, 17, 33, 48, 5};

class OpenAiE2eTest : public ::testing::Test {
 protected:
  void SetUp() override { Start(ServerOptions(), 4); }

  void Start(ServerOptions so, int max_sessions) {
    server_.reset();
    so.http_listen = "127.0.0.1:0";
    so.served_model_name = kModel;
    serving::EngineOptions eo;
    eo.model_path = testing::TestDataPath("gemma3_tiny_swa.gguf");
    eo.context_length = 128;
    eo.max_sessions = max_sessions;
    eo.chat_template = kTemplate;
    auto server = e2e::StartServer(eo, so);
    ASSERT_TRUE(server.ok()) << server.status();
    server_ = *std::move(server);
    stub_ = v1::Decoder::NewStub(e2e::ChannelTo(*server_));
  }

  // The server over the real model on 1 thread: its turns of a few hundred
  // tokens take seconds, long enough to be cut or cancelled mid-way.
  void StartOnTheRealModel() {
    server_.reset();
    ServerOptions so;
    so.http_listen = "127.0.0.1:0";
    so.served_model_name = kModel;
    serving::EngineOptions eo;
    eo.model_path = testing::RealModelPath();
    eo.context_length = 512;
    eo.threads_per_worker = 1;
    auto server = e2e::StartServer(eo, so);
    ASSERT_TRUE(server.ok()) << server.status();
    server_ = *std::move(server);
  }

  int port() const { return server_->http_port(); }

  // Waits (up to `timeout`) until no session is open and no KV block is
  // held. A session stops counting as active when it closes, but one closed
  // during its step gives its KV blocks back when that step returns (the
  // worker releases it then), so both are waited for.
  void WaitUntilEverySessionIsReleased(absl::Duration timeout) {
    const absl::Time deadline = absl::Now() + timeout;
    auto released = [&] {
      const serving::EngineStats s = server_->engine()->Stats();
      return s.sessions_active == 0 && s.kv_blocks_used == 0;
    };
    while (!released() && absl::Now() < deadline) absl::SleepFor(absl::Milliseconds(5));
  }

  // A gRPC stream whose session holds a slot: a 100-token turn whose first
  // event has arrived; its client reads nothing more, so the turn parks
  // after its unconsumed events. Cancel `ctx` to let it go.
  using GrpcStream = grpc::ClientReaderWriter<v1::GenerateRequest, v1::GenerateResponse>;
  std::unique_ptr<GrpcStream> HoldAGrpcSession(grpc::ClientContext* ctx) {
    std::unique_ptr<GrpcStream> stream = stub_->Generate(ctx);
    v1::GenerateRequest hold = e2e::TokensTurn(kPrompt, 100);
    hold.mutable_turn()->mutable_stopping()->set_ignore_eos(true);
    v1::GenerateResponse first;
    EXPECT_TRUE(stream->Write(hold) && stream->Read(&first));
    return stream;
  }

  static json Completion(const std::vector<int32_t>& prompt, int max_tokens) {
    return {{"model", kModel}, {"prompt", prompt}, {"max_tokens", max_tokens}, {"temperature", 0},
            {"ignore_eos", true}};
  }

  std::unique_ptr<DecodedServer> server_;
  std::unique_ptr<v1::Decoder::Stub> stub_;
};

TEST_F(OpenAiE2eTest, ACompletionIsTheSameTurnAsOverGrpc) {
  const e2e::TurnResult grpc = e2e::Solo(*stub_, e2e::TokensTurn(kPrompt, 6));
  ASSERT_TRUE(grpc.ended);
  json req = Completion(kPrompt, 6);
  req["logprobs"] = 2;
  const Reply r = Post(port(), "/v1/completions", req);
  ASSERT_EQ(r.status, 200) << r.body;
  const json j = json::parse(r.body);
  EXPECT_EQ(j["object"], "text_completion");
  EXPECT_EQ(j["model"], kModel);
  EXPECT_TRUE(absl::StartsWith(j["id"].get<std::string>(), "cmpl-"));
  const json& c = j["choices"][0];
  EXPECT_EQ(c["text"], grpc.text);
  EXPECT_EQ(c["finish_reason"], "length");
  EXPECT_EQ(j["usage"]["prompt_tokens"], 5);
  EXPECT_EQ(j["usage"]["completion_tokens"], 6);
  EXPECT_EQ(j["usage"]["total_tokens"], 11);
  EXPECT_TRUE(j["usage"]["prompt_tokens_details"]["cached_tokens"].is_number());
  // Log probabilities: the gRPC turn's, token for token, with 2 alternatives.
  const json& lp = c["logprobs"];
  ASSERT_EQ(lp["token_logprobs"].size(), 6u);
  for (size_t i = 0; i < 6; ++i) {
    EXPECT_EQ(lp["token_logprobs"][i].get<float>(), grpc.events[i].logprob()) << i;
    EXPECT_EQ(lp["top_logprobs"][i].size(), 2u) << i;
  }
  EXPECT_EQ(lp["tokens"].size(), 6u);
  EXPECT_EQ(lp["text_offset"][0], 0);
  // The daemon's metrics count HTTP turns as gRPC ones: two turns of 6
  // tokens, both ended by length.
  const std::string metrics = e2e::HttpGet(server_->metrics_port(), "/metrics");
  EXPECT_EQ(e2e::MetricValue(metrics, "decoded_generated_tokens_total"), 12) << metrics;
  EXPECT_EQ(e2e::MetricValue(metrics, R"(decoded_turns_total{finish_reason="length"})"), 2) << metrics;
}

TEST_F(OpenAiE2eTest, TheStreamedTextIsTheWholeReplysText) {
  const Reply whole = Post(port(), "/v1/completions", Completion(kPrompt, 8));
  ASSERT_EQ(whole.status, 200) << whole.body;
  json req = Completion(kPrompt, 8);
  req["stream"] = true;
  req["stream_options"] = {{"include_usage", true}};
  const Reply streamed = Post(port(), "/v1/completions", req);
  ASSERT_EQ(streamed.status, 200) << streamed.body;
  EXPECT_TRUE(absl::StrContains(streamed.head, "Content-Type: text/event-stream")) << streamed.head;
  const std::vector<std::string> events = Events(streamed.body);
  ASSERT_GE(events.size(), 3u) << streamed.body;
  EXPECT_EQ(events.back(), "[DONE]");
  std::string text, finish;
  for (size_t i = 0; i + 1 < events.size(); ++i) {
    const json e = json::parse(events[i]);
    EXPECT_EQ(e["object"], "text_completion");
    if (e["choices"].empty()) {  // the usage chunk, last before [DONE]
      EXPECT_EQ(i + 2, events.size());
      EXPECT_EQ(e["usage"]["completion_tokens"], 8);
      EXPECT_EQ(e["usage"]["prompt_tokens"], 5);
      continue;
    }
    EXPECT_TRUE(e["usage"].is_null());
    text += e["choices"][0]["text"].get<std::string>();
    if (!e["choices"][0]["finish_reason"].is_null()) finish = e["choices"][0]["finish_reason"];
  }
  EXPECT_EQ(text, json::parse(whole.body)["choices"][0]["text"].get<std::string>());
  EXPECT_EQ(finish, "length");
}

TEST_F(OpenAiE2eTest, ChatGoesThroughTheTemplateStreamedOrNot) {
  const json messages = json::array({{{"role", "developer"}, {"content", "Be brief."}},
                                     {{"role", "user"}, {"content", json::array({{{"type", "text"}, {"text", "hi"}}})}}});
  json req = {{"model", kModel}, {"messages", messages}, {"max_completion_tokens", 5}, {"temperature", 0},
              {"ignore_eos", true}};
  const Reply r = Post(port(), "/v1/chat/completions", req);
  ASSERT_EQ(r.status, 200) << r.body;
  const json j = json::parse(r.body);
  EXPECT_EQ(j["object"], "chat.completion");
  EXPECT_EQ(j["choices"][0]["message"]["role"], "assistant");
  EXPECT_EQ(j["usage"]["completion_tokens"], 5);
  // The same conversation through the gRPC chat turn: the same reply.
  v1::GenerateRequest g;
  for (const auto& [role, content] : {std::pair<const char*, const char*>{"system", "Be brief."}, {"user", "hi"}}) {
    v1::ChatMessage* m = g.mutable_turn()->mutable_messages()->add_messages();
    m->set_role(role);
    m->set_content(content);
  }
  g.mutable_turn()->mutable_stopping()->set_max_new_tokens(5);
  g.mutable_turn()->mutable_stopping()->set_ignore_eos(true);
  EXPECT_EQ(j["choices"][0]["message"]["content"], e2e::Solo(*stub_, g).text);

  req["stream"] = true;
  const Reply s = Post(port(), "/v1/chat/completions", req);
  ASSERT_EQ(s.status, 200);
  const std::vector<std::string> events = Events(s.body);
  ASSERT_GE(events.size(), 3u);
  const json first = json::parse(events[0]);
  EXPECT_EQ(first["object"], "chat.completion.chunk");
  EXPECT_EQ(first["choices"][0]["delta"]["role"], "assistant");
  std::string text;
  for (size_t i = 1; i + 1 < events.size(); ++i) {
    const json d = json::parse(events[i])["choices"][0]["delta"];
    if (d.contains("content")) text += d["content"].get<std::string>();
  }
  EXPECT_EQ(text, j["choices"][0]["message"]["content"].get<std::string>());
}

TEST_F(OpenAiE2eTest, EchoWithLogprobsScoresThePrompt) {
  json req = Completion(kPrompt, 0);
  req["echo"] = true;
  req["logprobs"] = 0;
  const Reply r = Post(port(), "/v1/completions", req);
  ASSERT_EQ(r.status, 200) << r.body;
  const json lp = json::parse(r.body)["choices"][0]["logprobs"];
  ASSERT_EQ(lp["tokens"].size(), kPrompt.size());
  EXPECT_TRUE(lp["token_logprobs"][0].is_null());  // nothing before the first
  for (size_t i = 1; i < kPrompt.size(); ++i) {
    ASSERT_TRUE(lp["token_logprobs"][i].is_number()) << r.body;
    EXPECT_LE(lp["token_logprobs"][i].get<double>(), 0.0);
  }
}

// text_offset counts characters of the reply's text (OpenAI's and vLLM's
// legacy logprobs), not bytes: after "日本" (6 bytes, 2 characters) the
// token " is" starts at 2, " Japan" at 5; streamed offsets continue after
// the echo. On the real model's vocabulary (the fixtures' has no CJK).
TEST_F(OpenAiE2eTest, TextOffsetsCountCharacters) {
  DECODED_REQUIRE_REAL_MODEL();
  StartOnTheRealModel();
  json req = {{"model", kModel}, {"prompt", "日本 is Japan"}, {"max_tokens", 2}, {"temperature", 0},
              {"echo", true}, {"logprobs", 0}};
  const Reply r = Post(port(), "/v1/completions", req);
  ASSERT_EQ(r.status, 200) << r.body;
  const json choice = json::parse(r.body)["choices"][0];
  const json& lp = choice["logprobs"];
  int is = -1, japan = -1;
  for (size_t i = 0; i < lp["tokens"].size(); ++i) {
    if (lp["tokens"][i] == " is") is = static_cast<int>(i);
    if (lp["tokens"][i] == " Japan") japan = static_cast<int>(i);
  }
  ASSERT_GE(is, 0) << lp.dump();
  ASSERT_GE(japan, 0) << lp.dump();
  EXPECT_EQ(lp["text_offset"][is], 2) << lp.dump();
  EXPECT_EQ(lp["text_offset"][japan], 5) << lp.dump();
  // The first generated token starts where the echoed prompt ends (11
  // characters), streamed or not.
  const size_t first_generated = lp["tokens"].size() - 2;
  EXPECT_EQ(lp["text_offset"][first_generated], 11) << lp.dump();
  req["stream"] = true;
  req["echo"] = false;
  req["prompt"] = "日本 is";
  req["logprobs"] = 0;
  json streamed_offsets = json::array();
  for (const std::string& e : Events(Post(port(), "/v1/completions", req).body)) {
    if (e == "[DONE]") continue;
    const json c = json::parse(e)["choices"];
    if (!c.empty() && c[0]["logprobs"].is_object()) streamed_offsets.push_back(c[0]["logprobs"]["text_offset"][0]);
  }
  ASSERT_FALSE(streamed_offsets.empty());
  EXPECT_EQ(streamed_offsets[0], 0);
}

TEST_F(OpenAiE2eTest, BadRequestsGetTheirStatusAndNameTheField) {
  auto expect = [&](const std::string& path, const std::string& raw_body, int status, const std::string& param) {
    const int fd = Connect(port());
    const std::string req = Request(path, raw_body);
    ASSERT_EQ(write(fd, req.data(), req.size()), static_cast<ssize_t>(req.size()));
    std::string raw;
    char buf[4096];
    for (ssize_t n; (n = read(fd, buf, sizeof(buf))) > 0;) raw.append(buf, static_cast<size_t>(n));
    close(fd);
    int got = 0;
    ASSERT_GT(raw.size(), 12u);
    (void)absl::SimpleAtoi(raw.substr(9, 3), &got);
    EXPECT_EQ(got, status) << raw_body << " -> " << raw;
    const json e = json::parse(raw.substr(raw.find("\r\n\r\n") + 4))["error"];
    if (!param.empty()) EXPECT_EQ(e["param"], param) << raw;
  };
  auto sessions = [&](const char* outcome) {
    const Reply r = Send(port(), "GET /metrics HTTP/1.1\r\nHost: x\r\nConnection: close\r\n\r\n");
    return e2e::MetricValue(r.body, absl::StrCat("decoded_sessions_total{outcome=\"", outcome, "\"}"));
  };
  const double invalid_before = sessions("invalid"), errors_before = sessions("error");
  const std::string m = absl::StrCat(R"("model":")", kModel, R"(")");
  expect("/v1/completions", "{not json", 400, "body");
  expect("/v1/completions", "[1,2]", 400, "body");
  expect("/v1/completions", R"({"prompt":"x"})", 400, "model");
  expect("/v1/completions", R"({"model":"gpt-4","prompt":"x"})", 404, "model");
  expect("/v1/completions", absl::StrCat("{", m, R"(,"prompt":"x","n":2})"), 400, "n");
  expect("/v1/completions", absl::StrCat("{", m, R"(,"prompt":"x","temperature":-1})"), 400, "temperature");
  expect("/v1/completions", absl::StrCat("{", m, R"(,"prompt":["a","b"]})"), 400, "prompt");
  expect("/v1/completions", absl::StrCat("{", m, R"(,"prompt":"x","max_tokens":"many"})"), 400, "max_tokens");
  expect("/v1/completions", absl::StrCat("{", m, R"(,"prompt":"x","stream_options":{"include_usage":true}})"), 400,
         "stream_options");
  expect("/v1/chat/completions", absl::StrCat("{", m, R"(,"messages":[{"role":"tool","content":"x"}]})"), 400,
         "messages[0].role");
  expect("/v1/chat/completions",
         absl::StrCat("{", m, R"(,"messages":[{"role":"user","content":[{"type":"image_url"}]}]})"), 400,
         "messages[0].content[0].type");
  expect("/v1/chat/completions", absl::StrCat("{", m, R"(,"messages":[{"role":"user","content":"x"}],"tools":[{}]})"),
         400, "tools");
  // logit_bias: keys are token ids (decimal, one spelling each: "05" would
  // add to "5"), values in [-100, 100], ids within the vocabulary (an outside
  // tester's {"abc": 5} and {"999999999": 5} had been answered 200).
  for (const char* bias : {R"({"abc":5})", R"({"-1":5})", R"({" 5":5})", R"({"5":101})", R"({"5":"high"})",
                           R"({"5":100,"05":100})", R"([[5,1]])", R"({"999999999":5})", R"({"99999999999999":5})"}) {
    expect("/v1/completions", absl::StrCat("{", m, R"(,"prompt":"x","logit_bias":)", bias, "}"), 400, "logit_bias");
  }
  // Invalid UTF-8 in a string is malformed JSON.
  expect("/v1/completions", absl::StrCat("{", m, ",\"prompt\":\"\xff\xfe\"}"), 400, "body");
  // The engine's own checks name the field too (engine/serving/turn_field.h;
  // an outside tester found "param": null here): a prompt longer than the
  // context, an id outside the vocabulary, more stop sequences than the
  // server's limit (16), a chat turn's messages over the context.
  std::vector<int32_t> long_prompt(200, 7);
  expect("/v1/completions", Completion(long_prompt, 1).dump(), 400, "prompt");
  // An input plus max_tokens past the context (128) is a 400 naming
  // max_tokens, as the OpenAI API and vLLM answer it, not a reply cut short;
  // one that fits exactly is served.
  expect("/v1/completions", Completion(kPrompt, 128 - 5 + 1).dump(), 400, "max_tokens");
  EXPECT_EQ(Post(port(), "/v1/completions", Completion(kPrompt, 128 - 5)).status, 200);
  expect("/v1/completions", Completion({2, 1 << 30}, 1).dump(), 400, "prompt");
  json many_stops = Completion(kPrompt, 1);
  many_stops["stop"] = json::array();
  for (int i = 0; i < 17; ++i) many_stops["stop"].push_back(absl::StrCat("s", i));
  expect("/v1/completions", many_stops.dump(), 400, "stop");
  expect("/v1/chat/completions",
         absl::StrCat("{", m, R"(,"messages":[{"role":"user","content":")", std::string(100000, 'x'), R"("}]})"), 400,
         "messages");
  // vLLM's stop_token_ids: a list of ids within the vocabulary.
  for (const char* ids : {R"("7")", R"([7,"x"])", R"([-1])", R"([999999999])"}) {
    expect("/v1/completions", absl::StrCat("{", m, R"(,"prompt":"x","stop_token_ids":)", ids, "}"), 400,
           "stop_token_ids");
  }
  expect("/v1/models", "{}", 405, "");
  // The engine refused those seven after their sessions opened: the client's
  // fault, counted apart from the server's errors.
  EXPECT_EQ(sessions("invalid"), invalid_before + 7);
  EXPECT_EQ(sessions("error"), errors_before);
}

// vLLM's stop_token_ids: the reply ends at the first of them it generates,
// with finish_reason "stop", as the gRPC turn with the same stop ids.
TEST_F(OpenAiE2eTest, StopTokenIdsEndTheReplyAsOverGrpc) {
  const e2e::TurnResult plain = e2e::Solo(*stub_, e2e::TokensTurn(kPrompt, 6));
  ASSERT_TRUE(plain.ended);
  ASSERT_EQ(plain.ids.size(), 6u);
  const int32_t stop_id = plain.ids[2];
  v1::GenerateRequest stopped = e2e::TokensTurn(kPrompt, 6);
  stopped.mutable_turn()->mutable_stopping()->add_stop_token_ids(stop_id);
  const e2e::TurnResult want = e2e::Solo(*stub_, stopped);
  ASSERT_TRUE(want.ended);
  EXPECT_LT(want.ids.size(), 6u);
  json req = Completion(kPrompt, 6);
  req["stop_token_ids"] = {stop_id};
  const Reply r = Post(port(), "/v1/completions", req);
  ASSERT_EQ(r.status, 200) << r.body;
  const json c = json::parse(r.body)["choices"][0];
  EXPECT_EQ(c["text"], want.text);
  EXPECT_EQ(c["finish_reason"], "stop");
  req["stop_token_ids"] = json::array();  // an empty list stops nothing
  EXPECT_EQ(json::parse(Post(port(), "/v1/completions", req).body)["choices"][0]["text"], plain.text);
}

// logit_bias over both doors: -100 on the greedy first token makes the turn
// start with the model's second choice (from the unbiased turn's top
// logprobs), +100 on a token makes every token that one; the HTTP door's
// replies are the gRPC turns' text.
TEST_F(OpenAiE2eTest, LogitBiasBansOrForcesTokensOverBothDoors) {
  v1::GenerateRequest plain = e2e::TokensTurn(kPrompt, 4);
  plain.mutable_turn()->mutable_sampling()->set_top_logprobs(2);
  const e2e::TurnResult unbiased = e2e::Solo(*stub_, plain);
  ASSERT_TRUE(unbiased.ended);
  ASSERT_EQ(unbiased.events[0].top_logprobs_size(), 2);
  const int32_t first = unbiased.ids[0];
  const int32_t second = unbiased.events[0].top_logprobs(1).id();
  ASSERT_EQ(unbiased.events[0].top_logprobs(0).id(), first);

  v1::GenerateRequest ban = e2e::TokensTurn(kPrompt, 4);
  (*ban.mutable_turn()->mutable_sampling()->mutable_logit_bias())[first] = -100.0f;
  const e2e::TurnResult banned = e2e::Solo(*stub_, ban);
  ASSERT_TRUE(banned.ended);
  EXPECT_EQ(banned.ids[0], second);
  EXPECT_EQ(banned.events[0].logprob(), unbiased.events[0].top_logprobs(1).logprob()) << "logprobs stay unbiased";
  json req = Completion(kPrompt, 4);
  req["logit_bias"] = {{std::to_string(first), -100}};
  Reply r = Post(port(), "/v1/completions", req);
  ASSERT_EQ(r.status, 200) << r.body;
  EXPECT_EQ(json::parse(r.body)["choices"][0]["text"], banned.text);

  const int32_t forced_id = 40;
  v1::GenerateRequest force = e2e::TokensTurn(kPrompt, 4);
  (*force.mutable_turn()->mutable_sampling()->mutable_logit_bias())[forced_id] = 100.0f;
  const e2e::TurnResult forced = e2e::Solo(*stub_, force);
  ASSERT_TRUE(forced.ended);
  EXPECT_EQ(forced.ids, std::vector<int32_t>(4, forced_id));
  req["logit_bias"] = {{std::to_string(forced_id), 100}};
  r = Post(port(), "/v1/completions", req);
  ASSERT_EQ(r.status, 200) << r.body;
  EXPECT_EQ(json::parse(r.body)["choices"][0]["text"], forced.text);
}

TEST_F(OpenAiE2eTest, AFullServerAnswers429) {
  Start(ServerOptions(), 1);
  // A gRPC session holds the only slot.
  grpc::ClientContext ctx;
  auto stream = HoldAGrpcSession(&ctx);
  const Reply r = Post(port(), "/v1/completions", Completion(kPrompt, 2));
  EXPECT_EQ(r.status, 429) << r.body;
  EXPECT_EQ(e2e::MetricValue(e2e::HttpGet(server_->metrics_port(), "/metrics"), "decoded_admission_rejections_total"),
            1);
  EXPECT_EQ(json::parse(r.body)["error"]["type"], "rate_limit_error");
  ctx.TryCancel();
}

// --max_sessions_per_peer counts an address's HTTP and gRPC sessions
// together: with a gRPC session held, the same address's HTTP request gets
// 429, and once it is gone, 200.
TEST_F(OpenAiE2eTest, SessionsPerPeerCountHttpAndGrpcTogether) {
  ServerOptions so;
  so.max_sessions_per_peer = 1;
  Start(so, 4);
  auto ctx = std::make_unique<grpc::ClientContext>();
  auto stream = HoldAGrpcSession(ctx.get());
  const Reply r = Post(port(), "/v1/completions", Completion(kPrompt, 2));
  EXPECT_EQ(r.status, 429) << r.body;
  EXPECT_NE(r.body.find("127.0.0.1"), std::string::npos) << r.body;  // the peer is named
  ctx->TryCancel();
  stream->Finish();
  stream.reset();
  ctx.reset();
  const absl::Time deadline = absl::Now() + absl::Seconds(5);
  int status = 0;
  while ((status = Post(port(), "/v1/completions", Completion(kPrompt, 2)).status) == 429 && absl::Now() < deadline) {
    absl::SleepFor(absl::Milliseconds(20));
  }
  EXPECT_EQ(status, 200);
}

// A client that waits for each reply before sending the next never exceeds
// one session: with room for one (and one per address) every request of a
// sequence gets 200, whole or streamed. The session must stop counting
// before the reply's end reaches the client (an outside tester saw 429 for
// 47 of 100 such requests).
TEST_F(OpenAiE2eTest, ASessionIsFreeOnceItsClientHasTheReply) {
  ServerOptions so;
  so.max_sessions_per_peer = 1;
  Start(so, 1);
  int refused = 0;
  for (int i = 0; i < 60; ++i) {
    json req = Completion(kPrompt, 2);
    req["stream"] = i % 2 == 1;
    const Reply r = Post(port(), "/v1/completions", req);
    refused += r.status == 429;
    EXPECT_EQ(r.status, 200) << i << ": " << r.body;
  }
  EXPECT_EQ(refused, 0);
}

TEST_F(OpenAiE2eTest, AClientGoneMidStreamCancelsItsTurnAndFreesItsSession) {
  json req = Completion(kPrompt, 120);
  req["stream"] = true;
  const int fd = Connect(port());
  const std::string raw = Request("/v1/completions", req.dump());
  ASSERT_EQ(write(fd, raw.data(), raw.size()), static_cast<ssize_t>(raw.size()));
  // Read until the first token's event, then go away.
  std::string got;
  char buf[4096];
  while (!absl::StrContains(got, "data: ")) {
    const ssize_t n = read(fd, buf, sizeof(buf));
    ASSERT_GT(n, 0);
    got.append(buf, static_cast<size_t>(n));
  }
  EXPECT_EQ(server_->engine()->Stats().sessions_active, 1);
  // The daemon's gauge counts HTTP sessions (the autoscaler reads it).
  EXPECT_EQ(e2e::MetricValue(e2e::HttpGet(server_->metrics_port(), "/metrics"), "decoded_sessions_active"), 1);
  close(fd);
  WaitUntilEverySessionIsReleased(absl::Seconds(5));
  const serving::EngineStats s = server_->engine()->Stats();
  EXPECT_EQ(s.sessions_active, 0);
  EXPECT_EQ(s.kv_blocks_used, 0);
  const std::string metrics = e2e::HttpGet(server_->metrics_port(), "/metrics");
  EXPECT_EQ(e2e::MetricValue(metrics, "decoded_sessions_active"), 0) << metrics;
  EXPECT_EQ(e2e::MetricValue(metrics, R"(decoded_sessions_total{outcome="client_gone"})"), 1) << metrics;
  // The server still serves.
  EXPECT_EQ(Post(port(), "/v1/completions", Completion(kPrompt, 2)).status, 200);
}

TEST_F(OpenAiE2eTest, ADrainEndsAStreamWithAFinalEventAndDone) {
  // The real model: its turn is still running at the drain's cut point (the
  // tiny fixture's 120 tokens end within a few ms).
  DECODED_REQUIRE_REAL_MODEL();
  StartOnTheRealModel();
  ASSERT_NE(server_, nullptr);
  json req = Completion(kPrompt, 400);
  req["stream"] = true;
  Reply r;
  std::thread client([&] { r = Post(port(), "/v1/completions", req); });
  const absl::Time deadline = absl::Now() + absl::Seconds(10);
  while (server_->engine()->Stats().turns_running == 0 && absl::Now() < deadline) absl::SleepFor(absl::Milliseconds(2));
  // 2 s: the drain ends running turns a fifth of its period before the cut
  // and leaves half of that for their last step and final events; at 800 ms
  // (80 ms for the step) a loaded sanitizer build lost the final event. The
  // 400-token turn still runs past the cut (~5 s in Release on 1 thread).
  server_->Drain(absl::Seconds(2));
  client.join();
  ASSERT_EQ(r.status, 200);
  const std::vector<std::string> events = Events(r.body);
  ASSERT_GE(events.size(), 2u) << r.body;
  EXPECT_EQ(events.back(), "[DONE]");
  const json last = json::parse(events[events.size() - 2]);
  // Cut by the drain: "abort" (vLLM's name for a turn ended from outside).
  EXPECT_EQ(last["choices"][0]["finish_reason"], "abort");
}

// Mutated requests (truncated, bytes flipped or inserted, chunked framing
// broken, invalid UTF-8, huge numbers): every one gets a status line or a
// closed connection, never a hang or a crash, and the server serves a good
// request after them with no session left open.
TEST_F(OpenAiE2eTest, MutatedRequestsNeverHangOrCrashTheServer) {
  const std::vector<std::string> seeds = {
      Request("/v1/completions", Completion(kPrompt, 2).dump()),
      Request("/v1/chat/completions",
              json{{"model", kModel}, {"messages", {{{"role", "user"}, {"content", "hi"}}}}, {"max_tokens", 2},
                   {"stream", true}}
                  .dump()),
      "POST /v1/completions HTTP/1.1\r\nHost: x\r\nConnection: close\r\nTransfer-Encoding: chunked\r\n\r\n"
      "10\r\n{\"model\":\"tiny\",\r\n14\r\n\"prompt\":\"ab\",\"max_tok\r\n9\r\nens\":2}  \r\n0\r\n\r\n",
      "GET /v1/models HTTP/1.1\r\nHost: x\r\nConnection: close\r\n\r\n",
  };
  std::mt19937 rng(20261206);
  const std::string junk = "\xff\xfe\x00\r\n:{}[]\"\\9e999-.,u\xc3\xa9\xed\xa0\x80";
  for (int i = 0; i < 300; ++i) {
    std::string req = seeds[rng() % seeds.size()];
    const int edits = 1 + static_cast<int>(rng() % 4);
    for (int e = 0; e < edits && !req.empty(); ++e) {
      const size_t at = rng() % req.size();
      switch (rng() % 4) {
        case 0: req.resize(at); break;                                        // truncate
        case 1: req[at] = junk[rng() % junk.size()]; break;                   // flip
        case 2: req.insert(at, std::string(1 + rng() % 64, junk[rng() % junk.size()])); break;  // insert
        case 3: req.insert(at, std::to_string(rng()) + std::to_string(rng())); break;  // digits
      }
    }
    const int fd = Connect(port());
    ASSERT_GE(fd, 0);
    timeval tv{10, 0};
    setsockopt(fd, SOL_SOCKET, SO_RCVTIMEO, &tv, sizeof(tv));
    (void)!write(fd, req.data(), req.size());
    shutdown(fd, SHUT_WR);  // a truncated request then ends in EOF, not the 30 s timeout
    std::string raw;
    char buf[4096];
    ssize_t n;
    while ((n = read(fd, buf, sizeof(buf))) > 0) raw.append(buf, static_cast<size_t>(n));
    close(fd);
    ASSERT_NE(n, -1) << "no reply and no close within 10 s for: " << absl::CEscape(req);
    if (!raw.empty()) EXPECT_TRUE(absl::StartsWith(raw, "HTTP/1.1 ")) << absl::CEscape(raw.substr(0, 200));
  }
  EXPECT_EQ(Post(port(), "/v1/completions", Completion(kPrompt, 2)).status, 200);
  const absl::Time deadline = absl::Now() + absl::Seconds(5);
  while (server_->engine()->Stats().sessions_active != 0 && absl::Now() < deadline) absl::SleepFor(absl::Milliseconds(10));
  EXPECT_EQ(server_->engine()->Stats().sessions_active, 0);
}

TEST_F(OpenAiE2eTest, AClientGoneBeforeAWholeReplyCancelsItsTurn) {
  // The real model: 400 tokens take seconds, so a session that ends at once
  // was cancelled, not finished.
  DECODED_REQUIRE_REAL_MODEL();
  StartOnTheRealModel();
  ASSERT_NE(server_, nullptr);
  const int fd = Connect(port());
  const std::string raw = Request("/v1/completions", Completion(kPrompt, 400).dump());
  ASSERT_EQ(write(fd, raw.data(), raw.size()), static_cast<ssize_t>(raw.size()));
  const absl::Time deadline = absl::Now() + absl::Seconds(10);
  while (server_->engine()->Stats().turns_running == 0 && absl::Now() < deadline) absl::SleepFor(absl::Milliseconds(2));
  ASSERT_EQ(server_->engine()->Stats().sessions_active, 1);
  const absl::Time closed = absl::Now();
  close(fd);
  WaitUntilEverySessionIsReleased(absl::Seconds(10));
  EXPECT_EQ(server_->engine()->Stats().sessions_active, 0);
  EXPECT_LT(absl::Now() - closed, absl::Seconds(1)) << "the turn ran on after its client left";
  EXPECT_EQ(server_->engine()->Stats().kv_blocks_used, 0);
}

// The endpoint picker of the Gateway API Inference Extension scrapes the
// pool's port: the model server protocol's three gauges are there, and they
// are the daemon's (a turn served over HTTP counts).
TEST_F(OpenAiE2eTest, MetricsAreServedOnTheApiPort) {
  ASSERT_EQ(Post(port(), "/v1/completions", Completion(kPrompt, 3)).status, 200);
  const Reply r = Send(port(), "GET /metrics HTTP/1.1\r\nHost: x\r\nConnection: close\r\n\r\n");
  EXPECT_EQ(r.status, 200);
  EXPECT_TRUE(absl::StrContains(r.head, "Content-Type: text/plain; version=0.0.4")) << r.head;
  for (const char* gauge : {"decoded_requests_waiting", "decoded_requests_running", "decoded_kv_cache_usage_ratio"}) {
    EXPECT_TRUE(absl::StrContains(r.body, absl::StrCat("\n# TYPE ", gauge, " gauge\n"))) << gauge;
  }
  EXPECT_EQ(e2e::MetricValue(r.body, "decoded_generated_tokens_total"), 3) << r.body;
  EXPECT_EQ(e2e::MetricValue(r.body, R"(decoded_sessions_total{outcome="ok"})"), 1) << r.body;
  EXPECT_EQ(e2e::MetricValue(r.body, "decoded_sessions_active"), 0) << r.body;
  // The HTTP server's own counters: the completion and this scrape.
  EXPECT_EQ(e2e::MetricValue(r.body, "decoded_http_requests_total"), 2) << r.body;
  EXPECT_EQ(e2e::MetricValue(r.body, "decoded_http_connections_accepted_total"), 2) << r.body;
}

TEST_F(OpenAiE2eTest, TheBearerTokenGuardsTheCompletions) {
  ServerOptions so;
  so.auth_token = "tok";
  Start(so, 4);
  EXPECT_EQ(Post(port(), "/v1/completions", Completion(kPrompt, 1)).status, 401);
  EXPECT_EQ(Post(port(), "/v1/completions", Completion(kPrompt, 1), "Authorization: Bearer tok\r\n").status, 200);
}

}  // namespace
}  // namespace decoded::server
