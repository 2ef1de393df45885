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
// Every cache is paged: its positions live in fixed-size blocks of a pool
// (engine/kv_pool.h), named by the cache's block tables, one per layer group
// (engine/kv_groups.h: layers of one attention window). A contiguous cache
// (KvCache::Create) is the one-block, one-group case: a block of `capacity`
// positions.
//
// Layout: int64 [rows, KvRowStride(n_layers)], row r =
//   [0]       capacity: positions row r's cache addresses
//   [1]       block_tokens: positions per block (== capacity for a contiguous cache)
//   [2]       the cache's element type: a DType id (f32, f16 or q8_0; engine/kv_layout.h)
//   [3]       0 (reserved)
//   then per layer l, at KvRowLayerEntry(l):
//   [+0]      device address of the block table of l's group: i32
//             [ceil(capacity / block_tokens)], entry i = the pool block holding
//             positions [i * block_tokens, (i + 1) * block_tokens), -1 while
//             unmapped (and for a sliding group's blocks that left its window)
//   [+1]      device address (DeviceBuffer::device_address(), the host pointer
//             on CPU) of layer l's K pool, [n_blocks, n_kv_heads, block_tokens]
//             rows of KvRowBytes(type, k_dim) bytes
//   [+2]      that of layer l's V pool, rows of KvRowBytes(type, v_dim) bytes;
//             0 when the layout keeps the value in the K row (KvLayout::v_in_k)
// So position p of kv head h in layer l is row ((table_l[p / bt] * n_kv_heads +
// h) * bt + p % bt) of its pool: vLLM's block layout (Kwon et al. 2023,
// "Efficient Memory Management for Large Language Model Serving with
// PagedAttention"), with the head outside the block's tokens so one head's
// keys of a block are contiguous. (The CPU backend stores f32 and f16 keys of
// blocks of whole multiples of 16 positions transposed in 16-position panels
// within those same bytes: engine/cpu/key_panels.h.)
// The driver fills a row from a KvCache it has checked on the host (geometry,
// mapped blocks, write offset: decode_driver.h); kernels only read it, and a
// KV write into an unmapped block is a fault, never a write.
#ifndef DECODED_ENGINE_KV_ROWS_H_
#define DECODED_ENGINE_KV_ROWS_H_

#include <cstdint>

#include "engine/dtype.h"

namespace decoded {

constexpr int64_t KvRowStride(int32_t n_layers) { return 4 + 3 * static_cast<int64_t>(n_layers); }
// Where layer `layer`'s three entries start in a row.
constexpr int64_t KvRowLayerEntry(int32_t layer) { return 4 + 3 * static_cast<int64_t>(layer); }

// Read side (kernels): the views of row `row`, layer `layer`.
struct KvRowView {
  uint8_t* k = nullptr;  // layer's K pool
  uint8_t* v = nullptr;  // layer's V pool; == k when the value lives in the K row
  const int32_t* blocks = nullptr;  // the block table of the layer's group
  int32_t capacity = 0;
  int32_t block_tokens = 0;
  DType type = DType::kF32;

  // The block holding position `pos` (< capacity): -1 while unmapped.
  int32_t block_of(int32_t pos) const { return blocks[pos / block_tokens]; }
  // Byte offset into a pool of `row_bytes` per row of the first position of
  // `block`, kv head `head`: the block's positions follow it contiguously.
  int64_t block_base(int32_t block, int32_t head, int32_t n_kv_heads, int64_t row_bytes) const {
    return (static_cast<int64_t>(block) * n_kv_heads + head) * block_tokens * row_bytes;
  }
};

inline KvRowView ReadKvRow(const int64_t* table, int64_t stride, int64_t row, int32_t layer) {
  const int64_t* r = table + row * stride;
  const int64_t* l = r + KvRowLayerEntry(layer);
  KvRowView view;
  view.capacity = static_cast<int32_t>(r[0]);
  view.block_tokens = static_cast<int32_t>(r[1]);
  view.type = static_cast<DType>(r[2]);
  view.blocks = reinterpret_cast<const int32_t*>(static_cast<intptr_t>(l[0]));
  view.k = reinterpret_cast<uint8_t*>(static_cast<intptr_t>(l[1]));
  const int64_t v = l[2];
  view.v = v != 0 ? reinterpret_cast<uint8_t*>(static_cast<intptr_t>(v)) : view.k;
  return view;
}

}  // namespace decoded

#endif  // DECODED_ENGINE_KV_ROWS_H_
