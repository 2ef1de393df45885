// The KV cache of one decode session: the positions it has cached, in blocks
// of a KvPool (engine/kv_pool.h) named by its block tables, one per layer
// group (engine/kv_groups.h).
//
// Two kinds, one addressing (engine/kv_rows.h):
//   Create       a contiguous cache: a private pool of one group and one
//                block of `capacity` positions, taken at creation. Per layer
//                K [n_kv_heads, capacity, k_dim] and V the same with v_dim, or
//                no V buffer when the layout keeps the value inside the K row
//                (v_in_k: MLA's latent), rows of the layout's KV type;
//                bytes = n_layers * capacity * layout.bytes_per_token().
//   CreatePaged  a cache over a shared pool: it holds the blocks its length
//                needs (Reserve takes them), gives back those past a
//                Truncate, and all of them when it goes. A sliding-window
//                group also gives back the blocks that fell out of its
//                window: every Reserve first frees those no later query can
//                read. bytes() = its blocks.
//
// Identity: allocation_id() is drawn from a process-wide counter that never
// repeats, so a step can tell two rows of one cache from rows of two caches
// of the same geometry.
//
// Not thread-safe: owned and used by one session at a time (its pool is).
#ifndef DECODED_ENGINE_KV_CACHE_H_
#define DECODED_ENGINE_KV_CACHE_H_

#include <cstdint>
#include <memory>
#include <vector>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "engine/backend.h"
#include "engine/kv_layout.h"
#include "engine/kv_pool.h"

namespace decoded {

class KvCache {
 public:
  // INVALID_ARGUMENT for non-positive geometry or a KV type the layout cannot
  // hold; RESOURCE_EXHAUSTED if its
  // byte size (formula above) overflows int64 or the backend cannot allocate
  // it. The size is checked before anything is allocated.
  static absl::StatusOr<std::unique_ptr<KvCache>> Create(Backend& backend, int32_t n_layers,
                                                         const KvLayout& layout, int32_t capacity);
  // KvLayout::Separate(n_kv_heads, head_dim).
  static absl::StatusOr<std::unique_ptr<KvCache>> Create(Backend& backend, int32_t n_layers,
                                                         int32_t n_kv_heads, int32_t head_dim,
                                                         int32_t capacity) {
    return Create(backend, n_layers, KvLayout::Separate(n_kv_heads, head_dim), capacity);
  }
  // A cache of up to `capacity` positions over `pool`, holding no block yet.
  // INVALID_ARGUMENT for a null pool or capacity < 1; RESOURCE_EXHAUSTED if
  // the backend cannot allocate its block table.
  static absl::StatusOr<std::unique_ptr<KvCache>> CreatePaged(std::shared_ptr<KvPool> pool, int32_t capacity);
  ~KvCache();
  KvCache(const KvCache&) = delete;
  KvCache& operator=(const KvCache&) = delete;

  int32_t n_layers() const { return pool_->n_layers(); }
  const KvLayout& layout() const { return pool_->layout(); }
  int32_t n_kv_heads() const { return layout().n_kv_heads; }
  int32_t capacity() const { return capacity_; }
  int32_t cached_len() const { return cached_len_; }
  uint64_t allocation_id() const { return allocation_id_; }
  int32_t block_tokens() const { return pool_->block_tokens(); }
  int32_t n_groups() const { return pool_->groups().n_groups(); }
  // Blocks this cache holds (all groups), and the positions they map: every
  // group's table covers [0, mapped_len()) but for a sliding group's blocks
  // that left its window (<= capacity).
  int32_t held_blocks() const { return held_; }
  int32_t mapped_len() const;
  // Bytes of the blocks this cache holds (K and V, all layers).
  int64_t bytes() const { return held_blocks() * pool_->block_bytes(); }

  // The host view of layer `layer`'s K (and V) pool: for a contiguous cache,
  // [n_kv_heads, capacity, dim]. nullptr where the backend keeps the cache in
  // memory the host cannot map (a discrete GPU).
  void* k(int32_t layer) { return pool_->k(layer); }
  // nullptr when the layout has no V slot (v_in_k).
  void* v(int32_t layer) { return pool_->v(layer); }

  // Writes this cache's row of a step's KV binding table (engine/kv_rows.h):
  // KvRowStride(n_layers()) entries at `row`.
  void FillKvRow(int64_t* row) const;

  // Maps the blocks `n_tokens` more rows after cached_len() need, taking them
  // from the pool, after giving back the sliding-window blocks no query at
  // cached_len() or later reads. RESOURCE_EXHAUSTED (with the numbers) past
  // capacity() or when the pool has too few free blocks; the blocks it did
  // map stay. Every step calls this before running.
  absl::Status Reserve(int32_t n_tokens);
  // The blocks Reserve(n_tokens) would take from the pool, less those it
  // would give back first (>= 0).
  int32_t BlocksToReserve(int32_t n_tokens) const;
  // OK if `n_tokens` more rows fit after cached_len() in mapped blocks;
  // RESOURCE_EXHAUSTED otherwise.
  absl::Status CheckWrite(int32_t n_tokens) const;
  // The write offset of the next step (the KV cache fills its own offset).
  int32_t write_offset() const { return cached_len_; }
  // Records that a step wrote `n_tokens` rows at write_offset().
  void Commit(int32_t n_tokens) { cached_len_ += n_tokens; }
  // The longest length <= len (<= cached_len()) this cache can be cut back
  // to and go on from: len, unless a sliding group gave back blocks that
  // queries from len on would read; then 0.
  int32_t TruncatableTo(int32_t len) const;
  // Forgets everything past `len` (<= cached_len(), and TruncatableTo(len) ==
  // len; otherwise nothing happens); a paged cache gives the blocks wholly
  // past it back to its pool (with len == cached_len(), the blocks Reserve
  // mapped that no step used).
  void Truncate(int32_t len);

  // Paged: the pool block of group `group` holding positions
  // [i * block_tokens(), ...), -1 if none (past the mapped blocks, out of a
  // sliding window, or a contiguous cache).
  int32_t block(int32_t group, int32_t i) const;
  // The i-th block this cache holds, group by group (i < held_blocks()).
  int32_t held_block(int32_t i) const;
  // Paged, holding nothing: maps cached prefix blocks as its first ones:
  // `blocks` is n ranges of n_groups() ids each (KvPool::LookupPrefix's, in
  // range order; -1 only for a sliding group's range out of the window
  // from the end), whose references the caller took; cached_len() becomes
  // n * block_tokens(). FAILED_PRECONDITION otherwise, past capacity(), or
  // for a -1 that a query from the end would read; nothing changes then
  // (the references stay the caller's).
  absl::Status Adopt(absl::Span<const int32_t> blocks);
  KvPool& pool() const { return *pool_; }

 private:
  KvCache() = default;
  // Copies group g's table entries [begin, end) to the device.
  void UploadTable(int32_t g, int32_t begin, int32_t end);
  // Gives back the sliding groups' blocks that no query at `next` or later
  // reads.
  void ReleaseOutOfWindow(int32_t next);
  // The blocks ReleaseOutOfWindow(next) would give back (all sliding groups).
  int32_t OutOfWindow(int32_t next) const;

  std::shared_ptr<KvPool> pool_;
  bool paged_ = false;
  int32_t capacity_ = 0;
  int32_t cached_len_ = 0;
  uint64_t allocation_id_ = 0;
  int32_t mapped_ = 0;  // block ranges [0, mapped_) mapped, but for released_
  int32_t held_ = 0;    // blocks held, all groups
  std::vector<int32_t> released_;  // per group: ranges [0, released_) given back (sliding groups)
  std::vector<std::vector<int32_t>> table_;  // per group, host copy: block per range, -1 where none
  std::vector<std::unique_ptr<DeviceBuffer>> table_buf_;  // per group, i32 [ceil(capacity / block_tokens)]
};

}  // namespace decoded

#endif  // DECODED_ENGINE_KV_CACHE_H_
