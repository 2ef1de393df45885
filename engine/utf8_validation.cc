#include "engine/utf8_validation.h"

#include <cstdint>

namespace decoded {
namespace {

bool IsContinuation(uint8_t b) { return (b & 0xC0) == 0x80; }

// Why `byte` starts no sequence (Utf8LeadOf(byte).length == 0).
Utf8Defect NonLeadDefect(uint8_t byte) {
  if (byte < 0xC0) return Utf8Defect::kStrayContinuation;
  if (byte < 0xC2) return Utf8Defect::kOverlong;  // C0, C1 could only encode U+0000..U+007F
  if (byte < 0xF8) return Utf8Defect::kAboveMax;  // F5..F7 would start sequences above U+10FFFF
  return Utf8Defect::kNeverUsedByte;
}

// Why a continuation byte falls outside the second-byte range that `lead`
// narrows: the range excludes exactly what the narrowing is for.
Utf8Defect NarrowedDefect(uint8_t lead) {
  if (lead == 0xED) return Utf8Defect::kSurrogate;
  if (lead == 0xF4) return Utf8Defect::kAboveMax;
  return Utf8Defect::kOverlong;  // E0, F0
}

}  // namespace

std::optional<Utf8Error> FindInvalidUtf8(std::string_view text) {
  size_t i = 0;
  while (i < text.size()) {
    const uint8_t first = static_cast<uint8_t>(text[i]);
    const Utf8Lead lead = Utf8LeadOf(first);
    if (lead.length == 0) return Utf8Error{i, NonLeadDefect(first)};
    for (int k = 1; k < lead.length; ++k) {
      if (i + k >= text.size()) return Utf8Error{i, Utf8Defect::kTruncated};
      const uint8_t b = static_cast<uint8_t>(text[i + k]);
      const bool in_range = k == 1 ? b >= lead.second_lo && b <= lead.second_hi : IsContinuation(b);
      if (in_range) continue;
      // A continuation byte outside a narrowed range condemns the sequence
      // whatever follows, so that defect is named rather than a truncation.
      if (k == 1 && IsContinuation(b)) return Utf8Error{i, NarrowedDefect(first)};
      return Utf8Error{i, Utf8Defect::kTruncated};
    }
    i += lead.length;
  }
  return std::nullopt;
}

std::string_view Utf8DefectDescription(Utf8Defect defect) {
  switch (defect) {
    case Utf8Defect::kStrayContinuation:
      return "is a continuation byte with no lead byte";
    case Utf8Defect::kTruncated:
      return "begins a sequence that is cut short";
    case Utf8Defect::kOverlong:
      return "begins an overlong encoding";
    case Utf8Defect::kSurrogate:
      return "begins an encoded surrogate (U+D800..U+DFFF)";
    case Utf8Defect::kAboveMax:
      return "begins a code point above U+10FFFF";
    case Utf8Defect::kNeverUsedByte:
      return "never occurs in UTF-8";
  }
  return "is not valid UTF-8";
}

}  // namespace decoded
