// The daemon serving on --device vulkan (lavapipe in CI), end to end over
// gRPC: the real Gemma 3 270M against the CPU backend's greedy tokens, a lost
// device, and the KV budget counted in device memory. Every family's fixture
// against Hugging Face on Vulkan is tests/server/family_serving_e2e_test.cc.
#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <memory>
#include <string>
#include <thread>
#include <vector>

#include "absl/strings/str_cat.h"
#include "absl/time/clock.h"
#include "absl/time/time.h"
#include "engine/backend.h"
#include "engine/serving/engine.h"
#include "grpcpp/grpcpp.h"
#include "gtest/gtest.h"
#include "proto/decoded.grpc.pb.h"
#include "server/server.h"
#include "tests/common/model_path.h"
#include "tests/common/test_backend.h"
#include "tests/server/e2e_support.h"

namespace decoded::server {
namespace {

// Greedy turns with the two most likely tokens reported: the top-1 minus
// top-2 log-probability is their logit gap (one softmax normalizes both).
v1::GenerateRequest GreedyTurn(const std::string& text, int max_new_tokens) {
  v1::GenerateRequest req = e2e::TextTurn(text, max_new_tokens);
  req.mutable_turn()->mutable_sampling()->set_top_logprobs(2);
  return req;
}

struct Served {
  std::vector<e2e::TurnResult> turns;
  std::string device;
};

// Each prompt on its own stream, all at once, on a fresh daemon serving
// `model` over `backend`: their prompts share mixed steps and their tokens
// batched ones, which leave every session's logits as they are alone
// (batch_decode_test, mixed_step_test): 25% less lavapipe time than one
// stream after another (measured; its shaders' time grows with the rows).
Served Serve(const std::string& model, std::shared_ptr<Backend> backend, const std::vector<std::string>& prompts,
             int max_new_tokens) {
  Served out;
  serving::EngineOptions eo;
  eo.model_path = model;
  eo.threads_per_worker = 2;
  eo.max_sessions = static_cast<int>(prompts.size());
  eo.context_length = 256;
  eo.backend = std::move(backend);
  absl::StatusOr<std::unique_ptr<DecodedServer>> server = e2e::StartServer(eo);
  EXPECT_TRUE(server.ok()) << server.status();
  if (!server.ok()) return out;
  auto stub = v1::Decoder::NewStub(e2e::ChannelTo(**server));
  grpc::ClientContext info_ctx;
  v1::ModelInfo info;
  EXPECT_TRUE(stub->GetModelInfo(&info_ctx, v1::GetModelInfoRequest(), &info).ok());
  out.device = info.device();
  out.turns.resize(prompts.size());
  std::vector<std::thread> clients;
  for (size_t i = 0; i < prompts.size(); ++i) {
    clients.emplace_back([&, i] { out.turns[i] = e2e::Solo(*stub, GreedyTurn(prompts[i], max_new_tokens)); });
  }
  for (std::thread& t : clients) t.join();
  const int port = (*server)->metrics_port();
  EXPECT_EQ(e2e::MetricValue(e2e::HttpGet(port, "/metrics"), "decoded_device_validation_messages_total"), 0);
  return out;
}

struct Agreement {
  int same = 0;         // tokens equal up to each prompt's first divergence
  int compared = 0;     // tokens compared
  int divergences = 0;  // prompts whose tokens differ somewhere
  double worst = 0;     // max |logprob a - logprob b| over the equal tokens
};

// Compares two daemons' greedy turns token by token up to each prompt's
// first divergence (the contexts differ from there): every equal token's
// log-probability within `tolerance`, every divergence at a near-tie of `a`
// (its top-1 / top-2 gap under twice the tolerance: a logit error that large
// can swap two such tokens), each printed with its gap.
Agreement Compare(const Served& a, const Served& b, const std::vector<std::string>& prompts, double tolerance,
                  const char* what) {
  Agreement out;
  for (size_t p = 0; p < prompts.size() && p < a.turns.size() && p < b.turns.size(); ++p) {
    const e2e::TurnResult& ta = a.turns[p];
    const e2e::TurnResult& tb = b.turns[p];
    EXPECT_TRUE(ta.ended && tb.ended) << prompts[p];
    EXPECT_EQ(ta.ids.size(), tb.ids.size()) << prompts[p];
    for (size_t i = 0; i < ta.ids.size() && i < tb.ids.size(); ++i) {
      ++out.compared;
      const v1::TokenEvent& ea = ta.events[i];
      EXPECT_EQ(ea.top_logprobs_size(), 2);
      if (ea.top_logprobs_size() < 2) break;
      const double gap = ea.top_logprobs(0).logprob() - ea.top_logprobs(1).logprob();
      if (ta.ids[i] != tb.ids[i]) {
        ++out.divergences;
        std::printf("[ measured ] %s, \"%s\": diverges at token %zu (%d vs %d), top-1/top-2 logit gap %.4f\n", what,
                    prompts[p].c_str(), i, ta.ids[i], tb.ids[i], gap);
        EXPECT_LT(gap, 2 * tolerance) << what << ", " << prompts[p] << " token " << i << ": not a near-tie";
        break;
      }
      ++out.same;
      out.worst = std::max(out.worst, std::abs(static_cast<double>(ea.logprob()) - tb.events[i].logprob()));
      EXPECT_NEAR(ea.logprob(), tb.events[i].logprob(), tolerance) << what << ", " << prompts[p] << " token " << i;
    }
  }
  std::printf("[ measured ] %s: %d of %d greedy tokens equal, %d divergences, max |logprob difference| %.3g\n", what,
              out.same, out.compared, out.divergences, out.worst);
  return out;
}

// The real model on Vulkan, against the CPU backend twice:
//  - on the same Q4_K_M file, greedy tokens equal except at near-ties: the
//    CPU multiplies Q8_K-quantized activations (as llama.cpp does), Vulkan
//    f32 ones, so their logits differ by up to ~0.12 (measured);
//  - on the same weights dequantized to an F32 file (scripts/fetch_f32_model.sh),
//    which the CPU multiplies in f32 as Vulkan does: logits within 1e-4 (5.7e-6 measured) and
//    every greedy token equal. This is what proves the GPU kernels; the
//    first comparison is what a user switching --device sees.
TEST(VulkanServingTest, RealGemma3GreedyTokensAreTheCpuBackendsExceptAtNearTies) {
#if defined(__SANITIZE_ADDRESS__)
  // Minutes of lavapipe (uninstrumented: its time is the same under the
  // sanitizers) for host code the fixture tests here run under them too.
  GTEST_SKIP() << "minutes of lavapipe compute; the Release build runs it";
#endif
  DECODED_REQUIRE_REAL_MODEL();
  const testing::NamedModel f32 = testing::NamedModelPath("DECODED_F32_MODEL_PATH", "gemma-3-270m-f32.gguf");
  DECODED_REQUIRE_NAMED_MODEL(f32);
  DECODED_TEST_BACKEND_OR_SKIP(vulkan, "vulkan");
  const std::vector<std::string> prompts = {"The capital of France is", "def fibonacci(n):",
                                            "Once upon a time, in a small village,"};
  constexpr int kTokens = 16;
  // Measured on lavapipe (3 prompts x 16 tokens): see the printed figures.
  constexpr double kQuantizedActivationTolerance = 0.15;
  constexpr double kF32Tolerance = 1e-4;
  const absl::Time t0 = absl::Now();
  const Served cpu = Serve(testing::RealModelPath(), SharedCpuBackend(), prompts, kTokens);
  const Served cpu_f32 = Serve(f32.path, SharedCpuBackend(), prompts, kTokens);
  const absl::Time t1 = absl::Now();
  const Served gpu = Serve(testing::RealModelPath(), vulkan, prompts, kTokens);
  const absl::Time t2 = absl::Now();
  ASSERT_EQ(gpu.turns.size(), prompts.size());
  EXPECT_EQ(gpu.device, vulkan->device_name());
  Compare(cpu, gpu, prompts, kQuantizedActivationTolerance, "cpu Q4_K_M vs vulkan Q4_K_M");
  const Agreement exact = Compare(cpu_f32, gpu, prompts, kF32Tolerance, "cpu F32 vs vulkan Q4_K_M");
  EXPECT_EQ(exact.divergences, 0);
  std::printf("[ measured ] real Gemma 3 270M on %s: cpu (both files) %.1f s, vulkan %.1f s\n", gpu.device.c_str(),
              absl::ToDoubleSeconds(t1 - t0), absl::ToDoubleSeconds(t2 - t1));
}

// VK_ERROR_DEVICE_LOST while a turn runs (injected: the device's submissions
// fail after the warm-up's) ends that turn with UNAVAILABLE, turns health
// NOT_SERVING for good (before that turn's error reaches the client),
// refuses new sessions, and the daemon keeps answering.
TEST(VulkanServingTest, ALostDeviceEndsTheTurnWithUnavailableAndHealthTurnsNotServing) {
  // The warm-up submits 3 steps (a prefill chunk, two decode tokens); the
  // turn's prefill (its first token) and 3 decode steps run, then the device
  // is "lost".
  setenv("DECODED_VULKAN_LOSE_DEVICE_AFTER_SUBMISSIONS", "7", 1);
  DECODED_TEST_BACKEND_OR_SKIP(vulkan, "vulkan");
  unsetenv("DECODED_VULKAN_LOSE_DEVICE_AFTER_SUBMISSIONS");
  serving::EngineOptions eo;
  eo.model_path = testing::TestDataPath("gemma3_tiny_swa.gguf");
  eo.context_length = 64;
  eo.backend = vulkan;
  absl::StatusOr<std::unique_ptr<DecodedServer>> server = e2e::StartServer(eo);
  ASSERT_TRUE(server.ok()) << server.status();
  auto channel = e2e::ChannelTo(**server);
  auto stub = v1::Decoder::NewStub(channel);
  ASSERT_EQ(e2e::HealthStatus(channel.get()), 1);

  grpc::ClientContext ctx;
  auto stream = stub->Generate(&ctx);
  ASSERT_TRUE(stream->Write(e2e::TextTurn("Hello there", 20)));
  const e2e::TurnResult r = e2e::ReadTurn(stream.get());
  EXPECT_FALSE(r.ended) << "the turn ended normally on a lost device";
  EXPECT_EQ(r.ids.size(), 4u) << "tokens before the loss";
  const grpc::Status status = stream->Finish();
  EXPECT_EQ(status.error_code(), grpc::StatusCode::UNAVAILABLE) << status.error_message();
  EXPECT_NE(status.error_message().find("lost"), std::string::npos) << status.error_message();

  // At once, not at the watchdog's next look (every 500 ms): the failing
  // step reports the loss before its turn ends.
  EXPECT_EQ(e2e::HealthStatus(channel.get()), 2) << "health still SERVING after the turn failed";
  const int port = (*server)->metrics_port();
  EXPECT_EQ(e2e::MetricValue(e2e::HttpGet(port, "/metrics"), "decoded_device_lost"), 1);
  EXPECT_EQ(e2e::MetricValue(e2e::HttpGet(port, "/metrics"), "decoded_health_serving"), 0);

  // A new session is refused at once, and the daemon still answers.
  grpc::ClientContext ctx2;
  auto stream2 = stub->Generate(&ctx2);
  ASSERT_TRUE(stream2->Write(e2e::TextTurn("Hello", 2)));
  EXPECT_FALSE(e2e::ReadTurn(stream2.get()).ended);
  EXPECT_EQ(stream2->Finish().error_code(), grpc::StatusCode::UNAVAILABLE);
  grpc::ClientContext info_ctx;
  v1::ModelInfo info;
  EXPECT_TRUE(stub->GetModelInfo(&info_ctx, v1::GetModelInfoRequest(), &info).ok());
  EXPECT_EQ(info.backend(), "vulkan");
  EXPECT_GT(info.device_memory_used_bytes(), 0) << "the weights are on the device";
  EXPECT_LT(info.device_memory_used_bytes(), info.device_memory_capacity_bytes());
}

// The serving guarantees are the scheduler's, whatever the device: on Vulkan
// a client that stops acknowledging is parked after max_unconsumed_events,
// a cancel ends its turn there, a drain cuts a parked turn with SHUTDOWN, and
// every device byte a session took is back once it closes.
TEST(VulkanServingTest, BackpressureCancelAndDrainHoldOnVulkan) {
  DECODED_TEST_BACKEND_OR_SKIP(vulkan, "vulkan");
  serving::EngineOptions eo;
  eo.model_path = testing::TestDataPath("gemma3_tiny_swa.gguf");
  eo.context_length = 128;
  eo.max_unconsumed_events = 8;
  eo.backend = vulkan;
  absl::StatusOr<std::unique_ptr<DecodedServer>> server = e2e::StartServer(eo);
  ASSERT_TRUE(server.ok()) << server.status();
  auto stub = v1::Decoder::NewStub(e2e::ChannelTo(**server));
  const int port = (*server)->metrics_port();
  const double idle_bytes = e2e::MetricValue(e2e::HttpGet(port, "/metrics"), "decoded_device_memory_bytes");
  const serving::Engine& engine = *(*server)->engine();
  auto unacknowledged = [](int tokens) {
    v1::GenerateRequest turn = e2e::TextTurn("Hello there", tokens);
    turn.mutable_turn()->set_acknowledge_events(true);
    return turn;
  };
  auto wait_parked = [&](int64_t want) {
    const absl::Time deadline = absl::Now() + absl::Seconds(30);
    while (engine.Stats().sessions_waiting_for_client != want && absl::Now() < deadline) {
      absl::SleepFor(absl::Milliseconds(10));
    }
    return engine.Stats().sessions_waiting_for_client;
  };

  // Parked after 8 events, then cancelled there.
  grpc::ClientContext a_ctx;
  auto a = stub->Generate(&a_ctx);
  ASSERT_TRUE(a->Write(unacknowledged(60)));
  ASSERT_EQ(wait_parked(1), 1);
  EXPECT_GT(e2e::MetricValue(e2e::HttpGet(port, "/metrics"), "decoded_device_memory_bytes"), idle_bytes);
  ASSERT_TRUE(a->Write(e2e::CancelRequest()));
  const e2e::TurnResult cancelled = e2e::ReadTurn(a.get());
  ASSERT_TRUE(cancelled.ended);
  EXPECT_EQ(cancelled.end.finish_reason(), v1::CANCELLED);
  EXPECT_EQ(cancelled.ids.size(), 8u);
  a->WritesDone();
  EXPECT_TRUE(a->Finish().ok());
  EXPECT_TRUE(e2e::EngineDrainsToZero(engine, absl::Seconds(5)));
  // The worker drops its batch plans once no session is open, a moment later.
  double device_bytes = -1;
  for (const absl::Time deadline = absl::Now() + absl::Seconds(5); absl::Now() < deadline;) {
    device_bytes = e2e::MetricValue(e2e::HttpGet(port, "/metrics"), "decoded_device_memory_bytes");
    if (device_bytes == idle_bytes) break;
    absl::SleepFor(absl::Milliseconds(10));
  }
  EXPECT_EQ(device_bytes, idle_bytes);

  // Parked again, then the drain cuts it with a final SHUTDOWN event.
  grpc::ClientContext b_ctx;
  auto b = stub->Generate(&b_ctx);
  ASSERT_TRUE(b->Write(unacknowledged(60)));
  ASSERT_EQ(wait_parked(1), 1);
  const absl::Time start = absl::Now();
  (*server)->Drain(absl::Seconds(2));
  EXPECT_LT(absl::Now() - start, absl::Seconds(3));
  const e2e::TurnResult cut = e2e::ReadTurn(b.get());
  ASSERT_TRUE(cut.ended);
  EXPECT_EQ(cut.end.finish_reason(), v1::SHUTDOWN);
  EXPECT_EQ(b->Finish().error_code(), grpc::StatusCode::UNAVAILABLE);
  EXPECT_EQ(e2e::MetricValue(e2e::HttpGet(port, "/metrics"), "decoded_device_validation_messages_total"), 0);
}

// --kv_budget_mb counts the device's memory: by default three quarters of
// what the weights leave of it; more than they leave is refused at start.
TEST(VulkanServingTest, TheKvBudgetIsDeviceMemory) {
  DECODED_TEST_BACKEND_OR_SKIP(vulkan, "vulkan");
  serving::EngineOptions eo;
  eo.model_path = testing::TestDataPath("gemma3_tiny_swa.gguf");
  eo.context_length = 64;
  eo.backend = vulkan;
  eo.kv_budget_bytes = -1;
  absl::StatusOr<std::unique_ptr<serving::Engine>> engine = serving::Engine::Create(eo);
  ASSERT_TRUE(engine.ok()) << engine.status();
  const serving::EngineStats s = (*engine)->Stats();
  ASSERT_GT(s.device_memory_capacity_bytes, 0);
  EXPECT_GT(s.device_memory_bytes, 0) << "the weights are on the device";
  // The budget is three quarters of what the weights left; the paged KV
  // pool, made from it, is device memory too (every session at its full
  // context fits in it here: 16 sessions x 64 / 16 position ranges x 3 layer
  // groups, the fixture's global layers and two groups of sliding ones).
  const int64_t pool_bytes = 16 * (*engine)->ModelInfo().session_kv_bytes;
  EXPECT_EQ(s.kv_blocks_total, 16 * 64 / 16 * 3);
  // The budget in force is the pool's bytes, within three quarters of what
  // the weights left.
  EXPECT_EQ(s.kv_budget_bytes, pool_bytes);
  EXPECT_LE(pool_bytes, (s.device_memory_capacity_bytes - (s.device_memory_bytes - pool_bytes)) / 4 * 3);
  const int64_t capacity = s.device_memory_capacity_bytes;
  engine->reset();

  eo.backend = testing::OpenTestBackend("vulkan", &vulkan_why);
  eo.kv_budget_bytes = capacity;  // the weights take some: cannot fit
  absl::StatusOr<std::unique_ptr<serving::Engine>> refused = serving::Engine::Create(eo);
  ASSERT_FALSE(refused.ok());
  EXPECT_TRUE(absl::IsResourceExhausted(refused.status())) << refused.status();
  EXPECT_NE(refused.status().message().find(vulkan->device_name()), std::string::npos) << refused.status();
}

// Weights that do not fit what the device has left are refused at load with
// RESOURCE_EXHAUSTED naming the tensor (the daemon exits 2), not at a first
// token. Another backend on the same device takes all but 1 KiB of its heap.
TEST(VulkanServingTest, AModelLargerThanTheDeviceHasLeftIsRefusedAtLoad) {
  DECODED_TEST_BACKEND_OR_SKIP(hog, "vulkan");
  DECODED_TEST_BACKEND_OR_SKIP(vulkan, "vulkan");
  std::vector<std::unique_ptr<DeviceBuffer>> taken;
  constexpr int64_t kChunk = int64_t{256} << 20;
  for (int64_t left = hog->memory_capacity_bytes() - hog->allocated_bytes() - 1024; left > 4096;
       left = hog->memory_capacity_bytes() - hog->allocated_bytes() - 1024) {
    auto b = hog->Allocate(static_cast<size_t>(std::min(left, kChunk)));
    ASSERT_TRUE(b.ok()) << b.status();
    taken.push_back(*std::move(b));
  }
  serving::EngineOptions eo;
  eo.model_path = testing::TestDataPath("gemma3_tiny_swa.gguf");
  eo.context_length = 64;
  eo.backend = vulkan;
  absl::StatusOr<std::unique_ptr<serving::Engine>> engine = serving::Engine::Create(eo);
  ASSERT_FALSE(engine.ok());
  EXPECT_TRUE(absl::IsResourceExhausted(engine.status())) << engine.status();
  EXPECT_NE(engine.status().message().find("the weights do not fit"), std::string::npos) << engine.status();
  EXPECT_NE(engine.status().message().find(".weight"), std::string::npos) << engine.status();
  taken.clear();
  EXPECT_EQ(vulkan->validation_messages(), 0);
}

}  // namespace
}  // namespace decoded::server
