// Hex <-> bytes for the tokenizer reference files, which store text and
// decoded bytes as hex so that invalid UTF-8 survives JSON.
#ifndef DECODED_TESTS_TOKENIZER_HEX_H_
#define DECODED_TESTS_TOKENIZER_HEX_H_

#include <string>

namespace decoded::testing {

inline std::string FromHex(const std::string& hex) {
  std::string out;
  for (size_t i = 0; i + 1 < hex.size(); i += 2) {
    out.push_back(static_cast<char>(std::stoi(hex.substr(i, 2), nullptr, 16)));
  }
  return out;
}

inline std::string ToHex(const std::string& bytes) {
  static const char* kDigits = "0123456789abcdef";
  std::string out;
  for (unsigned char c : bytes) {
    out.push_back(kDigits[c >> 4]);
    out.push_back(kDigits[c & 15]);
  }
  return out;
}

}  // namespace decoded::testing

#endif  // DECODED_TESTS_TOKENIZER_HEX_H_
