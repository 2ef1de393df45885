#include "server/proto_convert.h"

#include <algorithm>

namespace decoded::server {

absl::StatusOr<serving::TurnRequest> TurnFromProto(const v1::Turn& turn) {
  serving::TurnRequest req;
  switch (turn.input_case()) {
    case v1::Turn::kText:
      req.kind = serving::TurnRequest::InputKind::kText;
      req.text = turn.text();
      break;
    case v1::Turn::kMessages:
      req.kind = serving::TurnRequest::InputKind::kMessages;
      for (const v1::ChatMessage& m : turn.messages().messages()) req.messages.push_back({m.role(), m.content()});
      break;
    case v1::Turn::kTokens:
      req.kind = serving::TurnRequest::InputKind::kTokens;
      req.tokens.assign(turn.tokens().ids().begin(), turn.tokens().ids().end());
      break;
    case v1::Turn::INPUT_NOT_SET:
      return absl::InvalidArgumentError("the turn has no input (set text, messages or tokens)");
  }
  const v1::SamplingParams& s = turn.sampling();
  req.sampling.temperature = s.temperature();
  req.sampling.top_k = s.top_k();
  req.sampling.top_p = s.has_top_p() ? s.top_p() : 1.0f;
  req.sampling.min_p = s.min_p();
  req.sampling.repetition_penalty = s.has_repetition_penalty() ? s.repetition_penalty() : 1.0f;
  req.sampling.presence_penalty = s.presence_penalty();
  req.sampling.frequency_penalty = s.frequency_penalty();
  req.sampling.seed = s.seed();
  req.sampling.top_logprobs = s.top_logprobs();
  // By id: a proto map's order is unspecified, the sampler's sums need none
  // (one add per id) but a fixed order keeps the request reproducible.
  req.sampling.logit_bias.assign(s.logit_bias().begin(), s.logit_bias().end());
  std::sort(req.sampling.logit_bias.begin(), req.sampling.logit_bias.end());
  const v1::StoppingCriteria& st = turn.stopping();
  req.stopping.max_new_tokens = st.has_max_new_tokens() ? st.max_new_tokens() : 256;
  req.stopping.stop_sequences.assign(st.stop_sequences().begin(), st.stop_sequences().end());
  req.stopping.stop_token_ids.assign(st.stop_token_ids().begin(), st.stop_token_ids().end());
  req.stopping.ignore_eos = st.ignore_eos();
  req.prompt_logprobs = turn.prompt_logprobs();
  return req;
}

void TokenEventToProto(const serving::TokenEvent& event, const serving::Engine& engine, v1::TokenEvent* out) {
  out->set_id(event.id);
  out->set_text(event.text);
  out->set_logprob(event.logprob);
  for (const TokenLogprob& alt : event.top) {
    v1::TokenLogprob* p = out->add_top_logprobs();
    p->set_id(alt.id);
    p->set_logprob(alt.logprob);
    const int32_t ids[] = {alt.id};
    if (absl::StatusOr<std::string> text = engine.Detokenize(ids, false); text.ok()) p->set_text(*text);
  }
}

namespace {

v1::FinishReason ReasonToProto(serving::FinishReason reason) {
  switch (reason) {
    case serving::FinishReason::kStopToken: return v1::STOP_TOKEN;
    case serving::FinishReason::kStopSequence: return v1::STOP_SEQUENCE;
    case serving::FinishReason::kLength: return v1::LENGTH;
    case serving::FinishReason::kCancelled: return v1::CANCELLED;
    case serving::FinishReason::kContextFull: return v1::CONTEXT_FULL;
    case serving::FinishReason::kShutdown: return v1::SHUTDOWN;
    case serving::FinishReason::kError: break;
  }
  return v1::FINISH_REASON_UNSPECIFIED;
}

}  // namespace

void TurnEndToProto(const serving::TurnEnd& end, v1::TurnEnd* out) {
  out->set_finish_reason(ReasonToProto(end.reason));
  out->mutable_usage()->set_prompt_tokens(end.usage.prompt_tokens);
  out->mutable_usage()->set_generated_tokens(end.usage.generated_tokens);
  out->mutable_usage()->set_cached_tokens(end.usage.cached_tokens);
  out->mutable_usage()->set_prefilled_tokens(end.usage.prefilled_tokens);
  out->mutable_usage()->set_context_tokens(end.usage.context_tokens);
  v1::Timings* t = out->mutable_timings();
  t->set_queue_ms(end.timings.queue_ms);
  t->set_ttft_ms(end.timings.ttft_ms);
  t->set_prefill_ms(end.timings.prefill_ms);
  t->set_decode_ms(end.timings.decode_ms);
  t->set_mean_inter_token_ms(end.timings.mean_inter_token_ms);
  out->mutable_prompt_logprobs()->Add(end.prompt_logprobs.begin(), end.prompt_logprobs.end());
  out->set_text(end.text);
}

}  // namespace decoded::server
