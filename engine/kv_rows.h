// The KV binding table of a step: which KV cache each token row reads and
// writes (DataSlot::kKvRows).
//
// A step's token rows need not share a cache: a prefill chunk's rows all
// address one session's cache, a batched decode step's rows address B
// sessions' caches (one row each). So the cache is per-row *data*, rebound
// every step like the token ids, never a pointer compiled into the plan: one
// held plan serves whichever sessions fill its rows, and a device backend can
// capture it once (the kernels read the addresses from this device-resident
// table at launch).
//
// Layout: int64 [rows, KvRowStride(n_layers)], row r =
//   [0]           capacity of row r's cache (positions)
//   [1 + 2l]      device address (DeviceBuffer::device_address(), the host pointer
//                 on CPU) of layer l's K buffer (f32 [n_kv_heads, capacity, k_dim])
//   [2 + 2l]      that of layer l's V buffer (f32 [n_kv_heads, capacity, v_dim]);
//                 0 when the layout keeps the value in the K row (KvLayout::v_in_k)
// The driver fills a row from a KvCache it has checked on the host (geometry,
// capacity, write offset: decode_driver.h); kernels only read it.
#ifndef DECODED_ENGINE_KV_ROWS_H_
#define DECODED_ENGINE_KV_ROWS_H_

#include <cstdint>

namespace decoded {

constexpr int64_t KvRowStride(int32_t n_layers) { return 1 + 2 * static_cast<int64_t>(n_layers); }

// Read side (kernels): the views of row `row`, layer `layer`.
struct KvRowView {
  float* k = nullptr;
  float* v = nullptr;  // == k when the value lives in the K row
  int32_t capacity = 0;
};

inline KvRowView ReadKvRow(const int64_t* table, int64_t stride, int64_t row, int32_t layer) {
  const int64_t* r = table + row * stride;
  KvRowView view;
  view.capacity = static_cast<int32_t>(r[0]);
  view.k = reinterpret_cast<float*>(static_cast<intptr_t>(r[1 + 2 * layer]));
  const int64_t v = r[2 + 2 * layer];
  view.v = v != 0 ? reinterpret_cast<float*>(static_cast<intptr_t>(v)) : view.k;
  return view;
}

}  // namespace decoded

#endif  // DECODED_ENGINE_KV_ROWS_H_
