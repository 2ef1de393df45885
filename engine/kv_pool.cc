#include "engine/kv_pool.h"

#include <algorithm>

#include "absl/strings/str_cat.h"

namespace decoded {

absl::StatusOr<std::shared_ptr<KvPool>> KvPool::Create(Backend& backend, const KvGroups& groups,
                                                       const KvLayout& layout, int32_t block_tokens,
                                                       int32_t n_blocks) {
  const bool v_slot = !layout.v_in_k;
  const int32_t slots = groups.layers_per_group;
  if (groups.n_layers() <= 0 || slots <= 0 || groups.n_groups() * slots != groups.n_layers() ||
      layout.n_kv_heads <= 0 || layout.k_dim <= 0 || layout.v_dim <= 0 || block_tokens <= 0 || n_blocks <= 0 ||
      (!v_slot && layout.v_dim > layout.k_dim)) {
    return absl::InvalidArgumentError(absl::StrCat("KV pool geometry must be positive: layers=", groups.n_layers(),
                                                   " in ", groups.n_groups(), " groups of ", slots,
                                                   " kv_heads=", layout.n_kv_heads, " k_dim=", layout.k_dim,
                                                   " v_dim=", layout.v_dim, " block_tokens=", block_tokens,
                                                   " blocks=", n_blocks));
  }
  if (const char* why = layout.TypeProblem(layout.type); *why != 0) {
    return absl::InvalidArgumentError(absl::StrCat(why, " (KV type ", DTypeName(layout.type), ", k_dim=",
                                                   layout.k_dim, ", v_dim=", layout.v_dim, ")"));
  }
  // The geometry may come from a model file: size the pool with overflow
  // checks before allocating anything.
  bool overflow = false;
  auto slot_bytes = [&](int32_t dim) {
    int64_t per = KvRowBytes(layout.type, dim);
    for (const int64_t f : {int64_t{n_blocks}, int64_t{layout.n_kv_heads}, int64_t{block_tokens}}) {
      overflow |= __builtin_mul_overflow(per, f, &per);
    }
    return per;
  };
  const int64_t k_per = slot_bytes(layout.k_dim);
  const int64_t v_per = v_slot ? slot_bytes(layout.v_dim) : 0;
  int64_t per_slot = 0, total = 0;
  overflow |= __builtin_add_overflow(k_per, v_per, &per_slot);
  overflow |= __builtin_mul_overflow(per_slot, int64_t{slots}, &total);
  if (overflow) {
    return absl::ResourceExhaustedError(absl::StrCat("KV pool of ", slots, " layers per block, kv_heads=",
                                                     layout.n_kv_heads, " k_dim=", layout.k_dim,
                                                     " v_dim=", layout.v_dim, " blocks=", n_blocks, "x",
                                                     block_tokens, " would exceed 2^63 bytes"));
  }
  std::shared_ptr<KvPool> pool(new KvPool(backend));
  pool->groups_ = groups;
  pool->layout_ = layout;
  pool->block_tokens_ = block_tokens;
  pool->n_blocks_ = n_blocks;
  for (int32_t s = 0; s < slots; ++s) {
    auto k = backend.Allocate(static_cast<size_t>(k_per), BufferAccess::kDeviceOnly);
    if (!k.ok()) return k.status();
    pool->k_.push_back(*std::move(k));
    if (v_slot) {
      auto v = backend.Allocate(static_cast<size_t>(v_per), BufferAccess::kDeviceOnly);
      if (!v.ok()) return v.status();
      pool->v_.push_back(*std::move(v));
    }
  }
  absl::MutexLock lock(&pool->mu_);
  pool->refs_.assign(static_cast<size_t>(n_blocks), 0);
  pool->used_since_trim_.assign(static_cast<size_t>(n_blocks), 0);
  pool->key_of_.assign(static_cast<size_t>(n_blocks), 0);
  pool->registered_.assign(static_cast<size_t>(n_blocks), 0);
  pool->cached_free_at_.assign(static_cast<size_t>(n_blocks), {});
  pool->free_.reserve(static_cast<size_t>(n_blocks));
  for (int32_t b = n_blocks - 1; b >= 0; --b) pool->free_.push_back(b);
  return pool;
}

KvPool::~KvPool() = default;

int64_t KvPool::block_bytes() const {
  return static_cast<int64_t>(groups_.layers_per_group) * block_tokens_ * layout_.bytes_per_token();
}

int32_t KvPool::free_blocks() const {
  absl::MutexLock lock(&mu_);
  return static_cast<int32_t>(free_.size() + cached_free_.size()) + trimming_;
}

int32_t KvPool::cached_free_blocks() const {
  absl::MutexLock lock(&mu_);
  return static_cast<int32_t>(cached_free_.size());
}

absl::Status KvPool::Take(int32_t n, std::vector<int32_t>* out) {
  absl::MutexLock lock(&mu_);
  const size_t free = free_.size() + cached_free_.size() + static_cast<size_t>(trimming_);
  if (n < 0 || static_cast<size_t>(n) > free) {
    return absl::ResourceExhaustedError(absl::StrCat("the KV pool has ", free, " free blocks of ", n_blocks_, " (",
                                                     block_tokens_, " tokens each); ", n, " more are needed"));
  }
  if (static_cast<size_t>(n) > free_.size() + cached_free_.size()) {
    // Some of them are being discarded: they are free again within the Trim.
    auto trimmed = [this]() ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_) { return trimming_ == 0; };
    mu_.Await(absl::Condition(&trimmed));
  }
  for (int32_t i = 0; i < n; ++i) {
    int32_t b;
    if (!free_.empty()) {
      b = free_.back();
      free_.pop_back();
    } else {
      // Evict the least recently used cached prefix block.
      b = cached_free_.front();
      cached_free_.pop_front();
      EvictLocked(b);
    }
    refs_[static_cast<size_t>(b)] = 1;
    used_since_trim_[static_cast<size_t>(b)] = 1;
    out->push_back(b);
  }
  return absl::OkStatus();
}

void KvPool::Give(absl::Span<const int32_t> blocks) {
  absl::MutexLock lock(&mu_);
  for (const int32_t b : blocks) {
    if (b < 0 || b >= n_blocks_ || refs_[static_cast<size_t>(b)] == 0) continue;  // not ours: a caller bug
    if (--refs_[static_cast<size_t>(b)] != 0) continue;
    if (registered_[static_cast<size_t>(b)] != 0) {
      cached_free_at_[static_cast<size_t>(b)] = cached_free_.insert(cached_free_.end(), b);
    } else {
      free_.push_back(b);
    }
  }
}

int32_t KvPool::FreedByGiving(absl::Span<const int32_t> blocks) const {
  absl::flat_hash_map<int32_t, int32_t> given;  // block -> references among `blocks`
  for (const int32_t b : blocks) {
    if (b >= 0 && b < n_blocks_) ++given[b];
  }
  absl::MutexLock lock(&mu_);
  int32_t freed = 0;
  for (const auto& [b, n] : given) {
    const int32_t refs = refs_[static_cast<size_t>(b)];
    if (refs > 0 && n >= refs) ++freed;
  }
  return freed;
}

void KvPool::Trim() {
  absl::MutexLock trim_lock(&trim_mu_);
  std::vector<int32_t> discard;
  {
    // Set the free blocks used since the last Trim aside; the rest stay
    // free in stack order.
    absl::MutexLock lock(&mu_);
    size_t kept = 0;
    for (const int32_t b : free_) {
      if (used_since_trim_[static_cast<size_t>(b)] != 0) {
        discard.push_back(b);
      } else {
        free_[kept++] = b;
      }
    }
    free_.resize(kept);
    trimming_ = static_cast<int32_t>(discard.size());
  }
  if (discard.empty()) return;
  const size_t k_block = static_cast<size_t>(block_tokens_) * layout_.n_kv_heads * layout_.k_row_bytes();
  const size_t v_block = static_cast<size_t>(block_tokens_) * layout_.n_kv_heads * layout_.v_row_bytes();
  for (const int32_t b : discard) {
    for (size_t s = 0; s < k_.size(); ++s) {
      backend_.Discard(*k_[s], static_cast<size_t>(b) * k_block, k_block);
      if (!v_.empty()) backend_.Discard(*v_[s], static_cast<size_t>(b) * v_block, v_block);
    }
  }
  absl::MutexLock lock(&mu_);
  for (const int32_t b : discard) used_since_trim_[static_cast<size_t>(b)] = 0;
  // At the bottom of the stack: warm blocks given back later go out first.
  free_.insert(free_.begin(), discard.rbegin(), discard.rend());
  trimming_ = 0;
}

uint64_t KvPool::ChainKey(uint64_t parent, absl::Span<const int32_t> tokens) {
  // FNV-1a over the parent key's and the tokens' bytes, then a final mix
  // (splitmix64). 0 is kept for "no parent".
  uint64_t h = 1469598103934665603ull;
  auto mix_in = [&h](uint64_t v) {
    for (int i = 0; i < 8; ++i) {
      h ^= (v >> (8 * i)) & 0xff;
      h *= 1099511628211ull;
    }
  };
  mix_in(parent);
  for (const int32_t t : tokens) mix_in(static_cast<uint32_t>(t));
  h ^= h >> 30;
  h *= 0xbf58476d1ce4e5b9ull;
  h ^= h >> 27;
  h *= 0x94d049bb133111ebull;
  h ^= h >> 31;
  return h == 0 ? 1 : h;
}

void KvPool::RegisterLocked(int32_t b, uint64_t key, Entry& e, int32_t g) {
  const size_t i = static_cast<size_t>(b);
  e.blocks[static_cast<size_t>(g)] = b;
  registered_[i] = 1;
  key_of_[i] = key;
}

void KvPool::UnregisterBlockLocked(int32_t b) {
  const size_t i = static_cast<size_t>(b);
  if (registered_[i] == 0) return;
  registered_[i] = 0;
  key_of_[i] = 0;
  if (refs_[i] == 0) {  // cached-free: a plain free block now
    cached_free_.erase(cached_free_at_[i]);
    free_.push_back(b);
  }
}

void KvPool::EvictLocked(int32_t b) {
  const size_t i = static_cast<size_t>(b);
  if (registered_[i] == 0) return;
  const uint64_t key = key_of_[i];
  registered_[i] = 0;
  key_of_[i] = 0;
  auto it = entries_.find(key);
  if (it == entries_.end()) return;
  Entry& e = it->second;
  bool full_lost = false, any_left = false;
  for (size_t g = 0; g < e.blocks.size(); ++g) {
    if (e.blocks[g] == b) {
      e.blocks[g] = -1;
      full_lost |= !groups_.sliding(static_cast<int32_t>(g));
    }
    any_left |= e.blocks[g] >= 0;
  }
  if (!full_lost && any_left) return;
  // Unusable without its full-attention blocks: the entry goes.
  for (const int32_t other : e.blocks) {
    if (other >= 0) UnregisterBlockLocked(other);
  }
  entries_.erase(it);
}

void KvPool::LookupPrefix(absl::Span<const int32_t> tokens, std::vector<PrefixBlock>* out) {
  absl::MutexLock lock(&mu_);
  const size_t bt = static_cast<size_t>(block_tokens_);
  const int32_t n_groups = groups_.n_groups();
  // The chain's ranges whose full-attention blocks are all there.
  std::vector<const Entry*> chain;
  std::vector<uint64_t> keys;
  // Per sliding group, the last range of the chain so far without its block.
  std::vector<int64_t> last_missing(static_cast<size_t>(n_groups), -1);
  size_t best = 0;
  uint64_t parent_key = 0, parent_id = 0;
  for (size_t start = 0; start + bt <= tokens.size(); start += bt) {
    const absl::Span<const int32_t> range = tokens.subspan(start, bt);
    const uint64_t key = ChainKey(parent_key, range);
    auto it = entries_.find(key);
    if (it == entries_.end()) break;
    const Entry& e = it->second;
    if (e.parent_id != parent_id || !std::equal(e.tokens.begin(), e.tokens.end(), range.begin())) break;
    bool full = true;
    for (int32_t g = 0; g < n_groups; ++g) {
      if (e.blocks[static_cast<size_t>(g)] >= 0) continue;
      if (groups_.sliding(g)) {
        last_missing[static_cast<size_t>(g)] = static_cast<int64_t>(chain.size());
      } else {
        full = false;
      }
    }
    if (!full) break;
    chain.push_back(&e);
    keys.push_back(key);
    parent_key = key;
    parent_id = e.id;
    // A cache can go on from the end of this range if each sliding group
    // has the ranges its window reaches back to.
    const int32_t end = static_cast<int32_t>(chain.size() * bt);
    bool window_ok = true;
    for (int32_t g = 0; g < n_groups; ++g) {
      if (!groups_.sliding(g)) continue;
      window_ok &= last_missing[static_cast<size_t>(g)] < groups_.FirstRead(g, end) / block_tokens_;
    }
    if (window_ok) best = chain.size();
  }
  const int32_t end = static_cast<int32_t>(best * bt);
  for (size_t r = 0; r < best; ++r) {
    PrefixBlock link{std::vector<int32_t>(static_cast<size_t>(n_groups), -1), chain[r]->id, keys[r]};
    for (int32_t g = 0; g < n_groups; ++g) {
      if (groups_.sliding(g) && static_cast<int64_t>(r) < groups_.FirstRead(g, end) / block_tokens_) continue;
      const int32_t b = chain[r]->blocks[static_cast<size_t>(g)];
      const size_t i = static_cast<size_t>(b);
      if (refs_[i]++ == 0) cached_free_.erase(cached_free_at_[i]);
      link.blocks[static_cast<size_t>(g)] = b;
    }
    out->push_back(std::move(link));
  }
}

KvPool::PrefixBlock KvPool::RegisterPrefix(absl::Span<const int32_t> blocks, const PrefixBlock& parent,
                                           absl::Span<const int32_t> tokens) {
  absl::MutexLock lock(&mu_);
  const uint64_t key = ChainKey(parent.key, tokens);
  const size_t n_groups = static_cast<size_t>(groups_.n_groups());
  if (blocks.size() != n_groups || static_cast<size_t>(block_tokens_) != tokens.size()) return PrefixBlock{};
  for (const int32_t b : blocks) {
    if (b >= n_blocks_ || (b >= 0 && refs_[static_cast<size_t>(b)] == 0)) return PrefixBlock{};  // not held
  }
  auto [it, inserted] = entries_.try_emplace(key);
  Entry& e = it->second;
  if (!inserted && (e.parent_id != parent.entry || !std::equal(e.tokens.begin(), e.tokens.end(), tokens.begin()))) {
    // A key collision: the blocks stay unregistered; an entry id that no
    // entry has keeps the chain's later ranges from matching another's.
    return PrefixBlock{std::vector<int32_t>(blocks.begin(), blocks.end()), next_entry_id_++, key};
  }
  if (inserted) {
    e = Entry{next_entry_id_++, parent.entry, std::vector<int32_t>(tokens.begin(), tokens.end()),
              std::vector<int32_t>(n_groups, -1)};
  }
  // The entry takes the blocks it lacks (a new one all of them); a block
  // that is registered already is the entry's own (mapped from it).
  for (size_t g = 0; g < n_groups; ++g) {
    const int32_t b = blocks[g];
    if (e.blocks[g] < 0 && b >= 0 && registered_[static_cast<size_t>(b)] == 0) {
      RegisterLocked(b, key, e, static_cast<int32_t>(g));
    }
  }
  return PrefixBlock{e.blocks, e.id, key};
}

uint64_t KvPool::k_address(int32_t layer) const {
  return k_[static_cast<size_t>(groups_.slot_of[static_cast<size_t>(layer)])]->device_address();
}
uint64_t KvPool::v_address(int32_t layer) const {
  return v_.empty() ? 0 : v_[static_cast<size_t>(groups_.slot_of[static_cast<size_t>(layer)])]->device_address();
}
void* KvPool::k(int32_t layer) const { return k_[static_cast<size_t>(groups_.slot_of[static_cast<size_t>(layer)])]->data(); }
void* KvPool::v(int32_t layer) const {
  return v_.empty() ? nullptr : v_[static_cast<size_t>(groups_.slot_of[static_cast<size_t>(layer)])]->data();
}

}  // namespace decoded
