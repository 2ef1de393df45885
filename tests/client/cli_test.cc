// decoded-cli refuses text that is not UTF-8 before sending it. Runs the
// built binary with arguments passed as raw bytes (no shell quoting) against
// an address where no server listens. Its --health probe runs against gRPC's
// own default grpc.health.v1 service (not the daemon's), so the probe is
// checked against an independent server of the protocol.
#include <fcntl.h>
#include <spawn.h>
#include <sys/wait.h>
#include <unistd.h>

#include <cstdio>
#include <fstream>
#include <iterator>
#include <memory>
#include <string>
#include <vector>

#include "absl/strings/match.h"
#include "absl/strings/str_cat.h"
#include "decoded/version.h"
#include "grpcpp/grpcpp.h"
#include "grpcpp/health_check_service_interface.h"
#include "gtest/gtest.h"
#include "proto/decoded.grpc.pb.h"

extern char** environ;

namespace decoded {
namespace {

// Nothing listens on port 1 of the loopback: a connection is refused at once.
constexpr char kNoServer[] = "--server=127.0.0.1:1";

struct CliRun {
  int exit_status = -1;
  std::string out;  // stdout
  std::string err;  // stderr
};

// Runs decoded-cli with `args`, feeding `input` on stdin.
CliRun RunCli(const std::vector<std::string>& args, const std::string& input = "") {
  int in_pipe[2], err_pipe[2];
  EXPECT_EQ(pipe(in_pipe), 0);
  EXPECT_EQ(pipe(err_pipe), 0);
  posix_spawn_file_actions_t actions;
  posix_spawn_file_actions_init(&actions);
  posix_spawn_file_actions_adddup2(&actions, in_pipe[0], STDIN_FILENO);
  posix_spawn_file_actions_adddup2(&actions, err_pipe[1], STDERR_FILENO);
  static int runs = 0;
  const std::string out_path =
      ::testing::TempDir() + "cli_test_out_" + std::to_string(getpid()) + "_" + std::to_string(++runs);
  posix_spawn_file_actions_addopen(&actions, STDOUT_FILENO, out_path.c_str(), O_WRONLY | O_CREAT | O_TRUNC, 0644);
  posix_spawn_file_actions_addclose(&actions, in_pipe[1]);
  posix_spawn_file_actions_addclose(&actions, err_pipe[0]);
  std::vector<std::string> argv_strings = {DECODED_CLI_PATH};
  argv_strings.insert(argv_strings.end(), args.begin(), args.end());
  std::vector<char*> argv;
  for (std::string& a : argv_strings) argv.push_back(a.data());
  argv.push_back(nullptr);
  pid_t pid;
  const int spawned = posix_spawn(&pid, DECODED_CLI_PATH, &actions, nullptr, argv.data(), environ);
  posix_spawn_file_actions_destroy(&actions);
  close(in_pipe[0]);
  close(err_pipe[1]);
  CliRun run;
  if (spawned != 0) {
    ADD_FAILURE() << "cannot run " << DECODED_CLI_PATH;
    close(in_pipe[1]);
    close(err_pipe[0]);
    return run;
  }
  // The inputs are far below a pipe's capacity, so writing first cannot block.
  if (!input.empty()) {
    EXPECT_EQ(write(in_pipe[1], input.data(), input.size()), static_cast<ssize_t>(input.size()));
  }
  close(in_pipe[1]);
  char buf[4096];
  for (ssize_t n; (n = read(err_pipe[0], buf, sizeof(buf))) > 0;) run.err.append(buf, n);
  close(err_pipe[0]);
  int status = 0;
  waitpid(pid, &status, 0);
  run.exit_status = WIFEXITED(status) ? WEXITSTATUS(status) : -1;
  std::ifstream out(out_path, std::ios::binary);
  run.out.assign(std::istreambuf_iterator<char>(out), std::istreambuf_iterator<char>());
  std::remove(out_path.c_str());
  return run;
}

TEST(CliTest, PromptThatIsNotUtf8IsRefusedWithExitStatus2) {
  const CliRun run = RunCli({kNoServer, "--prompt", "caf\xE9"});
  EXPECT_EQ(run.exit_status, 2);
  EXPECT_TRUE(absl::StrContains(run.err, "decoded-cli: --prompt is not valid UTF-8 (byte 3 is 0xE9); convert it, "
                                         "e.g. with iconv -f latin1 -t utf-8"))
      << run.err;
}

TEST(CliTest, TokenizeRefusesAPromptThatIsNotUtf8) {
  const CliRun run = RunCli({kNoServer, "--tokenize", "--prompt", "\xC3\xA9t\xC3"});
  EXPECT_EQ(run.exit_status, 2);
  EXPECT_TRUE(absl::StrContains(run.err, "--prompt is not valid UTF-8 (byte 3 is 0xC3)")) << run.err;
}

TEST(CliTest, StopEntryThatIsNotUtf8IsRefused) {
  const CliRun run = RunCli({kNoServer, "--prompt", "hi", "--stop", "end,caf\xE9"});
  EXPECT_EQ(run.exit_status, 2);
  EXPECT_TRUE(absl::StrContains(run.err, "--stop entry 1 is not valid UTF-8 (byte 3 is 0xE9)")) << run.err;
}

TEST(CliTest, PerplexityFileThatIsNotUtf8IsRefused) {
  const std::string path = ::testing::TempDir() + "/cli_test_latin1.txt";
  {
    std::ofstream out(path, std::ios::binary);
    out << "hello\n caf\xE9 au lait\n";  // 0xE9 is byte 10
  }
  const CliRun run = RunCli({kNoServer, "--perplexity", path});
  EXPECT_EQ(run.exit_status, 2);
  EXPECT_TRUE(absl::StrContains(run.err, "--perplexity file " + path + " is not valid UTF-8 (byte 10 is 0xE9)"))
      << run.err;
  std::remove(path.c_str());
}

TEST(CliTest, MissingPerplexityFileIsBadInput) {
  const CliRun run = RunCli({kNoServer, "--perplexity", ::testing::TempDir() + "/no_such_file.txt"});
  EXPECT_EQ(run.exit_status, 2);
  EXPECT_TRUE(absl::StrContains(run.err, "cannot read")) << run.err;
}

// Two bad lines around an empty one: both are reported, so the chat read on
// after the first. The good line after them is sent; with no server the
// session then fails (exit status 1).
TEST(CliTest, ChatReportsEachNonUtf8LineAndKeepsReading) {
  const CliRun run = RunCli({kNoServer, "--chat"}, "caf\xE9\n\n\xFF" "bad\nfine\n");
  EXPECT_TRUE(absl::StrContains(run.err, "input line 1 is not valid UTF-8 (byte 3 is 0xE9)")) << run.err;
  EXPECT_TRUE(absl::StrContains(run.err, "input line 3 is not valid UTF-8 (byte 0 is 0xFF)")) << run.err;
  EXPECT_EQ(run.exit_status, 1);
}

// The control: well-formed text passes the check and reaches the (absent)
// server, which is a server error, not bad input.
TEST(CliTest, Utf8PromptIsSentAndAnUnreachableServerExits1) {
  const CliRun run = RunCli({kNoServer, "--prompt", "caf\xC3\xA9"});
  EXPECT_EQ(run.exit_status, 1);
  EXPECT_FALSE(absl::StrContains(run.err, "UTF-8")) << run.err;
}

TEST(CliTest, UnknownFlagsAndAModeWithoutItsInputAreBadInput) {
  CliRun run = RunCli({kNoServer, "--prompt", "hi", "--no_such_flag=1"});
  EXPECT_EQ(run.exit_status, 2);
  EXPECT_NE(run.err.find("unknown flag --no_such_flag"), std::string::npos) << run.err;
  run = RunCli({kNoServer, "--prompt", "hi", "--max_new_tokens", "99999999999"});
  EXPECT_EQ(run.exit_status, 2) << "Abseil's parser would exit 1";
  EXPECT_NE(run.err.find("--max_new_tokens: "), std::string::npos) << run.err;
  // A flag's separate value is not a flag, even when it starts with '-'.
  run = RunCli({kNoServer, "--prompt", "hi", "--presence_penalty", "-0.5"});
  EXPECT_FALSE(absl::StrContains(run.err, "unknown flag")) << run.err;
  EXPECT_NE(run.exit_status, 2) << run.err;
  run = RunCli({kNoServer, "--prompt", "hi", "--top_k=x"});
  EXPECT_EQ(run.exit_status, 2);
  EXPECT_NE(run.err.find("--top_k: "), std::string::npos) << run.err;
  run = RunCli({kNoServer, "--tokenize"});
  EXPECT_EQ(run.exit_status, 2);
  EXPECT_NE(run.err.find("--tokenize needs --prompt"), std::string::npos) << run.err;
  run = RunCli({kNoServer, "--prompt", "hi", "--system", "be brief"});
  EXPECT_EQ(run.exit_status, 2);
  EXPECT_NE(run.err.find("--system is for --chat"), std::string::npos) << run.err;
}

// Abseil's own usage flags are not unknown flags (they were, for a while).
TEST(CliTest, HelpAndVersionAreAnsweredAndUndefokNamesMayBeGiven) {
  CliRun run = RunCli({"--help"});
  EXPECT_EQ(run.exit_status, 1);  // Abseil's status after usage
  EXPECT_TRUE(absl::StrContains(run.out, "--server")) << run.out << run.err;
  EXPECT_FALSE(absl::StrContains(run.err, "unknown flag")) << run.err;
  run = RunCli({"--version"});
  EXPECT_EQ(run.exit_status, 0) << run.err;
  EXPECT_EQ(run.out, absl::StrCat("decoded-cli ", kVersion, " (", kRevision, ")\n")) << run.err;
  run = RunCli({kNoServer, "--prompt", "hi", "--undefok=no_such_flag", "--no_such_flag=1"});
  EXPECT_EQ(run.exit_status, 1) << run.err;  // reaches the absent server
  EXPECT_FALSE(absl::StrContains(run.err, "unknown flag")) << run.err;
}

TEST(CliTest, NoModeIsBadInput) {
  const CliRun run = RunCli({kNoServer});
  EXPECT_EQ(run.exit_status, 2);
  EXPECT_TRUE(absl::StrContains(run.err, "give --prompt TEXT")) << run.err;
}

// gRPC's default health service beside an unimplemented (synchronous)
// decoded.v1.Decoder, on a port of its own; the default service needs a
// synchronous service's polled completion queue.
class HealthServer {
 public:
  HealthServer() {
    grpc::EnableDefaultHealthCheckService(true);
    grpc::ServerBuilder builder;
    builder.AddListeningPort("127.0.0.1:0", grpc::InsecureServerCredentials(), &port_);
    builder.RegisterService(&decoder_);
    server_ = builder.BuildAndStart();
  }
  ~HealthServer() { server_->Shutdown(); }
  // The default service answers SERVING for "" until told otherwise.
  void SetServing(bool serving) { server_->GetHealthCheckService()->SetServingStatus(serving); }
  void SetServing(const std::string& service, bool serving) {
    server_->GetHealthCheckService()->SetServingStatus(service, serving);
  }
  std::string Address() const { return "--server=127.0.0.1:" + std::to_string(port_); }

 private:
  v1::Decoder::Service decoder_;
  int port_ = 0;
  std::unique_ptr<grpc::Server> server_;
};

TEST(CliHealthTest, ServingExits0AndPrintsTheStatus) {
  HealthServer server;
  server.SetServing(true);
  const CliRun run = RunCli({server.Address(), "--health"});
  EXPECT_EQ(run.exit_status, 0) << run.err;
  EXPECT_EQ(run.out, "SERVING\n");
}

TEST(CliHealthTest, NotServingExits1) {
  HealthServer server;
  server.SetServing(false);
  const CliRun run = RunCli({server.Address(), "--health"});
  EXPECT_EQ(run.exit_status, 1);
  EXPECT_EQ(run.out, "NOT_SERVING\n");
  EXPECT_TRUE(absl::StrContains(run.err, "health status NOT_SERVING")) << run.err;
}

TEST(CliHealthTest, NamedServiceIsChecked) {
  HealthServer server;
  server.SetServing("decoded.v1.Decoder", true);
  const CliRun serving = RunCli({server.Address(), "--health", "--health_service=decoded.v1.Decoder"});
  EXPECT_EQ(serving.exit_status, 0) << serving.err;
  EXPECT_EQ(serving.out, "SERVING\n");
  // A service the server does not know: the call's NOT_FOUND, exit 1.
  const CliRun unknown = RunCli({server.Address(), "--health", "--health_service=no.Such"});
  EXPECT_EQ(unknown.exit_status, 1);
  EXPECT_TRUE(absl::StrContains(unknown.err, "NOT_FOUND")) << unknown.err;
  EXPECT_EQ(unknown.out, "");
}

TEST(CliHealthTest, UnreachableServerExits1) {
  const CliRun run = RunCli({kNoServer, "--health", "--health_timeout_seconds=2"});
  EXPECT_EQ(run.exit_status, 1);
  EXPECT_EQ(run.out, "");
  EXPECT_TRUE(absl::StrContains(run.err, "UNAVAILABLE") || absl::StrContains(run.err, "DEADLINE_EXCEEDED"))
      << run.err;
}

TEST(CliHealthTest, NonPositiveTimeoutIsBadInput) {
  const CliRun run = RunCli({kNoServer, "--health", "--health_timeout_seconds=0"});
  EXPECT_EQ(run.exit_status, 2);
  EXPECT_TRUE(absl::StrContains(run.err, "--health_timeout_seconds must be > 0")) << run.err;
}

}  // namespace
}  // namespace decoded
