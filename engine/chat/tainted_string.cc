#include "engine/chat/tainted_string.h"

#include <algorithm>

namespace decoded::jinja {

TaintedString TaintedString::Data(std::string bytes) { return Derived(std::move(bytes), true); }

TaintedString TaintedString::Derived(std::string bytes, bool data) {
  TaintedString s(std::move(bytes));
  if (data) s.AddRange(0, s.bytes_.size());
  return s;
}

void TaintedString::AddRange(size_t begin, size_t end) {
  if (begin >= end) return;
  if (!data_.empty() && data_.back().second >= begin) {
    data_.back().second = std::max(data_.back().second, end);
    return;
  }
  data_.emplace_back(begin, end);
}

void TaintedString::Append(const TaintedString& other) {
  const size_t shift = bytes_.size();
  bytes_.append(other.bytes_);
  for (const auto& [b, e] : other.data_) AddRange(b + shift, e + shift);
}

TaintedString TaintedString::Substr(size_t begin, size_t end) const {
  end = std::min(end, bytes_.size());
  begin = std::min(begin, end);
  TaintedString out(bytes_.substr(begin, end - begin));
  // The first range ending after `begin`, then every range starting before `end`.
  auto it = std::upper_bound(data_.begin(), data_.end(), begin,
                             [](size_t pos, const std::pair<size_t, size_t>& r) { return pos < r.second; });
  for (; it != data_.end() && it->first < end; ++it) {
    const size_t lo = std::max(it->first, begin);
    const size_t hi = std::min(it->second, end);
    if (lo < hi) out.AddRange(lo - begin, hi - begin);
  }
  return out;
}

void TaintedString::MarkAllIfAny() {
  if (data_.empty()) return;
  data_.assign(1, {0, bytes_.size()});
}

}  // namespace decoded::jinja
