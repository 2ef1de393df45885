// The KV cache of one decode session: the positions it has cached, in blocks
// of a KvPool (engine/kv_pool.h) named by its block table.
//
// Two kinds, one addressing (engine/kv_rows.h):
//   Create       a contiguous cache: a private pool of one block of
//                `capacity` positions, taken at creation. Per layer K
//                [n_kv_heads, capacity, k_dim] and V the same with v_dim, or
//                no V buffer when the layout keeps the value inside the K row
//                (v_in_k: MLA's latent), rows of the layout's KV type;
//                bytes = n_layers * capacity * layout.bytes_per_token().
//   CreatePaged  a cache over a shared pool: it holds the blocks its length
//                needs (Reserve takes them), gives back those past a
//                Truncate, and all of them when it goes. bytes() = its blocks.
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
  // Blocks this cache holds, and the positions they map (<= capacity).
  int32_t held_blocks() const { return static_cast<int32_t>(blocks_.size()); }
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
  // from the pool. RESOURCE_EXHAUSTED (with the numbers) past capacity() or
  // when the pool has too few free blocks; the blocks it did map stay.
  // Every step calls this before running.
  absl::Status Reserve(int32_t n_tokens);
  // OK if `n_tokens` more rows fit after cached_len() in mapped blocks;
  // RESOURCE_EXHAUSTED otherwise.
  absl::Status CheckWrite(int32_t n_tokens) const;
  // The write offset of the next step (the KV cache fills its own offset).
  int32_t write_offset() const { return cached_len_; }
  // Records that a step wrote `n_tokens` rows at write_offset().
  void Commit(int32_t n_tokens) { cached_len_ += n_tokens; }
  // Forgets everything past `len` (<= cached_len()); a paged cache gives the
  // blocks wholly past it back to its pool (with len == cached_len(), the
  // blocks Reserve mapped that no step used).
  void Truncate(int32_t len);

  // Paged: the pool block holding positions [i * block_tokens(), ...) for
  // i < held_blocks(); -1 otherwise (and for a contiguous cache).
  int32_t block(int32_t i) const {
    return paged_ && i >= 0 && i < held_blocks() ? blocks_[static_cast<size_t>(i)] : -1;
  }
  // Paged, holding nothing: maps `blocks` (full ones whose references the
  // caller took, KvPool::LookupPrefix) as its first blocks, so cached_len()
  // becomes blocks.size() * block_tokens(). FAILED_PRECONDITION otherwise,
  // or past capacity(); nothing changes then (the references stay the
  // caller's).
  absl::Status Adopt(absl::Span<const int32_t> blocks);
  KvPool& pool() const { return *pool_; }

 private:
  KvCache() = default;
  // Copies table entries [begin, end) to the device's table.
  void UploadTable(int32_t begin, int32_t end);

  std::shared_ptr<KvPool> pool_;
  bool paged_ = false;
  int32_t capacity_ = 0;
  int32_t cached_len_ = 0;
  uint64_t allocation_id_ = 0;
  std::vector<int32_t> blocks_;               // held, in position order
  std::vector<int32_t> table_;                // host copy: blocks_, then -1 up to the table's length
  std::unique_ptr<DeviceBuffer> table_buf_;   // i32 [ceil(capacity / block_tokens)]
};

}  // namespace decoded

#endif  // DECODED_ENGINE_KV_CACHE_H_
