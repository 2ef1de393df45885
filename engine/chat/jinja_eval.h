// The interpreter that renders a parsed chat template.
//
// Scoping follows Jinja 3.1 as compiled by jinja2.compiler: `set` at the top level or inside if/with blocks of the
// top level assigns template variables; each for-loop iteration, macro call, call-block caller and
// {% generation %} body has its own scope that reads the enclosing ones and whose assignments vanish when it ends
// (hence namespace(), whose attributes are the one way to carry state out of a loop). Macros see the variables of
// the scope they were defined in as they are when called.
//
// Globals are Hugging Face's: raise_exception(message) (fails the render with INVALID_ARGUMENT carrying the
// template's message), strftime_now(format) (formats Env::now in UTC), namespace(...) and dict(...), plus Jinja's
// range() (limited to 100000 items like jinja2.sandbox.safe_range).
//
// Errors: INVALID_ARGUMENT from raise_exception; FAILED_PRECONDITION "chat template: <what> (line L)" for
// evaluation errors (types, undefined values used, unknown callables) and for exceeded limits (jinja_budget.h).
#ifndef DECODED_ENGINE_CHAT_JINJA_EVAL_H_
#define DECODED_ENGINE_CHAT_JINJA_EVAL_H_

#include <string>
#include <utility>
#include <vector>

#include "absl/status/statusor.h"
#include "absl/time/time.h"
#include "engine/chat/jinja_ast.h"
#include "engine/chat/jinja_value.h"
#include "engine/chat/tainted_string.h"

namespace decoded::jinja {

// Renders `tpl` with the template variables `context` (name, value). Thread-safe for concurrent renders of one
// template: all state lives in the call.
absl::StatusOr<TaintedString> RenderTemplate(const Template& tpl,
                                             const std::vector<std::pair<std::string, Value>>& context,
                                             absl::Time now);

}  // namespace decoded::jinja

#endif  // DECODED_ENGINE_CHAT_JINJA_EVAL_H_
