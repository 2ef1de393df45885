#include "engine/utf8_validation.h"

#include <cstdint>

namespace decoded {
namespace {

// The defect of a multi-byte sequence with lead byte `lead` whose second
// byte `second` is a continuation byte (0x80..0xBF), or nullopt when the pair
// is allowed. Only the second byte narrows the range
// (RFC 3629 section 4): E0 and F0 exclude overlongs, ED the surrogates, F4
// everything above U+10FFFF.
std::optional<Utf8Defect> SecondByteDefect(uint8_t lead, uint8_t second) {
  if (lead == 0xE0 && second < 0xA0) return Utf8Defect::kOverlong;
  if (lead == 0xED && second > 0x9F) return Utf8Defect::kSurrogate;
  if (lead == 0xF0 && second < 0x90) return Utf8Defect::kOverlong;
  if (lead == 0xF4 && second > 0x8F) return Utf8Defect::kAboveMax;
  return std::nullopt;
}

bool IsContinuation(uint8_t b) { return (b & 0xC0) == 0x80; }

}  // namespace

std::optional<Utf8Error> FindInvalidUtf8(std::string_view text) {
  size_t i = 0;
  while (i < text.size()) {
    const uint8_t lead = static_cast<uint8_t>(text[i]);
    size_t length;
    if (lead < 0x80) {
      ++i;
      continue;
    } else if (lead < 0xC0) {
      return Utf8Error{i, Utf8Defect::kStrayContinuation};
    } else if (lead < 0xC2) {
      // C0 and C1 could only encode U+0000..U+007F, which take one byte.
      return Utf8Error{i, Utf8Defect::kOverlong};
    } else if (lead < 0xE0) {
      length = 2;
    } else if (lead < 0xF0) {
      length = 3;
    } else if (lead < 0xF5) {
      length = 4;
    } else if (lead < 0xF8) {
      // F5..F7 would start four-byte sequences above U+10FFFF.
      return Utf8Error{i, Utf8Defect::kAboveMax};
    } else {
      return Utf8Error{i, Utf8Defect::kNeverUsedByte};
    }
    for (size_t k = 1; k < length; ++k) {
      if (i + k >= text.size() || !IsContinuation(static_cast<uint8_t>(text[i + k]))) {
        return Utf8Error{i, Utf8Defect::kTruncated};
      }
      // A second byte outside the lead's range condemns the sequence whatever
      // follows, so that defect is named rather than a later truncation.
      if (k == 1) {
        if (std::optional<Utf8Defect> defect = SecondByteDefect(lead, static_cast<uint8_t>(text[i + 1]))) {
          return Utf8Error{i, *defect};
        }
      }
    }
    i += length;
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
