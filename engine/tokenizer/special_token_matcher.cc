#include "engine/tokenizer/special_token_matcher.h"

#include <algorithm>
#include <tuple>

namespace decoded {

SpecialTokenMatcher::SpecialTokenMatcher() {
  root_children_.fill(-1);
  terminal_id_.push_back(-1);  // node 0 is the root
  terminal_always_.push_back(false);
}

int32_t SpecialTokenMatcher::Child(int32_t node, uint8_t byte) const {
  if (node == 0) return root_children_[byte];
  auto it = edges_.find((static_cast<uint64_t>(node) << 8) | byte);
  return it == edges_.end() ? -1 : it->second;
}

void SpecialTokenMatcher::Add(std::string_view spelling, int32_t id, bool always) {
  if (spelling.empty()) return;
  int32_t node = 0;
  for (char c : spelling) {
    const uint8_t b = static_cast<uint8_t>(c);
    int32_t next = Child(node, b);
    if (next < 0) {
      next = static_cast<int32_t>(terminal_id_.size());
      terminal_id_.push_back(-1);
      terminal_always_.push_back(false);
      if (node == 0) {
        root_children_[b] = next;
      } else {
        edges_.emplace((static_cast<uint64_t>(node) << 8) | b, next);
      }
    }
    node = next;
  }
  // Pieces are unique in a vocabulary; keep the first registration if not.
  if (terminal_id_[node] < 0) {
    terminal_id_[node] = id;
    terminal_always_[node] = always;
  }
}

void SpecialTokenMatcher::Split(std::string_view text, bool parse_special,
                                std::vector<Fragment>& out) const {
  const Range whole[] = {{0, text.size()}};
  SplitWithin(text, parse_special ? absl::Span<const Range>(whole) : absl::Span<const Range>(), out);
}

void SpecialTokenMatcher::SplitWithin(std::string_view text, absl::Span<const Range> special_ranges,
                                      std::vector<Fragment>& out) const {
  out.clear();
  struct Candidate {
    size_t len;
    int32_t id;
    size_t pos;
  };
  std::vector<Candidate> candidates;
  size_t range = 0;  // first range that does not end at or before `pos`
  for (size_t pos = 0; pos < text.size(); ++pos) {
    while (range < special_ranges.size() && special_ranges[range].end <= pos) ++range;
    const bool in_range = range < special_ranges.size() && special_ranges[range].begin <= pos;
    int32_t node = 0;
    for (size_t j = pos; j < text.size(); ++j) {
      node = Child(node, static_cast<uint8_t>(text[j]));
      if (node < 0) break;
      const int32_t id = terminal_id_[node];
      if (id < 0) continue;
      if (terminal_always_[node] || (in_range && j < special_ranges[range].end)) {
        candidates.push_back({j + 1 - pos, id, pos});
      }
    }
  }
  if (candidates.empty()) {
    if (!text.empty()) out.push_back({-1, 0, text.size()});
    return;
  }
  std::sort(candidates.begin(), candidates.end(), [](const Candidate& a, const Candidate& b) {
    return std::tie(b.len, a.id, a.pos) < std::tie(a.len, b.id, b.pos);
  });
  std::vector<bool> claimed(text.size(), false);
  std::vector<Fragment> tokens;
  for (const Candidate& c : candidates) {
    bool free = true;
    for (size_t k = c.pos; k < c.pos + c.len; ++k) {
      if (claimed[k]) {
        free = false;
        break;
      }
    }
    if (!free) continue;
    std::fill(claimed.begin() + c.pos, claimed.begin() + c.pos + c.len, true);
    tokens.push_back({c.id, c.pos, c.pos + c.len});
  }
  std::sort(tokens.begin(), tokens.end(),
            [](const Fragment& a, const Fragment& b) { return a.begin < b.begin; });
  size_t cursor = 0;
  for (const Fragment& t : tokens) {
    if (t.begin > cursor) out.push_back({-1, cursor, t.begin});
    out.push_back(t);
    cursor = t.end;
  }
  if (cursor < text.size()) out.push_back({-1, cursor, text.size()});
}

}  // namespace decoded
