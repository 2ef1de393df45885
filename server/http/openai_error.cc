#include "server/http/openai_error.h"

#include <string>

#include "nlohmann/json.hpp"

namespace decoded::server::http {

HttpResponse OpenAiError(int status, absl::string_view type, absl::string_view message, absl::string_view param,
                         absl::string_view code) {
  nlohmann::json error = {{"message", std::string(message)},
                          {"type", std::string(type)},
                          {"param", nullptr},
                          {"code", nullptr}};
  if (!param.empty()) error["param"] = std::string(param);
  if (!code.empty()) error["code"] = std::string(code);
  HttpResponse r;
  r.status = status;
  r.content_type = "application/json";
  // Replacement characters for invalid UTF-8 (a message may quote input).
  r.body = nlohmann::json{{"error", std::move(error)}}.dump(-1, ' ', false, nlohmann::json::error_handler_t::replace);
  return r;
}

}  // namespace decoded::server::http
