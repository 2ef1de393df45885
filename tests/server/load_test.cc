// The short CI run of decoded-loadgen (client/load_generator.h) against the
// decoded binary on the real model: 8 concurrent streams x 3 turns with
// cancels and disconnects must pass every check (greedy ids equal to the
// solo replay, every turn ended, gauges back to 0), and the same run with
// the reference corrupted on purpose must fail, showing the check can fail.
//
// DECODED_LOAD_TEST_DAEMON_FLAGS (space-separated) adds daemon flags, e.g.
// "--max_batch=8" once batched decode is in, without changing the test.
#include <fcntl.h>
#include <spawn.h>
#include <sys/wait.h>
#include <unistd.h>

#include <cstdlib>
#include <fstream>
#include <sstream>
#include <string>
#include <vector>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_split.h"
#include "absl/time/clock.h"
#include "absl/time/time.h"
#include "gtest/gtest.h"
#include "nlohmann/json.hpp"
#include "tests/common/model_path.h"
#include "tests/server/daemon_process.h"

namespace decoded::server {
namespace {

using e2e::Daemon;

struct LoadgenRun {
  int exit_status = -1;  // -1: killed at the time limit
  std::string out, err;
};

std::string ReadFile(const std::string& path) {
  std::ifstream in(path);
  std::stringstream s;
  s << in.rdbuf();
  return s.str();
}

// Runs decoded-loadgen against `daemon` with `flags`; kills it after `limit`.
LoadgenRun RunLoadgen(const Daemon& daemon, std::vector<std::string> flags, absl::Duration limit) {
  static int count = 0;
  const std::string base = ::testing::TempDir() + "loadgen_" + std::to_string(getpid()) + "_" + std::to_string(++count);
  std::vector<std::string> args = {DECODED_LOADGEN_PATH, absl::StrCat("--server=127.0.0.1:", daemon.port()),
                                   absl::StrCat("--metrics=127.0.0.1:", daemon.metrics_port())};
  args.insert(args.end(), flags.begin(), flags.end());
  std::vector<char*> argv;
  for (std::string& a : args) argv.push_back(a.data());
  argv.push_back(nullptr);
  posix_spawn_file_actions_t actions;
  posix_spawn_file_actions_init(&actions);
  posix_spawn_file_actions_addopen(&actions, 1, (base + ".out").c_str(), O_WRONLY | O_CREAT | O_TRUNC, 0644);
  posix_spawn_file_actions_addopen(&actions, 2, (base + ".err").c_str(), O_WRONLY | O_CREAT | O_TRUNC, 0644);
  pid_t pid = -1;
  LoadgenRun run;
  const int rc = posix_spawn(&pid, argv[0], &actions, nullptr, argv.data(), environ);
  posix_spawn_file_actions_destroy(&actions);
  if (rc != 0) {
    run.err = "cannot start " + args[0];
    return run;
  }
  const absl::Time deadline = absl::Now() + limit;
  int status = 0;
  while (waitpid(pid, &status, WNOHANG) != pid) {
    if (absl::Now() > deadline) {
      kill(pid, SIGKILL);
      waitpid(pid, &status, 0);
      status = -1;
      break;
    }
    absl::SleepFor(absl::Milliseconds(20));
  }
  if (status != -1) run.exit_status = WIFEXITED(status) ? WEXITSTATUS(status) : 128 + WTERMSIG(status);
  run.out = ReadFile(base + ".out");
  run.err = ReadFile(base + ".err");
  return run;
}

std::vector<std::string> DaemonFlags() {
  // Two workers on the CI machine's two cores, one compute thread each.
  std::vector<std::string> flags = {"--model=" + decoded::testing::RealModelPath(), "--context_length=512",
                                    "--workers=2", "--threads=1", "--max_sessions=16"};
  if (const char* extra = std::getenv("DECODED_LOAD_TEST_DAEMON_FLAGS"); extra != nullptr) {
    for (absl::string_view f : absl::StrSplit(extra, ' ', absl::SkipEmpty())) flags.emplace_back(f);
  }
  return flags;
}

// 8 streams x 3 turns, up to 48 prompt tokens and 16 new tokens per turn;
// the seed's plan has cancels (at once and mid-turn) and disconnects.
const std::vector<std::string> kRun = {"--streams=8", "--turns=3", "--min_prompt_tokens=4",
                                       "--max_prompt_tokens=48", "--max_new_tokens=16", "--cancel_probability=0.25",
                                       "--disconnect_probability=0.1", "--seed=7", "--deadline_seconds=240"};

TEST(LoadTest, ConcurrentStreamsEqualSoloRunsAndGaugesReturnToZero) {
  DECODED_REQUIRE_REAL_MODEL();
  Daemon daemon(DaemonFlags());
  ASSERT_TRUE(daemon.WaitServing(absl::Seconds(60))) << daemon.Log();
  const LoadgenRun run = RunLoadgen(daemon, kRun, absl::Minutes(9));
  ASSERT_EQ(run.exit_status, 0) << run.err << run.out << "\n" << daemon.Log();
  std::cerr << run.err;
  const nlohmann::json report = nlohmann::json::parse(run.out);
  EXPECT_TRUE(report["violations"].empty());
  EXPECT_TRUE(report["gauges_checked"].get<bool>());
  EXPECT_EQ(report["turns_sent"].get<int>(), report["turns_completed"].get<int>() +
                                                 report["turns_cancelled"].get<int>() +
                                                 report["disconnects"].get<int>());
  // The run exercised what it claims to: cancels, disconnects, and a solo
  // comparison for most turns.
  EXPECT_GE(report["cancels_sent"].get<int>(), 2);
  EXPECT_GE(report["disconnects"].get<int>(), 1);
  EXPECT_GE(report["turns_compared_with_solo"].get<int>(), 10);
  EXPECT_GT(report["tokens"].get<int>(), 100);
  daemon.Signal(SIGTERM);
  EXPECT_EQ(daemon.WaitExit(absl::Seconds(15)), 0);
}

// A second run with the same seed sends the same prompts to the same daemon:
// its first turns find them in the prefix cache (cached_tokens above the
// carried context), which the checks must accept, and the ids must still
// equal the solo replays.
TEST(LoadTest, ARepeatedRunFindsItsPromptsInThePrefixCacheAndPasses) {
  DECODED_REQUIRE_REAL_MODEL();
  Daemon daemon(DaemonFlags());
  ASSERT_TRUE(daemon.WaitServing(absl::Seconds(60))) << daemon.Log();
  const std::vector<std::string> flags = {"--streams=2", "--turns=2", "--min_prompt_tokens=40",
                                          "--max_prompt_tokens=48", "--max_new_tokens=8", "--cancel_probability=0",
                                          "--disconnect_probability=0", "--seed=11"};
  const LoadgenRun first = RunLoadgen(daemon, flags, absl::Minutes(5));
  ASSERT_EQ(first.exit_status, 0) << first.err << first.out;
  const double hits_before = e2e::MetricValue(daemon.Metrics(), "decoded_prefix_cache_hit_tokens_total");
  const LoadgenRun second = RunLoadgen(daemon, flags, absl::Minutes(5));
  EXPECT_EQ(second.exit_status, 0) << second.err << second.out;
  EXPECT_TRUE(nlohmann::json::parse(second.out)["violations"].empty()) << second.out;
  // The run hit the cache (32+ tokens: a 16-token block of each of 2 first
  // prompts at least), so the check above was put to the test.
  EXPECT_GE(e2e::MetricValue(daemon.Metrics(), "decoded_prefix_cache_hit_tokens_total") - hits_before, 32)
      << daemon.Metrics();
}

// The control: one id of the solo reference altered must fail the run
// (exit 1, the mismatch named), or the passing run above proves nothing.
TEST(LoadTest, CorruptedReferenceFailsTheRun) {
  DECODED_REQUIRE_REAL_MODEL();
  Daemon daemon(DaemonFlags());
  ASSERT_TRUE(daemon.WaitServing(absl::Seconds(60))) << daemon.Log();
  const LoadgenRun run = RunLoadgen(daemon,
                                    {"--streams=2", "--turns=2", "--max_prompt_tokens=16", "--max_new_tokens=8",
                                     "--cancel_probability=0", "--disconnect_probability=0", "--seed=7",
                                     "--corrupt_reference_for_testing"},
                                    absl::Minutes(5));
  EXPECT_EQ(run.exit_status, 1) << run.err << run.out;
  EXPECT_NE(run.err.find("VIOLATION: stream 0 turn 0: greedy ids differ from the solo replay at token 0"),
            std::string::npos)
      << run.err;
  const nlohmann::json report = nlohmann::json::parse(run.out);
  EXPECT_EQ(report["violations"].size(), 1u) << run.out;
}

// The control of the gauge check: a stream held open by the test keeps
// decoded_sessions_active and decoded_kv_bytes above 0, so the run must fail
// naming them.
TEST(LoadTest, SessionLeftOpenFailsTheGaugeCheck) {
  DECODED_REQUIRE_REAL_MODEL();
  Daemon daemon(DaemonFlags());
  ASSERT_TRUE(daemon.WaitServing(absl::Seconds(60))) << daemon.Log();
  auto stub = v1::Decoder::NewStub(daemon.channel());
  grpc::ClientContext ctx;
  auto held = stub->Generate(&ctx);
  ASSERT_TRUE(held->Write(e2e::TextTurn("Hello", 2)));
  ASSERT_TRUE(e2e::ReadTurn(held.get()).ended);
  const LoadgenRun run = RunLoadgen(daemon,
                                    {"--streams=1", "--turns=1", "--max_prompt_tokens=8", "--max_new_tokens=4",
                                     "--cancel_probability=0", "--disconnect_probability=0", "--settle_seconds=1"},
                                    absl::Minutes(5));
  EXPECT_EQ(run.exit_status, 1) << run.err << run.out;
  EXPECT_NE(run.err.find("VIOLATION: after the load phase, 1 s with no stream open: decoded_sessions_active = 1"),
            std::string::npos)
      << run.err;
  EXPECT_NE(run.err.find("decoded_kv_bytes = "), std::string::npos) << run.err;
  ctx.TryCancel();
  held->Finish();
}

}  // namespace
}  // namespace decoded::server
