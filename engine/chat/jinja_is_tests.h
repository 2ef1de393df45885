// Jinja tests (`value is name(args)`), with the semantics of Jinja 3.1's jinja2.tests.
//
// Supported: defined undefined none boolean true false integer float number string mapping iterable sequence
// callable sameas odd even divisibleby lower upper in filter test, and the comparisons == eq equalto != ne
// < lt lessthan <= le > gt greaterthan >= ge. Not supported (Parse reports UNIMPLEMENTED): escaped.
// `sameas` compares None, booleans and shared objects by identity, and ints in CPython's small-int cache
// (-5..256) by value; on other numbers and strings, where Python's answer depends on object caching, it fails.
#ifndef DECODED_ENGINE_CHAT_JINJA_IS_TESTS_H_
#define DECODED_ENGINE_CHAT_JINJA_IS_TESTS_H_

#include <string_view>

#include "absl/status/statusor.h"
#include "engine/chat/jinja_value.h"

namespace decoded::jinja {

using TestFn = absl::StatusOr<bool> (*)(Env& env, const Value& value, const CallArgs& args);

// The implementation of a test, or nullptr when this renderer does not support it.
TestFn FindTest(std::string_view name);
// Whether Jinja has a test of this name: the `is test` test.
bool IsJinjaTestName(std::string_view name);

}  // namespace decoded::jinja

#endif  // DECODED_ENGINE_CHAT_JINJA_IS_TESTS_H_
