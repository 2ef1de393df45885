// Status propagation shorthands for the chat template parser and interpreter, whose recursive descent would
// otherwise be mostly `if (!x.ok()) return x.status();`. Private to engine/chat.
#ifndef DECODED_ENGINE_CHAT_JINJA_STATUS_H_
#define DECODED_ENGINE_CHAT_JINJA_STATUS_H_

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/strings/string_view.h"

#include <string_view>

namespace decoded::jinja {
// Debian's Abseil has its own string_view type; StrCat and Status take only that one.
inline absl::string_view Sv(std::string_view s) { return absl::string_view(s.data(), s.size()); }
}  // namespace decoded::jinja

#define JINJA_CONCAT_INNER(a, b) a##b
#define JINJA_CONCAT(a, b) JINJA_CONCAT_INNER(a, b)

#define JINJA_RETURN_IF_ERROR(expr)      \
  do {                                   \
    ::absl::Status _jinja_status = (expr); \
    if (!_jinja_status.ok()) return _jinja_status; \
  } while (0)

#define JINJA_ASSIGN_OR_RETURN_IMPL(tmp, lhs, expr) \
  auto tmp = (expr);                                \
  if (!tmp.ok()) return tmp.status();               \
  lhs = *std::move(tmp)

// `lhs` may be a declaration: JINJA_ASSIGN_OR_RETURN(Value v, Eval(e));
#define JINJA_ASSIGN_OR_RETURN(lhs, expr) \
  JINJA_ASSIGN_OR_RETURN_IMPL(JINJA_CONCAT(_jinja_statusor_, __LINE__), lhs, expr)

#endif  // DECODED_ENGINE_CHAT_JINJA_STATUS_H_
