#include "engine/kv_cache.h"

#include <atomic>

#include "absl/strings/str_cat.h"
#include "engine/engine_counters.h"

namespace decoded {
namespace {
std::atomic<uint64_t> g_next_allocation_id{1};
}  // namespace

absl::StatusOr<std::unique_ptr<KvCache>> KvCache::Create(Backend& backend, int32_t n_layers,
                                                         const KvLayout& layout, int32_t capacity) {
  const bool v_slot = !layout.v_in_k;
  if (n_layers <= 0 || layout.n_kv_heads <= 0 || layout.k_dim <= 0 || layout.v_dim <= 0 || capacity <= 0 ||
      (!v_slot && layout.v_dim > layout.k_dim)) {
    return absl::InvalidArgumentError(absl::StrCat("KV cache geometry must be positive: layers=", n_layers,
                                                   " kv_heads=", layout.n_kv_heads, " k_dim=", layout.k_dim,
                                                   " v_dim=", layout.v_dim, layout.v_in_k ? " (inside K)" : "",
                                                   " capacity=", capacity));
  }
  // The geometry may come from a model file: size the cache with overflow
  // checks before allocating anything. k_per / v_per = bytes of K / V of one
  // layer.
  bool overflow = false;
  auto slot_bytes = [&](int32_t dim) {
    int64_t per = static_cast<int64_t>(sizeof(float));
    for (const int64_t f : {int64_t{layout.n_kv_heads}, int64_t{capacity}, int64_t{dim}}) {
      overflow |= __builtin_mul_overflow(per, f, &per);
    }
    return per;
  };
  const int64_t k_per = slot_bytes(layout.k_dim);
  const int64_t v_per = v_slot ? slot_bytes(layout.v_dim) : 0;
  int64_t per_layer = 0, total = 0;
  overflow |= __builtin_add_overflow(k_per, v_per, &per_layer);
  overflow |= __builtin_mul_overflow(per_layer, int64_t{n_layers}, &total);
  if (overflow) {
    return absl::ResourceExhaustedError(absl::StrCat("KV cache of layers=", n_layers, " kv_heads=", layout.n_kv_heads,
                                                     " k_dim=", layout.k_dim, " v_dim=", layout.v_dim,
                                                     " capacity=", capacity, " would exceed 2^63 bytes"));
  }
  std::unique_ptr<KvCache> kv(new KvCache());
  kv->n_layers_ = n_layers;
  kv->layout_ = layout;
  kv->capacity_ = capacity;
  kv->allocation_id_ = g_next_allocation_id.fetch_add(1);
  kv->versions_.assign(static_cast<size_t>(n_layers), 0);
  // Buffers not yet counted in the engine counters: on failure the
  // destructor must not subtract them.
  auto fail = [&kv](const absl::Status& s) {
    kv->k_.clear();
    kv->v_.clear();
    return s;
  };
  for (int32_t l = 0; l < n_layers; ++l) {
    auto k = backend.Allocate(static_cast<size_t>(k_per), BufferAccess::kDeviceOnly);
    if (!k.ok()) return fail(k.status());
    kv->k_.push_back(*std::move(k));
    if (v_slot) {
      auto v = backend.Allocate(static_cast<size_t>(v_per), BufferAccess::kDeviceOnly);
      if (!v.ok()) return fail(v.status());
      kv->v_.push_back(*std::move(v));
    }
  }
  counters::AddKvBytes(kv->bytes());
  return kv;
}

KvCache::~KvCache() {
  if (!k_.empty()) counters::AddKvBytes(-bytes());
}

int64_t KvCache::bytes() const {
  return static_cast<int64_t>(n_layers_) * capacity_ * layout_.floats_per_token() *
         static_cast<int64_t>(sizeof(float));
}

float* KvCache::k(int32_t layer) { return static_cast<float*>(k_[static_cast<size_t>(layer)]->data()); }
float* KvCache::v(int32_t layer) {
  return v_.empty() ? nullptr : static_cast<float*>(v_[static_cast<size_t>(layer)]->data());
}

void KvCache::FillKvRow(int64_t* row) {
  row[0] = capacity_;
  for (int32_t l = 0; l < n_layers_; ++l) {
    row[1 + 2 * l] = static_cast<int64_t>(k_[static_cast<size_t>(l)]->device_address());
    row[2 + 2 * l] = v_.empty() ? 0 : static_cast<int64_t>(v_[static_cast<size_t>(l)]->device_address());
  }
}

absl::Status KvCache::CheckWrite(int32_t n_tokens) const {
  if (n_tokens < 0 || static_cast<int64_t>(cached_len_) + n_tokens > capacity_) {
    return absl::ResourceExhaustedError(absl::StrCat("KV cache full: ", cached_len_, " cached + ", n_tokens,
                                                     " new tokens exceed the capacity of ", capacity_));
  }
  return absl::OkStatus();
}

void KvCache::Commit(int32_t n_tokens) {
  cached_len_ += n_tokens;
  for (auto& v : versions_) ++v;
}

void KvCache::Truncate(int32_t len) {
  if (len >= 0 && len < cached_len_) cached_len_ = len;
}

}  // namespace decoded
