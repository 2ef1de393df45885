// Which layers of a model share one KV block table.
//
// A sliding-window layer never reads a key more than its window behind the
// query (MaskPlan: a query at p sees keys p - w < j <= p), so its blocks can go
// back to the pool once they leave the window, while a full-attention layer
// keeps every block. So the layers are grouped by window, each group with a
// block table of its own, and every group holds the same number of layers:
// a block (one group's KV for block_tokens positions) then has one size in
// every group, and one pool serves them all. This is vLLM's hybrid KV cache
// manager (one page size, a block table per "KV cache group"). Gemma 3 270M
// (18 layers, every sixth global, window 512): 1 full group and 5 sliding
// groups of 3 layers; a session at 2,048 positions holds 3 x 128 + 15 x 33
// layer-blocks instead of 18 x 128.
//
// Layers of one window go to groups in layer order, layers_per_group at a
// time (the gcd of the windows' layer counts); a model without windows is
// one group of all its layers.
#ifndef DECODED_ENGINE_KV_GROUPS_H_
#define DECODED_ENGINE_KV_GROUPS_H_

#include <algorithm>
#include <cstdint>
#include <vector>

#include "absl/status/statusor.h"
#include "absl/types/span.h"

namespace decoded {

struct KvGroups {
  int32_t layers_per_group = 0;
  std::vector<int32_t> window;    // per group: 0 full attention, w > 0 a sliding window of w
  std::vector<int32_t> group_of;  // per layer
  std::vector<int32_t> slot_of;   // per layer: its place in its group, [0, layers_per_group)

  int32_t n_groups() const { return static_cast<int32_t>(window.size()); }
  int32_t n_layers() const { return static_cast<int32_t>(group_of.size()); }
  bool sliding(int32_t g) const { return window[static_cast<size_t>(g)] > 0; }
  bool any_sliding() const {
    return std::any_of(window.begin(), window.end(), [](int32_t w) { return w > 0; });
  }
  // The first position a query at `next` or later reads in group g.
  int32_t FirstRead(int32_t g, int32_t next) const {
    const int32_t w = window[static_cast<size_t>(g)];
    return w > 0 ? std::max(0, next - w + 1) : 0;
  }

  // All `n_layers` layers in one group (no windows).
  static KvGroups Single(int32_t n_layers);
  // The grouping of layers with these windows (MaskPlan's, 0 = full).
  // INVALID_ARGUMENT for an empty list or a negative window.
  static absl::StatusOr<KvGroups> ForWindows(absl::Span<const int32_t> window_per_layer);

  bool operator==(const KvGroups&) const = default;
};

}  // namespace decoded

#endif  // DECODED_ENGINE_KV_GROUPS_H_
