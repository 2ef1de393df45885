// OpenAI's error object (https://platform.openai.com/docs/guides/error-codes):
// {"error": {"message": ..., "type": ..., "param": ..., "code": ...}} with
// the HTTP status, for every error the HTTP front door answers, the HTTP
// server's own (400 malformed, 413, 414, 431) included, so a client's SDK maps
// each to its exception type.
#ifndef DECODED_SERVER_HTTP_OPENAI_ERROR_H_
#define DECODED_SERVER_HTTP_OPENAI_ERROR_H_

#include "absl/strings/string_view.h"

#include "server/http/http_types.h"

namespace decoded::server::http {

// `type` as OpenAI names them ("invalid_request_error", "authentication_error",
// "not_found_error", "rate_limit_error", "server_error", ...); `param` the
// request field at fault and `code` a short machine-readable reason, each
// JSON null when empty.
HttpResponse OpenAiError(int status, absl::string_view type, absl::string_view message, absl::string_view param = "",
                         absl::string_view code = "");

}  // namespace decoded::server::http

#endif  // DECODED_SERVER_HTTP_OPENAI_ERROR_H_
