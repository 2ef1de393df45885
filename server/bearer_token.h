// "authorization: Bearer <token>" (RFC 6750 section 2.1) for every endpoint
// that asks for one: the Decoder service, reflection, /metrics.
#ifndef DECODED_SERVER_BEARER_TOKEN_H_
#define DECODED_SERVER_BEARER_TOKEN_H_

#include <string_view>

namespace decoded::server {

// True when `header` (an authorization header's value) is "Bearer <token>"
// with the scheme in any case (RFC 7235 section 2.1) and the token exactly.
// Its time depends on the length of `header` only: neither where the two
// differ nor the length of `token` shows in it. An empty `token` matches
// nothing.
bool BearerTokenMatches(std::string_view header, std::string_view token);

}  // namespace decoded::server

#endif  // DECODED_SERVER_BEARER_TOKEN_H_
