// The field of a turn an engine check refused, carried with the
// INVALID_ARGUMENT status as a payload: the engine knows which part of a turn
// broke a rule or a limit (its input, its stop sequences, ...), and each front
// door names that part in its own API's terms (the OpenAI API's error "param":
// "prompt" or "messages", "stop", "max_tokens").
#ifndef DECODED_ENGINE_SERVING_TURN_FIELD_H_
#define DECODED_ENGINE_SERVING_TURN_FIELD_H_

#include <optional>
#include <string>

#include "absl/status/status.h"
#include "absl/strings/cord.h"
#include "absl/strings/string_view.h"

namespace decoded::serving {

enum class TurnField {
  kInput,          // the prompt: text, chat messages or token ids
  kStopSequences,  // StoppingParams::stop_sequences
  kStopTokenIds,   // StoppingParams::stop_token_ids
  kMaxNewTokens,   // StoppingParams::max_new_tokens
  kLogitBias,      // SamplingParams::logit_bias
  kLast = kLogitBias,
};

inline constexpr absl::string_view kTurnFieldPayload = "decoded.serving.turn_field";

// INVALID_ARGUMENT(message), naming `field` (one digit: the enumerator).
inline absl::Status TurnFieldError(TurnField field, absl::string_view message) {
  absl::Status s = absl::InvalidArgumentError(message);
  s.SetPayload(kTurnFieldPayload, absl::Cord(std::string(1, static_cast<char>('0' + static_cast<int>(field)))));
  return s;
}

// The field `status` names, if an engine check set one.
inline std::optional<TurnField> TurnFieldOf(const absl::Status& status) {
  const auto payload = status.GetPayload(kTurnFieldPayload);  // absl::optional in Debian's Abseil
  if (!payload || payload->size() != 1) return std::nullopt;
  const char c = (*payload)[0];
  if (c < '0' || c > '0' + static_cast<int>(TurnField::kLast)) return std::nullopt;
  return static_cast<TurnField>(c - '0');
}

}  // namespace decoded::serving

#endif  // DECODED_ENGINE_SERVING_TURN_FIELD_H_
