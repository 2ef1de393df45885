// decoded-cli: a command-line client of the decoded daemon.
//
//   decoded-cli --prompt "Once upon a time" --max_new_tokens 64
//   decoded-cli --chat                       (user lines from stdin, one stream)
//   decoded-cli --prompt TEXT --eval_logprobs --top_logprobs 5   (JSON per token)
//   decoded-cli --perplexity FILE            (JSON with the file's perplexity)
//   decoded-cli --tokenize --prompt TEXT | decoded-cli --info
//   decoded-cli --health                     (grpc.health.v1 Check: a probe for
//                                             container HEALTHCHECKs and scripts)
//
// Exit status:
//   0  success.
//   1  the server refused or failed a request, or could not be reached (its
//      status is printed to stderr); also a flag the flag parser rejects.
//      With --health: anything but SERVING (NOT_SERVING, an unknown service,
//      no answer within --health_timeout_seconds).
//   2  bad input, refused before anything is sent: an unexpected argument,
//      no mode given, an unreadable --perplexity file, or text that is not
//      valid UTF-8 (--prompt, a --stop entry, the --perplexity file). Every
//      string the protocol carries must be UTF-8 (proto/decoded.proto).
// In --chat a line that is not UTF-8 is reported and skipped; the chat goes on.
#include <chrono>
#include <cmath>
#include <fstream>
#include <iostream>
#include <memory>
#include <optional>
#include <sstream>
#include <string>
#include <string_view>
#include <utility>
#include <vector>

#include "absl/flags/flag.h"
#include "absl/flags/parse.h"
#include "absl/flags/usage.h"
#include "absl/strings/str_cat.h"
#include "absl/flags/usage_config.h"
#include "absl/status/status.h"
#include "absl/strings/match.h"
#include "absl/status/statusor.h"
#include "absl/strings/str_format.h"
#include "decoded/version.h"
#include "client/turn_stream.h"
#include "engine/utf8_validation.h"
#include "grpc/health/v1/health.grpc.pb.h"
#include "grpcpp/grpcpp.h"
#include "nlohmann/json.hpp"
#include "proto/decoded.grpc.pb.h"
#include "server/unknown_flags.h"

ABSL_FLAG(std::string, server, "127.0.0.1:50051", "daemon address");
ABSL_FLAG(std::string, auth_token, "", "bearer token, if the daemon requires one");
ABSL_FLAG(std::string, prompt, "", "prompt text (one turn)");
ABSL_FLAG(bool, chat, false, "multi-turn chat: read user lines from stdin");
ABSL_FLAG(std::string, system, "", "with --chat: a system message sent before the first user line");
ABSL_FLAG(bool, eval_logprobs, false, "print one JSON object per generated token");
ABSL_FLAG(std::string, perplexity, "", "print the perplexity of this text file");
ABSL_FLAG(bool, tokenize, false, "print the token ids of --prompt");
ABSL_FLAG(bool, info, false, "print the served model's facts");
ABSL_FLAG(bool, health, false,
          "grpc.health.v1 Check of --health_service: prints the status; exit 0 only on SERVING");
ABSL_FLAG(std::string, health_service, "", "service name for --health (\"\": the whole server)");
ABSL_FLAG(double, health_timeout_seconds, 5, "deadline of the --health call");
ABSL_FLAG(int, max_new_tokens, 256, "tokens to generate per turn");
ABSL_FLAG(float, temperature, 0.0f, "0 = greedy");
ABSL_FLAG(int, top_k, 0, "0 = off");
ABSL_FLAG(float, top_p, 1.0f, "(0, 1]");
ABSL_FLAG(float, min_p, 0.0f, "[0, 1)");
ABSL_FLAG(float, repetition_penalty, 1.0f, "1 = off");
ABSL_FLAG(float, presence_penalty, 0.0f, "[-2, 2]");
ABSL_FLAG(float, frequency_penalty, 0.0f, "[-2, 2]");
ABSL_FLAG(uint64_t, seed, 0, "sampling seed");
ABSL_FLAG(int, top_logprobs, 0, "alternatives per token (with --eval_logprobs)");
ABSL_FLAG(std::vector<std::string>, stop, {}, "comma-separated stop sequences");
ABSL_FLAG(bool, ignore_eos, false, "do not stop at end-of-generation tokens");

namespace decoded::client {
namespace {

class Client {
 public:
  explicit Client(std::shared_ptr<grpc::Channel> channel)
      : stub_(v1::Decoder::NewStub(channel)), token_(absl::GetFlag(FLAGS_auth_token)) {}

  void Authorize(grpc::ClientContext* ctx) const {
    if (!token_.empty()) ctx->AddMetadata("authorization", "Bearer " + token_);
  }

  absl::StatusOr<v1::ModelInfo> Info() {
    grpc::ClientContext ctx;
    Authorize(&ctx);
    v1::ModelInfo info;
    absl::Status s = FromGrpc(stub_->GetModelInfo(&ctx, v1::GetModelInfoRequest(), &info));
    if (!s.ok()) return s;
    return info;
  }

  absl::StatusOr<std::vector<int32_t>> Tokenize(const std::string& text, bool add_bos, bool parse_special) {
    grpc::ClientContext ctx;
    Authorize(&ctx);
    v1::TokenizeRequest req;
    req.set_text(text);
    req.set_add_bos(add_bos);
    req.set_parse_special(parse_special);
    v1::TokenizeResponse resp;
    absl::Status s = FromGrpc(stub_->Tokenize(&ctx, req, &resp));
    if (!s.ok()) return s;
    return std::vector<int32_t>(resp.ids().begin(), resp.ids().end());
  }

  v1::Decoder::Stub* stub() { return stub_.get(); }
  const std::string& token() const { return token_; }

 private:
  std::unique_ptr<v1::Decoder::Stub> stub_;
  std::string token_;
};

// The sampling and stopping flags as a turn without input.
v1::Turn TurnFromFlags() {
  v1::Turn turn;
  v1::SamplingParams* s = turn.mutable_sampling();
  s->set_temperature(absl::GetFlag(FLAGS_temperature));
  s->set_top_k(absl::GetFlag(FLAGS_top_k));
  s->set_top_p(absl::GetFlag(FLAGS_top_p));
  s->set_min_p(absl::GetFlag(FLAGS_min_p));
  s->set_repetition_penalty(absl::GetFlag(FLAGS_repetition_penalty));
  s->set_presence_penalty(absl::GetFlag(FLAGS_presence_penalty));
  s->set_frequency_penalty(absl::GetFlag(FLAGS_frequency_penalty));
  s->set_seed(absl::GetFlag(FLAGS_seed));
  s->set_top_logprobs(absl::GetFlag(FLAGS_top_logprobs));
  v1::StoppingCriteria* st = turn.mutable_stopping();
  st->set_max_new_tokens(absl::GetFlag(FLAGS_max_new_tokens));
  for (const std::string& stop : absl::GetFlag(FLAGS_stop)) st->add_stop_sequences(stop);
  st->set_ignore_eos(absl::GetFlag(FLAGS_ignore_eos));
  return turn;
}

void PrintTurnStats(const v1::TurnEnd& end) {
  std::cerr << "\n[" << v1::FinishReason_Name(end.finish_reason()) << "] prompt " << end.usage().prompt_tokens()
            << " tok, generated " << end.usage().generated_tokens() << " tok, context " << end.usage().context_tokens()
            << " tok, ttft " << end.timings().ttft_ms() << " ms, " << end.timings().mean_inter_token_ms()
            << " ms/token\n";
}

void PrintText(const v1::TokenEvent& t) { std::cout << t.text() << std::flush; }

void PrintJson(const v1::TokenEvent& t) {
  nlohmann::json j = {{"id", t.id()}, {"text", t.text()}, {"logprob", t.logprob()}};
  nlohmann::json top = nlohmann::json::array();
  for (const v1::TokenLogprob& alt : t.top_logprobs()) {
    top.push_back({{"id", alt.id()}, {"text", alt.text()}, {"logprob", alt.logprob()}});
  }
  j["top_logprobs"] = top;
  std::cout << j.dump(-1, ' ', false, nlohmann::json::error_handler_t::replace) << "\n" << std::flush;
}

// Text the protocol carries must be UTF-8; refusing it here gives a shell
// user the offending byte and a fix instead of the server's error.
absl::Status CheckUtf8(std::string_view what, std::string_view text) {
  std::optional<Utf8Error> error = FindInvalidUtf8(text);
  if (!error) return absl::OkStatus();
  return absl::InvalidArgumentError(
      absl::StrFormat("%s is not valid UTF-8 (byte %d is 0x%02X); convert it, e.g. with iconv -f latin1 -t utf-8",
                      what, error->offset, static_cast<uint8_t>(text[error->offset])));
}

// What the command line asks for, read and checked before anything is sent.
struct Input {
  std::string perplexity_text;  // contents of the --perplexity file
};

// INVALID_ARGUMENT or NOT_FOUND (exit status 2) when the input is unusable.
absl::StatusOr<Input> ReadInput() {
  Input input;
  const bool has_mode = !absl::GetFlag(FLAGS_prompt).empty() || absl::GetFlag(FLAGS_chat) ||
                        !absl::GetFlag(FLAGS_perplexity).empty() || absl::GetFlag(FLAGS_tokenize) ||
                        absl::GetFlag(FLAGS_info) || absl::GetFlag(FLAGS_health);
  if (!has_mode) {
    return absl::InvalidArgumentError(
        "give --prompt TEXT, --chat, --perplexity FILE, --tokenize, --info or --health");
  }
  if (absl::GetFlag(FLAGS_tokenize) && absl::GetFlag(FLAGS_prompt).empty()) {
    return absl::InvalidArgumentError("--tokenize needs --prompt TEXT");
  }
  if (absl::GetFlag(FLAGS_health) && !(absl::GetFlag(FLAGS_health_timeout_seconds) > 0)) {
    return absl::InvalidArgumentError("--health_timeout_seconds must be > 0");
  }
  if (absl::Status s = CheckUtf8("--prompt", absl::GetFlag(FLAGS_prompt)); !s.ok()) return s;
  if (absl::Status s = CheckUtf8("--system", absl::GetFlag(FLAGS_system)); !s.ok()) return s;
  if (!absl::GetFlag(FLAGS_system).empty() && !absl::GetFlag(FLAGS_chat)) {
    return absl::InvalidArgumentError("--system is for --chat");
  }
  const std::vector<std::string> stops = absl::GetFlag(FLAGS_stop);
  for (size_t i = 0; i < stops.size(); ++i) {
    if (absl::Status s = CheckUtf8(absl::StrFormat("--stop entry %d", i), stops[i]); !s.ok()) return s;
  }
  if (const std::string path = absl::GetFlag(FLAGS_perplexity); !path.empty()) {
    std::ifstream in(path, std::ios::binary);
    if (!in) return absl::NotFoundError("cannot read " + path);
    std::stringstream buf;
    buf << in.rdbuf();
    input.perplexity_text = buf.str();
    if (absl::Status s = CheckUtf8("--perplexity file " + path, input.perplexity_text); !s.ok()) return s;
  }
  return input;
}

absl::Status RunPrompt(Client& client) {
  TurnStream stream(client.stub(), client.token());
  v1::Turn turn = TurnFromFlags();
  turn.set_text(absl::GetFlag(FLAGS_prompt));
  const bool json = absl::GetFlag(FLAGS_eval_logprobs);
  absl::StatusOr<v1::TurnEnd> end = stream.Run(turn, json ? PrintJson : PrintText);
  if (!end.ok()) return end.status();
  if (!json) std::cout << end->text() << "\n";
  PrintTurnStats(*end);
  return stream.Close();
}

absl::Status RunChat(Client& client) {
  // The conversation so far, to send again on a new stream when the daemon
  // ended an idle one (--idle_session_seconds): the session is gone, the
  // conversation need not be.
  std::vector<v1::ChatMessage> conversation;
  if (const std::string system = absl::GetFlag(FLAGS_system); !system.empty()) {
    v1::ChatMessage s;
    s.set_role("system");
    s.set_content(system);
    conversation.push_back(s);
  }
  auto stream = std::make_unique<TurnStream>(client.stub(), client.token());
  std::string line;
  int line_number = 0;
  std::cerr << "> " << std::flush;
  while (std::getline(std::cin, line)) {
    ++line_number;
    if (line.empty()) {
      std::cerr << "> " << std::flush;
      continue;
    }
    if (absl::Status s = CheckUtf8(absl::StrFormat("input line %d", line_number), line); !s.ok()) {
      std::cerr << "decoded-cli: " << s.message() << "; the line is not sent\n> " << std::flush;
      continue;
    }
    v1::ChatMessage user;
    user.set_role("user");
    user.set_content(line);
    std::string reply;
    auto print = [&reply](const v1::TokenEvent& t) {
      reply += t.text();
      PrintText(t);
    };
    // A new stream gets the whole conversation; one that holds it, the new message.
    auto turn_for = [&](const TurnStream& s) {
      v1::Turn turn = TurnFromFlags();
      if (!s.opened()) {
        for (const v1::ChatMessage& m : conversation) *turn.mutable_messages()->add_messages() = m;
      }
      *turn.mutable_messages()->add_messages() = user;
      return turn;
    };
    absl::StatusOr<v1::TurnEnd> end = stream->Run(turn_for(*stream), print);
    if (!end.ok() && absl::IsDeadlineExceeded(end.status()) && reply.empty()) {
      std::cerr << "(the server ended the idle session: " << end.status().message()
                << "; sending the conversation again on a new stream)\n";
      stream = std::make_unique<TurnStream>(client.stub(), client.token());
      end = stream->Run(turn_for(*stream), print);
    }
    if (!end.ok()) return end.status();
    std::cout << end->text() << "\n";
    PrintTurnStats(*end);
    conversation.push_back(user);
    v1::ChatMessage assistant;
    assistant.set_role("assistant");
    assistant.set_content(reply + end->text());
    conversation.push_back(assistant);
    std::cerr << "> " << std::flush;
  }
  return stream->Close();
}

// Perplexity = exp(mean negative log-likelihood) of the file's tokens, each
// chunk scored in a fresh session as BOS + chunk (chunk = context - 1 tokens).
absl::Status RunPerplexity(Client& client, const std::string& path, const std::string& text) {
  absl::StatusOr<v1::ModelInfo> info = client.Info();
  if (!info.ok()) return info.status();
  absl::StatusOr<std::vector<int32_t>> ids = client.Tokenize(text, false, false);
  if (!ids.ok()) return ids.status();
  if (ids->empty()) return absl::InvalidArgumentError(path + " has no tokens");
  const size_t chunk = static_cast<size_t>(std::max(1, info->session_context_length() - 1));
  double nll = 0;
  int64_t scored = 0;
  int chunks = 0;
  for (size_t begin = 0; begin < ids->size(); begin += chunk) {
    const size_t end = std::min(ids->size(), begin + chunk);
    v1::Turn turn;
    turn.mutable_tokens()->add_ids(info->bos_id());
    for (size_t i = begin; i < end; ++i) turn.mutable_tokens()->add_ids((*ids)[i]);
    turn.mutable_stopping()->set_max_new_tokens(0);
    turn.set_prompt_logprobs(true);
    TurnStream stream(client.stub(), client.token());
    absl::StatusOr<v1::TurnEnd> result = stream.Run(turn, [](const v1::TokenEvent&) {});
    if (!result.ok()) return result.status();
    for (float lp : result->prompt_logprobs()) nll -= lp;
    scored += result->prompt_logprobs_size();
    ++chunks;
    if (absl::Status s = stream.Close(); !s.ok()) return s;
  }
  nlohmann::json j = {{"file", path},
                      {"tokens", scored},
                      {"chunks", chunks},
                      {"mean_nll", nll / scored},
                      {"perplexity", std::exp(nll / scored)}};
  std::cout << j.dump() << "\n";
  return absl::OkStatus();
}

// grpc.health.v1 Check (https://github.com/grpc/grpc/blob/master/doc/health-checking.md):
// prints the serving status; OK only for SERVING, UNAVAILABLE naming the
// status otherwise (the call's own error, e.g. NOT_FOUND for an unknown
// service or DEADLINE_EXCEEDED, passes through).
absl::Status RunHealth(const std::shared_ptr<grpc::Channel>& channel, const std::string& token) {
  auto stub = grpc::health::v1::Health::NewStub(channel);
  grpc::ClientContext ctx;
  if (!token.empty()) ctx.AddMetadata("authorization", "Bearer " + token);
  ctx.set_deadline(std::chrono::system_clock::now() +
                   std::chrono::microseconds(
                       static_cast<int64_t>(absl::GetFlag(FLAGS_health_timeout_seconds) * 1e6)));
  grpc::health::v1::HealthCheckRequest request;
  request.set_service(absl::GetFlag(FLAGS_health_service));
  grpc::health::v1::HealthCheckResponse response;
  if (absl::Status s = FromGrpc(stub->Check(&ctx, request, &response)); !s.ok()) return s;
  const std::string name = grpc::health::v1::HealthCheckResponse::ServingStatus_Name(response.status());
  std::cout << name << "\n";
  if (response.status() != grpc::health::v1::HealthCheckResponse::SERVING) {
    return absl::UnavailableError("health status " + name);
  }
  return absl::OkStatus();
}

absl::Status Main(const Input& input) {
  std::shared_ptr<grpc::Channel> channel =
      grpc::CreateChannel(absl::GetFlag(FLAGS_server), grpc::InsecureChannelCredentials());
  if (absl::GetFlag(FLAGS_health)) return RunHealth(channel, absl::GetFlag(FLAGS_auth_token));
  Client client(channel);
  if (absl::GetFlag(FLAGS_info)) {
    absl::StatusOr<v1::ModelInfo> info = client.Info();
    if (!info.ok()) return info.status();
    std::cout << info->DebugString();
    return absl::OkStatus();
  }
  if (absl::GetFlag(FLAGS_tokenize)) {
    absl::StatusOr<std::vector<int32_t>> ids = client.Tokenize(absl::GetFlag(FLAGS_prompt), true, true);
    if (!ids.ok()) return ids.status();
    for (size_t i = 0; i < ids->size(); ++i) std::cout << (i ? " " : "") << (*ids)[i];
    std::cout << "\n";
    return absl::OkStatus();
  }
  if (!absl::GetFlag(FLAGS_perplexity).empty()) {
    return RunPerplexity(client, absl::GetFlag(FLAGS_perplexity), input.perplexity_text);
  }
  if (absl::GetFlag(FLAGS_chat)) return RunChat(client);
  return RunPrompt(client);
}

}  // namespace
}  // namespace decoded::client

int main(int argc, char** argv) {
  absl::SetProgramUsageMessage(
      "decoded-cli [--server ADDR] [--prompt TEXT | --chat] [sampling flags]\n"
      "Text must be UTF-8. Exit status: 0 success; 1 the server refused or failed a request (or was\n"
      "unreachable); 2 bad input, refused before sending (e.g. text that is not valid UTF-8).");
  // --help lists this file's flags (absl matches flags by their defining file).
  absl::FlagsUsageConfig usage;
  usage.contains_help_flags = [](absl::string_view file) { return absl::EndsWith(file, "client/main.cc"); };
  usage.version_string = [] { return absl::StrCat("decoded-cli ", decoded::kVersion, " (", decoded::kRevision, ")\n"); };
  absl::SetFlagsUsageConfig(usage);
  constexpr int kServerError = 1, kBadInput = 2;
  if (std::optional<std::string> unknown = decoded::FirstUnknownFlag(argc, argv)) {
    std::cerr << "decoded-cli: unknown flag --" << *unknown << " (decoded-cli --help lists them)\n";
    return kBadInput;
  }
  if (std::optional<std::string> bad = decoded::FirstBadFlagValue(argc, argv)) {
    std::cerr << "decoded-cli: " << *bad << "\n";
    return kBadInput;
  }
  std::vector<char*> rest = absl::ParseCommandLine(argc, argv);
  if (rest.size() > 1) {
    std::cerr << "decoded-cli: unexpected argument '" << rest[1] << "' (the prompt is given with --prompt)\n";
    return kBadInput;
  }
  absl::StatusOr<decoded::client::Input> input = decoded::client::ReadInput();
  if (!input.ok()) {
    std::cerr << "decoded-cli: " << input.status().message() << "\n";
    return kBadInput;
  }
  absl::Status status = decoded::client::Main(*input);
  if (!status.ok()) {
    std::cerr << "decoded-cli: " << status << "\n";
    return kServerError;
  }
  return 0;
}
