#include "server/bearer_token.h"

namespace decoded::server {

bool BearerTokenMatches(std::string_view header, std::string_view token) {
  constexpr std::string_view kScheme = "bearer ";
  // Every byte of `header` is compared, whatever it holds; the token's bytes
  // are read cyclically, so its length changes nothing either.
  unsigned diff = (token.empty() || header.size() != kScheme.size() + token.size()) ? 1u : 0u;
  for (size_t i = 0; i < header.size(); ++i) {
    unsigned char c = static_cast<unsigned char>(header[i]);
    if (i < kScheme.size()) {
      if (c >= 'A' && c <= 'Z') c = static_cast<unsigned char>(c + ('a' - 'A'));
      diff |= c ^ static_cast<unsigned char>(kScheme[i]);
    } else {
      const size_t j = i - kScheme.size();
      const unsigned char t = token.empty() ? 0 : static_cast<unsigned char>(token[j % token.size()]);
      diff |= c ^ t;
    }
  }
  return diff == 0;
}

}  // namespace decoded::server
