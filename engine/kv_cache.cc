#include "engine/kv_cache.h"

#include <algorithm>
#include <atomic>

#include "absl/strings/str_cat.h"
#include "engine/engine_counters.h"
#include "engine/kv_rows.h"

namespace decoded {
namespace {
std::atomic<uint64_t> g_next_allocation_id{1};

int32_t Ranges(int32_t len, int32_t bt) { return len / bt + (len % bt != 0 ? 1 : 0); }
}  // namespace

absl::StatusOr<std::unique_ptr<KvCache>> KvCache::Create(Backend& backend, int32_t n_layers,
                                                         const KvLayout& layout, int32_t capacity) {
  if (capacity <= 0) {
    return absl::InvalidArgumentError(absl::StrCat("KV cache geometry must be positive: capacity=", capacity));
  }
  auto pool = KvPool::Create(backend, n_layers, layout, /*block_tokens=*/capacity, /*n_blocks=*/1);
  if (!pool.ok()) return pool.status();
  auto kv = CreatePaged(*std::move(pool), capacity);
  if (!kv.ok()) return kv.status();
  (*kv)->paged_ = false;
  // Cannot fail: one block of `capacity` positions in a pool of one.
  if (auto s = (*kv)->Reserve(capacity); !s.ok()) return s;
  return kv;
}

absl::StatusOr<std::unique_ptr<KvCache>> KvCache::CreatePaged(std::shared_ptr<KvPool> pool, int32_t capacity) {
  if (pool == nullptr || capacity <= 0) {
    return absl::InvalidArgumentError(absl::StrCat("a paged KV cache needs a pool and a capacity >= 1, got ",
                                                   capacity));
  }
  const int32_t entries = Ranges(capacity, pool->block_tokens());
  const int32_t n_groups = pool->groups().n_groups();
  std::unique_ptr<KvCache> kv(new KvCache());
  for (int32_t g = 0; g < n_groups; ++g) {
    auto buf = pool->backend().Allocate(static_cast<size_t>(entries) * sizeof(int32_t), BufferAccess::kHost);
    if (!buf.ok()) return buf.status();
    kv->table_buf_.push_back(*std::move(buf));
  }
  kv->pool_ = std::move(pool);
  kv->paged_ = true;
  kv->capacity_ = capacity;
  kv->allocation_id_ = g_next_allocation_id.fetch_add(1);
  kv->released_.assign(static_cast<size_t>(n_groups), 0);
  kv->table_.assign(static_cast<size_t>(n_groups), std::vector<int32_t>(static_cast<size_t>(entries), -1));
  for (int32_t g = 0; g < n_groups; ++g) kv->UploadTable(g, 0, entries);
  return kv;
}

KvCache::~KvCache() {
  if (held_ == 0) return;
  counters::AddKvBytes(-bytes());
  std::vector<int32_t> held;
  for (const std::vector<int32_t>& t : table_) {
    for (const int32_t b : t) {
      if (b >= 0) held.push_back(b);
    }
  }
  pool_->Give(held);
}

int32_t KvCache::mapped_len() const {
  return static_cast<int32_t>(std::min<int64_t>(capacity_, int64_t{mapped_} * block_tokens()));
}

int32_t KvCache::block(int32_t group, int32_t i) const {
  if (!paged_ || group < 0 || group >= n_groups() || i < 0 || i >= mapped_) return -1;
  return table_[static_cast<size_t>(group)][static_cast<size_t>(i)];
}

int32_t KvCache::held_block(int32_t i) const {
  for (int32_t g = 0; g < n_groups(); ++g) {
    const int32_t n = mapped_ - released_[static_cast<size_t>(g)];
    if (i < n) return table_[static_cast<size_t>(g)][static_cast<size_t>(released_[static_cast<size_t>(g)] + i)];
    i -= n;
  }
  return -1;
}

void KvCache::FillKvRow(int64_t* row) const {
  row[0] = capacity_;
  row[1] = block_tokens();
  row[2] = static_cast<int64_t>(layout().type);
  row[3] = 0;
  const KvGroups& groups = pool_->groups();
  for (int32_t l = 0; l < n_layers(); ++l) {
    int64_t* layer = row + KvRowLayerEntry(l);
    layer[0] = static_cast<int64_t>(table_buf_[static_cast<size_t>(groups.group_of[static_cast<size_t>(l)])]
                                        ->device_address());
    layer[1] = static_cast<int64_t>(pool_->k_address(l));
    layer[2] = static_cast<int64_t>(pool_->v_address(l));
  }
}

void KvCache::UploadTable(int32_t g, int32_t begin, int32_t end) {
  if (begin >= end) return;
  const std::vector<int32_t>& t = table_[static_cast<size_t>(g)];
  pool_->backend().Upload(*table_buf_[static_cast<size_t>(g)], t.data() + begin,
                          static_cast<size_t>(end - begin) * sizeof(int32_t), static_cast<size_t>(begin) * sizeof(int32_t));
}

int32_t KvCache::OutOfWindow(int32_t next) const {
  if (!paged_) return 0;
  const KvGroups& groups = pool_->groups();
  int32_t n = 0;
  for (int32_t g = 0; g < n_groups(); ++g) {
    if (!groups.sliding(g)) continue;
    const int32_t keep_from = std::min(mapped_, groups.FirstRead(g, next) / block_tokens());
    n += std::max(0, keep_from - released_[static_cast<size_t>(g)]);
  }
  return n;
}

void KvCache::ReleaseOutOfWindow(int32_t next) {
  if (!paged_) return;
  const KvGroups& groups = pool_->groups();
  std::vector<int32_t> freed;
  for (int32_t g = 0; g < n_groups(); ++g) {
    if (!groups.sliding(g)) continue;
    const int32_t keep_from = std::min(mapped_, groups.FirstRead(g, next) / block_tokens());
    int32_t& released = released_[static_cast<size_t>(g)];
    if (keep_from <= released) continue;
    std::vector<int32_t>& t = table_[static_cast<size_t>(g)];
    for (int32_t i = released; i < keep_from; ++i) {
      if (t[static_cast<size_t>(i)] >= 0) freed.push_back(t[static_cast<size_t>(i)]);
      t[static_cast<size_t>(i)] = -1;
    }
    UploadTable(g, released, keep_from);
    released = keep_from;
  }
  if (freed.empty()) return;
  pool_->Give(freed);
  held_ -= static_cast<int32_t>(freed.size());
  counters::AddKvBytes(-static_cast<int64_t>(freed.size()) * pool_->block_bytes());
}

int32_t KvCache::BlocksToReserve(int32_t n_tokens) const {
  if (n_tokens < 0 || static_cast<int64_t>(cached_len_) + n_tokens > capacity_) return 0;
  const int32_t ranges = Ranges(cached_len_ + n_tokens, block_tokens()) - mapped_;
  return std::max(0, std::max(0, ranges) * n_groups() - OutOfWindow(cached_len_));
}

absl::Status KvCache::Reserve(int32_t n_tokens) {
  if (n_tokens < 0 || static_cast<int64_t>(cached_len_) + n_tokens > capacity_) {
    return CheckWrite(n_tokens);
  }
  ReleaseOutOfWindow(cached_len_);
  const int32_t ranges = Ranges(cached_len_ + n_tokens, block_tokens()) - mapped_;
  if (ranges <= 0) return absl::OkStatus();
  const int32_t groups = n_groups();
  std::vector<int32_t> taken;
  if (auto s = pool_->Take(ranges * groups, &taken); !s.ok()) {
    return absl::ResourceExhaustedError(absl::StrCat("KV cache of ", cached_len_, " tokens cannot grow by ",
                                                     n_tokens, ": ", s.message()));
  }
  for (int32_t g = 0; g < groups; ++g) {
    std::copy(taken.begin() + g * ranges, taken.begin() + (g + 1) * ranges,
              table_[static_cast<size_t>(g)].begin() + mapped_);
    UploadTable(g, mapped_, mapped_ + ranges);
  }
  mapped_ += ranges;
  held_ += ranges * groups;
  counters::AddKvBytes(int64_t{ranges} * groups * pool_->block_bytes());
  return absl::OkStatus();
}

absl::Status KvCache::CheckWrite(int32_t n_tokens) const {
  if (n_tokens < 0 || static_cast<int64_t>(cached_len_) + n_tokens > capacity_) {
    return absl::ResourceExhaustedError(absl::StrCat("KV cache full: ", cached_len_, " cached + ", n_tokens,
                                                     " new tokens exceed the capacity of ", capacity_));
  }
  if (cached_len_ + n_tokens > mapped_len()) {
    return absl::ResourceExhaustedError(absl::StrCat("KV cache of ", cached_len_, " tokens has ", mapped_len(),
                                                     " positions in blocks; ", n_tokens,
                                                     " more need Reserve first"));
  }
  return absl::OkStatus();
}

absl::Status KvCache::Adopt(absl::Span<const int32_t> blocks) {
  const int32_t groups = n_groups();
  const size_t n = blocks.size() / static_cast<size_t>(groups);
  const int64_t len = static_cast<int64_t>(n) * block_tokens();
  bool ok = paged_ && cached_len_ == 0 && held_ == 0 && blocks.size() % static_cast<size_t>(groups) == 0 &&
            len <= capacity_;
  // A query at `len` reads every full group's range and a sliding group's
  // from its window's start.
  std::vector<int32_t> first(static_cast<size_t>(groups), 0);
  for (int32_t g = 0; ok && g < groups; ++g) {
    const KvGroups& kg = pool_->groups();
    // The first range with a block: all from it on must have one.
    int32_t f = static_cast<int32_t>(n);
    for (size_t r = 0; r < n; ++r) {
      if (blocks[r * static_cast<size_t>(groups) + static_cast<size_t>(g)] >= 0) {
        f = static_cast<int32_t>(r);
        break;
      }
    }
    for (size_t r = static_cast<size_t>(f); r < n; ++r) {
      ok &= blocks[r * static_cast<size_t>(groups) + static_cast<size_t>(g)] >= 0;
    }
    ok &= f <= kg.FirstRead(g, static_cast<int32_t>(len)) / block_tokens();
    first[static_cast<size_t>(g)] = f;
  }
  if (!ok) {
    return absl::FailedPreconditionError(absl::StrCat("cannot map ", n, " cached block ranges into a KV cache ",
                                                      "of ", cached_len_, " tokens and ", held_, " blocks"));
  }
  int32_t held = 0;
  for (int32_t g = 0; g < groups; ++g) {
    std::vector<int32_t>& t = table_[static_cast<size_t>(g)];
    for (size_t r = 0; r < n; ++r) {
      t[r] = blocks[r * static_cast<size_t>(groups) + static_cast<size_t>(g)];
      held += t[r] >= 0 ? 1 : 0;
    }
    released_[static_cast<size_t>(g)] = first[static_cast<size_t>(g)];
    UploadTable(g, 0, static_cast<int32_t>(n));
  }
  mapped_ = static_cast<int32_t>(n);
  held_ = held;
  counters::AddKvBytes(int64_t{held} * pool_->block_bytes());
  cached_len_ = static_cast<int32_t>(len);
  return absl::OkStatus();
}

int32_t KvCache::TruncatableTo(int32_t len) const {
  if (!paged_ || len <= 0) return std::max(0, len);
  const KvGroups& groups = pool_->groups();
  for (int32_t g = 0; g < n_groups(); ++g) {
    if (groups.sliding(g) && groups.FirstRead(g, len) / block_tokens() < released_[static_cast<size_t>(g)]) return 0;
  }
  return len;
}

void KvCache::Truncate(int32_t len) {
  if (len < 0 || len > cached_len_ || TruncatableTo(len) != len) return;
  cached_len_ = len;
  if (!paged_) return;
  const int32_t keep = Ranges(len, block_tokens());
  if (keep >= mapped_) return;
  std::vector<int32_t> dropped;
  for (int32_t g = 0; g < n_groups(); ++g) {
    std::vector<int32_t>& t = table_[static_cast<size_t>(g)];
    for (int32_t i = keep; i < mapped_; ++i) {
      if (t[static_cast<size_t>(i)] >= 0) dropped.push_back(t[static_cast<size_t>(i)]);
      t[static_cast<size_t>(i)] = -1;
    }
    UploadTable(g, keep, mapped_);
    int32_t& released = released_[static_cast<size_t>(g)];
    released = std::min(released, keep);
  }
  mapped_ = keep;
  pool_->Give(dropped);
  held_ -= static_cast<int32_t>(dropped.size());
  counters::AddKvBytes(-static_cast<int64_t>(dropped.size()) * pool_->block_bytes());
}

}  // namespace decoded
