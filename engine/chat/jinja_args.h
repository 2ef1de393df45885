// Binding call arguments to a Python-style signature, for the builtins (filters, tests, methods, globals).
#ifndef DECODED_ENGINE_CHAT_JINJA_ARGS_H_
#define DECODED_ENGINE_CHAT_JINJA_ARGS_H_

#include <cstdint>
#include <initializer_list>
#include <optional>
#include <string>
#include <string_view>
#include <vector>

#include "absl/status/statusor.h"
#include "engine/chat/jinja_value.h"

namespace decoded::jinja {

// The arguments of one call, bound to parameter names like Python binds `def f(a, b=None, c=False)`: positional
// arguments fill parameters in order, keywords by name; `required` leading parameters must be given.
// FAILED_PRECONDITION names the callee for too many arguments, an unknown or repeated keyword, or a missing one.
class BoundArgs {
 public:
  static absl::StatusOr<BoundArgs> Bind(std::string_view callee, const CallArgs& args,
                                        std::initializer_list<std::string_view> params, size_t required = 0);

  // The argument for parameter `i`, or nullptr when not given.
  const Value* Get(size_t i) const { return given_[i] ? &values_[i] : nullptr; }
  bool Has(size_t i) const { return given_[i]; }

  // Typed reads with the default used when the parameter is not given (or, for the *OrNone forms, is None).
  // FAILED_PRECONDITION naming the parameter when the argument has another type.
  absl::StatusOr<int64_t> Int(size_t i, int64_t fallback) const;
  absl::StatusOr<bool> Bool(size_t i, bool fallback) const;  // any value, by truthiness
  absl::StatusOr<std::optional<std::string>> StringOrNone(size_t i) const;
  absl::StatusOr<std::string> String(size_t i, std::string_view fallback) const;

 private:
  std::string callee_;
  std::vector<std::string> names_;
  std::vector<Value> values_;
  std::vector<bool> given_;
};

// Errors for builtins: FAILED_PRECONDITION with the message as given.
absl::Status TypeError(absl::string_view message);

}  // namespace decoded::jinja

#endif  // DECODED_ENGINE_CHAT_JINJA_ARGS_H_
