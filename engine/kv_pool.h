// One pool of fixed-size KV blocks that many sessions' caches share
// (PagedAttention, Kwon et al. 2023): a cache holds the blocks its live length
// needs, named by its block tables, and gives them back when it shrinks or
// goes, so how many sessions fit is set by what they hold, not by what they
// might grow to.
//
// Layers come in groups (engine/kv_groups.h: by attention window, each with a
// block table of its own in a cache) of layers_per_group layers. A block is
// one group's KV for block_tokens positions: slot s of the group (its s-th
// layer) has K [n_blocks, n_kv_heads, block_tokens] rows of k_dim elements of
// the layout's KV type (f32, f16 or q8_0: engine/kv_layout.h) and V the same
// with v_dim (no V pool when the layout keeps the value inside the K row:
// KvLayout::v_in_k), so a block id names the same rows in each slot.
// bytes = layers_per_group * n_blocks * block_tokens * layout.bytes_per_token().
// A model without sliding windows is one group: a block then holds every layer.
//
// Blocks are reference-counted: Take hands out blocks with one reference,
// Give drops one, and a block is free again when none is left. (A block that
// several caches read, a shared prefix, holds one reference per reader.)
//
// Prefix caching (vLLM's automatic prefix caching; SGLang's RadixAttention
// keeps the same in a tree): the blocks at one position range of a cache (one
// per group) can be registered under the chain of their tokens, key =
// hash(previous key, the range's tokens), and a cache whose context starts
// with the same tokens maps the registered blocks instead of computing them
// again (LookupPrefix), read-only: a cache writes only past its length, and
// registered blocks lie wholly before it. A registered block whose last
// reference goes stays registered, as a free block that Take hands out last,
// least recently used first (evicting it then). Lookups compare the tokens
// and the previous entry, not only the hash, so a collision can never map
// another prefix's KV: each entry has an id that is never reused, and an
// entry names its previous one. A match needs every full-attention group's
// block of each range, but a sliding group's only for the ranges its window
// reaches back to from the match's end (vLLM's sliding-window rule): the
// older ones may have been evicted.
//
// Thread-safe: caches of sessions on different workers take and give blocks
// concurrently.
#ifndef DECODED_ENGINE_KV_POOL_H_
#define DECODED_ENGINE_KV_POOL_H_

#include <cstdint>
#include <list>
#include <memory>
#include <vector>

#include "absl/base/thread_annotations.h"
#include "absl/container/flat_hash_map.h"
#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/synchronization/mutex.h"
#include "absl/types/span.h"
#include "engine/backend.h"
#include "engine/kv_groups.h"
#include "engine/kv_layout.h"

namespace decoded {

class KvPool {
 public:
  // INVALID_ARGUMENT for non-positive geometry, a grouping of another
  // number of layers, or a KV type the layout cannot hold
  // (KvLayout::TypeProblem); RESOURCE_EXHAUSTED if the byte size (formula
  // above) overflows int64 or the backend cannot allocate it. Checked before
  // anything is allocated.
  static absl::StatusOr<std::shared_ptr<KvPool>> Create(Backend& backend, const KvGroups& groups,
                                                        const KvLayout& layout, int32_t block_tokens,
                                                        int32_t n_blocks);
  // One group of `n_layers` layers.
  static absl::StatusOr<std::shared_ptr<KvPool>> Create(Backend& backend, int32_t n_layers, const KvLayout& layout,
                                                        int32_t block_tokens, int32_t n_blocks) {
    return Create(backend, KvGroups::Single(n_layers), layout, block_tokens, n_blocks);
  }
  ~KvPool();
  KvPool(const KvPool&) = delete;
  KvPool& operator=(const KvPool&) = delete;

  Backend& backend() const { return backend_; }
  const KvGroups& groups() const { return groups_; }
  int32_t n_layers() const { return groups_.n_layers(); }
  const KvLayout& layout() const { return layout_; }
  int32_t block_tokens() const { return block_tokens_; }
  int32_t n_blocks() const { return n_blocks_; }
  // Bytes of one block (K and V of its group's layers).
  int64_t block_bytes() const;
  int64_t bytes() const { return block_bytes() * n_blocks_; }

  // Blocks with no reference now (those a Trim is discarding included, and
  // registered ones no cache holds: cached_free_blocks()).
  int32_t free_blocks() const ABSL_LOCKS_EXCLUDED(mu_);
  // Free blocks that hold a registered prefix (evicted as Take needs them).
  int32_t cached_free_blocks() const ABSL_LOCKS_EXCLUDED(mu_);
  int32_t used_blocks() const { return n_blocks_ - free_blocks(); }

  // Appends `n` free blocks (one reference each) to *out, the most recently
  // given back unregistered ones first (their memory is committed and likely
  // in cache), then registered ones least recently used first (their
  // entries go);
  // RESOURCE_EXHAUSTED (with the numbers) and nothing taken when fewer are
  // free. Waits for a running Trim only when it needs the blocks it holds.
  absl::Status Take(int32_t n, std::vector<int32_t>* out) ABSL_LOCKS_EXCLUDED(mu_);
  // Drops one reference of each block (ids from Take).
  void Give(absl::Span<const int32_t> blocks) ABSL_LOCKS_EXCLUDED(mu_);
  // How many blocks Give(blocks) would free now: the distinct blocks of
  // `blocks` whose every reference is among them (a block that appears
  // once but that another cache also reads stays taken). What preemption
  // can win by taking a set of caches' blocks back, shared prefixes counted
  // once and only where no other cache reads them.
  int32_t FreedByGiving(absl::Span<const int32_t> blocks) const ABSL_LOCKS_EXCLUDED(mu_);

  // Gives the memory of the free blocks that were used since the last call
  // back to the backend (Backend::Discard: on the CPU, their pages to the
  // operating system), so resident KV memory follows the blocks in use, not
  // their peak. The blocks being discarded are set aside and the pool's lock
  // is not held meanwhile: Take and Give go on, and only a Take that needs
  // those very blocks waits for them. Trimmed blocks go to the bottom of the
  // free stack (handed out last: their memory is cold). Calls serialize.
  void Trim() ABSL_LOCKS_EXCLUDED(mu_, trim_mu_);

  // The key of a position range of `tokens` (block_tokens() of them) after
  // the range whose key is `parent` (0 before the first).
  static uint64_t ChainKey(uint64_t parent, absl::Span<const int32_t> tokens);
  // One registered position range of a chain: its blocks (one per group; -1
  // where the cache maps none: a sliding group's block outside its window),
  // entry id and key.
  struct PrefixBlock {
    std::vector<int32_t> blocks;
    uint64_t entry = 0;
    uint64_t key = 0;
  };
  // The longest run of registered ranges that `tokens` (a context's tokens
  // from position 0) starts with and that a cache can continue from (rule
  // above), at most tokens.size() / block_tokens() of them, appended to
  // *out in order; each block it names has one more reference (the caller
  // gives them back as any block).
  void LookupPrefix(absl::Span<const int32_t> tokens, std::vector<PrefixBlock>* out) ABSL_LOCKS_EXCLUDED(mu_);
  // Registers `blocks` (one per group, -1 for none; blocks the caller holds,
  // their block_tokens() positions written from `tokens`) after the chain
  // whose last range is `parent` (PrefixBlock{} for the first). Returns the
  // chain's new last range: the entry `blocks` made, or the one registered
  // with the same tokens after the same parent before (which then takes
  // those of `blocks` it lacks; the others stay unregistered and are freed
  // as any block).
  PrefixBlock RegisterPrefix(absl::Span<const int32_t> blocks, const PrefixBlock& parent,
                             absl::Span<const int32_t> tokens) ABSL_LOCKS_EXCLUDED(mu_);

  // The device address of layer `layer`'s K / V pool (its group slot's; 0
  // for V when the layout has no V slot): what the KV binding table holds.
  uint64_t k_address(int32_t layer) const;
  uint64_t v_address(int32_t layer) const;
  // The host view of layer `layer`'s K / V pool; nullptr where the backend
  // keeps it in memory the host cannot map, or (V) when there is no V slot.
  void* k(int32_t layer) const;
  void* v(int32_t layer) const;

 private:
  explicit KvPool(Backend& backend) : backend_(backend) {}

  Backend& backend_;
  KvGroups groups_;
  int32_t block_tokens_ = 0, n_blocks_ = 0;
  KvLayout layout_;
  std::vector<std::unique_ptr<DeviceBuffer>> k_, v_;  // per slot

  absl::Mutex trim_mu_;  // one Trim at a time
  mutable absl::Mutex mu_;
  std::vector<int32_t> refs_ ABSL_GUARDED_BY(mu_);  // references per block
  // Free ids as a stack (a fresh pool hands out 0, 1, 2, ...), without the
  // ones a Trim is discarding.
  std::vector<int32_t> free_ ABSL_GUARDED_BY(mu_);
  // Per block: taken since it was last trimmed (its memory may be committed).
  std::vector<uint8_t> used_since_trim_ ABSL_GUARDED_BY(mu_);
  int32_t trimming_ ABSL_GUARDED_BY(mu_) = 0;  // free blocks a Trim holds aside

  // The prefix index: key -> entry (a position range: its block per group,
  // -1 once evicted or never registered); per block, the key of its entry
  // while registered.
  struct Entry {
    uint64_t id;
    uint64_t parent_id;  // 0: the first range of a chain
    std::vector<int32_t> tokens;
    std::vector<int32_t> blocks;  // per group
  };
  absl::flat_hash_map<uint64_t, Entry> entries_ ABSL_GUARDED_BY(mu_);
  std::vector<uint64_t> key_of_ ABSL_GUARDED_BY(mu_);       // per block; 0: not registered
  std::vector<uint8_t> registered_ ABSL_GUARDED_BY(mu_);    // per block
  uint64_t next_entry_id_ ABSL_GUARDED_BY(mu_) = 1;
  // Registered blocks without a reference, least recently used first.
  std::list<int32_t> cached_free_ ABSL_GUARDED_BY(mu_);
  std::vector<std::list<int32_t>::iterator> cached_free_at_ ABSL_GUARDED_BY(mu_);  // per block, if in it
  // Registers `b` as group g's block of the entry under `key`.
  void RegisterLocked(int32_t b, uint64_t key, Entry& e, int32_t g) ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  // Unregisters `b`: a free one becomes a plain free block.
  void UnregisterBlockLocked(int32_t b) ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  // The entry evicts its group-g block `b` (Take reuses it): an entry that
  // lost a full-attention group's block, or every block, goes, its other
  // blocks unregistered.
  void EvictLocked(int32_t b) ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
};

}  // namespace decoded

#endif  // DECODED_ENGINE_KV_POOL_H_
