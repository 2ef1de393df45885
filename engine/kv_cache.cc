#include "engine/kv_cache.h"

#include <algorithm>
#include <atomic>

#include "absl/strings/str_cat.h"
#include "engine/engine_counters.h"

namespace decoded {
namespace {
std::atomic<uint64_t> g_next_allocation_id{1};
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
  const int32_t bt = pool->block_tokens();
  const int32_t entries = capacity / bt + (capacity % bt != 0 ? 1 : 0);
  auto buf = pool->backend().Allocate(static_cast<size_t>(entries) * sizeof(int32_t), BufferAccess::kHost);
  if (!buf.ok()) return buf.status();
  std::unique_ptr<KvCache> kv(new KvCache());
  kv->pool_ = std::move(pool);
  kv->paged_ = true;
  kv->capacity_ = capacity;
  kv->allocation_id_ = g_next_allocation_id.fetch_add(1);
  kv->table_.assign(static_cast<size_t>(entries), -1);
  kv->table_buf_ = *std::move(buf);
  kv->UploadTable(0, entries);
  return kv;
}

KvCache::~KvCache() {
  if (blocks_.empty()) return;
  counters::AddKvBytes(-bytes());
  pool_->Give(blocks_);
}

int32_t KvCache::mapped_len() const {
  return static_cast<int32_t>(std::min<int64_t>(capacity_, int64_t{held_blocks()} * block_tokens()));
}

void KvCache::FillKvRow(int64_t* row) const {
  row[0] = capacity_;
  row[1] = block_tokens();
  row[2] = static_cast<int64_t>(layout().type);
  row[3] = static_cast<int64_t>(table_buf_->device_address());
  for (int32_t l = 0; l < n_layers(); ++l) {
    row[4 + 2 * l] = static_cast<int64_t>(pool_->k_address(l));
    row[5 + 2 * l] = static_cast<int64_t>(pool_->v_address(l));
  }
}

void KvCache::UploadTable(int32_t begin, int32_t end) {
  if (begin >= end) return;
  pool_->backend().Upload(*table_buf_, table_.data() + begin, static_cast<size_t>(end - begin) * sizeof(int32_t),
                          static_cast<size_t>(begin) * sizeof(int32_t));
}

absl::Status KvCache::Reserve(int32_t n_tokens) {
  if (n_tokens < 0 || static_cast<int64_t>(cached_len_) + n_tokens > capacity_) {
    return CheckWrite(n_tokens);
  }
  const int32_t bt = block_tokens();
  const int32_t end = cached_len_ + n_tokens;
  const int32_t need = end / bt + (end % bt != 0 ? 1 : 0) - held_blocks();
  if (need <= 0) return absl::OkStatus();
  const size_t first = blocks_.size();
  if (auto s = pool_->Take(need, &blocks_); !s.ok()) {
    return absl::ResourceExhaustedError(absl::StrCat("KV cache of ", cached_len_, " tokens cannot grow by ",
                                                     n_tokens, ": ", s.message()));
  }
  std::copy(blocks_.begin() + static_cast<ptrdiff_t>(first), blocks_.end(),
            table_.begin() + static_cast<ptrdiff_t>(first));
  UploadTable(static_cast<int32_t>(first), held_blocks());
  counters::AddKvBytes(int64_t{need} * pool_->block_bytes());
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
  const int64_t len = static_cast<int64_t>(blocks.size()) * block_tokens();
  if (!paged_ || cached_len_ != 0 || !blocks_.empty() || len > capacity_) {
    return absl::FailedPreconditionError(absl::StrCat("cannot map ", blocks.size(), " cached blocks into a KV cache ",
                                                      "of ", cached_len_, " tokens and ", held_blocks(), " blocks"));
  }
  blocks_.assign(blocks.begin(), blocks.end());
  std::copy(blocks_.begin(), blocks_.end(), table_.begin());
  UploadTable(0, held_blocks());
  counters::AddKvBytes(held_blocks() * pool_->block_bytes());
  cached_len_ = static_cast<int32_t>(len);
  return absl::OkStatus();
}

void KvCache::Truncate(int32_t len) {
  if (len < 0 || len > cached_len_) return;
  cached_len_ = len;
  if (!paged_) return;
  const int32_t bt = block_tokens();
  const size_t keep = static_cast<size_t>(len / bt + (len % bt != 0 ? 1 : 0));
  if (keep >= blocks_.size()) return;
  const int32_t dropped = static_cast<int32_t>(blocks_.size() - keep);
  pool_->Give(absl::MakeConstSpan(blocks_).subspan(keep));
  counters::AddKvBytes(-int64_t{dropped} * pool_->block_bytes());
  blocks_.resize(keep);
  std::fill(table_.begin() + static_cast<ptrdiff_t>(keep), table_.begin() + static_cast<ptrdiff_t>(keep + dropped), -1);
  UploadTable(static_cast<int32_t>(keep), static_cast<int32_t>(keep) + dropped);
}

}  // namespace decoded
