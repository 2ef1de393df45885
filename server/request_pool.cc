#include "server/request_pool.h"

#include <sys/resource.h>
#include <sys/syscall.h>
#include <unistd.h>

#include <algorithm>
#include <utility>

#include "absl/strings/str_cat.h"

namespace decoded::server {

RequestPool::RequestPool(RequestPoolOptions options) : options_(std::move(options)) {
  for (int i = 0; i < std::max(1, options_.threads); ++i) threads_.emplace_back([this] { Run(); });
}

RequestPool::~RequestPool() {
  {
    absl::MutexLock lock(&mu_);
    stopping_ = true;
  }
  for (std::thread& t : threads_) t.join();
}

absl::Status RequestPool::Submit(absl::AnyInvocable<void()> task) {
  absl::MutexLock lock(&mu_);
  if (static_cast<int>(queue_.size()) >= options_.max_queued) {
    return absl::ResourceExhaustedError(absl::StrCat("the server's ", options_.name, " queue is full (",
                                                     options_.max_queued, " requests waiting",
                                                     options_.flag.empty() ? "" : ", " + options_.flag,
                                                     "); retry later"));
  }
  queue_.push_back(std::move(task));
  return absl::OkStatus();
}

int RequestPool::queued() const {
  absl::MutexLock lock(&mu_);
  return static_cast<int>(queue_.size());
}

int RequestPool::running() const {
  absl::MutexLock lock(&mu_);
  return running_;
}

void RequestPool::Run() {
  // Linux keeps a nice value per thread: PRIO_PROCESS with a thread id.
  if (options_.nice > 0) {
    const pid_t tid = static_cast<pid_t>(syscall(SYS_gettid));
    setpriority(PRIO_PROCESS, tid, std::min(19, getpriority(PRIO_PROCESS, tid) + options_.nice));
  }
  auto has_work = [this]() ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_) { return stopping_ || !queue_.empty(); };
  for (;;) {
    absl::AnyInvocable<void()> task;
    {
      absl::MutexLock lock(&mu_);
      mu_.Await(absl::Condition(&has_work));
      // Stopping still runs what is queued: each task finishes a call.
      if (queue_.empty()) return;
      task = std::move(queue_.front());
      queue_.pop_front();
      ++running_;
    }
    task();
    task = nullptr;  // its captures go before the next task starts
    absl::MutexLock lock(&mu_);
    --running_;
  }
}

}  // namespace decoded::server
