#include "engine/tokenizer/utf8.h"

#include "engine/utf8_validation.h"

namespace decoded {

void Utf8Sanitizer::Append(std::string_view bytes, std::string& out) {
  size_t i = 0;
  while (i < bytes.size()) {
    const uint8_t b = static_cast<uint8_t>(bytes[i]);
    if (held_ == 0) {
      if (b < 0x80) {
        // A run of ASCII is copied in one go: most text is mostly ASCII.
        size_t end = i + 1;
        while (end < bytes.size() && static_cast<uint8_t>(bytes[end]) < 0x80) ++end;
        out.append(bytes.data() + i, end - i);
        i = end;
        continue;
      }
      ++i;
      // Lead bytes of Table 3-7 (engine/utf8_validation.h): E0/ED/F0/F4 narrow
      // the range of the second byte, which excludes overlong forms,
      // surrogates and > U+10FFFF.
      const Utf8Lead lead = Utf8LeadOf(b);
      if (lead.length == 0) {
        // 80..C1, F5..FF start no well-formed sequence: a maximal subpart of one byte.
        out.append(kReplacementCharacter);
        continue;
      }
      length_ = static_cast<uint8_t>(lead.length);
      lower_ = lead.second_lo;
      upper_ = lead.second_hi;
      seq_[held_++] = static_cast<char>(b);
      continue;
    }
    if (b < lower_ || b > upper_) {
      // The held bytes are a maximal subpart. `b` is not consumed: it may
      // start the next sequence.
      out.append(kReplacementCharacter);
      held_ = 0;
      continue;
    }
    ++i;
    seq_[held_++] = static_cast<char>(b);
    lower_ = 0x80;
    upper_ = 0xBF;
    if (held_ == length_) {
      out.append(seq_, held_);
      held_ = 0;
    }
  }
}

void Utf8Sanitizer::Finish(std::string& out) {
  if (held_ > 0) out.append(kReplacementCharacter);
  held_ = 0;
}

std::string ToValidUtf8(std::string_view bytes) {
  std::string out;
  out.reserve(bytes.size());
  Utf8Sanitizer sanitizer;
  sanitizer.Append(bytes, out);
  sanitizer.Finish(out);
  return out;
}

std::string ToValidUtf8PerByte(std::string_view bytes) {
  std::string out;
  out.reserve(bytes.size() + bytes.size() / 2);
  size_t i = 0;
  while (i < bytes.size()) {
    const Utf8Lead lead = Utf8LeadOf(static_cast<uint8_t>(bytes[i]));
    bool well_formed = lead.length > 0 && i + lead.length <= bytes.size();
    for (int k = 1; well_formed && k < lead.length; ++k) {
      const uint8_t b = static_cast<uint8_t>(bytes[i + k]);
      const uint8_t lo = k == 1 ? lead.second_lo : 0x80;
      const uint8_t hi = k == 1 ? lead.second_hi : 0xBF;
      well_formed = b >= lo && b <= hi;
    }
    if (well_formed) {
      out.append(bytes.substr(i, lead.length));
      i += lead.length;
    } else {
      out.append(kReplacementCharacter);
      ++i;
    }
  }
  return out;
}

}  // namespace decoded
