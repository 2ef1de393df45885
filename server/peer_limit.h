// What each client address holds (sessions, Generate streams, HTTP
// connections), counted against one limit per address so that one client
// cannot take every slot of the server. The callers pick the address (the
// client's IP without its port: one client's connections share it) and word
// their own refusal.
//
// Thread-safety: every method may be called from any thread; a Slot may be
// destroyed on any thread, before its PeerLimit.
#ifndef DECODED_SERVER_PEER_LIMIT_H_
#define DECODED_SERVER_PEER_LIMIT_H_

#include <optional>
#include <string>
#include <string_view>

#include "absl/base/thread_annotations.h"
#include "absl/container/flat_hash_map.h"
#include "absl/synchronization/mutex.h"

namespace decoded::server {

class PeerLimit {
 public:
  // `max_per_peer` 0: no limit (counted all the same).
  explicit PeerLimit(int max_per_peer) : max_per_peer_(max_per_peer) {}
  PeerLimit(const PeerLimit&) = delete;
  PeerLimit& operator=(const PeerLimit&) = delete;

  // One thing an address holds; its count is released when destroyed.
  class Slot {
   public:
    Slot(Slot&& other) noexcept : owner_(other.owner_), address_(std::move(other.address_)) {
      other.owner_ = nullptr;
    }
    Slot& operator=(Slot&&) = delete;
    Slot(const Slot&) = delete;
    ~Slot();
    const std::string& address() const { return address_; }

   private:
    friend class PeerLimit;
    Slot(PeerLimit* owner, std::string address) : owner_(owner), address_(std::move(address)) {}
    PeerLimit* owner_;
    std::string address_;
  };

  // A slot for `address`; nullopt when it holds max_per_peer already.
  std::optional<Slot> TryAcquire(std::string address) ABSL_LOCKS_EXCLUDED(mu_);
  // Slots `address` holds.
  int Count(std::string_view address) const ABSL_LOCKS_EXCLUDED(mu_);
  int max_per_peer() const { return max_per_peer_; }

 private:
  void Release(const std::string& address) ABSL_LOCKS_EXCLUDED(mu_);

  const int max_per_peer_;
  mutable absl::Mutex mu_;
  absl::flat_hash_map<std::string, int> held_ ABSL_GUARDED_BY(mu_);
};

}  // namespace decoded::server

#endif  // DECODED_SERVER_PEER_LIMIT_H_
