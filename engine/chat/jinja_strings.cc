#include "engine/chat/jinja_strings.h"

#include <algorithm>

#include "engine/chat/jinja_unicode.h"

namespace decoded::jinja {
namespace {

// The code points of `s` with their byte offsets (offsets.size() == cps.size() + 1).
struct CodePoints {
  std::vector<char32_t> cps;
  std::vector<size_t> offsets;
};

CodePoints Decode(std::string_view s) {
  CodePoints out;
  size_t pos = 0;
  while (pos < s.size()) {
    out.offsets.push_back(pos);
    out.cps.push_back(DecodeUtf8At(s, &pos));
  }
  out.offsets.push_back(s.size());
  return out;
}

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
  const CodePoints d = Decode(s.bytes());
  std::vector<char32_t> set;
  if (chars) {
    size_t p = 0;
    while (p < chars->size()) set.push_back(DecodeUtf8At(*chars, &p));
  }
  auto strip = [&](char32_t c) {
    return chars ? std::find(set.begin(), set.end(), c) != set.end() : IsSpace(c);
  };
  size_t lo = 0;
  size_t hi = d.cps.size();
  if (side != StripSide::kRight) {
    while (lo < hi && strip(d.cps[lo])) ++lo;
  }
  if (side != StripSide::kLeft) {
    while (hi > lo && strip(d.cps[hi - 1])) --hi;
  }
  return s.Substr(d.offsets[lo], d.offsets[hi]);
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
  const CodePoints d = Decode(bytes);
  const int64_t n = static_cast<int64_t>(d.cps.size());
  auto piece = [&](int64_t a, int64_t b) { return s.Substr(d.offsets[a], d.offsets[b]); };
  if (!from_right) {
    int64_t i = 0;
    while (budget-- > 0) {
      while (i < n && IsSpace(d.cps[i])) ++i;
      if (i == n) break;
      const int64_t j = i++;
      while (i < n && !IsSpace(d.cps[i])) ++i;
      out.push_back(piece(j, i));
    }
    if (i < n) {
      while (i < n && IsSpace(d.cps[i])) ++i;
      if (i != n) out.push_back(piece(i, n));
    }
  } else {
    int64_t i = n - 1;
    while (budget-- > 0) {
      while (i >= 0 && IsSpace(d.cps[i])) --i;
      if (i < 0) break;
      const int64_t j = i--;
      while (i >= 0 && !IsSpace(d.cps[i])) --i;
      out.push_back(piece(i + 1, j + 1));
    }
    if (i >= 0) {
      while (i >= 0 && IsSpace(d.cps[i])) --i;
      if (i >= 0) out.push_back(piece(0, i + 1));
    }
    std::reverse(out.begin(), out.end());
  }
  return out;
}

std::vector<TaintedString> PySplitLines(const TaintedString& s, bool keepends) {
  std::vector<TaintedString> out;
  const CodePoints d = Decode(s.bytes());
  const size_t n = d.cps.size();
  size_t i = 0;
  while (i < n) {
    const size_t start = i;
    while (i < n && !IsLineBreak(d.cps[i])) ++i;
    size_t eol = i;
    if (i < n) {
      if (d.cps[i] == '\r' && i + 1 < n && d.cps[i + 1] == '\n') {
        i += 2;
      } else {
        ++i;
      }
      if (keepends) eol = i;
    }
    out.push_back(s.Substr(d.offsets[start], d.offsets[eol]));
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
    const CodePoints d = Decode(bytes);
    size_t i = 0;
    for (; i <= d.cps.size(); ++i) {
      if (budget-- <= 0) break;
      out += new_b;
      if (i < d.cps.size()) out.append(bytes, d.offsets[i], d.offsets[i + 1] - d.offsets[i]);
    }
    if (i < d.cps.size()) out.append(bytes, d.offsets[i], std::string::npos);
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
