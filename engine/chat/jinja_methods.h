// Python methods a template may call on strings, dicts and lists: `message.content.split('</think>')`,
// `tool.get('name')`, `'{} {}'.format(a, b)`.
//
// Supported:
//   str:   strip lstrip rstrip split rsplit splitlines startswith endswith upper lower title capitalize replace
//          find rfind index rindex count join format partition rpartition removeprefix removesuffix center ljust
//          rjust zfill isalpha isalnum isdigit isspace isupper islower istitle isascii isprintable
//   dict:  get items keys values copy
//   list:  count index copy (tuples: count index)
// format() takes "{}", "{0}" and "{name}" fields with optional !s / !r and no format spec. The mutating methods of
// list and dict are Undefined with the sandbox's message ("access to attribute 'append' of 'list' object is
// unsafe."), so calling one fails as in Hugging Face's ImmutableSandboxedEnvironment. The other Python methods
// (casefold, encode, expandtabs, format_map, translate, swapcase, isdecimal, isnumeric, isidentifier, fromkeys)
// are reported by the parser as UNIMPLEMENTED.
//
// Data ranges: methods that return parts of the receiver (strip, split, partition, removeprefix, padding) keep
// them exactly; join concatenates; every other string result holding any data is all data.
#ifndef DECODED_ENGINE_CHAT_JINJA_METHODS_H_
#define DECODED_ENGINE_CHAT_JINJA_METHODS_H_

#include <optional>
#include <string_view>

#include "engine/chat/jinja_value.h"

namespace decoded::jinja {

// `receiver.name` when the receiver's Python type has a method of that name: a callable bound to the receiver, or
// the sandbox's Undefined for a mutating method. nullopt when the type has no such method.
std::optional<Value> LookupMethod(const Value& receiver, std::string_view name);

// A Python str/dict/list method this renderer does not implement.
bool IsUnsupportedPythonMethod(std::string_view name);

}  // namespace decoded::jinja

#endif  // DECODED_ENGINE_CHAT_JINJA_METHODS_H_
