// Python's json.dumps, for the `tojson` filter.
//
// Hugging Face replaces Jinja's HTML-escaping tojson with
//   json.dumps(x, ensure_ascii=False, indent=indent, separators=separators, sort_keys=sort_keys)
// (transformers' chat_template_utils), and templates print tool schemas and arguments through it, so the bytes
// must be json.dumps's: ", " / ": " separators without indent and "," / ": " with it, floats as Python's repr with
// NaN/Infinity, dict keys coerced to strings (true/false/null/float repr), and TypeError for anything else
// ("Object of type Undefined is not JSON serializable").
#ifndef DECODED_ENGINE_CHAT_JINJA_JSON_H_
#define DECODED_ENGINE_CHAT_JINJA_JSON_H_

#include <optional>
#include <string>

#include "absl/status/statusor.h"
#include "engine/chat/jinja_value.h"

namespace decoded::jinja {

struct JsonOptions {
  bool ensure_ascii = false;
  std::optional<std::string> indent;  // the indent unit; nullopt: one line
  std::optional<std::string> item_separator;  // default ", " without indent, "," with it
  std::string key_separator = ": ";
  bool sort_keys = false;
};

// FAILED_PRECONDITION with Python's TypeError message for values JSON cannot hold.
absl::StatusOr<std::string> JsonDumps(const Value& v, const JsonOptions& options, Budget& budget);

}  // namespace decoded::jinja

#endif  // DECODED_ENGINE_CHAT_JINJA_JSON_H_
