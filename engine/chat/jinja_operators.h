// Jinja's operators and lookups on Values, with Python's semantics.
//
// Arithmetic follows Python 3 (int / int is a float, // and % floor toward negative infinity, str * int repeats,
// list + list concatenates); `a.b` and `a[b]` follow jinja2.sandbox.ImmutableSandboxedEnvironment.getattr/getitem:
// attribute lookup falls back to item lookup and back, a missing one is Undefined, and the mutating methods of
// list and dict (append, update, pop ...) are Undefined values that fail when called, as in the sandbox.
// Failures are FAILED_PRECONDITION with Python's message ("unsupported operand type(s) for -: 'str' and 'int'");
// using an Undefined where Jinja raises UndefinedError fails with the Undefined's message.
#ifndef DECODED_ENGINE_CHAT_JINJA_OPERATORS_H_
#define DECODED_ENGINE_CHAT_JINJA_OPERATORS_H_

#include <string>
#include <string_view>
#include <vector>

#include "absl/status/statusor.h"
#include "engine/chat/jinja_value.h"

namespace decoded::jinja {

// op is one of + - * / // % **.
absl::StatusOr<Value> Arithmetic(std::string_view op, const Value& a, const Value& b, Budget& budget);
absl::StatusOr<Value> Negate(const Value& v);
absl::StatusOr<Value> Positive(const Value& v);
// a ~ b ~ ...: the str() of each, concatenated.
absl::StatusOr<Value> Concat(const std::vector<Value>& parts, Budget& budget);
// op is one of == != < <= > >= in notin.
absl::StatusOr<bool> Compare(std::string_view op, const Value& a, const Value& b);
// item in container.
absl::StatusOr<bool> Contains(const Value& container, const Value& item);

// obj.name (Jinja's getattr: attribute first, then item).
absl::StatusOr<Value> GetAttr(const Value& obj, std::string_view name);
// obj[key] (Jinja's getitem: item first, then attribute for string keys).
absl::StatusOr<Value> GetItem(const Value& obj, const Value& key);
// obj[start:stop:step]; each bound is None/Undefined when absent.
absl::StatusOr<Value> GetSlice(const Value& obj, const Value& start, const Value& stop, const Value& step,
                               Budget& budget);

// The error Jinja raises when an Undefined is used (UndefinedError), as FAILED_PRECONDITION.
absl::Status UndefinedError(const Value& undefined);
// markupsafe.escape: & < > " ' as HTML entities.
std::string HtmlEscape(std::string_view s);

}  // namespace decoded::jinja

#endif  // DECODED_ENGINE_CHAT_JINJA_OPERATORS_H_
