// Helpers of the end-to-end tests: a real server in-process on a free
// loopback port, raw health and /metrics reads, and turn builders/readers.
#ifndef DECODED_TESTS_SERVER_E2E_SUPPORT_H_
#define DECODED_TESTS_SERVER_E2E_SUPPORT_H_

#include <arpa/inet.h>
#include <netinet/in.h>
#include <sys/socket.h>
#include <unistd.h>

#include <cstdlib>
#include <fstream>
#include <sstream>
#include <memory>
#include <string>
#include <vector>

#include "absl/status/statusor.h"
#include "absl/strings/str_cat.h"
#include "absl/time/clock.h"
#include "absl/time/time.h"
#include "engine/runtime.h"
#include "engine/serving/engine.h"
#include "grpcpp/grpcpp.h"
#include "grpcpp/impl/client_unary_call.h"
#include "gtest/gtest.h"
#include "proto/decoded.grpc.pb.h"
#include "server/server.h"

namespace decoded::server::e2e {

// grpc.health.v1.HealthCheckResponse.ServingStatus, read from the raw reply
// (field 1, varint): 1 SERVING, 2 NOT_SERVING; -1 when the call fails. The
// request (empty service name) encodes as zero bytes.
inline int HealthStatus(grpc::Channel* channel) {
  grpc::ClientContext ctx;
  grpc::ByteBuffer request, response;
  grpc::Slice empty("", 0);
  request = grpc::ByteBuffer(&empty, 1);
  grpc::Status s = grpc::internal::BlockingUnaryCall<grpc::ByteBuffer, grpc::ByteBuffer>(
      channel, grpc::internal::RpcMethod("/grpc.health.v1.Health/Check", grpc::internal::RpcMethod::NORMAL_RPC),
      &ctx, request, &response);
  if (!s.ok()) return -1;
  std::vector<grpc::Slice> slices;
  if (!response.Dump(&slices).ok()) return -1;
  std::string bytes;
  for (const grpc::Slice& sl : slices) bytes.append(reinterpret_cast<const char*>(sl.begin()), sl.size());
  if (bytes.size() == 2 && bytes[0] == 0x08) return bytes[1];
  return 0;  // UNKNOWN (field absent)
}

// The body of an HTTP/1.0 GET on loopback ("" when the connection fails).
inline std::string HttpGet(int port, const std::string& path) {
  int fd = socket(AF_INET, SOCK_STREAM, 0);
  sockaddr_in addr{};
  addr.sin_family = AF_INET;
  addr.sin_port = htons(port);
  addr.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
  if (connect(fd, reinterpret_cast<sockaddr*>(&addr), sizeof(addr)) != 0) {
    close(fd);
    return "";
  }
  const std::string req = absl::StrCat("GET ", path, " HTTP/1.0\r\nHost: localhost\r\n\r\n");
  if (write(fd, req.data(), req.size()) != static_cast<ssize_t>(req.size())) {
    close(fd);
    return "";
  }
  std::string body;
  char buf[4096];
  for (ssize_t n; (n = read(fd, buf, sizeof(buf))) > 0;) body.append(buf, n);
  close(fd);
  return body;
}

// The value of the sample `series` (name with labels, exactly as exposed,
// e.g. decoded_sessions_total{outcome="error"}) in a Prometheus text
// exposition; -1 when absent.
inline double MetricValue(const std::string& body, const std::string& series) {
  const std::string key = "\n" + series + " ";
  const size_t at = body.find(key);
  if (at == std::string::npos) return -1;
  return std::strtod(body.c_str() + at + key.size(), nullptr);
}

struct TurnResult {
  std::vector<int32_t> ids;
  std::vector<v1::TokenEvent> events;
  std::string text;
  v1::TurnEnd end;
  bool ended = false;
};

using Stream = grpc::ClientReaderWriter<v1::GenerateRequest, v1::GenerateResponse>;

// Reads one turn's events; stops at TurnEnd or a broken stream.
inline TurnResult ReadTurn(Stream* stream) {
  TurnResult r;
  v1::GenerateResponse resp;
  while (stream->Read(&resp)) {
    if (resp.has_token()) {
      r.ids.push_back(resp.token().id());
      r.text += resp.token().text();
      r.events.push_back(resp.token());
    } else if (resp.has_turn_end()) {
      r.end = resp.turn_end();
      r.ended = true;
      break;
    }
  }
  return r;
}

inline v1::GenerateRequest TextTurn(const std::string& text, int max_new_tokens, bool ignore_eos = true) {
  v1::GenerateRequest req;
  req.mutable_turn()->set_text(text);
  req.mutable_turn()->mutable_stopping()->set_max_new_tokens(max_new_tokens);
  req.mutable_turn()->mutable_stopping()->set_ignore_eos(ignore_eos);
  return req;
}

inline v1::GenerateRequest TokensTurn(const std::vector<int32_t>& ids, int max_new_tokens) {
  v1::GenerateRequest req;
  req.mutable_turn()->mutable_tokens()->mutable_ids()->Add(ids.begin(), ids.end());
  req.mutable_turn()->mutable_stopping()->set_max_new_tokens(max_new_tokens);
  req.mutable_turn()->mutable_stopping()->set_ignore_eos(true);
  return req;
}

inline v1::GenerateRequest CancelRequest() {
  v1::GenerateRequest req;
  req.mutable_cancel();
  return req;
}

inline v1::GenerateRequest ChatTurn(const std::string& user_content, int max_new_tokens) {
  v1::GenerateRequest req;
  v1::ChatMessage* m = req.mutable_turn()->mutable_messages()->add_messages();
  m->set_role("user");
  m->set_content(user_content);
  req.mutable_turn()->mutable_stopping()->set_max_new_tokens(max_new_tokens);
  return req;
}

inline std::vector<int32_t> Tokenize(v1::Decoder::Stub& stub, const std::string& text, bool add_bos,
                                     bool parse_special = true) {
  grpc::ClientContext ctx;
  v1::TokenizeRequest req;
  req.set_text(text);
  req.set_add_bos(add_bos);
  req.set_parse_special(parse_special);
  v1::TokenizeResponse resp;
  EXPECT_TRUE(stub.Tokenize(&ctx, req, &resp).ok());
  return {resp.ids().begin(), resp.ids().end()};
}

// One stream, one turn, half-close; the stream must end OK.
inline TurnResult Solo(v1::Decoder::Stub& stub, const v1::GenerateRequest& req) {
  grpc::ClientContext ctx;
  auto stream = stub.Generate(&ctx);
  EXPECT_TRUE(stream->Write(req));
  TurnResult r = ReadTurn(stream.get());
  stream->WritesDone();
  grpc::Status s = stream->Finish();
  EXPECT_TRUE(s.ok()) << s.error_code() << " " << s.error_message();
  return r;
}

// Waits until `engine` holds no session and the process no context, binding
// or KV byte; false at timeout.
inline bool EngineDrainsToZero(const serving::Engine& engine, absl::Duration timeout) {
  const absl::Time deadline = absl::Now() + timeout;
  while (absl::Now() < deadline) {
    const EngineCounters c = GetEngineCounters();
    if (engine.Stats().sessions_active == 0 && c.live_contexts == 0 && c.bound_nodes == 0 && c.kv_bytes == 0) {
      return true;
    }
    absl::SleepFor(absl::Milliseconds(10));
  }
  return false;
}

// A server on a free loopback port (and /metrics on another, unless
// `server_options` says otherwise), serving `engine_options` (its on_step
// feeds the server's metrics).
inline absl::StatusOr<std::unique_ptr<DecodedServer>> StartServer(serving::EngineOptions engine_options,
                                                                   ServerOptions so = ServerOptions()) {
  so.listen = "127.0.0.1:0";
  if (so.metrics_listen.empty()) so.metrics_listen = "127.0.0.1:0";
  absl::StatusOr<std::unique_ptr<DecodedServer>> server = DecodedServer::Start(so);
  if (!server.ok()) return server.status();
  (*server)->ObserveEngine(engine_options);
  absl::StatusOr<std::unique_ptr<serving::Engine>> engine = serving::Engine::Create(engine_options);
  if (!engine.ok()) return engine.status();
  (*server)->AttachEngine(*std::move(engine));
  return server;
}

// Gemma 3's instruct chat template (tests/data/chat_templates/gemma3.jinja):
// the default base-model file carries none, so servers that test chat turns on
// it are given this one, as --chat_template would.
inline std::string Gemma3ChatTemplate() {
  std::ifstream in(std::string(DECODED_TEST_DATA_DIR) + "/chat_templates/gemma3.jinja", std::ios::binary);
  std::stringstream text;
  text << in.rdbuf();
  EXPECT_FALSE(text.str().empty());
  return text.str();
}

inline std::shared_ptr<grpc::Channel> ChannelTo(const DecodedServer& server,
                                                const grpc::ChannelArguments& args = grpc::ChannelArguments()) {
  return grpc::CreateCustomChannel(absl::StrCat("127.0.0.1:", server.port()), grpc::InsecureChannelCredentials(),
                                   args);
}

}  // namespace decoded::server::e2e

#endif  // DECODED_TESTS_SERVER_E2E_SUPPORT_H_
