// A bounded pool of threads for request work whose cost grows with the
// request: tokenizing text, detokenizing ids, rendering a chat conversation,
// opening a session. gRPC's callback threads are few and shared by every
// call (health checks, token writes of every stream); work of this kind on
// them stalls all of those (a 4 MiB Tokenize held one for 8.5 s). Here it
// waits in a queue of fixed length instead, and runs on threads with a nice
// value of their own, so that on a machine whose cores the compute workers
// keep busy, it takes the CPU time they leave rather than time from decoding
// streams.
//
// Tasks run in submission order, each on one pool thread. The destructor
// runs every task already queued, then joins the threads: gRPC waits for
// the calls whose replies those tasks finish.
//
// Thread-safety: every method may be called from any thread.
#ifndef DECODED_SERVER_REQUEST_POOL_H_
#define DECODED_SERVER_REQUEST_POOL_H_

#include <deque>
#include <string>
#include <thread>
#include <vector>

#include "absl/base/thread_annotations.h"
#include "absl/functional/any_invocable.h"
#include "absl/status/status.h"
#include "absl/synchronization/mutex.h"

namespace decoded::server {

struct RequestPoolOptions {
  std::string name = "request";  // in error messages: "the <name> queue is full"
  std::string flag;              // the flag that sizes the queue, named in the error
  int threads = 1;               // >= 1
  int max_queued = 64;           // tasks waiting (not yet running), >= 1
  int nice = 0;                  // added to each thread's nice value (setpriority), 0..19
};

class RequestPool {
 public:
  explicit RequestPool(RequestPoolOptions options);
  ~RequestPool();
  RequestPool(const RequestPool&) = delete;
  RequestPool& operator=(const RequestPool&) = delete;

  // Queues `task`. RESOURCE_EXHAUSTED (naming the queue, its length and its
  // flag) when max_queued tasks are waiting; `task` is then destroyed unrun.
  absl::Status Submit(absl::AnyInvocable<void()> task) ABSL_LOCKS_EXCLUDED(mu_);

  int queued() const ABSL_LOCKS_EXCLUDED(mu_);
  int running() const ABSL_LOCKS_EXCLUDED(mu_);

 private:
  void Run();

  const RequestPoolOptions options_;
  mutable absl::Mutex mu_;
  std::deque<absl::AnyInvocable<void()>> queue_ ABSL_GUARDED_BY(mu_);
  int running_ ABSL_GUARDED_BY(mu_) = 0;
  bool stopping_ ABSL_GUARDED_BY(mu_) = false;
  std::vector<std::thread> threads_;
};

}  // namespace decoded::server

#endif  // DECODED_SERVER_REQUEST_POOL_H_
