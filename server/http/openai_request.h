// OpenAI Completions and Chat Completions request bodies -> an engine turn
// (https://platform.openai.com/docs/api-reference/completions/create and
// .../chat/create; vLLM's extra sampling fields, as its OpenAI server reads
// them).
//
// Accepted (anything else in the body is ignored, as OpenAI and vLLM do):
//   both    model (required), max_tokens (and, for chat, max_completion_tokens,
//           which wins), temperature [0, 2], top_p (0, 1], presence_penalty
//           and frequency_penalty [-2, 2], stop (a string or a list), seed,
//           n (1 only: a KV cache cannot be forked yet), stream,
//           stream_options.include_usage (with stream only), user (ignored);
//           vLLM's top_k (-1 or 0: off), min_p [0, 1), repetition_penalty
//           (> 0), ignore_eos.
//   completions  prompt: a string, a list of one string, a list of token ids
//           or a list of one such list (several prompts: 400); echo;
//           logprobs 0..20 (alternatives per token; with echo, the prompt's
//           logprobs too, without alternatives, and not when streaming:
//           400); text_offset counts characters; best_of 1 only;
//           suffix null only. Default max_tokens 16 (OpenAI's).
//   chat    messages: system, developer (as system), user and assistant
//           roles, content a string or a list of {"type": "text"} parts;
//           logprobs (bool) and top_logprobs 0..20; tools, a tool role,
//           non-text parts and response_format other than text: 400.
//           Default max_tokens: the rest of the context.
// A temperature of 0 (or below 1e-5) is greedy; without a seed, a sampled
// request gets a random one (OpenAI's requests are not reproducible unless
// seeded).
//
// Errors: INVALID_ARGUMENT whose message names the field, with the field's
// name as the payload kParamPayload (OpenAI's error "param"); "body" for
// JSON that does not parse, holds a number beyond a double, nests deeper
// than 64 levels or holds more than 2^20 values (checked before a DOM is
// built). Never an exception.
#ifndef DECODED_SERVER_HTTP_OPENAI_REQUEST_H_
#define DECODED_SERVER_HTTP_OPENAI_REQUEST_H_

#include <cstdint>
#include <string>

#include "absl/status/statusor.h"
#include "absl/strings/string_view.h"
#include "engine/serving/engine.h"

namespace decoded::server::http {

enum class OpenAiEndpoint { kCompletions, kChatCompletions };

struct OpenAiRequest {
  OpenAiEndpoint endpoint = OpenAiEndpoint::kCompletions;
  std::string model;
  serving::TurnRequest turn;
  bool max_tokens_given = false;  // else the endpoint's default applies (see ResolveMaxTokens)
  bool stream = false;
  bool include_usage = false;  // stream_options.include_usage
  bool echo = false;           // completions: the prompt's text before the completion
  // Log probabilities asked for: completions' logprobs (-1: none) or chat's
  // logprobs: true (top_logprobs alternatives each).
  bool logprobs = false;
  int32_t top_logprobs = 0;
};

// The payload key of the field an INVALID_ARGUMENT names.
inline constexpr absl::string_view kParamPayload = "decoded.openai.param";

// The field a ParseOpenAiRequest error names ("" if none).
std::string ErrorParam(const absl::Status& status);

absl::StatusOr<OpenAiRequest> ParseOpenAiRequest(absl::string_view body, OpenAiEndpoint endpoint);

// max_new_tokens when the request named none: 16 for completions (OpenAI's
// default), the session's whole context for chat (the engine ends the turn
// when the context is full).
void ResolveMaxTokens(OpenAiRequest& request, int32_t session_context_length);

}  // namespace decoded::server::http

#endif  // DECODED_SERVER_HTTP_OPENAI_REQUEST_H_
