// The daemon's process signals, handled on one thread of their own.
//
// BlockProcessSignals() is the first thing main() does, before any thread
// exists (threads inherit the mask), so no signal can take its default
// action once main has started:
//   SIGTERM, SIGINT, SIGHUP   stop the daemon (a drain once it serves; see
//                             server/main.cc for what a second one does).
//                             SIGHUP is a stop, not a reload: decoded has no
//                             configuration to re-read, and a hang-up means
//                             whoever started it is gone.
//   SIGUSR1, SIGUSR2          logged and ignored (no meaning here; by
//                             default they would kill the process).
//   SIGPIPE                   ignored for good: a write to a closed socket
//                             or pipe (a closed stderr, a /metrics client
//                             gone) returns EPIPE to its caller instead.
// Other signals keep their default action (SIGQUIT still dumps core, SIGKILL
// cannot be caught).
#ifndef DECODED_SERVER_SIGNALS_H_
#define DECODED_SERVER_SIGNALS_H_

#include <functional>
#include <string>

namespace decoded::server {

// See the file comment. Call once, from main, before starting any thread.
void BlockProcessSignals();

// Waits for the blocked signals on its own thread and hands each stop signal
// (SIGTERM, SIGINT, SIGHUP) to `on_stop` with its number and how many stop
// signals came before it (0 for the first). `on_stop` runs on that thread;
// the thread lives until the process exits. Requires BlockProcessSignals().
class SignalWatcher {
 public:
  explicit SignalWatcher(std::function<void(int signal, int earlier_stops)> on_stop);
  SignalWatcher(const SignalWatcher&) = delete;
  SignalWatcher& operator=(const SignalWatcher&) = delete;
  // The watching thread is detached: it may be inside `on_stop` when main
  // returns.
  ~SignalWatcher() = default;
};

// "SIGTERM", "SIGHUP", ... ("signal N" for others).
std::string SignalName(int signal);

}  // namespace decoded::server

#endif  // DECODED_SERVER_SIGNALS_H_
