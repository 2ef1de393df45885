#include "engine/kv_groups.h"

#include <map>
#include <numeric>

#include "absl/strings/str_cat.h"

namespace decoded {

KvGroups KvGroups::Single(int32_t n_layers) {
  KvGroups g;
  g.layers_per_group = n_layers;
  g.window = {0};
  g.group_of.assign(static_cast<size_t>(n_layers), 0);
  g.slot_of.resize(static_cast<size_t>(n_layers));
  std::iota(g.slot_of.begin(), g.slot_of.end(), 0);
  return g;
}

absl::StatusOr<KvGroups> KvGroups::ForWindows(absl::Span<const int32_t> window_per_layer) {
  if (window_per_layer.empty()) return absl::InvalidArgumentError("KV groups need at least one layer");
  std::map<int32_t, std::vector<int32_t>> layers_of;  // window -> its layers, in order
  for (size_t l = 0; l < window_per_layer.size(); ++l) {
    const int32_t w = window_per_layer[l];
    if (w < 0) return absl::InvalidArgumentError(absl::StrCat("layer ", l, " has a negative window ", w));
    layers_of[w].push_back(static_cast<int32_t>(l));
  }
  int32_t per = 0;
  for (const auto& [w, layers] : layers_of) per = std::gcd(per, static_cast<int32_t>(layers.size()));
  KvGroups g;
  g.layers_per_group = per;
  g.group_of.resize(window_per_layer.size());
  g.slot_of.resize(window_per_layer.size());
  // Groups numbered by their first layer.
  std::vector<std::pair<int32_t, std::vector<int32_t>>> groups;  // (window, layers)
  for (const auto& [w, layers] : layers_of) {
    for (size_t i = 0; i < layers.size(); i += static_cast<size_t>(per)) {
      groups.emplace_back(w, std::vector<int32_t>(layers.begin() + static_cast<ptrdiff_t>(i),
                                                  layers.begin() + static_cast<ptrdiff_t>(i) + per));
    }
  }
  std::sort(groups.begin(), groups.end(), [](const auto& a, const auto& b) { return a.second[0] < b.second[0]; });
  for (size_t gi = 0; gi < groups.size(); ++gi) {
    g.window.push_back(groups[gi].first);
    for (int32_t s = 0; s < per; ++s) {
      const size_t l = static_cast<size_t>(groups[gi].second[static_cast<size_t>(s)]);
      g.group_of[l] = static_cast<int32_t>(gi);
      g.slot_of[l] = s;
    }
  }
  return g;
}

}  // namespace decoded
