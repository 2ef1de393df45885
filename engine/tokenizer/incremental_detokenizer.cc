#include <cstdint>
#include <string>

#include "engine/tokenizer/tokenizer.h"

namespace decoded {
namespace {

constexpr std::string_view kReplacement = "\xEF\xBF\xBD";  // U+FFFD

enum class Scan { kComplete, kIncomplete, kInvalid };

// Checks the UTF-8 sequence starting at s[0] (RFC 3629: no overlongs, no
// surrogates, nothing above U+10FFFF). On kComplete/kInvalid `len` is the
// number of bytes consumed (an invalid sequence consumes its maximal invalid
// prefix, at least one byte, as the Unicode "substitution of maximal subparts"
// practice does); kIncomplete means every byte present is a valid prefix.
Scan ScanSequence(std::string_view s, size_t& len) {
  const uint8_t b0 = static_cast<uint8_t>(s[0]);
  size_t need;
  uint8_t lo = 0x80, hi = 0xBF;  // allowed range of the second byte
  if (b0 < 0x80) {
    len = 1;
    return Scan::kComplete;
  } else if (b0 >= 0xC2 && b0 <= 0xDF) {
    need = 2;
  } else if (b0 >= 0xE0 && b0 <= 0xEF) {
    need = 3;
    if (b0 == 0xE0) lo = 0xA0;
    if (b0 == 0xED) hi = 0x9F;
  } else if (b0 >= 0xF0 && b0 <= 0xF4) {
    need = 4;
    if (b0 == 0xF0) lo = 0x90;
    if (b0 == 0xF4) hi = 0x8F;
  } else {
    len = 1;
    return Scan::kInvalid;
  }
  for (size_t i = 1; i < need; ++i) {
    if (i >= s.size()) return Scan::kIncomplete;
    const uint8_t b = static_cast<uint8_t>(s[i]);
    const bool ok = i == 1 ? (b >= lo && b <= hi) : (b >= 0x80 && b <= 0xBF);
    if (!ok) {
      len = i;
      return Scan::kInvalid;
    }
  }
  len = need;
  return Scan::kComplete;
}

}  // namespace

std::string IncrementalDetokenizer::Push(int32_t id) {
  pending_ += tokenizer_->TokenBytes(id);
  std::string out;
  size_t pos = 0;
  while (pos < pending_.size()) {
    size_t len = 0;
    const Scan scan = ScanSequence(std::string_view(pending_).substr(pos), len);
    if (scan == Scan::kIncomplete) break;
    if (scan == Scan::kComplete) {
      out.append(pending_, pos, len);
    } else {
      out.append(kReplacement);
    }
    pos += len;
  }
  pending_.erase(0, pos);
  return out;
}

std::string IncrementalDetokenizer::Flush() {
  // Whatever is held is a valid but unfinished sequence: one replacement.
  std::string out = pending_.empty() ? "" : std::string(kReplacement);
  pending_.clear();
  return out;
}

}  // namespace decoded
