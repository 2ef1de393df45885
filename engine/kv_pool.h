// One pool of fixed-size KV blocks that many sessions' caches share
// (PagedAttention, Kwon et al. 2023): a cache holds the blocks its live length
// needs, named by its block table, and gives them back when it shrinks or
// goes, so how many sessions fit is set by what they hold, not by what they
// might grow to.
//
// Layout per layer (f32): K [n_blocks, n_kv_heads, block_tokens, k_dim] and V
// the same with v_dim (no V pool when the layout keeps the value inside the K
// row: KvLayout::v_in_k). Block b of every layer holds the same positions of
// one cache, so one id names it in all of them (engine/kv_rows.h).
// bytes = n_layers * n_blocks * block_tokens * layout.floats_per_token() * 4.
//
// Blocks are reference-counted: Take hands out blocks with one reference,
// Give drops one, and a block is free again when none is left. (A block that
// several caches read, a shared prefix, holds one reference per reader.)
//
// Thread-safe: caches of sessions on different workers take and give blocks
// concurrently.
#ifndef DECODED_ENGINE_KV_POOL_H_
#define DECODED_ENGINE_KV_POOL_H_

#include <cstdint>
#include <memory>
#include <vector>

#include "absl/base/thread_annotations.h"
#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/synchronization/mutex.h"
#include "absl/types/span.h"
#include "engine/backend.h"
#include "engine/kv_layout.h"

namespace decoded {

class KvPool {
 public:
  // INVALID_ARGUMENT for non-positive geometry; RESOURCE_EXHAUSTED if the
  // byte size (formula above) overflows int64 or the backend cannot allocate
  // it. Checked before anything is allocated.
  static absl::StatusOr<std::shared_ptr<KvPool>> Create(Backend& backend, int32_t n_layers, const KvLayout& layout,
                                                        int32_t block_tokens, int32_t n_blocks);
  ~KvPool();
  KvPool(const KvPool&) = delete;
  KvPool& operator=(const KvPool&) = delete;

  Backend& backend() const { return backend_; }
  int32_t n_layers() const { return n_layers_; }
  const KvLayout& layout() const { return layout_; }
  int32_t block_tokens() const { return block_tokens_; }
  int32_t n_blocks() const { return n_blocks_; }
  // Bytes of one block over all layers (K and V).
  int64_t block_bytes() const;
  int64_t bytes() const { return block_bytes() * n_blocks_; }

  // Blocks with no reference now (those a Trim is discarding included).
  int32_t free_blocks() const ABSL_LOCKS_EXCLUDED(mu_);
  int32_t used_blocks() const { return n_blocks_ - free_blocks(); }

  // Appends `n` free blocks (one reference each) to *out, the most recently
  // given back first (its memory is committed and likely in cache);
  // RESOURCE_EXHAUSTED (with the numbers) and nothing taken when fewer are
  // free. Waits for a running Trim only when it needs the blocks it holds.
  absl::Status Take(int32_t n, std::vector<int32_t>* out) ABSL_LOCKS_EXCLUDED(mu_);
  // Drops one reference of each block (ids from Take).
  void Give(absl::Span<const int32_t> blocks) ABSL_LOCKS_EXCLUDED(mu_);

  // Gives the memory of the free blocks that were used since the last call
  // back to the backend (Backend::Discard: on the CPU, their pages to the
  // operating system), so resident KV memory follows the blocks in use, not
  // their peak. The blocks being discarded are set aside and the pool's lock
  // is not held meanwhile: Take and Give go on, and only a Take that needs
  // those very blocks waits for them. Trimmed blocks go to the bottom of the
  // free stack (handed out last: their memory is cold). Calls serialize.
  void Trim() ABSL_LOCKS_EXCLUDED(mu_, trim_mu_);

  // The device address of layer `layer`'s K / V pool (0 for V when the
  // layout has no V slot): what the KV binding table holds.
  uint64_t k_address(int32_t layer) const;
  uint64_t v_address(int32_t layer) const;
  // The host view of layer `layer`'s K / V pool; nullptr where the backend
  // keeps it in memory the host cannot map, or (V) when there is no V slot.
  float* k(int32_t layer) const;
  float* v(int32_t layer) const;

 private:
  explicit KvPool(Backend& backend) : backend_(backend) {}

  Backend& backend_;
  int32_t n_layers_ = 0, block_tokens_ = 0, n_blocks_ = 0;
  KvLayout layout_;
  std::vector<std::unique_ptr<DeviceBuffer>> k_, v_;

  absl::Mutex trim_mu_;  // one Trim at a time
  mutable absl::Mutex mu_;
  std::vector<int32_t> refs_ ABSL_GUARDED_BY(mu_);  // references per block
  // Free ids as a stack (a fresh pool hands out 0, 1, 2, ...), without the
  // ones a Trim is discarding.
  std::vector<int32_t> free_ ABSL_GUARDED_BY(mu_);
  // Per block: taken since it was last trimmed (its memory may be committed).
  std::vector<uint8_t> used_since_trim_ ABSL_GUARDED_BY(mu_);
  int32_t trimming_ ABSL_GUARDED_BY(mu_) = 0;  // free blocks a Trim holds aside
};

}  // namespace decoded

#endif  // DECODED_ENGINE_KV_POOL_H_
