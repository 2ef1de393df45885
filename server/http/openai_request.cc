#include "server/http/openai_request.h"

#include <cmath>
#include <limits>
#include <optional>
#include <random>
#include <utility>

#include "absl/strings/cord.h"
#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "nlohmann/json.hpp"

namespace decoded::server::http {
namespace {

using nlohmann::json;

absl::Status Bad(absl::string_view param, absl::string_view message) {
  absl::Status s = absl::InvalidArgumentError(absl::StrCat("'", param, "': ", message));
  s.SetPayload(kParamPayload, absl::Cord(param));
  return s;
}

// A JSON field read with OpenAI's types; null counts as absent.
class Fields {
 public:
  explicit Fields(const json& body) : body_(body) {}

  const json* Get(const char* name) const {
    const auto it = body_.find(name);
    return it == body_.end() || it->is_null() ? nullptr : &*it;
  }

  absl::Status Number(const char* name, double lo, double hi, bool lo_open, float* out) const {
    const json* v = Get(name);
    if (v == nullptr) return absl::OkStatus();
    if (!v->is_number()) return Bad(name, "must be a number");
    const double x = v->get<double>();
    if (!std::isfinite(x) || x < lo || x > hi || (lo_open && x == lo)) {
      return Bad(name, absl::StrCat("must be in ", lo_open ? "(" : "[", lo, ", ", hi, "], got ", x));
    }
    *out = static_cast<float>(x);
    return absl::OkStatus();
  }

  absl::Status Integer(const char* name, int64_t lo, int64_t hi, std::optional<int64_t>* out) const {
    const json* v = Get(name);
    if (v == nullptr) return absl::OkStatus();
    if (!v->is_number_integer()) return Bad(name, absl::StrCat("must be an integer in [", lo, ", ", hi, "]"));
    const int64_t x = v->is_number_unsigned() && v->get<uint64_t>() > uint64_t{INT64_MAX}
                          ? INT64_MAX
                          : v->get<int64_t>();
    if (x < lo || x > hi) return Bad(name, absl::StrCat("must be in [", lo, ", ", hi, "], got ", x));
    *out = x;
    return absl::OkStatus();
  }

  absl::Status Bool(const char* name, bool* out) const {
    const json* v = Get(name);
    if (v == nullptr) return absl::OkStatus();
    if (!v->is_boolean()) return Bad(name, "must be true or false");
    *out = v->get<bool>();
    return absl::OkStatus();
  }

 private:
  const json& body_;
};

// A list of token ids (each a non-negative int32; the engine checks the
// vocabulary).
absl::Status TokenIds(const json& list, absl::string_view param, std::vector<int32_t>* out) {
  for (const json& id : list) {
    if (!id.is_number_integer() || id.get<int64_t>() < 0 || id.get<int64_t>() > INT32_MAX) {
      return Bad(param, "a token id list must hold non-negative integers");
    }
    out->push_back(static_cast<int32_t>(id.get<int64_t>()));
  }
  if (out->empty()) return Bad(param, "must not be empty");
  return absl::OkStatus();
}

// OpenAI's prompt: a string, a list of token ids, or a list holding one of
// those (a batch of one). Deeper nesting is refused, not followed.
absl::Status Prompt(const json& given, serving::TurnRequest* turn) {
  const bool batch_of_one = given.is_array() && given.size() == 1 && (given[0].is_string() || given[0].is_array());
  const json& prompt = batch_of_one ? given[0] : given;
  if (prompt.is_string()) {
    turn->kind = serving::TurnRequest::InputKind::kText;
    turn->text = prompt.get<std::string>();
    if (turn->text.empty()) return Bad("prompt", "must not be empty");
    return absl::OkStatus();
  }
  if (!prompt.is_array() || prompt.empty()) {
    return Bad("prompt", "must be a string, a list of token ids, or a list of one of those");
  }
  if (prompt[0].is_string() || prompt[0].is_array()) {
    return Bad("prompt", batch_of_one ? "must be a string, a list of token ids, or a list of one of those"
                                      : "several prompts in one request are not supported: send one prompt per "
                                        "request");
  }
  turn->kind = serving::TurnRequest::InputKind::kTokens;
  return TokenIds(prompt, "prompt", &turn->tokens);
}

absl::Status Messages(const json& messages, serving::TurnRequest* turn) {
  if (!messages.is_array() || messages.empty()) return Bad("messages", "must be a non-empty list of messages");
  turn->kind = serving::TurnRequest::InputKind::kMessages;
  for (size_t i = 0; i < messages.size(); ++i) {
    const json& m = messages[i];
    const std::string at = absl::StrCat("messages[", i, "]");
    if (!m.is_object()) return Bad(at, "must be an object with a role and content");
    const auto role_it = m.find("role");
    if (role_it == m.end() || !role_it->is_string()) return Bad(absl::StrCat(at, ".role"), "must be a string");
    std::string role = role_it->get<std::string>();
    if (role == "developer") role = "system";  // OpenAI's newer name for the system role
    if (role != "system" && role != "user" && role != "assistant") {
      return Bad(absl::StrCat(at, ".role"),
                 absl::StrCat("'", role_it->get<std::string>(),
                              "' is not supported: use system, developer, user or assistant (no tools)"));
    }
    if (const auto calls = m.find("tool_calls");
        calls != m.end() && !calls->is_null() && !(calls->is_array() && calls->empty())) {
      return Bad(absl::StrCat(at, ".tool_calls"), "tool calls are not supported");
    }
    const auto content = m.find("content");
    std::string text;
    if (content == m.end() || content->is_null()) {
      return Bad(absl::StrCat(at, ".content"), "is required");
    } else if (content->is_string()) {
      text = content->get<std::string>();
    } else if (content->is_array()) {
      // Text parts are joined as one text, as vLLM does.
      for (size_t j = 0; j < content->size(); ++j) {
        const json& part = (*content)[j];
        const std::string part_at = absl::StrCat(at, ".content[", j, "]");
        if (!part.is_object() || !part.contains("type") || !part["type"].is_string()) {
          return Bad(part_at, "must be an object with a type");
        }
        if (part["type"] != "text") {
          return Bad(absl::StrCat(part_at, ".type"),
                     absl::StrCat("'", part["type"].get<std::string>(), "' parts are not supported: text only"));
        }
        if (!part.contains("text") || !part["text"].is_string()) {
          return Bad(absl::StrCat(part_at, ".text"), "must be a string");
        }
        if (j > 0) text += "\n";
        text += part["text"].get<std::string>();
      }
    } else {
      return Bad(absl::StrCat(at, ".content"), "must be a string or a list of text parts");
    }
    turn->messages.push_back(ChatMessage{std::move(role), std::move(text)});
  }
  return absl::OkStatus();
}

absl::Status Stop(const json* stop, serving::TurnRequest* turn) {
  if (stop == nullptr) return absl::OkStatus();
  if (stop->is_string()) {
    if (!stop->get<std::string>().empty()) turn->stopping.stop_sequences.push_back(stop->get<std::string>());
    return absl::OkStatus();
  }
  if (!stop->is_array()) return Bad("stop", "must be a string or a list of strings");
  for (const json& s : *stop) {
    if (!s.is_string()) return Bad("stop", "must be a string or a list of strings");
    if (!s.get<std::string>().empty()) turn->stopping.stop_sequences.push_back(s.get<std::string>());
  }
  return absl::OkStatus();
}

// OpenAI's logit_bias: {"<token id>": bias in [-100, 100], ...}. Ids beyond
// the vocabulary are the engine's to refuse (it knows the vocabulary).
absl::Status LogitBias(const json* bias, SamplingParams* p) {
  if (bias == nullptr || bias->is_null()) return absl::OkStatus();
  if (!bias->is_object()) return Bad("logit_bias", "must be an object of token ids (as strings) to biases");
  if (bias->size() > static_cast<size_t>(kMaxLogitBias)) {
    return Bad("logit_bias", absl::StrCat("has ", bias->size(), " entries, over the limit of ", kMaxLogitBias));
  }
  for (const auto& [key, value] : bias->items()) {
    int32_t id = 0;
    // One spelling per id: "7042" and "07042" would otherwise be two entries
    // for one token whose biases add up (past [-100, 100]), where vLLM keeps
    // one of them.
    if (key.empty() || key.find_first_not_of("0123456789") != std::string::npos || (key[0] == '0' && key.size() > 1) ||
        !absl::SimpleAtoi(key, &id)) {
      return Bad("logit_bias",
                 absl::StrCat("key '", key, "' is not a token id (a decimal integer >= 0, no leading zeros)"));
    }
    if (!value.is_number() || !(value.get<double>() >= -100 && value.get<double>() <= 100)) {
      return Bad("logit_bias", absl::StrCat("the bias of token ", id, " must be a number in [-100, 100]"));
    }
    p->logit_bias.emplace_back(id, value.get<float>());
  }
  return absl::OkStatus();
}

absl::Status Parse(const json& body, OpenAiEndpoint endpoint, OpenAiRequest* r) {
  if (!body.is_object()) return Bad("body", "must be a JSON object");
  const Fields f(body);
  const bool chat = endpoint == OpenAiEndpoint::kChatCompletions;
  r->endpoint = endpoint;

  const json* model = f.Get("model");
  if (model == nullptr || !model->is_string()) return Bad("model", "is required: the served model's id (GET /v1/models)");
  r->model = model->get<std::string>();

  if (chat) {
    const json* messages = f.Get("messages");
    if (messages == nullptr) return Bad("messages", "is required");
    if (absl::Status s = Messages(*messages, &r->turn); !s.ok()) return s;
    if (const json* tools = f.Get("tools"); tools != nullptr && !(tools->is_array() && tools->empty())) {
      return Bad("tools", "tool calling is not supported");
    }
    if (const json* rf = f.Get("response_format"); rf != nullptr) {
      const auto type = rf->is_object() ? rf->find("type") : rf->end();
      if (!rf->is_object() || type == rf->end() || !type->is_string() || *type != "text") {
        return Bad("response_format", "only {\"type\": \"text\"} is supported");
      }
    }
  } else {
    const json* prompt = f.Get("prompt");
    if (prompt == nullptr) return Bad("prompt", "is required");
    if (absl::Status s = Prompt(*prompt, &r->turn); !s.ok()) return s;
    if (f.Get("suffix") != nullptr) return Bad("suffix", "is not supported");
    if (absl::Status s = f.Bool("echo", &r->echo); !s.ok()) return s;
    std::optional<int64_t> best_of;
    if (absl::Status s = f.Integer("best_of", 1, 1, &best_of); !s.ok()) {
      return Bad("best_of", "only 1 is supported (one sequence per request)");
    }
  }

  if (absl::Status s = LogitBias(f.Get("logit_bias"), &r->turn.sampling); !s.ok()) return s;

  std::optional<int64_t> n;
  if (absl::Status s = f.Integer("n", 1, 1, &n); !s.ok()) {
    return Bad("n", "only 1 is supported: a session's KV cache cannot be forked yet");
  }

  std::optional<int64_t> max_tokens;
  if (absl::Status s = f.Integer("max_tokens", 0, INT32_MAX, &max_tokens); !s.ok()) return s;
  if (chat) {
    std::optional<int64_t> max_completion;
    if (absl::Status s = f.Integer("max_completion_tokens", 0, INT32_MAX, &max_completion); !s.ok()) return s;
    if (max_completion) max_tokens = max_completion;
  }
  if (max_tokens) {
    r->turn.stopping.max_new_tokens = static_cast<int32_t>(*max_tokens);
    // As the OpenAI API and vLLM: an input plus max_tokens beyond the context is a 400, not a cut reply.
    r->turn.stopping.max_new_tokens_must_fit = true;
    r->max_tokens_given = true;
  }

  SamplingParams& p = r->turn.sampling;
  p.temperature = 1.0f;  // OpenAI's default
  if (absl::Status s = f.Number("temperature", 0, 2, false, &p.temperature); !s.ok()) return s;
  if (absl::Status s = f.Number("top_p", 0, 1, true, &p.top_p); !s.ok()) return s;
  if (absl::Status s = f.Number("presence_penalty", -2, 2, false, &p.presence_penalty); !s.ok()) return s;
  if (absl::Status s = f.Number("frequency_penalty", -2, 2, false, &p.frequency_penalty); !s.ok()) return s;
  if (absl::Status s = f.Number("min_p", 0, 1, false, &p.min_p); !s.ok()) return s;
  if (p.min_p == 1.0f) return Bad("min_p", "must be below 1 (1 would keep only tokens as likely as the best)");
  if (absl::Status s = f.Number("repetition_penalty", 0, 1e6, true, &p.repetition_penalty); !s.ok()) return s;
  std::optional<int64_t> top_k;
  if (absl::Status s = f.Integer("top_k", -1, INT32_MAX, &top_k); !s.ok()) return s;
  if (top_k) p.top_k = *top_k < 0 ? 0 : static_cast<int32_t>(*top_k);
  std::optional<int64_t> seed;
  if (absl::Status s = f.Integer("seed", INT64_MIN, INT64_MAX, &seed); !s.ok()) return s;
  if (seed) {
    p.seed = static_cast<uint64_t>(*seed);
  } else if (p.temperature > 0) {
    std::random_device rd;
    p.seed = (static_cast<uint64_t>(rd()) << 32) | rd();
  }
  if (absl::Status s = Stop(f.Get("stop"), &r->turn); !s.ok()) return s;
  // vLLM's stop_token_ids: generation stops at any of them (finish_reason
  // "stop"); the engine refuses ids outside the vocabulary and long lists.
  if (const json* ids = f.Get("stop_token_ids"); ids != nullptr && !ids->is_null()) {
    if (!ids->is_array()) return Bad("stop_token_ids", "must be a list of token ids");
    if (!ids->empty()) {
      if (absl::Status s = TokenIds(*ids, "stop_token_ids", &r->turn.stopping.stop_token_ids); !s.ok()) return s;
    }
  }
  if (absl::Status s = f.Bool("ignore_eos", &r->turn.stopping.ignore_eos); !s.ok()) return s;

  if (chat) {
    if (absl::Status s = f.Bool("logprobs", &r->logprobs); !s.ok()) return s;
    std::optional<int64_t> top;
    if (absl::Status s = f.Integer("top_logprobs", 0, 20, &top); !s.ok()) return s;
    if (top && !r->logprobs) return Bad("top_logprobs", "needs \"logprobs\": true");
    r->top_logprobs = top.value_or(0);
  } else {
    std::optional<int64_t> lp;
    if (absl::Status s = f.Integer("logprobs", 0, 20, &lp); !s.ok()) return s;
    r->logprobs = lp.has_value();
    r->top_logprobs = lp.value_or(0);
    // The prompt's own log probabilities come back with echo.
    r->turn.prompt_logprobs = r->echo && r->logprobs;
  }
  p.top_logprobs = r->top_logprobs;

  if (absl::Status s = f.Bool("stream", &r->stream); !s.ok()) return s;
  if (r->stream && r->echo && r->logprobs) {
    // The prompt's log probabilities arrive with the turn's end, after the
    // echo chunk a stream sends first.
    return Bad("echo", "echo with logprobs needs a whole reply: drop \"stream\" or \"logprobs\"");
  }
  if (const json* so = f.Get("stream_options"); so != nullptr) {
    if (!r->stream) return Bad("stream_options", "is only allowed with \"stream\": true");
    if (!so->is_object()) return Bad("stream_options", "must be an object");
    const Fields sf(*so);
    if (absl::Status s = sf.Bool("include_usage", &r->include_usage); !s.ok()) {
      return Bad("stream_options.include_usage", "must be true or false");
    }
  }
  return absl::OkStatus();
}

// The SAX pass's limits: a request is a few levels deep (messages[i].
// content[j].text is 4) and its values are at most a prompt of token ids
// (a context's worth), so deeper or larger documents are refused before a
// DOM is built: a DOM node is 16 bytes and an empty object ~60 more, so 8
// MiB of "{}," would take ~300 MB, and nesting is what deep recursion (in
// any code that walks the tree) needs.
struct JsonLimits : nlohmann::json_sax<json> {
  static constexpr int kMaxDepth = 64;
  static constexpr int64_t kMaxValues = int64_t{1} << 20;
  int depth = 0;
  int64_t values = 0;
  std::string error;

  bool Value() {
    if (++values <= kMaxValues) return true;
    error = absl::StrCat("more than ", kMaxValues, " values");
    return false;
  }
  bool Open() {
    if (++depth <= kMaxDepth && Value()) return true;
    if (error.empty()) error = absl::StrCat("nested deeper than ", kMaxDepth, " levels");
    return false;
  }
  bool null() override { return Value(); }
  bool boolean(bool) override { return Value(); }
  bool number_integer(number_integer_t) override { return Value(); }
  bool number_unsigned(number_unsigned_t) override { return Value(); }
  bool number_float(number_float_t, const string_t&) override { return Value(); }
  bool string(string_t&) override { return Value(); }
  bool binary(binary_t&) override { return Value(); }
  bool start_object(std::size_t) override { return Open(); }
  bool key(string_t&) override { return true; }
  bool end_object() override {
    --depth;
    return true;
  }
  bool start_array(std::size_t) override { return Open(); }
  bool end_array() override {
    --depth;
    return true;
  }
  bool parse_error(std::size_t, const std::string&, const nlohmann::detail::exception& e) override {
    error = e.what();  // a syntax error, or a number out of a double's range
    return false;
  }
};

}  // namespace

std::string ErrorParam(const absl::Status& status) {
  const auto p = status.GetPayload(kParamPayload);
  return p ? std::string(*p) : "";
}

absl::StatusOr<OpenAiRequest> ParseOpenAiRequest(absl::string_view body, OpenAiEndpoint endpoint) {
  // First a pass that builds nothing: syntax, numbers a double cannot hold,
  // and the limits, each with the parser's message naming the byte.
  JsonLimits limits;
  if (!json::sax_parse(body.begin(), body.end(), &limits)) {
    return Bad("body", absl::StrCat("not valid JSON: ", limits.error.empty() ? "parse error" : limits.error));
  }
  const json parsed = json::parse(body.begin(), body.end(), nullptr, /*allow_exceptions=*/false);
  if (parsed.is_discarded()) return Bad("body", "not valid JSON");
  OpenAiRequest r;
  try {
    if (absl::Status s = Parse(parsed, endpoint, &r); !s.ok()) return s;
  } catch (const json::exception& e) {
    // Every read above checks its type first; this is the net under them,
    // so a request can never take the daemon down.
    return Bad("body", absl::StrCat("unexpected JSON: ", e.what()));
  }
  return r;
}

void ResolveMaxTokens(OpenAiRequest& request, int32_t session_context_length) {
  if (request.max_tokens_given) return;
  request.turn.stopping.max_new_tokens =
      request.endpoint == OpenAiEndpoint::kCompletions ? 16 : std::max<int32_t>(1, session_context_length);
}

}  // namespace decoded::server::http
