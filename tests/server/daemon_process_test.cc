// The decoded binary as a process: how it stops on SIGTERM/SIGINT (exit
// status, final events, time within --drain_seconds, open health Watch
// calls) and what an abort storm does to its resident memory and its
// session outcome counts. Runs the built daemon on the real model, on ports
// it picks itself (it logs them).
#include <fcntl.h>
#include <signal.h>
#include <spawn.h>
#include <sys/stat.h>
#include <sys/wait.h>
#include <unistd.h>

#include <atomic>
#include <cstdio>
#include <cstdlib>
#include <fstream>
#include <memory>
#include <random>
#include <regex>
#include <sstream>
#include <string>
#include <thread>
#include <vector>

#include "absl/strings/str_cat.h"
#include "absl/time/clock.h"
#include "absl/time/time.h"
#include "grpcpp/grpcpp.h"
#include "grpcpp/impl/client_unary_call.h"
#include "gtest/gtest.h"
#include "proto/decoded.grpc.pb.h"
#include "tests/common/model_path.h"
#include "tests/server/daemon_process.h"
#include "tests/server/e2e_support.h"

namespace decoded::server {
namespace {

using e2e::Daemon;
using e2e::HealthStatus;
using e2e::HttpGet;
using e2e::MetricValue;
using e2e::ReadTurn;
using e2e::TextTurn;
using e2e::TurnResult;

std::vector<std::string> ModelFlags(std::vector<std::string> more = {}) {
  std::vector<std::string> flags = {"--model=" + decoded::testing::RealModelPath(), "--context_length=512"};
  flags.insert(flags.end(), more.begin(), more.end());
  return flags;
}

// A grpc.health.v1.Health/Watch call (empty service name) read on its own
// thread: the statuses it delivered and whether the server ended it.
class HealthWatch {
 public:
  explicit HealthWatch(std::shared_ptr<grpc::Channel> channel) {
    thread_ = std::thread([this, channel] {
      grpc::Slice empty("", 0);
      grpc::ByteBuffer request(&empty, 1);
      std::unique_ptr<grpc::ClientReader<grpc::ByteBuffer>> reader(
          grpc::internal::ClientReaderFactory<grpc::ByteBuffer>::Create(
              channel.get(),
              grpc::internal::RpcMethod("/grpc.health.v1.Health/Watch", grpc::internal::RpcMethod::SERVER_STREAMING),
              &ctx_, request));
      grpc::ByteBuffer response;
      while (reader->Read(&response)) {
        std::vector<grpc::Slice> slices;
        (void)response.Dump(&slices);
        std::string bytes;
        for (const grpc::Slice& s : slices) bytes.append(reinterpret_cast<const char*>(s.begin()), s.size());
        absl::MutexLock lock(&mu_);
        statuses_.push_back(bytes.size() == 2 ? bytes[1] : 0);
      }
      grpc::Status status = reader->Finish();
      absl::MutexLock lock(&mu_);
      ended_ = true;
      end_status_ = status;
    });
  }
  ~HealthWatch() {
    ctx_.TryCancel();
    thread_.join();
  }
  bool WaitFirst(absl::Duration timeout) {
    absl::MutexLock lock(&mu_);
    return mu_.AwaitWithTimeout(absl::Condition(+[](std::vector<int>* s) { return !s->empty(); }, &statuses_),
                                timeout);
  }
  bool WaitEnded(absl::Duration timeout) {
    absl::MutexLock lock(&mu_);
    return mu_.AwaitWithTimeout(absl::Condition(&ended_), timeout);
  }
  std::vector<int> statuses() {
    absl::MutexLock lock(&mu_);
    return statuses_;
  }

 private:
  grpc::ClientContext ctx_;
  absl::Mutex mu_;
  std::vector<int> statuses_ ABSL_GUARDED_BY(mu_);
  bool ended_ ABSL_GUARDED_BY(mu_) = false;
  grpc::Status end_status_ ABSL_GUARDED_BY(mu_);
  std::thread thread_;
};

// SIGTERM during a long turn: health watchers see NOT_SERVING and their Watch
// ends at once; the turn runs on until the cut point, then ends with SHUTDOWN
// (then UNAVAILABLE), and the process exits 0 within --drain_seconds.
TEST(DaemonProcessTest, SigtermCutsARunningTurnAndExitsZeroWithinTheDrainPeriod) {
  DECODED_REQUIRE_REAL_MODEL();
  Daemon daemon(ModelFlags({"--drain_seconds=3"}));
  ASSERT_TRUE(daemon.WaitServing(absl::Seconds(60))) << daemon.Log();
  HealthWatch watch(daemon.channel());
  ASSERT_TRUE(watch.WaitFirst(absl::Seconds(5)));
  auto stub = v1::Decoder::NewStub(daemon.channel());
  grpc::ClientContext ctx;
  auto stream = stub->Generate(&ctx);
  ASSERT_TRUE(stream->Write(TextTurn("Count to one thousand:", 480)));
  v1::GenerateResponse first;
  ASSERT_TRUE(stream->Read(&first));

  daemon.Signal(SIGTERM);
  // The Watch ends at once, long before the turn is cut.
  ASSERT_TRUE(watch.WaitEnded(absl::Seconds(1)));
  const std::vector<int> statuses = watch.statuses();
  ASSERT_GE(statuses.size(), 2u);
  EXPECT_EQ(statuses.front(), 1);  // SERVING
  EXPECT_EQ(statuses.back(), 2);   // NOT_SERVING before the Watch ended
  TurnResult cut = ReadTurn(stream.get());
  ASSERT_TRUE(cut.ended) << daemon.Log();
  EXPECT_EQ(cut.end.finish_reason(), v1::SHUTDOWN);
  EXPECT_EQ(stream->Finish().error_code(), grpc::StatusCode::UNAVAILABLE);
  EXPECT_EQ(daemon.WaitExit(absl::Seconds(10)), 0) << daemon.Log();
  EXPECT_LE(daemon.exit_time(), absl::Seconds(3) + absl::Milliseconds(300)) << daemon.Log();
  EXPECT_GE(daemon.exit_time(), absl::Seconds(2)) << "the turn was cut long before the drain period's end";
}

// Load balancers keep a Watch open: it must not hold an idle daemon's exit
// for the drain period.
TEST(DaemonProcessTest, OpenHealthWatchDoesNotDelayAnIdleDaemonsExit) {
  DECODED_REQUIRE_REAL_MODEL();
  Daemon daemon(ModelFlags({"--drain_seconds=10"}));
  ASSERT_TRUE(daemon.WaitServing(absl::Seconds(60))) << daemon.Log();
  HealthWatch watch(daemon.channel());
  ASSERT_TRUE(watch.WaitFirst(absl::Seconds(5)));
  daemon.Signal(SIGTERM);
  EXPECT_EQ(daemon.WaitExit(absl::Seconds(15)), 0) << daemon.Log();
  EXPECT_LT(daemon.exit_time(), absl::Milliseconds(1000));
  EXPECT_TRUE(watch.WaitEnded(absl::Seconds(1)));
}

// A signal while the model loads exits the same way as one while serving.
TEST(DaemonProcessTest, SignalDuringModelLoadExitsZero) {
  for (int sig : {SIGTERM, SIGINT}) {
    // Opening a FIFO for reading blocks until a writer comes: the load hangs.
    const std::string fifo = ::testing::TempDir() + "decoded_fifo_" + std::to_string(getpid()) + ".gguf";
    unlink(fifo.c_str());
    ASSERT_EQ(mkfifo(fifo.c_str(), 0600), 0);
    Daemon daemon({"--model=" + fifo});
    ASSERT_TRUE(daemon.WaitListening(absl::Seconds(10))) << daemon.Log();
    absl::SleepFor(absl::Milliseconds(100));
    daemon.Signal(sig);
    EXPECT_EQ(daemon.WaitExit(absl::Seconds(5)), 0) << "signal " << sig << "\n" << daemon.Log();
    unlink(fifo.c_str());
  }
}

// DECODED_CPU_ISA: a value the daemon cannot honour stops it at startup with
// the reason; a supported tier is what it logs, what GetModelInfo reports and
// what the decoded_cpu_isa_info metric names.
TEST(DaemonProcessTest, CpuIsaOverrideIsLoggedReportedOrRefused) {
  {
    ASSERT_EQ(setenv("DECODED_CPU_ISA", "avx9000", 1), 0);
    Daemon daemon(ModelFlags());
    ASSERT_EQ(unsetenv("DECODED_CPU_ISA"), 0);
    EXPECT_EQ(daemon.WaitExit(absl::Seconds(10)), 1) << daemon.Log();
    EXPECT_NE(daemon.Log().find("DECODED_CPU_ISA=\"avx9000\" is not a kernel tier"), std::string::npos)
        << daemon.Log();
  }
  DECODED_REQUIRE_REAL_MODEL();
  ASSERT_EQ(setenv("DECODED_CPU_ISA", "scalar", 1), 0);
  Daemon daemon(ModelFlags());
  ASSERT_EQ(unsetenv("DECODED_CPU_ISA"), 0);
  ASSERT_TRUE(daemon.WaitServing(absl::Seconds(120))) << daemon.Log();
  EXPECT_NE(daemon.Log().find("CPU kernels scalar"), std::string::npos) << daemon.Log();
  auto stub = v1::Decoder::NewStub(daemon.channel());
  grpc::ClientContext ctx;
  v1::ModelInfo info;
  ASSERT_TRUE(stub->GetModelInfo(&ctx, v1::GetModelInfoRequest(), &info).ok());
  EXPECT_EQ(info.cpu_isa(), "scalar");
  const std::string metrics = daemon.Metrics();
  EXPECT_NE(metrics.find("decoded_cpu_isa_info{cpu_isa=\"scalar\"} 1"), std::string::npos) << metrics;
  daemon.Signal(SIGTERM);
  EXPECT_EQ(daemon.WaitExit(absl::Seconds(10)), 0) << daemon.Log();
}

// --kv_type: the daemon's default f16 is what it logs, reports and exports;
// a type the KV cache cannot hold stops it at startup (exit 2, the flags).
TEST(DaemonProcessTest, KvTypeIsLoggedReportedOrRefused) {
  {
    std::vector<std::string> flags = ModelFlags();
    flags.push_back("--kv_type=q4_0");
    Daemon daemon(flags);
    EXPECT_EQ(daemon.WaitExit(absl::Seconds(10)), 2) << daemon.Log();
    EXPECT_NE(daemon.Log().find("--kv_type q4_0: must be f32, f16 or q8_0"), std::string::npos) << daemon.Log();
  }
  DECODED_REQUIRE_REAL_MODEL();
  Daemon daemon(ModelFlags());
  ASSERT_TRUE(daemon.WaitServing(absl::Seconds(120))) << daemon.Log();
  // Gemma 3 270M: 18 layers x 1 kv head x (256 + 256) values x 2 bytes.
  EXPECT_NE(daemon.Log().find("KV cache f16 (18432 bytes per token)"), std::string::npos) << daemon.Log();
  auto stub = v1::Decoder::NewStub(daemon.channel());
  grpc::ClientContext ctx;
  v1::ModelInfo info;
  ASSERT_TRUE(stub->GetModelInfo(&ctx, v1::GetModelInfoRequest(), &info).ok());
  EXPECT_EQ(info.kv_type(), "f16");
  const std::string metrics = daemon.Metrics();
  EXPECT_NE(metrics.find("decoded_kv_cache_info{type=\"f16\"} 1"), std::string::npos) << metrics;
  daemon.Signal(SIGTERM);
  EXPECT_EQ(daemon.WaitExit(absl::Seconds(10)), 0) << daemon.Log();
}

// A second signal while a drain waits for a long turn: the operator wants out
// now, so the daemon exits at once, with status 1 (the drain was cut short).
TEST(DaemonProcessTest, SecondSignalDuringTheDrainExitsAtOnce) {
  DECODED_REQUIRE_REAL_MODEL();
  Daemon daemon(ModelFlags({"--drain_seconds=30"}));
  ASSERT_TRUE(daemon.WaitServing(absl::Seconds(60))) << daemon.Log();
  auto stub = v1::Decoder::NewStub(daemon.channel());
  grpc::ClientContext ctx;
  auto stream = stub->Generate(&ctx);
  ASSERT_TRUE(stream->Write(TextTurn("Count to one thousand:", 480)));
  v1::GenerateResponse first;
  ASSERT_TRUE(stream->Read(&first));
  daemon.Signal(SIGTERM);
  absl::SleepFor(absl::Milliseconds(300));
  daemon.Signal(SIGINT);
  EXPECT_EQ(daemon.WaitExit(absl::Seconds(5)), 1) << daemon.Log();
  EXPECT_LT(daemon.exit_time(), absl::Seconds(3)) << "waited for the drain";
}

// 1,000 streams aborted at random phases (before their turn, while queued,
// during prefill, during decode): the daemon gives freed memory back, every
// gauge returns to 0 and every session counts as client_gone.
TEST(DaemonProcessTest, AbortStormLeavesMemoryAndGaugesWhereTheyWere) {
  DECODED_REQUIRE_REAL_MODEL();
  // The default context length (2048), and as many concurrent streams as
  // sessions are allowed, as a busy server sees.
  constexpr int kClients = 16;
  Daemon daemon({"--model=" + decoded::testing::RealModelPath(), "--max_sessions=16", "--workers=2"});
  ASSERT_TRUE(daemon.WaitServing(absl::Seconds(60))) << daemon.Log();
  std::string long_prompt;
  for (int i = 0; i < 40; ++i) absl::StrAppend(&long_prompt, "Line ", i, " of the story. ");
  auto storm = [&](int streams, int seed) {
    std::vector<std::thread> clients;
    for (int c = 0; c < kClients; ++c) {
      clients.emplace_back([&, c] {
        auto stub = v1::Decoder::NewStub(daemon.channel());
        std::mt19937 rng(seed * 10 + c);
        for (int i = 0; i < streams / kClients; ++i) {
          grpc::ClientContext ctx;
          auto stream = stub->Generate(&ctx);
          const int phase = std::uniform_int_distribution<int>(0, 3)(rng);
          if (phase > 0) stream->Write(TextTurn(phase == 2 ? long_prompt : "Tell me a story.", 200));
          if (phase == 3) {
            v1::GenerateResponse resp;
            for (int seen = 0, want = std::uniform_int_distribution<int>(1, 3)(rng); seen < want && stream->Read(&resp);)
              seen += resp.has_token();
          } else {
            absl::SleepFor(absl::Microseconds(std::uniform_int_distribution<int>(0, 20000)(rng)));
          }
          ctx.TryCancel();
          stream->Finish();
        }
      });
    }
    for (std::thread& t : clients) t.join();
  };
  // Closed sessions are freed once their last step returns (a prefill chunk
  // can take a second on a loaded machine); the heap is trimmed within a
  // quarter second after that.
  auto settled_rss = [&] {
    const absl::Time deadline = absl::Now() + absl::Seconds(30);
    while (absl::Now() < deadline) {
      const std::string m = daemon.Metrics();
      if (MetricValue(m, "decoded_sessions_active") == 0 && MetricValue(m, "decoded_workers_busy") == 0 &&
          MetricValue(m, "decoded_kv_bytes") == 0) {
        break;
      }
      absl::SleepFor(absl::Milliseconds(50));
    }
    absl::SleepFor(absl::Milliseconds(500));
    return daemon.Rss();
  };
#if defined(__SANITIZE_ADDRESS__)
  constexpr int kStorm = 256;  // the sanitized daemon is several times slower; RSS is not checked there
#else
  constexpr int kStorm = 1008;
#endif
  storm(96, 1);  // warm-up: arenas, caches and gRPC buffers reach their steady size
  const int64_t rss_before = settled_rss();
  storm(kStorm, 2);
  const int64_t rss_after = settled_rss();
  const std::string metrics = daemon.Metrics();
  EXPECT_EQ(MetricValue(metrics, "decoded_sessions_active"), 0);
  EXPECT_EQ(MetricValue(metrics, "decoded_kv_bytes"), 0);
  EXPECT_EQ(MetricValue(metrics, "decoded_bound_nodes"), 0);
  EXPECT_EQ(MetricValue(metrics, "decoded_workers_busy"), 0);
  EXPECT_EQ(MetricValue(metrics, "decoded_sessions_total{outcome=\"error\"}"), 0) << metrics;
  // Every session ended as client_gone: each stream was aborted mid-turn.
  // (Streams refused, or cancelled before the server dispatched them, had
  // no session.)
  EXPECT_GT(MetricValue(metrics, "decoded_sessions_total{outcome=\"client_gone\"}"), 0);
  EXPECT_EQ(MetricValue(metrics, "decoded_sessions_total{outcome=\"ok\"}"), 0);
  EXPECT_EQ(MetricValue(metrics, "decoded_sessions_total{outcome=\"shutdown\"}"), 0);
  std::cerr << "RSS before " << rss_before / (1 << 20) << " MiB, after 1,000 aborted streams "
            << rss_after / (1 << 20) << " MiB\n";
#if defined(__SANITIZE_ADDRESS__)
  GTEST_SKIP() << "ASan's quarantine keeps freed memory resident by design; RSS is checked in the plain build";
#else
  // Measured on this test: -2 to +9 MiB; with the heap trim disabled, +31 to
  // +48 MiB (and +148 MB in the fault report's longer storm).
  EXPECT_LT(rss_after - rss_before, int64_t{16} << 20) << "RSS grew from " << rss_before << " to " << rss_after;
#endif
  daemon.Signal(SIGTERM);
  EXPECT_EQ(daemon.WaitExit(absl::Seconds(15)), 0);
}

}  // namespace
}  // namespace decoded::server
