// End to end, real model: one client must not be able to take the server
// from the others. Each test is an attack an outside tester ran against the
// daemon (issue 16), with what must hold instead: streams that send nothing
// hold no session, idle ones end, a client that stops reading loses its slot,
// one address cannot hold every slot, huge requests are refused before any
// work, heavy requests do not stall health or token writes, oversized metadata
// ends only its own stream, a reset burst leaves nothing held, reflection and
// /metrics ask for their tokens, and /metrics answers beside slow clients.
#include <arpa/inet.h>
#include <netinet/in.h>
#include <sys/socket.h>
#include <unistd.h>

#include <algorithm>
#include <atomic>
#include <chrono>
#include <fstream>
#include <sstream>
#include <memory>
#include <string>
#include <thread>
#include <vector>

#include "absl/strings/escaping.h"
#include "absl/strings/match.h"
#include "absl/strings/str_cat.h"
#include "absl/synchronization/notification.h"
#include "absl/time/clock.h"
#include "absl/time/time.h"
#include "grpc/reflection/v1/reflection.grpc.pb.h"
#include "grpc/reflection/v1alpha/reflection.grpc.pb.h"
#include "grpcpp/grpcpp.h"
#include "gtest/gtest.h"
#include "proto/decoded.grpc.pb.h"
#include "server/server.h"
#include "tests/common/model_path.h"
#include "tests/server/e2e_support.h"
#include "tests/server/raw_http2.h"

namespace decoded::server {
namespace {

using e2e::HealthStatus;
using e2e::HttpGet;
using e2e::MetricValue;
using e2e::RawHttp2;
using e2e::ReadTurn;
using e2e::TextTurn;
using e2e::TurnResult;

serving::EngineOptions SmallEngine(int max_sessions) {
  serving::EngineOptions eo;
  eo.model_path = decoded::testing::RealModelPath();
  eo.workers = 1;
  eo.threads_per_worker = 1;
  eo.max_sessions = max_sessions;
  eo.context_length = 256;  // small: the ASan build prefills slowly
  return eo;
}

std::unique_ptr<DecodedServer> Serve(serving::EngineOptions eo, ServerOptions so = ServerOptions()) {
  absl::StatusOr<std::unique_ptr<DecodedServer>> server = e2e::StartServer(std::move(eo), std::move(so));
  EXPECT_TRUE(server.ok()) << server.status();
  return server.ok() ? *std::move(server) : nullptr;
}

double Metric(const DecodedServer& server, const std::string& series) {
  return MetricValue(HttpGet(server.metrics_port(), "/metrics"), series);
}

// Waits until `series` reads `value`; returns the last value read.
double MetricSettles(const DecodedServer& server, const std::string& series, double value,
                     absl::Duration timeout = absl::Seconds(10)) {
  const absl::Time deadline = absl::Now() + timeout;
  double v = Metric(server, series);
  while (v != value && absl::Now() < deadline) {
    absl::SleepFor(absl::Milliseconds(20));
    v = Metric(server, series);
  }
  return v;
}

// A stream whose client sends one message (or none) and then waits.
struct OpenStreamClient {
  explicit OpenStreamClient(v1::Decoder::Stub& stub) : stream(stub.Generate(&ctx)) {}
  grpc::ClientContext ctx;
  std::unique_ptr<e2e::Stream> stream;
};

// f57ec97: a slot (and a whole KV cache) was taken when a stream opened, so
// 16 streams that sent HEADERS and nothing else refused every newcomer.
TEST(HardeningTest, StreamsThatSendNoTurnHoldNoSessionSlot) {
  DECODED_REQUIRE_REAL_MODEL();
  auto server = Serve(SmallEngine(/*max_sessions=*/2));
  ASSERT_NE(server, nullptr);
  auto stub = v1::Decoder::NewStub(e2e::ChannelTo(*server));
  std::vector<std::unique_ptr<OpenStreamClient>> idle;
  for (int i = 0; i < 16; ++i) idle.push_back(std::make_unique<OpenStreamClient>(*stub));
  EXPECT_EQ(MetricSettles(*server, "decoded_streams_open", 16), 16);
  EXPECT_EQ(Metric(*server, "decoded_sessions_active"), 0);
  EXPECT_EQ(server->engine()->Stats().kv_bytes, 0) << "a stream without a turn holds a KV cache";
  const TurnResult r = e2e::Solo(*stub, TextTurn("Hello", 3));
  EXPECT_TRUE(r.ended);
  EXPECT_EQ(r.ids.size(), 3u);
  for (auto& c : idle) c->ctx.TryCancel();
}

// Sessions are what is scarce: once taken (by a first turn) they are
// refused beyond --max_sessions with a message naming the flag.
TEST(HardeningTest, SessionLimitIsHitAtTheFirstTurnAndNamed) {
  DECODED_REQUIRE_REAL_MODEL();
  auto server = Serve(SmallEngine(/*max_sessions=*/2));
  ASSERT_NE(server, nullptr);
  auto stub = v1::Decoder::NewStub(e2e::ChannelTo(*server));
  std::vector<std::unique_ptr<OpenStreamClient>> holders;
  for (int i = 0; i < 2; ++i) {
    holders.push_back(std::make_unique<OpenStreamClient>(*stub));
    ASSERT_TRUE(holders.back()->stream->Write(TextTurn("Hello", 1)));
    ASSERT_TRUE(ReadTurn(holders.back()->stream.get()).ended);
  }
  OpenStreamClient third(*stub);
  ASSERT_TRUE(third.stream->Write(TextTurn("Hello", 1)));
  EXPECT_FALSE(ReadTurn(third.stream.get()).ended);
  const grpc::Status s = third.stream->Finish();
  EXPECT_EQ(s.error_code(), grpc::StatusCode::RESOURCE_EXHAUSTED);
  EXPECT_TRUE(absl::StrContains(s.error_message(), "--max_sessions")) << s.error_message();
  for (auto& h : holders) h->ctx.TryCancel();
}

// A stream with no turn in flight ends after --idle_session_seconds with
// DEADLINE_EXCEEDED naming the flag, and its session slot is free at once.
TEST(HardeningTest, IdleStreamsEndAfterTheTimeoutAndFreeTheirSessions) {
  DECODED_REQUIRE_REAL_MODEL();
  ServerOptions so;
  so.idle_session_timeout = absl::Seconds(1);
  auto server = Serve(SmallEngine(/*max_sessions=*/1), so);
  ASSERT_NE(server, nullptr);
  auto stub = v1::Decoder::NewStub(e2e::ChannelTo(*server));
  OpenStreamClient with_turn(*stub);
  ASSERT_TRUE(with_turn.stream->Write(TextTurn("Hello", 2)));
  ASSERT_TRUE(ReadTurn(with_turn.stream.get()).ended);
  OpenStreamClient without_turn(*stub);
  EXPECT_EQ(Metric(*server, "decoded_sessions_active"), 1);
  const absl::Time idle_from = absl::Now();
  v1::GenerateResponse more;
  EXPECT_FALSE(with_turn.stream->Read(&more));
  const grpc::Status s = with_turn.stream->Finish();
  EXPECT_EQ(s.error_code(), grpc::StatusCode::DEADLINE_EXCEEDED);
  EXPECT_TRUE(absl::StrContains(s.error_message(), "--idle_session_seconds")) << s.error_message();
  EXPECT_GE(absl::Now() - idle_from, absl::Milliseconds(500));
  EXPECT_LT(absl::Now() - idle_from, absl::Seconds(5));
  EXPECT_FALSE(without_turn.stream->Read(&more));
  EXPECT_EQ(without_turn.stream->Finish().error_code(), grpc::StatusCode::DEADLINE_EXCEEDED);
  EXPECT_EQ(MetricSettles(*server, "decoded_sessions_active", 0), 0);
  EXPECT_EQ(MetricSettles(*server, "decoded_sessions_total{outcome=\"idle\"}", 1), 1);
  EXPECT_TRUE(e2e::Solo(*stub, TextTurn("Hello", 2)).ended);  // the slot is free
}

// A turn whose client takes none of its events holds a slot and a KV cache
// for nothing: after the idle timeout the call is cancelled (no status could
// reach a client that does not read) and both are free.
TEST(HardeningTest, AClientThatStopsReadingLosesItsSessionAfterTheTimeout) {
  DECODED_REQUIRE_REAL_MODEL();
  ServerOptions so;
  so.idle_session_timeout = absl::Seconds(1);
  auto server = Serve(SmallEngine(/*max_sessions=*/1), so);
  ASSERT_NE(server, nullptr);
  auto stub = v1::Decoder::NewStub(e2e::ChannelTo(*server));
  int idle = 0;
  for (bool acknowledged : {true, false}) {
    SCOPED_TRACE(acknowledged ? "acknowledged events" : "transport flow control");
    OpenStreamClient silent(*stub);
    v1::GenerateRequest turn = TextTurn("Count to one thousand:", 240);
    turn.mutable_turn()->set_acknowledge_events(acknowledged);
    // Large events, so the transport's window fills within the turn.
    turn.mutable_turn()->mutable_sampling()->set_top_logprobs(20);
    ASSERT_TRUE(silent.stream->Write(turn));
    EXPECT_EQ(MetricSettles(*server, "decoded_sessions_active", 1), 1);
    // Not read: the session is parked, then cancelled (the transport's
    // window fills first: a minute for the sanitizer build).
    EXPECT_EQ(MetricSettles(*server, "decoded_sessions_active", 0, absl::Seconds(90)), 0);
    EXPECT_TRUE(e2e::Solo(*stub, TextTurn("Hello", 2)).ended);
    // Counted as idle before this client goes: a cancel that reached the
    // server before gRPC was done with the call would count it client_gone
    // (seen once on a loaded -j2 run).
    ++idle;
    EXPECT_EQ(MetricSettles(*server, "decoded_sessions_total{outcome=\"idle\"}", idle), idle);
    silent.ctx.TryCancel();
  }
}

// Only turns are work: a client sending cancels (or acks) and nothing else
// is idle all the same, and a stream that sends no turn at all ends after
// --first_turn_seconds.
TEST(HardeningTest, CancelsDoNotKeepAnIdleStreamAliveAndAStreamWithoutATurnEndsSooner) {
  DECODED_REQUIRE_REAL_MODEL();
  ServerOptions so;
  so.idle_session_timeout = absl::Seconds(2);
  so.first_turn_timeout = absl::Seconds(1);
  auto server = Serve(SmallEngine(/*max_sessions=*/1), so);
  ASSERT_NE(server, nullptr);
  auto stub = v1::Decoder::NewStub(e2e::ChannelTo(*server));
  OpenStreamClient keeper(*stub);
  ASSERT_TRUE(keeper.stream->Write(TextTurn("Hello", 1)));
  ASSERT_TRUE(ReadTurn(keeper.stream.get()).ended);
  const absl::Time start = absl::Now();
  std::atomic<bool> stop{false};
  std::thread cancels([&] {
    while (!stop.load() && keeper.stream->Write(e2e::CancelRequest())) absl::SleepFor(absl::Milliseconds(200));
  });
  v1::GenerateResponse more;
  EXPECT_FALSE(keeper.stream->Read(&more));
  stop = true;
  cancels.join();
  const grpc::Status s = keeper.stream->Finish();
  EXPECT_EQ(s.error_code(), grpc::StatusCode::DEADLINE_EXCEEDED) << s.error_message();
  EXPECT_LT(absl::Now() - start, absl::Seconds(6));
  OpenStreamClient silent(*stub);
  const absl::Time opened = absl::Now();
  EXPECT_FALSE(silent.stream->Read(&more));
  const grpc::Status t = silent.stream->Finish();
  EXPECT_EQ(t.error_code(), grpc::StatusCode::DEADLINE_EXCEEDED);
  EXPECT_TRUE(absl::StrContains(t.error_message(), "--first_turn_seconds")) << t.error_message();
  EXPECT_LT(absl::Now() - opened, absl::Seconds(2) + absl::Milliseconds(900));
}

// One client address cannot hold every stream slot, nor every connection
// (--max_streams_per_peer, --max_connections_per_peer).
TEST(HardeningTest, OneClientAddressCannotHoldEveryStreamOrConnection) {
  DECODED_REQUIRE_REAL_MODEL();
  ServerOptions so;
  so.max_streams_per_peer = 4;
  so.max_connections_per_peer = 3;
  auto server = Serve(SmallEngine(/*max_sessions=*/1), so);
  ASSERT_NE(server, nullptr);
  auto stub = v1::Decoder::NewStub(e2e::ChannelTo(*server));
  std::vector<std::unique_ptr<OpenStreamClient>> held;
  for (int i = 0; i < 4; ++i) held.push_back(std::make_unique<OpenStreamClient>(*stub));
  ASSERT_EQ(MetricSettles(*server, "decoded_streams_open", 4), 4);
  OpenStreamClient fifth(*stub);
  v1::GenerateResponse none;
  EXPECT_FALSE(fifth.stream->Read(&none));
  const grpc::Status s = fifth.stream->Finish();
  EXPECT_EQ(s.error_code(), grpc::StatusCode::RESOURCE_EXHAUSTED);
  EXPECT_TRUE(absl::StrContains(s.error_message(), "--max_streams_per_peer")) << s.error_message();
  for (auto& h : held) h->ctx.TryCancel();
  held.clear();
  // The channel above holds one connection; two more fit, the fourth is closed.
  std::vector<std::unique_ptr<RawHttp2>> conns;
  for (int i = 0; i < 3; ++i) conns.push_back(std::make_unique<RawHttp2>(server->port()));
  for (auto& c : conns) c->Read(absl::Milliseconds(300));
  int open = 0;
  for (auto& c : conns) open += c->open() ? 1 : 0;
  EXPECT_EQ(open, 2);
  EXPECT_GE(Metric(*server, "decoded_connections_refused_total"), 1);
}

TEST(HardeningTest, OneClientAddressCannotHoldMoreThanItsShareOfSessions) {
  DECODED_REQUIRE_REAL_MODEL();
  ServerOptions so;
  so.max_sessions_per_peer = 1;
  auto server = Serve(SmallEngine(/*max_sessions=*/4), so);
  ASSERT_NE(server, nullptr);
  auto stub = v1::Decoder::NewStub(e2e::ChannelTo(*server));
  OpenStreamClient first(*stub);
  ASSERT_TRUE(first.stream->Write(TextTurn("Hello", 1)));
  ASSERT_TRUE(ReadTurn(first.stream.get()).ended);
  OpenStreamClient second(*stub);
  ASSERT_TRUE(second.stream->Write(TextTurn("Hello", 1)));
  EXPECT_FALSE(ReadTurn(second.stream.get()).ended);
  const grpc::Status s = second.stream->Finish();
  EXPECT_EQ(s.error_code(), grpc::StatusCode::RESOURCE_EXHAUSTED);
  EXPECT_TRUE(absl::StrContains(s.error_message(), "--max_sessions_per_peer")) << s.error_message();
  first.stream->WritesDone();
  EXPECT_TRUE(first.stream->Finish().ok());
  // Its slot comes back once the server is done with the stream.
  EXPECT_EQ(MetricSettles(*server, "decoded_sessions_active", 0), 0);
  EXPECT_TRUE(e2e::Solo(*stub, TextTurn("Hello", 1)).ended);
}

// A smaller text limit than the default (1 MiB), so each bound is reached
// by a request of modest size.
constexpr int64_t kMaxTextBytes = 64 << 10;

class RequestLimitsTest : public ::testing::Test {
 protected:
  static void SetUpTestSuite() {
    if (!std::filesystem::exists(decoded::testing::RealModelPath())) return;
    serving::EngineOptions eo = SmallEngine(4);
    eo.chat_template = e2e::Gemma3ChatTemplate();
    eo.limits.max_text_bytes = kMaxTextBytes;
    server_ = Serve(eo).release();
  }
  static void TearDownTestSuite() {
    delete server_;
    server_ = nullptr;
  }
  void SetUp() override {
    DECODED_REQUIRE_REAL_MODEL();
    ASSERT_NE(server_, nullptr);
    stub_ = v1::Decoder::NewStub(e2e::ChannelTo(*server_));
  }
  static DecodedServer* server_;
  std::unique_ptr<v1::Decoder::Stub> stub_;
};
DecodedServer* RequestLimitsTest::server_ = nullptr;

// f57ec97 tokenized a 4 MiB text for 8.5 s on a gRPC thread.
TEST_F(RequestLimitsTest, TextBeyondTheLimitIsRefusedBeforeTokenizing) {
  grpc::ClientContext ctx;
  v1::TokenizeRequest req;
  req.set_text(std::string((4 << 20) - 64, 'a'));
  v1::TokenizeResponse resp;
  const absl::Time start = absl::Now();
  const grpc::Status s = stub_->Tokenize(&ctx, req, &resp);
  EXPECT_EQ(s.error_code(), grpc::StatusCode::INVALID_ARGUMENT);
  EXPECT_TRUE(absl::StrContains(s.error_message(), "max_text_bytes")) << s.error_message();
  EXPECT_LT(absl::Now() - start, absl::Seconds(2));
}

// f57ec97 rendered 380k empty messages on the reactor thread for 5-10 s
// before refusing them (only content bytes were counted).
TEST_F(RequestLimitsTest, ManyEmptyChatMessagesAreRefusedBeforeRendering) {
  v1::GenerateRequest turn = e2e::ChatTurn("", 1);
  for (int i = 0; i < 380000; ++i) turn.mutable_turn()->mutable_messages()->add_messages()->set_role("user");
  grpc::ClientContext ctx;
  auto stream = stub_->Generate(&ctx);
  const absl::Time start = absl::Now();
  ASSERT_TRUE(stream->Write(turn));
  EXPECT_FALSE(ReadTurn(stream.get()).ended);
  const grpc::Status s = stream->Finish();
  EXPECT_EQ(s.error_code(), grpc::StatusCode::INVALID_ARGUMENT);
  EXPECT_TRUE(absl::StrContains(s.error_message(), "max_chat_messages")) << s.error_message();
  EXPECT_LT(absl::Now() - start, absl::Seconds(3));
  // Fewer messages than max_chat_messages, all empty, yet over the byte
  // limit: each counts its role and 16 bytes.
  v1::GenerateRequest bytes = e2e::ChatTurn("", 1);
  for (int i = 0; i < 4000; ++i) bytes.mutable_turn()->mutable_messages()->add_messages()->set_role("user");
  grpc::ClientContext ctx2;
  auto stream2 = stub_->Generate(&ctx2);
  ASSERT_TRUE(stream2->Write(bytes));
  EXPECT_FALSE(ReadTurn(stream2.get()).ended);
  const grpc::Status s2 = stream2->Finish();
  EXPECT_EQ(s2.error_code(), grpc::StatusCode::INVALID_ARGUMENT);
  EXPECT_TRUE(absl::StrContains(s2.error_message(), "max_text_bytes")) << s2.error_message();
}

// f57ec97 answered Detokenize of 10^6 ids with 37 MB and kept 150 MB.
TEST_F(RequestLimitsTest, DetokenizeIsBoundedInIdsAndReplyBytes) {
  grpc::ClientContext ctx;
  v1::DetokenizeRequest req;
  for (int i = 0; i < 1000000; ++i) req.add_ids(100 + i % 1000);
  v1::DetokenizeResponse resp;
  grpc::Status s = stub_->Detokenize(&ctx, req, &resp);
  EXPECT_EQ(s.error_code(), grpc::StatusCode::INVALID_ARGUMENT);
  EXPECT_TRUE(absl::StrContains(s.error_message(), "max_token_ids")) << s.error_message();
  // Within the id limit, but spelling more than max_text_bytes.
  const std::vector<int32_t> hello = e2e::Tokenize(*stub_, " Hello", false);
  ASSERT_EQ(hello.size(), 1u);
  v1::DetokenizeRequest wide;
  for (int64_t i = 0; i < kMaxTextBytes / 5; ++i) wide.add_ids(hello[0]);
  grpc::ClientContext ctx2;
  s = stub_->Detokenize(&ctx2, wide, &resp);
  EXPECT_EQ(s.error_code(), grpc::StatusCode::INVALID_ARGUMENT);
  EXPECT_TRUE(absl::StrContains(s.error_message(), "max_text_bytes")) << s.error_message();
  // And just under it, answered.
  wide.mutable_ids()->Truncate(static_cast<int>(kMaxTextBytes / 7));
  grpc::ClientContext ctx3;
  EXPECT_TRUE(stub_->Detokenize(&ctx3, wide, &resp).ok());
}

// Latency percentile (0..1) of `samples`, seconds.
double Percentile(std::vector<double> samples, double q) {
  if (samples.empty()) return 0;
  std::sort(samples.begin(), samples.end());
  return samples[std::min(samples.size() - 1, static_cast<size_t>(q * samples.size()))];
}

// Inter-token gaps of one streamed turn.
std::vector<double> StreamGaps(v1::Decoder::Stub& stub, int tokens) {
  grpc::ClientContext ctx;
  auto stream = stub.Generate(&ctx);
  EXPECT_TRUE(stream->Write(TextTurn("Count to one thousand:", tokens)));
  std::vector<double> gaps;
  v1::GenerateResponse resp;
  auto last = std::chrono::steady_clock::now();
  bool first = true;
  while (stream->Read(&resp) && !resp.has_turn_end()) {
    const auto now = std::chrono::steady_clock::now();
    if (!first) gaps.push_back(std::chrono::duration<double>(now - last).count());
    first = false;
    last = now;
  }
  stream->WritesDone();
  const grpc::Status s = stream->Finish();
  EXPECT_TRUE(s.ok()) << s.error_code() << " " << s.error_message();
  return gaps;
}

// f57ec97: two 4 MiB Tokenize calls dropped a streaming client from 30 to 6
// tok/s with 3 s gaps and made health checks time out. Now they wait their
// turn on the utility pool: health answers and the stream keeps its pace.
// The figures are printed; the bounds asserted are loose enough for a loaded
// machine and the sanitizer build (docs/serving.md has the measured ones).
// A team that takes every CPU lends a thread while a large Tokenize runs
// (EngineOptions::lend_threads_to_host_work): a stream decoded while
// 1 MiB Tokenize calls come and go has the same tokens and log-probabilities
// as the same turn served alone, and the calls are answered.
TEST(HardeningTest, ATeamThatLendsAThreadToTokenizeServesTheSameTokens) {
  DECODED_REQUIRE_REAL_MODEL();
  serving::EngineOptions eo = SmallEngine(/*max_sessions=*/2);
  eo.threads_per_worker = 2;
  eo.lend_threads_to_host_work = true;
  auto server = Serve(std::move(eo));
  ASSERT_NE(server, nullptr);
  auto stub = v1::Decoder::NewStub(e2e::ChannelTo(*server));
  v1::GenerateRequest turn = TextTurn("Count to one thousand:", 40);
  turn.mutable_turn()->mutable_sampling()->set_top_logprobs(5);
  const e2e::TurnResult alone = e2e::Solo(*stub, turn);
  ASSERT_TRUE(alone.ended);
  std::atomic<bool> stop{false};
  std::atomic<int> tokenized{0};
  std::thread tokenizer([&] {
    auto own = v1::Decoder::NewStub(e2e::ChannelTo(*server));
    v1::TokenizeRequest req;
    std::string text;
    while (text.size() < (1 << 20) - 16) absl::StrAppend(&text, "a long text ");
    req.set_text(text);
    while (!stop.load()) {
      grpc::ClientContext ctx;
      v1::TokenizeResponse resp;
      if (own->Tokenize(&ctx, req, &resp).ok()) ++tokenized;
    }
  });
  absl::SleepFor(absl::Milliseconds(100));
  const e2e::TurnResult loaded = e2e::Solo(*stub, turn);
  stop = true;
  tokenizer.join();
  EXPECT_GT(tokenized.load(), 0);
  ASSERT_TRUE(loaded.ended);
  EXPECT_EQ(loaded.ids, alone.ids);
  ASSERT_EQ(loaded.events.size(), alone.events.size());
  for (size_t i = 0; i < alone.events.size(); ++i) {
    EXPECT_EQ(loaded.events[i].SerializeAsString(), alone.events[i].SerializeAsString()) << "event " << i;
  }
}

TEST(HardeningTest, HeavyTokenizeCallsDoNotStallHealthOrAStream) {
  DECODED_REQUIRE_REAL_MODEL();
  auto server = Serve(SmallEngine(/*max_sessions=*/2));
  ASSERT_NE(server, nullptr);
  auto channel = e2e::ChannelTo(*server);
  auto stub = v1::Decoder::NewStub(channel);
  const std::vector<double> alone = StreamGaps(*stub, 60);
  std::atomic<bool> stop{false};
  std::vector<std::thread> tokenizers;
  std::atomic<int> tokenized{0};
  std::vector<std::unique_ptr<grpc::ClientContext>> calls;
  for (int i = 0; i < 8; ++i) calls.push_back(std::make_unique<grpc::ClientContext>());
  for (int i = 0; i < 8; ++i) {
    tokenizers.emplace_back([&, i] {
      auto own = v1::Decoder::NewStub(e2e::ChannelTo(*server));
      v1::TokenizeRequest req;
      std::string text;
      while (text.size() < (1 << 20) - 16) absl::StrAppend(&text, "word", i, " of a long text ");
      req.set_text(text);
      v1::TokenizeResponse resp;
      if (own->Tokenize(calls[i].get(), req, &resp).ok()) ++tokenized;
    });
  }
  std::vector<double> health;
  std::thread prober([&] {
    while (!stop.load()) {
      const absl::Time start = absl::Now();
      EXPECT_EQ(HealthStatus(channel.get()), 1);
      health.push_back(absl::ToDoubleSeconds(absl::Now() - start));
      absl::SleepFor(absl::Milliseconds(50));
    }
  });
  absl::SleepFor(absl::Milliseconds(200));  // the pool is busy
  const std::vector<double> loaded = StreamGaps(*stub, 60);
  stop = true;
  prober.join();
  // What is still queued is not worked on once cancelled.
  for (auto& call : calls) call->TryCancel();
  for (std::thread& t : tokenizers) t.join();
  const double p99_alone = Percentile(alone, 0.99), p99_loaded = Percentile(loaded, 0.99);
  const double health_max = *std::max_element(health.begin(), health.end());
  std::printf("inter-token p99 alone %.1f ms, beside 8 x 1 MiB Tokenize %.1f ms (%.2fx); health max %.1f ms over %zu "
              "checks; %d of 8 tokenized\n",
              p99_alone * 1e3, p99_loaded * 1e3, p99_loaded / p99_alone, health_max * 1e3, health.size(),
              tokenized.load());
  EXPECT_LT(health_max, 1.0);
  EXPECT_LT(p99_loaded, std::max(4 * p99_alone, 0.25));
}

// What a connection's two streams saw: stream 1 streaming a long turn,
// stream 3 opened beside it with `kib` KiB of metadata.
struct SharedConnection {
  bool stream3_refused_by_the_daemon = false;  // its trailers name --max_metadata_bytes
  bool stream1_went_on = false;                 // DATA on stream 1 after stream 3
  std::string stream1_error;                    // trailers that ended stream 1, if any
  bool goaway = false;
  std::string goaway_reason;                    // its debug data
};

SharedConnection MetadataBesideAStream(int port, size_t kib) {
  SharedConnection seen;
  RawHttp2 conn(port);
  conn.SendWindowUpdate(0, 1 << 24);
  conn.SendHeaderBlock(1, RawHttp2::GrpcHeaders("/decoded.v1.Decoder/Generate"), false);
  conn.SendMessage(1, TextTurn("Count to one thousand:", 200).SerializeAsString(), false);
  conn.SendWindowUpdate(1, 1 << 24);
  conn.Read(absl::Seconds(1));  // tokens flow; the server's SETTINGS are acknowledged
  conn.SendHeaderBlock(3, RawHttp2::GrpcHeaders("/decoded.v1.Decoder/GetModelInfo",
                                                {{"x-padding", std::string(kib << 10, 'p')}}),
                       false);
  conn.SendMessage(3, "", true);
  // Until stream 3 has its answer and stream 1 has shown what became of it
  // (the sanitizer build is several times slower).
  bool stream3_answered = false;
  const absl::Time deadline = absl::Now() + absl::Seconds(15);
  while (absl::Now() < deadline && conn.open() &&
         !(stream3_answered && (seen.stream1_went_on || !seen.stream1_error.empty()))) {
    for (const e2e::Http2Frame& f : conn.Read(absl::Milliseconds(200))) {
      if (f.type == e2e::kGoaway) {
        seen.goaway = true;
        seen.goaway_reason = f.payload.size() > 8 ? f.payload.substr(8) : "";
      }
      if (f.type == e2e::kData && f.stream == 1 && stream3_answered) seen.stream1_went_on = true;
      if ((f.type == e2e::kHeaders || f.type == e2e::kRstStream) && f.stream == 3) stream3_answered = true;
      if (f.type == e2e::kHeaders && f.stream == 3 && absl::StrContains(f.payload, "--max_metadata_bytes")) {
        seen.stream3_refused_by_the_daemon = true;
      }
      if (f.type == e2e::kHeaders && f.stream == 1 && absl::StrContains(f.payload, "grpc-status")) {
        seen.stream1_error = absl::CEscape(f.payload);
      }
    }
  }
  return seen;
}

// f57ec97: metadata over 8 KiB on one stream ended every stream on that TCP
// connection (clients share connections between channels). Now the
// transport takes up to 1 MiB and the daemon refuses that call alone
// (RESOURCE_EXHAUSTED naming --max_metadata_bytes); the connection's other
// streams go on.
TEST(HardeningTest, OversizedMetadataEndsOnlyItsOwnStream) {
  DECODED_REQUIRE_REAL_MODEL();
  auto server = Serve(SmallEngine(/*max_sessions=*/2));
  ASSERT_NE(server, nullptr);
  for (size_t kib : {16, 256}) {
    SCOPED_TRACE(absl::StrCat(kib, " KiB of metadata"));
    const SharedConnection seen = MetadataBesideAStream(server->port(), kib);
    EXPECT_TRUE(seen.stream3_refused_by_the_daemon);
    EXPECT_TRUE(seen.stream1_went_on) << seen.stream1_error;
    EXPECT_TRUE(seen.stream1_error.empty()) << seen.stream1_error;
    EXPECT_FALSE(seen.goaway);
  }
}

// Metadata over the transport's own limit (kMaxMetadataTransportBytes,
// 1 MiB): gRPC 1.51 would fail the other streams of the connection with a
// misattributed error ("received initial metadata size exceeds limit") and
// keep the connection. The HTTP/2 guard ends such a connection itself, with
// GOAWAY (ENHANCE_YOUR_CALM) saying why, before gRPC sees the block.
TEST(HardeningTest, MetadataOverTheTransportLimitEndsItsConnectionWithGoaway) {
  DECODED_REQUIRE_REAL_MODEL();
  auto server = Serve(SmallEngine(/*max_sessions=*/2));
  ASSERT_NE(server, nullptr);
  const SharedConnection seen = MetadataBesideAStream(server->port(), (kMaxMetadataTransportBytes >> 10) * 2);
  EXPECT_FALSE(seen.stream3_refused_by_the_daemon);
  EXPECT_TRUE(seen.goaway);
  EXPECT_TRUE(absl::StrContains(seen.goaway_reason, "header block over")) << seen.goaway_reason;
  EXPECT_EQ(Metric(*server, "decoded_connections_header_block_closed_total"), 1);
  // The daemon itself serves on.
  auto stub = v1::Decoder::NewStub(e2e::ChannelTo(*server));
  EXPECT_TRUE(e2e::Solo(*stub, TextTurn("Hello", 2)).ended);
}

// f57ec97: 20k streams opened and reset in 5-7 s raised a streaming client's
// inter-token latency from ~22 ms to 34-67 ms (max 1.3 s), and reset streams
// held session slots (each allocated a KV cache) so newcomers were refused.
// Now a stream that never sent a turn holds nothing, the connection that
// resets faster than --max_stream_resets_per_second is closed long before
// 20k, the burst leaves no stream and no session behind, and a newcomer is
// served at once.
TEST(HardeningTest, ARapidResetBurstLeavesNothingHeldAndDoesNotStarveAStream) {
  DECODED_REQUIRE_REAL_MODEL();
  // The streaming client stands for another client, but shares the
  // attacker's address here: without a per-address cap, the streams of the
  // burst that gRPC has opened and not yet reported cancelled (many, on a
  // loaded machine) cannot refuse it.
  ServerOptions so;
  so.max_streams_per_peer = 0;
  auto server = Serve(SmallEngine(/*max_sessions=*/2), so);
  ASSERT_NE(server, nullptr);
  auto stub = v1::Decoder::NewStub(e2e::ChannelTo(*server));
  const std::vector<double> alone = StreamGaps(*stub, 60);
  std::atomic<bool> stop{false};
  std::atomic<int> resets{0};
  std::atomic<bool> closed{false};
  std::thread attacker([&] {
    RawHttp2 conn(server->port());
    const std::string block = RawHttp2::GrpcHeaders("/decoded.v1.Decoder/Generate");
    uint32_t stream = 1;
    while (!stop.load() && resets.load() < 20000 && conn.open()) {
      std::string burst;
      for (int i = 0; i < 100; ++i, stream += 2) {
        burst += RawHttp2::Frame(e2e::kHeaders, e2e::kEndHeaders, stream, block);
        std::string code("\0\0\0\x08", 4);
        burst += RawHttp2::Frame(e2e::kRstStream, 0, stream, code);
      }
      if (!conn.Send(burst)) break;
      resets += 100;
      conn.Read(absl::ZeroDuration());
    }
    conn.Read(absl::Seconds(5));  // until the server closes the connection
    closed = !conn.open();
  });
  absl::SleepFor(absl::Milliseconds(100));
  const std::vector<double> loaded = StreamGaps(*stub, 60);
  stop = true;
  attacker.join();
  std::printf("%d streams opened and reset; inter-token p99 alone %.1f ms, during the burst %.1f ms, max %.1f ms\n",
              resets.load(), Percentile(alone, 0.99) * 1e3, Percentile(loaded, 0.99) * 1e3,
              Percentile(loaded, 1.0) * 1e3);
  EXPECT_TRUE(closed.load()) << "the resetting connection was left open";
  const double handled = Metric(*server, "decoded_streams_total{outcome=\"client_gone\"}");
  std::printf("the server handled %.0f of the reset streams before it closed the connection\n", handled);
  EXPECT_LT(handled, 20000);
  EXPECT_EQ(Metric(*server, "decoded_connections_reset_flood_closed_total"), 1);
  EXPECT_EQ(MetricSettles(*server, "decoded_streams_open", 0), 0);
  EXPECT_EQ(Metric(*server, "decoded_sessions_active"), 0);
  EXPECT_TRUE(e2e::Solo(*stub, TextTurn("Hello", 2)).ended);
  EXPECT_LT(Percentile(loaded, 1.0), 1.0);
}

int64_t OwnRss() {
  std::ifstream in("/proc/self/status");
  for (std::string line; std::getline(in, line);) {
    if (line.rfind("VmRSS:", 0) == 0) return std::stoll(line.substr(6)) * 1024;
  }
  return -1;
}

// f57ec97: one header block that never ended (CONTINUATION frames without
// END_HEADERS) grew RSS by 1.7x the bytes sent (+440 MiB for 256 MiB), and the
// connection was never closed: gRPC 1.51 keeps the whole block and has no
// bound on it. Both ways of never ending a block are closed now: many
// complete headers (by gRPC at its 1 MiB metadata limit, or by the listener),
// and one header value whose declared length never arrives (gRPC re-copies it
// at every frame and reads ever slower: the listener closes a connection
// whose unread bytes wait for 2 s with no call started and no message read).
// Memory stays bounded, and other clients are served meanwhile.
TEST(HardeningTest, AHeaderBlockThatNeverEndsClosesItsConnectionWithBoundedMemory) {
  DECODED_REQUIRE_REAL_MODEL();
  auto server = Serve(SmallEngine(/*max_sessions=*/1));
  ASSERT_NE(server, nullptr);
  auto channel = e2e::ChannelTo(*server);
  ASSERT_EQ(HealthStatus(channel.get()), 1);
  for (bool one_value : {false, true}) {
    SCOPED_TRACE(one_value ? "one endless header value" : "endless headers");
    const int64_t rss_before = OwnRss();
    RawHttp2 conn(server->port());
    std::string first = RawHttp2::GrpcHeaders("/decoded.v1.Decoder/Generate");
    std::string filler;
    if (one_value) {
      first += std::string(1, '\0') + RawHttp2::Integer(5, 7) + "x-pad" + RawHttp2::Integer(uint64_t{1} << 31, 7);
      filler = std::string(16000, 'v');
    } else {
      for (int i = 0; filler.size() < 15800; ++i) filler += RawHttp2::Literal(absl::StrCat("x-pad", i), "b");
    }
    ASSERT_TRUE(conn.Send(RawHttp2::Frame(e2e::kHeaders, 0, 1, first)));
    int64_t sent = 0;
    const absl::Time start = absl::Now();
    while (conn.open() && sent < (int64_t{256} << 20) && absl::Now() - start < absl::Seconds(60)) {
      std::string burst;
      for (int i = 0; i < 16; ++i) burst += RawHttp2::Frame(e2e::kContinuation, 0, 1, filler);
      if (!conn.Send(burst)) break;
      sent += static_cast<int64_t>(burst.size());
      conn.Read(absl::ZeroDuration());
    }
    conn.Read(absl::Seconds(2));
    absl::SleepFor(absl::Milliseconds(1500));  // gRPC frees the block, the listener trims the heap
    const int64_t grown = OwnRss() - rss_before;
    std::printf("%s: the connection was %s after %.1f MiB sent in %.1f s; RSS %+.1f MiB\n",
                one_value ? "one endless value" : "endless headers", conn.open() ? "still open" : "closed",
                sent / 1048576.0, absl::ToDoubleSeconds(absl::Now() - start), grown / 1048576.0);
    EXPECT_FALSE(conn.open());
    EXPECT_LT(sent, int64_t{64} << 20);
#if !defined(__SANITIZE_ADDRESS__)
    // (ASan's quarantine keeps freed memory resident by design.)
    EXPECT_LT(grown, int64_t{128} << 20);
#endif
    EXPECT_LT(absl::Now() - start, absl::Seconds(15));
    EXPECT_EQ(HealthStatus(channel.get()), 1);
  }
  // Which of the two closed it depends on when gRPC applied its advertised
  // limit; the listener's own check is tested in server_parts_test.
  const double closed = Metric(*server, "decoded_connections_without_progress_closed_total");
  // Large requests that do start calls are not mistaken for it.
  auto stub = v1::Decoder::NewStub(channel);
  for (int i = 0; i < 4; ++i) {
    grpc::ClientContext ctx;
    v1::DetokenizeRequest req;
    for (int j = 0; j < 131072; ++j) req.add_ids(70000 + j % 1000);  // 3-byte varints: ~0.4 MiB
    v1::DetokenizeResponse resp;
    const grpc::Status s = stub->Detokenize(&ctx, req, &resp);
    EXPECT_NE(s.error_code(), grpc::StatusCode::UNAVAILABLE) << s.error_message();
  }
  grpc::ClientContext tctx;
  v1::TokenizeRequest big;
  big.set_text(std::string((4 << 20) - 64, 'z'));
  for (int i = 0; i < 3; ++i) {
    grpc::ClientContext ctx;
    v1::TokenizeResponse resp;
    EXPECT_EQ(stub->Tokenize(&ctx, big, &resp).error_code(), grpc::StatusCode::INVALID_ARGUMENT);
  }
  EXPECT_EQ(Metric(*server, "decoded_connections_without_progress_closed_total"), closed);
}

std::string ReadText(const std::string& path) {
  std::ifstream in(path, std::ios::binary);
  std::stringstream s;
  s << in.rdbuf();
  return s.str();
}

// The daemon's own listener hands TLS connections to gRPC like plaintext
// ones: turns are served over TLS, a plaintext client is refused without
// harm to anyone, and the watchdog's probe (closed at accept) sees a live
// listener. tests/data/tls_test_{cert,key}.pem: a self-signed pair for
// localhost and 127.0.0.1 (openssl req -x509 -newkey rsa:2048 -nodes
// -days 36500 -subj /CN=localhost -addext
// subjectAltName=DNS:localhost,IP:127.0.0.1), for tests only.
TEST(HardeningTest, TlsIsServedThroughTheDaemonsListener) {
  DECODED_REQUIRE_REAL_MODEL();
  ServerOptions so;
  so.tls_cert_file = decoded::testing::TestDataPath("tls_test_cert.pem");
  so.tls_key_file = decoded::testing::TestDataPath("tls_test_key.pem");
  so.listener_probe_interval = absl::Milliseconds(500);
  auto server = Serve(SmallEngine(1), so);
  ASSERT_NE(server, nullptr);
  grpc::SslCredentialsOptions tls;
  tls.pem_root_certs = ReadText(so.tls_cert_file);
  auto secure = grpc::CreateChannel(absl::StrCat("127.0.0.1:", server->port()), grpc::SslCredentials(tls));
  EXPECT_EQ(HealthStatus(secure.get()), 1);
  auto stub = v1::Decoder::NewStub(secure);
  EXPECT_TRUE(e2e::Solo(*stub, TextTurn("Hello", 2)).ended);
  auto plain = e2e::ChannelTo(*server);
  const absl::Time start = absl::Now();
  EXPECT_EQ(HealthStatus(plain.get()), -1);
  EXPECT_LT(absl::Now() - start, absl::Seconds(10));
  absl::SleepFor(absl::Seconds(2));  // four probes
  EXPECT_EQ(HealthStatus(secure.get()), 1) << "the probe took a TLS listener for a dead one";
  EXPECT_TRUE(e2e::Solo(*stub, TextTurn("Hello", 2)).ended);
}

// list_services, then file_containing_symbol for the Decoder (the count of
// files answered, appended), through either reflection version: their
// messages have the same fields.
template <typename Service, typename Request, typename Response>
std::pair<grpc::Status, std::vector<std::string>> ListServices(const std::shared_ptr<grpc::Channel>& channel,
                                                               bool with_token) {
  grpc::ClientContext ctx;
  if (with_token) ctx.AddMetadata("authorization", "Bearer s3cret");
  auto stub = Service::NewStub(channel);
  auto stream = stub->ServerReflectionInfo(&ctx);
  std::vector<std::string> names;
  Request req;
  req.set_list_services("*");
  stream->Write(req);
  Response resp;
  if (stream->Read(&resp)) {
    for (const auto& s : resp.list_services_response().service()) names.push_back(s.name());
  }
  req.set_file_containing_symbol("decoded.v1.Decoder");
  stream->Write(req);
  if (stream->Read(&resp)) names.push_back(absl::StrCat(resp.file_descriptor_response().file_descriptor_proto_size()));
  stream->WritesDone();
  return {stream->Finish(), names};
}

// With a token, reflection (both versions) asks for it; health never does
// (probes carry no token).
TEST(HardeningTest, ReflectionServesV1AndV1AlphaAndAsksForTheToken) {
  DECODED_REQUIRE_REAL_MODEL();
  ServerOptions so;
  so.auth_token = "s3cret";
  auto server = Serve(SmallEngine(1), so);
  ASSERT_NE(server, nullptr);
  auto channel = e2e::ChannelTo(*server);
  EXPECT_EQ(HealthStatus(channel.get()), 1);
  auto list = [&](bool with_token, bool v1) -> std::pair<grpc::Status, std::vector<std::string>> {
    return v1 ? ListServices<grpc::reflection::v1::ServerReflection, grpc::reflection::v1::ServerReflectionRequest,
                             grpc::reflection::v1::ServerReflectionResponse>(channel, with_token)
              : ListServices<grpc::reflection::v1alpha::ServerReflection,
                             grpc::reflection::v1alpha::ServerReflectionRequest,
                             grpc::reflection::v1alpha::ServerReflectionResponse>(channel, with_token);
  };
  for (bool v1 : {true, false}) {
    SCOPED_TRACE(v1 ? "v1" : "v1alpha");
    auto [refused, none] = list(false, v1);
    EXPECT_EQ(refused.error_code(), grpc::StatusCode::UNAUTHENTICATED);
    EXPECT_TRUE(none.empty());
    auto [ok, names] = list(true, v1);
    EXPECT_TRUE(ok.ok()) << ok.error_message();
    EXPECT_NE(std::find(names.begin(), names.end(), "decoded.v1.Decoder"), names.end());
    EXPECT_NE(std::find(names.begin(), names.end(), "grpc.reflection.v1.ServerReflection"), names.end());
    EXPECT_EQ(names.back(), "1") << "decoded.proto imports nothing";
  }
}

TEST(HardeningTest, MetricsAskForTheirTokenAndAnswerBesideSlowClients) {
  DECODED_REQUIRE_REAL_MODEL();
  ServerOptions so;
  so.metrics_auth_token = "m3trics";
  auto server = Serve(SmallEngine(1), so);
  ASSERT_NE(server, nullptr);
  auto get = [&](const std::string& auth) {
    const int fd = socket(AF_INET, SOCK_STREAM | SOCK_CLOEXEC, 0);
    sockaddr_in addr{};
    addr.sin_family = AF_INET;
    addr.sin_port = htons(static_cast<uint16_t>(server->metrics_port()));
    addr.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
    std::string reply;
    if (connect(fd, reinterpret_cast<sockaddr*>(&addr), sizeof(addr)) == 0) {
      const std::string req = "GET /metrics HTTP/1.0\r\n" + auth + "\r\n";
      (void)!write(fd, req.data(), req.size());
      char buf[4096];
      for (ssize_t n; (n = read(fd, buf, sizeof(buf))) > 0;) reply.append(buf, static_cast<size_t>(n));
    }
    close(fd);
    return reply;
  };
  EXPECT_TRUE(absl::StartsWith(get(""), "HTTP/1.1 401")) << get("");
  EXPECT_TRUE(absl::StartsWith(get("Authorization: Bearer wrong\r\n"), "HTTP/1.1 401"));
  EXPECT_TRUE(absl::StrContains(get("Authorization: Bearer m3trics\r\n"), "decoded_health_serving 1"));
  // f57ec97: two connections trickling their requests blocked scraping for
  // ~30 s (civetweb's 2 threads, 30 s timeout).
  std::vector<int> slow;
  for (int i = 0; i < 8; ++i) {
    const int fd = socket(AF_INET, SOCK_STREAM | SOCK_CLOEXEC, 0);
    sockaddr_in addr{};
    addr.sin_family = AF_INET;
    addr.sin_port = htons(static_cast<uint16_t>(server->metrics_port()));
    addr.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
    ASSERT_EQ(connect(fd, reinterpret_cast<sockaddr*>(&addr), sizeof(addr)), 0);
    (void)!write(fd, "GET /metr", 9);
    slow.push_back(fd);
  }
  absl::SleepFor(absl::Milliseconds(200));
  for (int round = 0; round < 3; ++round) {
    for (int fd : slow) (void)!write(fd, "i", 1);  // still trickling
    const absl::Time start = absl::Now();
    EXPECT_TRUE(absl::StrContains(get("Authorization: Bearer m3trics\r\n"), "decoded_health_serving 1"));
    EXPECT_LT(absl::Now() - start, absl::Seconds(1));
    absl::SleepFor(absl::Milliseconds(300));
  }
  for (int fd : slow) close(fd);
}

}  // namespace
}  // namespace decoded::server
