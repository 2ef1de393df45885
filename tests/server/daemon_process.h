// The decoded binary as a child process for tests: started with the given
// flags on ports it picks itself (read back from its log), probed for health,
// signalled, waited for, its /metrics and memory read. The tests that use it
// define DECODED_DAEMON_PATH (the built binary); DECODED_DAEMON_BINARY in the
// environment runs them against another build.
#ifndef DECODED_TESTS_SERVER_DAEMON_PROCESS_H_
#define DECODED_TESTS_SERVER_DAEMON_PROCESS_H_

#include <fcntl.h>
#include <poll.h>
#include <signal.h>
#include <spawn.h>
#include <sys/wait.h>
#include <unistd.h>

#include <cstdlib>
#include <fstream>
#include <memory>
#include <regex>
#include <sstream>
#include <string>
#include <vector>

#include "absl/strings/str_cat.h"
#include "absl/time/clock.h"
#include "absl/time/time.h"
#include "grpcpp/grpcpp.h"
#include "gtest/gtest.h"
#include "tests/server/e2e_support.h"

extern char** environ;

namespace decoded::server::e2e {

// How a Daemon is started, beyond its flags.
struct DaemonLaunch {
  // A command the daemon runs under, e.g. {"prlimit", "--nofile=1024:4096",
  // "--"} (looked up on PATH).
  std::vector<std::string> launcher;
  // stderr into a pipe the test reads (Log) and may close (CloseStderr),
  // rather than into a file.
  bool stderr_pipe = false;
};

// One daemon process; killed (SIGKILL) if a test leaves it running.
class Daemon {
 public:
  explicit Daemon(std::vector<std::string> flags, DaemonLaunch launch = {}) {
    log_path_ = ::testing::TempDir() + "decoded_" + std::to_string(getpid()) + "_" + std::to_string(++count_) + ".log";
    // DECODED_DAEMON_BINARY runs the tests against another build of the
    // daemon (an older one, or the one in a container image).
    const char* binary = std::getenv("DECODED_DAEMON_BINARY");
    std::vector<std::string> args = {binary != nullptr && *binary ? binary : DECODED_DAEMON_PATH,
                                     "--listen=127.0.0.1:0", "--metrics_listen=127.0.0.1:0", "--workers=1",
                                     "--threads=1"};
    args.insert(args.end(), flags.begin(), flags.end());
    args.insert(args.begin(), launch.launcher.begin(), launch.launcher.end());
    std::vector<char*> argv;
    for (std::string& a : args) argv.push_back(a.data());
    argv.push_back(nullptr);
    posix_spawn_file_actions_t actions;
    posix_spawn_file_actions_init(&actions);
    int pipe_fds[2] = {-1, -1};
    if (launch.stderr_pipe && pipe2(pipe_fds, O_CLOEXEC) == 0) {
      pipe_ = pipe_fds[0];
      posix_spawn_file_actions_adddup2(&actions, pipe_fds[1], 2);
    } else {
      posix_spawn_file_actions_addopen(&actions, 2, log_path_.c_str(), O_WRONLY | O_CREAT | O_TRUNC, 0644);
    }
    if (posix_spawnp(&pid_, argv[0], &actions, nullptr, argv.data(), environ) != 0) pid_ = -1;
    posix_spawn_file_actions_destroy(&actions);
    if (pipe_fds[1] >= 0) close(pipe_fds[1]);
  }
  ~Daemon() {
    CloseStderr();
    if (pid_ > 0 && !exited_) {
      kill(pid_, SIGKILL);
      waitpid(pid_, nullptr, 0);
    }
  }

  // What the daemon has written to stderr so far.
  std::string Log() {
    if (pipe_ < 0 && piped_.empty()) {
      std::ifstream in(log_path_);
      std::stringstream s;
      s << in.rdbuf();
      return s.str();
    }
    for (pollfd p{pipe_, POLLIN, 0}; pipe_ >= 0 && poll(&p, 1, 0) > 0;) {
      char buf[4096];
      const ssize_t n = read(pipe_, buf, sizeof(buf));
      if (n <= 0) break;
      piped_.append(buf, static_cast<size_t>(n));
    }
    return piped_;
  }
  // With DaemonLaunch::stderr_pipe: the daemon's stderr loses its reader.
  void CloseStderr() {
    if (pipe_ >= 0) close(pipe_);
    pipe_ = -1;
  }

  // Waits for the log line with the ports; false on timeout or exit.
  bool WaitListening(absl::Duration timeout) {
    const std::regex re("listening on port ([0-9]+)(, metrics on port ([0-9]+))?");
    const absl::Time deadline = absl::Now() + timeout;
    while (absl::Now() < deadline && pid_ > 0) {
      std::smatch m;
      const std::string log = Log();
      if (std::regex_search(log, m, re)) {
        port_ = std::stoi(m[1]);
        metrics_port_ = m[3].matched ? std::stoi(m[3]) : 0;
        channel_ = grpc::CreateChannel(absl::StrCat("127.0.0.1:", port_), grpc::InsecureChannelCredentials());
        return true;
      }
      absl::SleepFor(absl::Milliseconds(10));
    }
    return false;
  }
  bool WaitServing(absl::Duration timeout) {
    const absl::Time deadline = absl::Now() + timeout;
    if (!WaitListening(timeout)) return false;
    while (absl::Now() < deadline) {
      if (HealthStatus(channel_.get()) == 1) return true;
      absl::SleepFor(absl::Milliseconds(20));
    }
    return false;
  }

  void Signal(int sig) {
    signalled_at_ = absl::Now();
    kill(pid_, sig);
  }
  // The exit status (or 128 + signal), -1 on timeout.
  int WaitExit(absl::Duration timeout) {
    const absl::Time deadline = absl::Now() + timeout;
    while (absl::Now() < deadline) {
      int status = 0;
      if (waitpid(pid_, &status, WNOHANG) == pid_) {
        exited_ = true;
        exit_time_ = absl::Now() - signalled_at_;
        return WIFEXITED(status) ? WEXITSTATUS(status) : 128 + WTERMSIG(status);
      }
      absl::SleepFor(absl::Milliseconds(2));
    }
    return -1;
  }
  // From Signal() to the process's exit.
  absl::Duration exit_time() const { return exit_time_; }

  // Resident set size, bytes (VmRSS of /proc/PID/status).
  int64_t Rss() const {
    std::ifstream in(absl::StrCat("/proc/", pid_, "/status"));
    for (std::string line; std::getline(in, line);) {
      if (line.rfind("VmRSS:", 0) == 0) return std::stoll(line.substr(6)) * 1024;
    }
    return -1;
  }

  std::string Metrics() const { return HttpGet(metrics_port_, "/metrics"); }
  pid_t pid() const { return pid_; }
  int port() const { return port_; }
  int metrics_port() const { return metrics_port_; }
  std::shared_ptr<grpc::Channel> channel() const { return channel_; }

 private:
  static inline int count_ = 0;
  std::string log_path_;
  int pipe_ = -1;       // read end of stderr's pipe (DaemonLaunch::stderr_pipe)
  std::string piped_;   // what came through it
  pid_t pid_ = -1;
  bool exited_ = false;
  int port_ = 0;
  int metrics_port_ = 0;
  std::shared_ptr<grpc::Channel> channel_;
  absl::Time signalled_at_;
  absl::Duration exit_time_;
};

}  // namespace decoded::server::e2e

#endif  // DECODED_TESTS_SERVER_DAEMON_PROCESS_H_
