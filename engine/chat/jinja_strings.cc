#include "engine/chat/jinja_strings.h"

#include <algorithm>

#include "engine/chat/jinja_unicode.h"

namespace decoded::jinja {
namespace {

bool IsLineBreak(char32_t c) {
  switch (c) {
    case '\n':
    case '\r':
    case 0x0B:
    case 0x0C:
    case 0x1C:
    case 0x1D:
    case 0x1E:
    case 0x85:
    case 0x2028:
    case 0x2029:
      return true;
    default:
      return false;
  }
}

}  // namespace

TaintedString PyStrip(const TaintedString& s, const std::optional<std::string>& chars, StripSide side) {
  std::vector<char32_t> set;
  if (chars) {
    size_t p = 0;
    while (p < chars->size()) set.push_back(DecodeUtf8At(*chars, &p));
  }
  auto strip = [&](char32_t c) {
    return chars ? std::find(set.begin(), set.end(), c) != set.end() : IsSpace(c);
  };
  const std::string& bytes = s.bytes();
  size_t lo = 0;
  size_t hi = bytes.size();
  if (side != StripSide::kRight) {
    while (lo < hi) {
      size_t next = lo;
      if (!strip(DecodeUtf8At(bytes, &next))) break;
      lo = next;
    }
  }
  if (side != StripSide::kLeft) {
    while (hi > lo) {
      size_t prev = hi;
      if (!strip(DecodeUtf8Before(bytes, &prev))) break;
      hi = prev;
    }
  }
  return s.Substr(lo, hi);
}

std::vector<TaintedString> PySplit(const TaintedString& s, const std::optional<std::string>& sep, int64_t maxsplit,
                                   bool from_right) {
  std::vector<TaintedString> out;
  const std::string& bytes = s.bytes();
  int64_t budget = maxsplit < 0 ? INT64_MAX : maxsplit;
  if (sep) {
    const std::string& p = *sep;
    if (!from_right) {
      size_t start = 0;
      while (budget-- > 0) {
        const size_t hit = bytes.find(p, start);
        if (hit == std::string::npos) break;
        out.push_back(s.Substr(start, hit));
        start = hit + p.size();
      }
      out.push_back(s.Substr(start, bytes.size()));
    } else {
      size_t end = bytes.size();
      while (budget-- > 0 && end >= p.size()) {
        const size_t hit = bytes.rfind(p, end - p.size());
        if (hit == std::string::npos) break;
        out.push_back(s.Substr(hit + p.size(), end));
        end = hit;
      }
      out.push_back(s.Substr(0, end));
      std::reverse(out.begin(), out.end());
    }
    return out;
  }
  // Whitespace runs separate the pieces; Python's algorithm, walking code points (forward, or backward for rsplit).
  const size_t n = bytes.size();
  auto space_at = [&](size_t pos, size_t* next) {
    *next = pos;
    return IsSpace(DecodeUtf8At(bytes, next));
  };
  auto space_before = [&](size_t pos, size_t* prev) {
    *prev = pos;
    return IsSpace(DecodeUtf8Before(bytes, prev));
  };
  size_t next = 0;
  if (!from_right) {
    size_t i = 0;
    while (budget-- > 0) {
      while (i < n && space_at(i, &next)) i = next;
      if (i == n) break;
      const size_t j = i;
      while (i < n && !space_at(i, &next)) i = next;
      out.push_back(s.Substr(j, i));
    }
    if (i < n) {
      while (i < n && space_at(i, &next)) i = next;
      if (i != n) out.push_back(s.Substr(i, n));
    }
  } else {
    size_t i = n;  // the end of the unprocessed prefix
    while (budget-- > 0) {
      while (i > 0 && space_before(i, &next)) i = next;
      if (i == 0) break;
      const size_t j = i;
      while (i > 0 && !space_before(i, &next)) i = next;
      out.push_back(s.Substr(i, j));
    }
    if (i > 0) {
      while (i > 0 && space_before(i, &next)) i = next;
      if (i > 0) out.push_back(s.Substr(0, i));
    }
    std::reverse(out.begin(), out.end());
  }
  return out;
}

std::vector<TaintedString> PySplitLines(const TaintedString& s, bool keepends) {
  std::vector<TaintedString> out;
  const std::string& bytes = s.bytes();
  size_t i = 0;
  while (i < bytes.size()) {
    const size_t start = i;
    size_t eol = i;
    size_t next = i;
    while (i < bytes.size()) {
      next = i;
      const char32_t c = DecodeUtf8At(bytes, &next);
      if (IsLineBreak(c)) {
        eol = i;
        i = c == '\r' && next < bytes.size() && bytes[next] == '\n' ? next + 1 : next;
        if (keepends) eol = i;
        break;
      }
      i = next;
      eol = i;
    }
    out.push_back(s.Substr(start, eol));
  }
  return out;
}

TaintedString PyReplace(const TaintedString& s, const TaintedString& old_part, const TaintedString& new_part,
                        int64_t count) {
  const bool data = s.has_data() || old_part.has_data() || new_part.has_data();
  const std::string& bytes = s.bytes();
  const std::string& old_b = old_part.bytes();
  const std::string& new_b = new_part.bytes();
  int64_t budget = count < 0 ? INT64_MAX : count;
  std::string out;
  if (old_b.empty()) {
    // Python inserts `new` before every character and at the end, up to `count` times.
    size_t pos = 0;
    while (budget-- > 0) {
      out += new_b;
      if (pos >= bytes.size()) break;
      const size_t start = pos;
      DecodeUtf8At(bytes, &pos);
      out.append(bytes, start, pos - start);
    }
    if (pos < bytes.size()) out.append(bytes, pos, std::string::npos);
    return TaintedString::Derived(std::move(out), data);
  }
  size_t start = 0;
  while (budget-- > 0) {
    const size_t hit = bytes.find(old_b, start);
    if (hit == std::string::npos) break;
    out.append(bytes, start, hit - start);
    out += new_b;
    start = hit + old_b.size();
  }
  out.append(bytes, start, std::string::npos);
  return TaintedString::Derived(std::move(out), data);
}

TaintedString PyPad(const TaintedString& s, int64_t width, std::string_view fill, PadSide side) {
  const int64_t len = static_cast<int64_t>(CodePointCount(s.bytes()));
  const int64_t margin = width - len;
  if (margin <= 0) return s;
  int64_t left = 0;
  if (side == PadSide::kCenter) {
    left = margin / 2 + (margin & width & 1);
  } else if (side == PadSide::kRight) {
    left = margin;
  }
  const int64_t right = margin - left;
  std::string pad_left, pad_right;
  for (int64_t i = 0; i < left; ++i) pad_left.append(fill);
  for (int64_t i = 0; i < right; ++i) pad_right.append(fill);
  TaintedString out(std::move(pad_left));
  out.Append(s);
  out.AppendMarkup(pad_right);
  return out;
}

bool ResolveRange(std::optional<int64_t> start, std::optional<int64_t> end, int64_t length, int64_t* lo,
                  int64_t* hi) {
  int64_t a = start.value_or(0);
  int64_t b = end.value_or(length);
  if (a < 0) a = std::max<int64_t>(a + length, 0);
  if (b < 0) b = std::max<int64_t>(b + length, 0);
  b = std::min(b, length);
  if (a > length) return false;
  *lo = a;
  *hi = b;
  return true;
}

}  // namespace decoded::jinja
