#include "server/signals.h"

#include <signal.h>

#include <iostream>
#include <thread>
#include <utility>

namespace decoded::server {
namespace {

sigset_t WatchedSignals() {
  sigset_t set;
  sigemptyset(&set);
  for (int sig : {SIGTERM, SIGINT, SIGHUP, SIGUSR1, SIGUSR2}) sigaddset(&set, sig);
  return set;
}

}  // namespace

void BlockProcessSignals() {
  signal(SIGPIPE, SIG_IGN);
  const sigset_t set = WatchedSignals();
  pthread_sigmask(SIG_BLOCK, &set, nullptr);
}

SignalWatcher::SignalWatcher(std::function<void(int signal, int earlier_stops)> on_stop) {
  std::thread([on_stop = std::move(on_stop)] {
    const sigset_t set = WatchedSignals();
    int stops = 0;
    for (;;) {
      int sig = 0;
      if (sigwait(&set, &sig) != 0) continue;
      if (sig == SIGUSR1 || sig == SIGUSR2) {
        std::cerr << "decoded: " << SignalName(sig) << " ignored (it has no meaning here; SIGTERM drains)\n";
        continue;
      }
      on_stop(sig, stops++);
    }
  }).detach();
}

std::string SignalName(int signal) {
  switch (signal) {
    case SIGTERM: return "SIGTERM";
    case SIGINT: return "SIGINT";
    case SIGHUP: return "SIGHUP";
    case SIGUSR1: return "SIGUSR1";
    case SIGUSR2: return "SIGUSR2";
    case SIGPIPE: return "SIGPIPE";
    default: return "signal " + std::to_string(signal);
  }
}

}  // namespace decoded::server
