// How the CPU backend lays out keys inside a KV block: in panels of 16
// positions, so the attention kernel's q.k takes 16 keys per vector with no
// reduction across lanes (engine/cpu/attention_isa.cc).
//
// A kv head's keys in a block are, in engine/kv_rows.h's row layout, rows of
// k_dim elements one position after another. Where KeysInPanels holds, each
// run of 16 positions (p / 16 within the block) occupies the same bytes as
// its 16 rows would, transposed: [k_dim][16], element d of position p at
// element (p / 16 * k_dim + slot(d)) * 16 + p % 16 from the head's block
// base, slot(d) = d within its 16 elements of width permuted (PanelSlot).
// It holds for f32 and f16 keys of a cache with a V pool, blocks of a
// multiple of 16 positions and rows of a multiple of 16 elements; q8_0
// (32-element blocks along a row), the value-in-key row of multi-head latent
// attention (KvLayout::v_in_k, whose value is read as a row) and other
// geometries keep rows. Values always keep rows.
//
// Only the CPU backend's KV write and attention read these pools' keys
// (both decide by this predicate, from the cache's own binding row); the
// Vulkan backend's pools keep rows.
#ifndef DECODED_ENGINE_CPU_KEY_PANELS_H_
#define DECODED_ENGINE_CPU_KEY_PANELS_H_

#include <cstdint>

#include "engine/dtype.h"

namespace decoded::cpu {

inline constexpr int32_t kPanelPositions = 16;

// `has_v_pool`: the cache has a V slot (false for KvLayout::v_in_k).
inline bool KeysInPanels(DType type, bool has_v_pool, int32_t block_tokens, int32_t k_dim) {
  return (type == DType::kF32 || type == DType::kF16) && has_v_pool && block_tokens % kPanelPositions == 0 &&
         k_dim % kPanelPositions == 0;
}

// Within each 16 elements of width, element j sits in slot j % 4 * 4 + j / 4,
// so the four that the kernel sums together first (j = l, l + 4, l + 8,
// l + 12: its reduction's first two levels) are adjacent.
inline int32_t PanelSlot(int32_t j) { return j % 4 * 4 + j / 4; }

// Element offset of element d of the key at `in_block` (the position's index
// in its block) from its kv head's block base, for a cache whose keys are in
// panels.
inline int64_t PanelElement(int32_t in_block, int32_t k_dim, int32_t d) {
  return (static_cast<int64_t>(in_block / kPanelPositions) * k_dim + d / 16 * 16 + PanelSlot(d % 16)) *
             kPanelPositions +
         in_block % kPanelPositions;
}

}  // namespace decoded::cpu

#endif  // DECODED_ENGINE_CPU_KEY_PANELS_H_
