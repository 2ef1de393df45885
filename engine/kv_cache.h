// The KV cache of one decode session.
//
// Layout per layer (f32), from the family's KvLayout (engine/kv_layout.h):
// K [n_kv_heads, capacity, k_dim], row `pos` of head h at
// ((h * capacity) + pos) * k_dim, and V the same with v_dim, or no V buffer
// when the layout keeps the value inside the K row (v_in_k: MLA's latent).
// Capacity is fixed at creation;
// bytes = n_layers * capacity * layout.floats_per_token() * 4.
//
// Identity: allocation_id() is drawn from a process-wide counter that never
// repeats, so a held decode plan can tell "the cache I was bound to" from
// "another cache of the same geometry" (a plan must never run over a cache it
// was not bound to). layer_version(l) counts the writes into layer l.
//
// Not thread-safe: owned and used by one session at a time.
#ifndef DECODED_ENGINE_KV_CACHE_H_
#define DECODED_ENGINE_KV_CACHE_H_

#include <cstdint>
#include <memory>
#include <vector>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "engine/backend.h"
#include "engine/kv_layout.h"

namespace decoded {

class KvCache {
 public:
  // INVALID_ARGUMENT for non-positive geometry; RESOURCE_EXHAUSTED if its
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
  ~KvCache();
  KvCache(const KvCache&) = delete;
  KvCache& operator=(const KvCache&) = delete;

  int32_t n_layers() const { return n_layers_; }
  const KvLayout& layout() const { return layout_; }
  int32_t n_kv_heads() const { return layout_.n_kv_heads; }
  int32_t capacity() const { return capacity_; }
  int32_t cached_len() const { return cached_len_; }
  uint64_t allocation_id() const { return allocation_id_; }
  uint64_t layer_version(int32_t layer) const { return versions_[static_cast<size_t>(layer)]; }
  int64_t bytes() const;

  // The host view of a layer's K (and V) rows: nullptr where the backend
  // keeps the cache in memory the host cannot map (a discrete GPU).
  float* k(int32_t layer);
  // nullptr when the layout has no V slot (v_in_k).
  float* v(int32_t layer);

  // Writes this cache's row of a step's KV binding table (engine/kv_rows.h):
  // KvRowStride(n_layers()) entries at `row`.
  void FillKvRow(int64_t* row);

  // OK if `n_tokens` more rows fit after cached_len(); RESOURCE_EXHAUSTED
  // (with the numbers) otherwise. Every step calls this before running.
  absl::Status CheckWrite(int32_t n_tokens) const;
  // The write offset of the next step (the KV cache fills its own offset).
  int32_t write_offset() const { return cached_len_; }
  // Records that a step wrote `n_tokens` rows at write_offset().
  void Commit(int32_t n_tokens);
  // Forgets everything past `len` (<= cached_len()); the rows are simply
  // overwritten by later steps.
  void Truncate(int32_t len);

 private:
  KvCache() = default;
  int32_t n_layers_ = 0, capacity_ = 0;
  KvLayout layout_;
  int32_t cached_len_ = 0;
  uint64_t allocation_id_ = 0;
  std::vector<uint64_t> versions_;
  std::vector<std::unique_ptr<DeviceBuffer>> k_, v_;
};

}  // namespace decoded

#endif  // DECODED_ENGINE_KV_CACHE_H_
