// End to end, real model: what happens to a session around its turns —
// cancellation at every phase, usage accounting over many turns, streams that
// are cancelled in a loop, clients that stop reading, and a drain that cuts
// turns short. Expected values come from independent runs of the same server
// (a fresh session on the same context) or from arithmetic on the request.
#include <atomic>
#include <cstdio>
#include <cstring>
#include <limits>
#include <memory>
#include <random>
#include <string>
#include <thread>
#include <vector>

#include "absl/cleanup/cleanup.h"
#include "absl/strings/str_cat.h"
#include "absl/synchronization/notification.h"
#include "absl/time/clock.h"
#include "absl/time/time.h"
#include "engine/runtime.h"
#include "engine/serving/engine.h"
#include "grpcpp/grpcpp.h"
#include "gtest/gtest.h"
#include "proto/decoded.grpc.pb.h"
#include "server/server.h"
#include "tests/common/model_path.h"
#include "tests/gguf/gguf_test_writer.h"
#include "tests/server/e2e_support.h"

namespace decoded::server {
namespace {

using e2e::CancelRequest;
using e2e::HttpGet;
using e2e::MetricValue;
using e2e::ReadTurn;
using e2e::Stream;
using e2e::TextTurn;
using e2e::TokensTurn;
using e2e::TurnResult;

constexpr int kMaxSessions = 6;
constexpr int kContext = 320;  // small: the ASan build prefills slowly

serving::EngineOptions EngineOptionsForTests() {
  serving::EngineOptions eo;
  eo.model_path = decoded::testing::RealModelPath();
  eo.chat_template = e2e::Gemma3ChatTemplate();
  eo.workers = 2;
  eo.threads_per_worker = 1;
  eo.max_sessions = kMaxSessions;
  eo.max_queued = 16;
  eo.context_length = kContext;
  // These tests time cancels into a prompt's prefill; a prompt another test
  // sent before would come from the prefix cache and leave no prefill to
  // cancel (prefix_cache_serving_test covers the cache).
  eo.prefix_cache = false;
  // A prompt prefills over several steps, so a cancel can land between two
  // of them (the default budget takes these prompts in one step).
  eo.max_step_tokens = 64;
  return eo;
}

class StreamLifecycleTest : public ::testing::Test {
 protected:
  static void SetUpTestSuite() {
    if (!std::filesystem::exists(decoded::testing::RealModelPath())) return;
    auto server = e2e::StartServer(EngineOptionsForTests());
    ASSERT_TRUE(server.ok()) << server.status();
    server_ = server->release();
  }
  static void TearDownTestSuite() {
    delete server_;
    server_ = nullptr;
  }

  void SetUp() override {
    DECODED_REQUIRE_REAL_MODEL();
    ASSERT_NE(server_, nullptr);
    channel_ = e2e::ChannelTo(*server_);
    stub_ = v1::Decoder::NewStub(channel_);
  }

  std::vector<int32_t> Tokenize(const std::string& text, bool add_bos) { return e2e::Tokenize(*stub_, text, add_bos); }

  TurnResult Solo(const v1::GenerateRequest& req) { return e2e::Solo(*stub_, req); }

  std::string Metrics() { return HttpGet(server_->metrics_port(), "/metrics"); }

  // The scrape once `series` reads `value` (streams are counted when gRPC is
  // done with them, a little after the engine), or the last one at timeout.
  std::string MetricsOnce(const std::string& series, double value, absl::Duration timeout) {
    const absl::Time deadline = absl::Now() + timeout;
    std::string body = Metrics();
    while (MetricValue(body, series) != value && absl::Now() < deadline) {
      absl::SleepFor(absl::Milliseconds(20));
      body = Metrics();
    }
    return body;
  }

  static bool EngineDrainsToZero(absl::Duration timeout) {
    return e2e::EngineDrainsToZero(*server_->engine(), timeout);
  }

  static DecodedServer* server_;
  std::shared_ptr<grpc::Channel> channel_;
  std::unique_ptr<v1::Decoder::Stub> stub_;
};

DecodedServer* StreamLifecycleTest::server_ = nullptr;

// Greedy continuation with the 5 best alternatives per token: logits compared
// through their log-softmax values.
v1::GenerateRequest Scored(v1::GenerateRequest req) {
  req.mutable_turn()->mutable_sampling()->set_top_logprobs(5);
  return req;
}

void ExpectSameLogits(const TurnResult& got, const TurnResult& want, const std::string& what) {
  ASSERT_EQ(got.ids, want.ids) << what;
  for (size_t i = 0; i < got.events.size(); ++i) {
    const v1::TokenEvent& g = got.events[i];
    const v1::TokenEvent& w = want.events[i];
    EXPECT_EQ(g.logprob(), w.logprob()) << what << " token " << i;
    ASSERT_EQ(g.top_logprobs_size(), w.top_logprobs_size()) << what;
    for (int k = 0; k < g.top_logprobs_size(); ++k) {
      EXPECT_EQ(g.top_logprobs(k).id(), w.top_logprobs(k).id()) << what << " token " << i << " alt " << k;
      EXPECT_EQ(g.top_logprobs(k).logprob(), w.top_logprobs(k).logprob()) << what << " token " << i << " alt " << k;
    }
  }
}

// Whatever phase a cancel hits (queued, prefill, decode), the session's next
// turn sees exactly the context the cancel left, BOS included when that
// context is empty: its logits equal a fresh session's fed the same tokens.
TEST_F(StreamLifecycleTest, TurnAfterACancelAtAnyPhaseMatchesAFreshSessionOnTheSameContext) {
  std::string long_text;
  for (int i = 0; i < 30; ++i) absl::StrAppend(&long_text, "Item ", i, " is on the list. ");
  const std::string next = "Hello world";
  const std::vector<int32_t> next_ids = Tokenize(next, false);
  struct Phase {
    std::string name;
    std::string prompt;
    int read_before_cancel;  // tokens read before the cancel; -1: cancel at once
    absl::Duration wait;     // wait before the cancel
  };
  const std::vector<Phase> phases = {
      {"queued", "Hello world", -1, absl::ZeroDuration()},
      {"prefill", long_text, -1, absl::Milliseconds(150)},
      {"decode", "Count to one hundred:", 2, absl::ZeroDuration()},
  };
  int saw_empty = 0, saw_partial_prefill = 0, saw_decode = 0;
  for (const Phase& phase : phases) {
    // Two busy streams keep both workers occupied, so a turn and its cancel
    // sent back to back usually find the turn still queued.
    std::vector<std::thread> busy;
    if (phase.name == "queued") {
      for (int i = 0; i < 2; ++i) busy.emplace_back([&] { Solo(TextTurn(long_text, 1)); });
      absl::SleepFor(absl::Milliseconds(50));
    }
    grpc::ClientContext ctx;
    auto stream = stub_->Generate(&ctx);
    ASSERT_TRUE(stream->Write(TextTurn(phase.prompt, 100)));
    std::vector<int32_t> read_before;
    if (phase.read_before_cancel > 0) {
      v1::GenerateResponse resp;
      while (static_cast<int>(read_before.size()) < phase.read_before_cancel && stream->Read(&resp)) {
        if (resp.has_token()) read_before.push_back(resp.token().id());
      }
    } else {
      absl::SleepFor(phase.wait);
    }
    ASSERT_TRUE(stream->Write(CancelRequest()));
    TurnResult cancelled = ReadTurn(stream.get());
    cancelled.ids.insert(cancelled.ids.begin(), read_before.begin(), read_before.end());
    ASSERT_TRUE(cancelled.ended) << phase.name;
    ASSERT_EQ(cancelled.end.finish_reason(), v1::CANCELLED) << phase.name;
    for (std::thread& t : busy) t.join();

    // The context the cancel left: a prefix of BOS + prompt, then the tokens
    // generated before the cancel.
    std::vector<int32_t> context = Tokenize(phase.prompt, true);
    const int32_t kept = cancelled.end.usage().context_tokens();
    const int32_t generated = cancelled.end.usage().generated_tokens();
    ASSERT_LE(kept - generated, static_cast<int32_t>(context.size())) << phase.name;
    context.resize(kept - generated);
    context.insert(context.end(), cancelled.ids.begin(), cancelled.ids.end());
    ASSERT_EQ(static_cast<int32_t>(context.size()), kept);
    if (kept == 0) ++saw_empty;
    if (generated == 0 && kept > 0) ++saw_partial_prefill;
    if (generated > 0) ++saw_decode;

    ASSERT_TRUE(stream->Write(Scored(TextTurn(next, 4))));
    TurnResult after = ReadTurn(stream.get());
    stream->WritesDone();
    ASSERT_TRUE(stream->Finish().ok()) << phase.name;
    ASSERT_TRUE(after.ended) << phase.name;
    EXPECT_EQ(after.end.usage().cached_tokens(), kept) << phase.name;

    // Reference: a fresh session fed the same context and the same input.
    std::vector<int32_t> fresh_input = context;
    if (fresh_input.empty()) fresh_input = Tokenize(next, true);  // opens the context: with BOS
    else fresh_input.insert(fresh_input.end(), next_ids.begin(), next_ids.end());
    TurnResult fresh = Solo(Scored(TokensTurn(fresh_input, 4)));
    ASSERT_TRUE(fresh.ended);
    EXPECT_EQ(after.end.usage().context_tokens(), fresh.end.usage().context_tokens()) << phase.name;
    ExpectSameLogits(after, fresh, phase.name);
    if (kept == 0) {
      // The case: "Hello world" has 3 prompt tokens fresh, and still
      // 3 after a cancelled first turn.
      EXPECT_EQ(after.end.usage().prompt_tokens(), static_cast<int32_t>(Tokenize(next, true).size()));
    }
  }
  // Each phase was seen at least once (the queued one through the empty
  // context it leaves), so the assertions above covered all three.
  EXPECT_GE(saw_empty, 1);
  EXPECT_GE(saw_partial_prefill, 1);
  EXPECT_GE(saw_decode, 1);
}

// Usage adds up over a session's turns: every turn's context is its cached
// tokens plus its prompt and generated tokens, the next turn starts from it,
// and the session accepts exactly the room that the last context leaves.
TEST_F(StreamLifecycleTest, UsageAddsUpToTheContextOverTurns) {
  grpc::ClientContext ctx;
  auto stream = stub_->Generate(&ctx);
  std::vector<v1::GenerateRequest> turns = {TextTurn("The capital of France is", 5), TextTurn(" Paris.", 0),
                                            TextTurn(" And of Italy?", 3), TokensTurn({100, 200, 300}, 2)};
  v1::GenerateRequest chat = e2e::ChatTurn("Say hi.", 4);
  chat.mutable_turn()->mutable_stopping()->set_ignore_eos(true);
  turns.push_back(chat);
  int32_t sum = 0, previous = 0;
  for (size_t i = 0; i < turns.size(); ++i) {
    ASSERT_TRUE(stream->Write(turns[i]));
    TurnResult r = ReadTurn(stream.get());
    ASSERT_TRUE(r.ended) << "turn " << i;
    const v1::Usage& u = r.end.usage();
    EXPECT_EQ(u.cached_tokens(), previous) << "turn " << i;
    EXPECT_EQ(u.context_tokens(), u.cached_tokens() + u.prompt_tokens() + u.generated_tokens()) << "turn " << i;
    EXPECT_EQ(u.generated_tokens(), static_cast<int32_t>(r.ids.size())) << "turn " << i;
    // The previous turn's last token is fed by this one, unless it generated none.
    const bool carried = i > 0 && turns[i - 1].turn().stopping().max_new_tokens() > 0;
    EXPECT_EQ(u.prefilled_tokens(), u.prompt_tokens() + (carried ? 1 : 0)) << "turn " << i;
    sum += u.prompt_tokens() + u.generated_tokens();
    previous = u.context_tokens();
  }
  EXPECT_EQ(previous, sum);
  // Turn 1 opened the context: its prompt is the text's tokens with BOS.
  // Exactly the remaining room fits; one token more does not.
  const int32_t room = kContext - previous;
  ASSERT_TRUE(stream->Write(TokensTurn(std::vector<int32_t>(room, 100), 0)));
  TurnResult fill = ReadTurn(stream.get());
  ASSERT_TRUE(fill.ended);
  EXPECT_EQ(fill.end.usage().context_tokens(), kContext);
  ASSERT_TRUE(stream->Write(TokensTurn({100}, 0)));
  TurnResult over = ReadTurn(stream.get());
  EXPECT_FALSE(over.ended);
  EXPECT_EQ(stream->Finish().error_code(), grpc::StatusCode::INVALID_ARGUMENT);
}

// A client that opens a stream, sends a short turn and cancels the RPC a few
// ms later, over and over, holds at most one stream: it must never be
// refused, neither over one channel nor with a channel per stream, and the
// aborted streams count as client_gone, never as errors.
TEST_F(StreamLifecycleTest, CancelledStreamsNeverHoldSessionSlots) {
  ASSERT_TRUE(EngineDrainsToZero(absl::Seconds(10)));
  const std::string before = Metrics();
  auto outcome = [](const std::string& body, const char* name) {
    return MetricValue(body, absl::StrCat("decoded_sessions_total{outcome=\"", name, "\"}"));
  };
  std::mt19937 rng(7);
  int refused = 0, cycles = 0;
  for (bool channel_per_stream : {false, true}) {
    for (int i = 0; i < 150; ++i, ++cycles) {
      std::shared_ptr<grpc::Channel> channel = channel_per_stream ? e2e::ChannelTo(*server_) : channel_;
      std::unique_ptr<v1::Decoder::Stub> stub = v1::Decoder::NewStub(channel);
      grpc::ClientContext ctx;
      auto stream = stub->Generate(&ctx);
      stream->Write(TextTurn("Tell me a long story about a dragon.", 50));
      absl::SleepFor(absl::Microseconds(std::uniform_int_distribution<int>(0, 6000)(rng)));
      ctx.TryCancel();
      v1::GenerateResponse resp;
      while (stream->Read(&resp)) {
      }
      const grpc::Status s = stream->Finish();
      if (s.error_code() == grpc::StatusCode::RESOURCE_EXHAUSTED) ++refused;
    }
  }
  EXPECT_EQ(refused, 0) << "of " << cycles << " cycles";
  EXPECT_TRUE(EngineDrainsToZero(absl::Seconds(10)));
  const std::string after = MetricsOnce("decoded_sessions_active", 0, absl::Seconds(10));
  // Every session these cycles opened ended as client_gone (a stream the
  // client cancels before the server dispatches it opens none).
  EXPECT_GT(outcome(after, "client_gone"), outcome(before, "client_gone"));
  for (const char* other : {"ok", "invalid", "error", "shutdown"}) {
    EXPECT_EQ(outcome(after, other), outcome(before, other)) << other;
  }
  EXPECT_EQ(MetricValue(after, "decoded_sessions_active"), 0);
}

// A client that stops reading is not stepped once max_unconsumed_events of
// its events wait: it generates nothing more, however long it waits, while
// another client's turn runs; and when it reads, it gets every event.
TEST_F(StreamLifecycleTest, ClientThatStopsReadingIsNotSteppedUntilItReads) {
  ASSERT_TRUE(EngineDrainsToZero(absl::Seconds(10)));
  // A small HTTP/2 receive window on the idle client, and 20 alternatives per
  // token (~300-byte events), so the transport holds only a dozen events
  // before its flow control stops the server's writes.
  grpc::ChannelArguments args;
  args.SetInt(GRPC_ARG_HTTP2_BDP_PROBE, 0);
  args.SetInt(GRPC_ARG_HTTP2_STREAM_LOOKAHEAD_BYTES, 4096);
  std::shared_ptr<grpc::Channel> idle_channel = e2e::ChannelTo(*server_, args);
  auto idle_stub = v1::Decoder::NewStub(idle_channel);
  grpc::ClientContext idle_ctx;
  auto idle = idle_stub->Generate(&idle_ctx);
  constexpr int kIdleTokens = 160;
  v1::GenerateRequest big = TextTurn("Write the numbers from one to a thousand:", kIdleTokens);
  big.mutable_turn()->mutable_sampling()->set_top_logprobs(20);
  const double generated_start = MetricValue(Metrics(), "decoded_generated_tokens_total");
  ASSERT_TRUE(idle->Write(big));

  // Wait for the engine to park it.
  const absl::Time deadline = absl::Now() + absl::Seconds(60);
  while (server_->engine()->Stats().sessions_waiting_for_client == 0 && absl::Now() < deadline) {
    absl::SleepFor(absl::Milliseconds(20));
  }
  ASSERT_EQ(server_->engine()->Stats().sessions_waiting_for_client, 1);
  const double parked_at = MetricValue(Metrics(), "decoded_generated_tokens_total");
  const double idle_generated = parked_at - generated_start;
  EXPECT_LT(idle_generated, kIdleTokens) << "parked only when its turn was over";
  absl::SleepFor(absl::Milliseconds(500));
  EXPECT_EQ(MetricValue(Metrics(), "decoded_generated_tokens_total"), parked_at) << "generated while parked";
  EXPECT_EQ(server_->engine()->Stats().sessions_waiting_for_client, 1);

  // A reading client meanwhile gets its whole turn, and only its tokens are generated.
  TurnResult reader = Solo(TextTurn("Once upon a time", 48));
  ASSERT_TRUE(reader.ended);
  EXPECT_EQ(reader.ids.size(), 48u);
  EXPECT_EQ(MetricValue(Metrics(), "decoded_generated_tokens_total"), parked_at + 48);

  // Reading now delivers everything, in order, and the turn completes.
  TurnResult all = ReadTurn(idle.get());
  ASSERT_TRUE(all.ended);
  EXPECT_EQ(all.end.usage().generated_tokens(), static_cast<int32_t>(all.ids.size()));
  EXPECT_GE(static_cast<double>(all.ids.size()), idle_generated);
  idle->WritesDone();
  EXPECT_TRUE(idle->Finish().ok());
}

// With acknowledge_events, what counts is what the client has processed, not
// what its transport holds: on a channel with gRPC's default (64 KiB, growing)
// receive window, a client that stops acknowledging is parked after exactly
// max_unconsumed_events (8) events, and a reader beside it is unaffected.
TEST_F(StreamLifecycleTest, ClientThatStopsAcknowledgingIsParkedAfterMaxUnconsumedEvents) {
  ASSERT_TRUE(EngineDrainsToZero(absl::Seconds(10)));
  grpc::ClientContext idle_ctx;
  auto idle = stub_->Generate(&idle_ctx);
  constexpr int kIdleTokens = 40;
  v1::GenerateRequest turn = TextTurn("Write the numbers from one to a thousand:", kIdleTokens);
  turn.mutable_turn()->set_acknowledge_events(true);
  turn.mutable_turn()->mutable_stopping()->set_ignore_eos(true);
  const double generated_start = MetricValue(Metrics(), "decoded_generated_tokens_total");
  ASSERT_TRUE(idle->Write(turn));

  const absl::Time deadline = absl::Now() + absl::Seconds(60);
  while (server_->engine()->Stats().sessions_waiting_for_client == 0 && absl::Now() < deadline) {
    absl::SleepFor(absl::Milliseconds(20));
  }
  ASSERT_EQ(server_->engine()->Stats().sessions_waiting_for_client, 1);
  const double parked_at = MetricValue(Metrics(), "decoded_generated_tokens_total");
  EXPECT_EQ(parked_at - generated_start, 8);  // EngineOptions::max_unconsumed_events
  absl::SleepFor(absl::Milliseconds(300));
  EXPECT_EQ(MetricValue(Metrics(), "decoded_generated_tokens_total"), parked_at) << "generated while parked";

  TurnResult reader = Solo(TextTurn("Once upon a time", 24));
  ASSERT_TRUE(reader.ended);
  EXPECT_EQ(MetricValue(Metrics(), "decoded_generated_tokens_total"), parked_at + 24);

  // Reading and acknowledging one event at a time delivers the whole turn.
  v1::GenerateRequest ack;
  ack.mutable_ack()->set_events(1);
  v1::GenerateResponse resp;
  int tokens = 0;
  bool ended = false;
  while (!ended && idle->Read(&resp)) {
    if (resp.has_token()) {
      ++tokens;
      ASSERT_TRUE(idle->Write(ack));
    } else {
      ended = resp.has_turn_end();
    }
  }
  ASSERT_TRUE(ended);
  EXPECT_EQ(tokens, kIdleTokens);
  idle->WritesDone();
  EXPECT_TRUE(idle->Finish().ok());
}

// Acks that do not match what was sent end the stream with INVALID_ARGUMENT.
TEST_F(StreamLifecycleTest, AcksBeyondWhatWasSentAreInvalidArgument) {
  struct Case {
    bool acknowledge_events;
    uint32_t events;
    const char* message_part;
  };
  for (const Case& c : {Case{false, 1, "did not set acknowledge_events"}, Case{true, 3, "[1, 2]"},
                        Case{true, 0, "[1, 2]"}}) {
    SCOPED_TRACE(c.events);
    grpc::ClientContext ctx;
    auto stream = stub_->Generate(&ctx);
    v1::GenerateRequest turn = TextTurn("Hello", 2);
    turn.mutable_turn()->set_acknowledge_events(c.acknowledge_events);
    turn.mutable_turn()->mutable_stopping()->set_ignore_eos(true);
    ASSERT_TRUE(stream->Write(turn));
    TurnResult r = ReadTurn(stream.get());
    ASSERT_TRUE(r.ended);
    ASSERT_EQ(r.ids.size(), 2u);
    v1::GenerateRequest ack;
    ack.mutable_ack()->set_events(c.events);
    stream->Write(ack);
    v1::GenerateResponse resp;
    EXPECT_FALSE(stream->Read(&resp));
    const grpc::Status status = stream->Finish();
    EXPECT_EQ(status.error_code(), grpc::StatusCode::INVALID_ARGUMENT);
    EXPECT_NE(status.error_message().find(c.message_part), std::string::npos) << status.error_message();
  }
}

// Input with more bytes than the context could hold as tokens is refused
// before tokenization, so a huge run of whitespace costs no tokenizer time.
TEST_F(StreamLifecycleTest, InputLongerThanAnyContextIsRefusedBeforeTokenization) {
  for (bool chat : {false, true}) {
    SCOPED_TRACE(chat);
    const std::string spaces(2'000'000, ' ');
    v1::GenerateRequest turn = TextTurn("", 4);
    if (chat) {
      v1::ChatMessage* m = turn.mutable_turn()->mutable_messages()->add_messages();
      m->set_role("user");
      m->set_content(spaces);
    } else {
      turn.mutable_turn()->set_text(spaces);
    }
    const absl::Time start = absl::Now();
    grpc::ClientContext ctx;
    auto stream = stub_->Generate(&ctx);
    ASSERT_TRUE(stream->Write(turn));
    v1::GenerateResponse resp;
    EXPECT_FALSE(stream->Read(&resp));
    const grpc::Status status = stream->Finish();
    EXPECT_EQ(status.error_code(), grpc::StatusCode::INVALID_ARGUMENT);
    EXPECT_NE(status.error_message().find("2000000 bytes"), std::string::npos) << status.error_message();
    EXPECT_LT(absl::Now() - start, absl::Seconds(1)) << "tokenized first";
  }
  EXPECT_TRUE(Solo(TextTurn("Hello", 2)).ended);  // and serving goes on
}

// SIGTERM's drain: idle streams end at once with UNAVAILABLE; a turn that
// outlasts the drain period ends with a TurnEnd whose finish reason is
// SHUTDOWN, then UNAVAILABLE, and the drain returns within its period. A turn
// sent during the drain ends the stream UNAVAILABLE only after the turn
// before it has its TurnEnd.
TEST(StreamDrainTest, DrainEndsIdleStreamsAndCutsLongTurnsWithAFinalEvent) {
  DECODED_REQUIRE_REAL_MODEL();
  // The long turn must outlast the 3 s period on the fastest host: 256
  // tokens ended with LENGTH in 2.5 s on a 2-vCPU EPYC; 1,984 cannot.
  constexpr int kDrainContext = 2048;
  serving::EngineOptions eo = EngineOptionsForTests();
  eo.context_length = kDrainContext;
  auto server = e2e::StartServer(eo);
  ASSERT_TRUE(server.ok()) << server.status();
  auto stub = v1::Decoder::NewStub(e2e::ChannelTo(**server));

  grpc::ClientContext idle_ctx;
  auto idle = stub->Generate(&idle_ctx);
  ASSERT_TRUE(idle->Write(TextTurn("Hi", 1)));
  ASSERT_TRUE(ReadTurn(idle.get()).ended);

  grpc::ClientContext long_ctx;
  auto long_turn = stub->Generate(&long_ctx);
  ASSERT_TRUE(long_turn->Write(TextTurn("Count to one thousand:", kDrainContext - 64)));
  v1::GenerateResponse first;
  ASSERT_TRUE(long_turn->Read(&first));  // it runs

  // A client that cancels its turn during the drain and sends the next one.
  grpc::ClientContext resend_ctx;
  auto resend = stub->Generate(&resend_ctx);
  ASSERT_TRUE(resend->Write(TextTurn("Count to one thousand:", kDrainContext - 64)));
  ASSERT_TRUE(resend->Read(&first));

  const absl::Duration period = absl::Seconds(3);
  const absl::Time start = absl::Now();
  std::thread drain([&] { (*server)->Drain(period); });
  absl::Cleanup join_drain = [&] { drain.join(); };

  // The idle stream ends at once.
  v1::GenerateResponse resp;
  EXPECT_FALSE(idle->Read(&resp));
  const grpc::Status idle_status = idle->Finish();
  EXPECT_EQ(idle_status.error_code(), grpc::StatusCode::UNAVAILABLE) << idle_status.error_message();
  EXPECT_LT(absl::Now() - start, absl::Milliseconds(500));

  // Its cancelled turn still gets its TurnEnd (CANCELLED); the next turn is
  // refused by the stream ending UNAVAILABLE.
  v1::GenerateRequest cancel;
  cancel.mutable_cancel();
  ASSERT_TRUE(resend->Write(cancel));
  resend->Write(TextTurn("And now?", 4));
  TurnResult cancelled = ReadTurn(resend.get());
  ASSERT_TRUE(cancelled.ended);
  EXPECT_EQ(cancelled.end.finish_reason(), v1::CANCELLED);
  const bool accepted = resend->Read(&resp);
  EXPECT_FALSE(accepted) << "the turn sent during the drain was served";
  // Finish waits for every message to be read: end the call instead of hanging.
  if (accepted) resend_ctx.TryCancel();
  const grpc::Status resend_status = resend->Finish();
  EXPECT_EQ(resend_status.error_code(), grpc::StatusCode::UNAVAILABLE) << resend_status.error_message();

  // The long turn runs on until the cut, then ends with SHUTDOWN.
  TurnResult cut = ReadTurn(long_turn.get());
  ASSERT_TRUE(cut.ended);
  EXPECT_EQ(cut.end.finish_reason(), v1::SHUTDOWN);
  EXPECT_GT(cut.ids.size(), 0u);
  const grpc::Status long_status = long_turn->Finish();
  EXPECT_EQ(long_status.error_code(), grpc::StatusCode::UNAVAILABLE) << long_status.error_message();
  std::move(join_drain).Invoke();
  EXPECT_LE(absl::Now() - start, period + absl::Milliseconds(200));
  const std::string body = HttpGet((*server)->metrics_port(), "/metrics");
  EXPECT_EQ(MetricValue(body, "decoded_sessions_total{outcome=\"shutdown\"}"), 3);
  EXPECT_EQ(MetricValue(body, "decoded_sessions_total{outcome=\"error\"}"), 0);
}

// A model whose numbers make NaN logits (here: a NaN in the final norm's
// weights, which the loader cannot know is wrong) must not stream tokens
// sampled from them: the turn ends with INTERNAL, the count of such turns
// rises, and the server keeps serving.
TEST(NonFiniteLogitsTest, TurnOfAModelThatMakesNanLogitsEndsWithInternal) {
  std::vector<uint8_t> bytes = decoded::testing::ReadFileBytes(decoded::testing::TestDataPath("gemma3_tiny_swa.gguf"));
  decoded::testing::ParsedBuffer parsed = decoded::testing::ParseExact(bytes);
  ASSERT_TRUE(parsed.file.ok()) << parsed.file.status();
  const GgufTensorInfo* norm = (*parsed.file)->FindTensor("output_norm.weight");
  ASSERT_NE(norm, nullptr);
  ASSERT_EQ(norm->type, DType::kF32);
  const float nan = std::numeric_limits<float>::quiet_NaN();
  std::memcpy(bytes.data() + (norm->data - parsed.bytes.get()), &nan, sizeof(nan));
  const std::string path = decoded::testing::WriteTempFile(bytes, "nan_norm");

  serving::EngineOptions eo;
  eo.model_path = path;
  eo.context_length = 64;
  auto server = e2e::StartServer(eo);
  ASSERT_TRUE(server.ok()) << server.status();
  auto stub = v1::Decoder::NewStub(e2e::ChannelTo(**server));
  for (int attempt = 0; attempt < 2; ++attempt) {
    grpc::ClientContext ctx;
    auto stream = stub->Generate(&ctx);
    ASSERT_TRUE(stream->Write(TextTurn("a b c", 4)));
    TurnResult r = ReadTurn(stream.get());
    EXPECT_FALSE(r.ended);
    EXPECT_TRUE(r.ids.empty()) << "a token was sampled from NaN logits";
    const grpc::Status status = stream->Finish();
    EXPECT_EQ(status.error_code(), grpc::StatusCode::INTERNAL);
    EXPECT_NE(status.error_message().find("non-finite"), std::string::npos) << status.error_message();
  }
  const std::string body = HttpGet((*server)->metrics_port(), "/metrics");
  EXPECT_EQ(MetricValue(body, "decoded_nonfinite_logits_total"), 2);
  EXPECT_EQ(e2e::HealthStatus(e2e::ChannelTo(**server).get()), 1);  // still SERVING
  std::remove(path.c_str());
}

}  // namespace
}  // namespace decoded::server
