// Jinja filters (`value|name(args)`), with the semantics of Jinja 3.1's jinja2.filters as a Hugging Face chat
// template sees them (autoescape off; tojson replaced by Hugging Face's json.dumps wrapper).
//
// Supported: abs attr batch capitalize center count d default dictsort e escape first float forceescape indent
// int items join last length list lower map max min reject rejectattr replace reverse round safe select
// selectattr sort string sum title tojson trim truncate unique upper wordcount.
// Not supported (Parse reports UNIMPLEMENTED): filesizeformat format groupby pprint random slice striptags
// urlencode urlize wordwrap xmlattr, and any filter Jinja does not have.
//
// Filters that return generators in Jinja (map, select, reject, selectattr, rejectattr, unique, batch, items,
// reverse of a non-string) return one-shot iterators here too, so `|list`, iteration, truthiness and `|length`
// behave as in Python (a generator is always true and has no length).
#ifndef DECODED_ENGINE_CHAT_JINJA_FILTERS_H_
#define DECODED_ENGINE_CHAT_JINJA_FILTERS_H_

#include <string_view>

#include "absl/status/statusor.h"
#include "engine/chat/jinja_value.h"

namespace decoded::jinja {

using FilterFn = absl::StatusOr<Value> (*)(Env& env, const Value& value, const CallArgs& args);

// The implementation of a filter, or nullptr when this renderer does not support it.
FilterFn FindFilter(std::string_view name);
// Whether Jinja (with Hugging Face's additions) has a filter of this name: the `is filter` test.
bool IsJinjaFilterName(std::string_view name);

}  // namespace decoded::jinja

#endif  // DECODED_ENGINE_CHAT_JINJA_FILTERS_H_
