#include "client/load_generator.h"

#include <algorithm>
#include <chrono>
#include <optional>
#include <random>
#include <thread>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "client/metrics_scrape.h"
#include "client/turn_stream.h"
#include "nlohmann/json.hpp"

namespace decoded::client {
namespace {

using Clock = std::chrono::steady_clock;
double Ms(Clock::time_point a, Clock::time_point b) { return std::chrono::duration<double, std::milli>(b - a).count(); }

// What the client does to a turn while it runs.
enum class Action {
  kNone,
  kCancelAtOnce,     // Cancel right after the turn (cuts it while queued or in prefill)
  kCancelAfter,      // Cancel after `after` token events
  kDisconnectAfter,  // drop the stream after `after` token events (0: right after sending)
};

struct TurnPlan {
  std::vector<int32_t> prompt;
  Action action = Action::kNone;
  int after = 0;
};

struct StreamPlan {
  std::vector<TurnPlan> turns;
  bool acknowledge = false;
};

struct TurnRecord {
  bool ended = false;         // a TurnEnd arrived
  bool cancel_sent = false;
  bool disconnected = false;  // the client dropped the stream during this turn
  bool has_status = false;    // the stream ended during this turn with `status`
  grpc::Status status;
  v1::TurnEnd end;
  std::vector<int32_t> ids;
  double ttft_ms = -1;
  std::vector<double> gaps_ms;
};

struct StreamRecord {
  std::vector<TurnRecord> turns;
  bool finished_cleanly = false;  // every turn ended and the stream closed with OK
  grpc::Status final_status;
};

std::chrono::system_clock::time_point DeadlineIn(double seconds) {
  return std::chrono::system_clock::now() + std::chrono::microseconds(static_cast<int64_t>(seconds * 1e6));
}

v1::Turn TokenTurn(const std::vector<int32_t>& ids, int max_new_tokens) {
  v1::Turn turn;
  for (int32_t id : ids) turn.mutable_tokens()->add_ids(id);
  turn.mutable_sampling()->set_temperature(0);
  turn.mutable_stopping()->set_max_new_tokens(max_new_tokens);
  turn.mutable_stopping()->set_ignore_eos(true);
  return turn;
}

std::vector<StreamPlan> MakePlans(const LoadOptions& o, const v1::ModelInfo& info) {
  // Ids spread over the vocabulary, clear of the low control/byte ids of
  // large vocabularies.
  const int lo = info.vocab_size() > 2000 ? 1000 : 0;
  const int hi = std::min(info.vocab_size(), lo + 50000);
  std::vector<StreamPlan> plans(static_cast<size_t>(o.streams));
  for (int s = 0; s < o.streams; ++s) {
    std::mt19937_64 rng(o.seed * 1000003 + static_cast<uint64_t>(s));
    std::uniform_real_distribution<double> u(0, 1);
    StreamPlan& p = plans[static_cast<size_t>(s)];
    p.acknowledge = u(rng) < o.acknowledge_fraction;
    for (int t = 0; t < o.turns; ++t) {
      TurnPlan turn;
      const int n = std::uniform_int_distribution<int>(o.min_prompt_tokens, o.max_prompt_tokens)(rng);
      if (t == 0) turn.prompt.push_back(info.bos_id());
      while (static_cast<int>(turn.prompt.size()) < n) {
        turn.prompt.push_back(std::uniform_int_distribution<int>(lo, hi - 1)(rng));
      }
      const double x = u(rng);
      if (x < o.disconnect_probability) {
        turn.action = Action::kDisconnectAfter;
        turn.after = std::uniform_int_distribution<int>(0, std::max(0, o.max_new_tokens - 1))(rng);
      } else if (x < o.disconnect_probability + o.cancel_probability) {
        if (u(rng) < 0.25) {
          turn.action = Action::kCancelAtOnce;
        } else {
          turn.action = Action::kCancelAfter;
          turn.after = std::uniform_int_distribution<int>(1, std::max(1, o.max_new_tokens - 1))(rng);
        }
      }
      p.turns.push_back(std::move(turn));
    }
  }
  return plans;
}

// Runs one stream's plan; fills `rec`.
void RunStream(v1::Decoder::Stub* stub, const StreamPlan& plan, const LoadOptions& o,
               std::chrono::system_clock::time_point deadline, StreamRecord* rec) {
  grpc::ClientContext ctx;
  ctx.set_deadline(deadline);
  auto stream = stub->Generate(&ctx);
  v1::GenerateRequest cancel, ack;
  cancel.mutable_cancel();
  ack.mutable_ack()->set_events(1);
  bool broken = false;
  for (size_t k = 0; k < plan.turns.size() && !broken; ++k) {
    const TurnPlan& tp = plan.turns[k];
    TurnRecord& r = rec->turns.emplace_back();
    v1::GenerateRequest request;
    *request.mutable_turn() = TokenTurn(tp.prompt, o.max_new_tokens);
    request.mutable_turn()->set_acknowledge_events(plan.acknowledge);
    const auto sent_at = Clock::now();
    auto last = sent_at;
    if (!stream->Write(request)) {
      broken = true;
      break;
    }
    if (tp.action == Action::kCancelAtOnce) r.cancel_sent = stream->Write(cancel);
    if (tp.action == Action::kDisconnectAfter && tp.after == 0) {
      ctx.TryCancel();
      r.disconnected = broken = true;
      break;
    }
    v1::GenerateResponse response;
    while (stream->Read(&response)) {
      if (response.has_token()) {
        const auto now = Clock::now();
        r.ids.push_back(response.token().id());
        if (r.ids.size() == 1) {
          r.ttft_ms = Ms(sent_at, now);
        } else {
          r.gaps_ms.push_back(Ms(last, now));
        }
        last = now;
        // A failed write means the stream is ending: the next Read says how.
        if (plan.acknowledge) stream->Write(ack);
        const int n = static_cast<int>(r.ids.size());
        if (tp.action == Action::kCancelAfter && n == tp.after && !r.cancel_sent) r.cancel_sent = stream->Write(cancel);
        if (tp.action == Action::kDisconnectAfter && n == tp.after) {
          ctx.TryCancel();
          r.disconnected = true;
          break;
        }
      } else if (response.has_turn_end()) {
        r.end = response.turn_end();
        r.ended = true;
        break;
      }
    }
    if (!r.ended) broken = true;
  }
  if (!broken) stream->WritesDone();
  rec->final_status = stream->Finish();
  if (broken && !rec->turns.empty()) {
    rec->turns.back().has_status = true;
    rec->turns.back().status = rec->final_status;
  }
  rec->finished_cleanly = !broken && rec->final_status.ok();
}

std::string StatusText(const grpc::Status& s) {
  return absl::StrCat(s.error_code(), " (", s.error_message(), ")");
}

// The protocol's checks on one stream of the load phase.
void CheckStream(int s, const StreamPlan& plan, const StreamRecord& rec, const LoadOptions& o,
                 std::vector<std::string>* violations) {
  int32_t previous_context = 0;
  for (size_t k = 0; k < rec.turns.size(); ++k) {
    const TurnRecord& r = rec.turns[k];
    const std::string where = absl::StrCat("stream ", s, " turn ", k, ": ");
    if (!r.ended) {
      if (!r.has_status) {
        violations->push_back(where + "ended with neither a TurnEnd nor a status");
      } else if (r.disconnected) {
        if (r.status.error_code() != grpc::StatusCode::CANCELLED) {
          violations->push_back(where + "dropped by the client, but the stream ended with " + StatusText(r.status));
        }
      } else {
        violations->push_back(where + "the stream ended before the TurnEnd with " + StatusText(r.status));
      }
      continue;
    }
    const v1::Usage& u = r.end.usage();
    const int prompt = static_cast<int>(plan.turns[k].prompt.size());
    if (u.generated_tokens() != static_cast<int>(r.ids.size())) {
      violations->push_back(absl::StrCat(where, "usage.generated_tokens ", u.generated_tokens(), " but ",
                                         r.ids.size(), " token events"));
    }
    if (u.prompt_tokens() != prompt) {
      violations->push_back(absl::StrCat(where, "usage.prompt_tokens ", u.prompt_tokens(), ", sent ", prompt));
    }
    // cached_tokens is the context carried over (all of it unless the
    // server preempted the session and recomputes some) plus prompt tokens
    // the prefix cache held, which a prompt another stream (or an earlier
    // run with this seed) sent can give: at most the carried context and the
    // whole prompt. The context itself grows by exactly prompt + generated.
    if (u.cached_tokens() < 0 || u.cached_tokens() > previous_context + prompt) {
      violations->push_back(absl::StrCat(where, "usage.cached_tokens ", u.cached_tokens(), " outside [0, ",
                                         previous_context, " carried + ", prompt, " prompt]"));
    }
    const bool cut_in_prefill = r.end.finish_reason() == v1::CANCELLED && r.ids.empty();
    if (cut_in_prefill) {
      if (u.context_tokens() < u.cached_tokens() || u.context_tokens() > previous_context + prompt) {
        violations->push_back(absl::StrCat(where, "cut in prefill, but context ", u.context_tokens(),
                                           " is outside [cached, previous context ", previous_context,
                                           " + prompt]"));
      }
    } else if (u.context_tokens() != previous_context + u.prompt_tokens() + u.generated_tokens()) {
      violations->push_back(absl::StrCat(where, "usage.context_tokens ", u.context_tokens(), " != previous context ",
                                         previous_context, " + prompt ", u.prompt_tokens(), " + generated ",
                                         u.generated_tokens()));
    }
    if (r.end.finish_reason() == v1::CANCELLED) {
      if (!r.cancel_sent) violations->push_back(where + "ended CANCELLED, but no Cancel was sent");
    } else if (r.end.finish_reason() != v1::LENGTH || static_cast<int>(r.ids.size()) != o.max_new_tokens) {
      violations->push_back(absl::StrCat(where, "ended ", v1::FinishReason_Name(r.end.finish_reason()), " after ",
                                         r.ids.size(), " tokens; expected LENGTH after ", o.max_new_tokens,
                                         " (ignore_eos)"));
    }
    previous_context = u.context_tokens();
  }
  if (!rec.turns.empty() && !rec.turns.back().disconnected && rec.turns.back().ended && !rec.final_status.ok()) {
    violations->push_back(absl::StrCat("stream ", s, ": closed with ", StatusText(rec.final_status),
                                       " after its last TurnEnd"));
  }
}

// Replays the turns of one load stream that ended with a TurnEnd, alone, and
// compares its greedy ids. A turn that the load run completed replays as is.
// A cancelled turn replays with max_new_tokens = the tokens it generated
// before the cancel took effect (greedy: the solo run must produce the same
// prefix); one cut in prefill replays as the part of its prompt that entered
// the context, with max_new_tokens = 0 (skipped if none did). So the replay
// builds exactly the context the load run built, turn by turn.
int ReplayAndCompare(v1::Decoder::Stub* stub, int s, const StreamPlan& plan, const StreamRecord& rec,
                     const LoadOptions& o, const v1::ModelInfo& info, bool* corrupt_pending,
                     std::vector<std::string>* violations) {
  grpc::ClientContext ctx;
  ctx.set_deadline(DeadlineIn(o.deadline_seconds));
  auto stream = stub->Generate(&ctx);
  int compared = 0;
  for (size_t k = 0; k < rec.turns.size() && rec.turns[k].ended; ++k) {
    const TurnRecord& r = rec.turns[k];
    const std::string where = absl::StrCat("stream ", s, " turn ", k, ": ");
    std::vector<int32_t> prompt = plan.turns[k].prompt;
    int max_new = o.max_new_tokens;
    if (r.end.finish_reason() == v1::CANCELLED) {
      max_new = static_cast<int>(r.ids.size());
      if (r.ids.empty()) {
        const int entered = r.end.usage().context_tokens() - r.end.usage().cached_tokens();
        if (entered <= 0) continue;
        prompt.resize(static_cast<size_t>(std::min<int>(entered, static_cast<int>(prompt.size()))));
      }
    }
    v1::GenerateRequest request;
    *request.mutable_turn() = TokenTurn(prompt, max_new);
    if (!stream->Write(request)) break;
    std::vector<int32_t> solo;
    v1::GenerateResponse response;
    bool ended = false;
    v1::TurnEnd end;
    while (stream->Read(&response)) {
      if (response.has_token()) solo.push_back(response.token().id());
      if (response.has_turn_end()) {
        end = response.turn_end();
        ended = true;
        break;
      }
    }
    if (!ended) {
      violations->push_back(absl::StrCat(where, "solo replay failed: ", StatusText(stream->Finish())));
      return compared;
    }
    if (*corrupt_pending && !solo.empty()) {
      solo[0] = (solo[0] + 1) % info.vocab_size();
      *corrupt_pending = false;
    }
    ++compared;
    if (solo != r.ids) {
      size_t i = 0;
      while (i < solo.size() && i < r.ids.size() && solo[i] == r.ids[i]) ++i;
      violations->push_back(absl::StrCat(
          where, "greedy ids differ from the solo replay at token ", i, " of ", r.ids.size(), " (load ",
          i < r.ids.size() ? absl::StrCat(r.ids[i]) : "none", ", solo ", i < solo.size() ? absl::StrCat(solo[i]) : "none",
          "); load [", absl::StrJoin(r.ids, " "), "] solo [", absl::StrJoin(solo, " "), "], context ",
          r.end.usage().cached_tokens(), " + ", prompt.size(), " tokens"));
    }
    if (end.usage().context_tokens() != r.end.usage().context_tokens()) {
      violations->push_back(absl::StrCat(where, "solo replay ended at context ", end.usage().context_tokens(),
                                         ", the load run at ", r.end.usage().context_tokens()));
    }
  }
  stream->WritesDone();
  if (grpc::Status st = stream->Finish(); !st.ok()) {
    violations->push_back(absl::StrCat("stream ", s, ": solo replay closed with ", StatusText(st)));
  }
  return compared;
}

// Gauges that must read 0 once no stream is open.
constexpr const char* kZeroGauges[] = {"decoded_sessions_active", "decoded_bound_nodes", "decoded_kv_bytes",
                                       "decoded_sessions_queued", "decoded_workers_busy"};
constexpr const char* kErrorSessions = "decoded_sessions_total{outcome=\"error\"}";

// Polls /metrics until every gauge of kZeroGauges reads 0.
void CheckGaugesSettle(const LoadOptions& o, const std::string& phase, std::vector<std::string>* violations) {
  const auto deadline = Clock::now() + std::chrono::microseconds(static_cast<int64_t>(o.settle_seconds * 1e6));
  std::string last;
  while (true) {
    absl::StatusOr<std::string> body = ScrapeMetrics(o.metrics_address);
    if (!body.ok()) {
      last = body.status().ToString();
    } else {
      std::vector<std::string> nonzero;
      for (const char* g : kZeroGauges) {
        std::optional<double> v = MetricSample(*body, g);
        if (!v.has_value()) {
          nonzero.push_back(absl::StrCat(g, " absent"));
        } else if (*v != 0) {
          nonzero.push_back(absl::StrCat(g, " = ", *v));
        }
      }
      if (nonzero.empty()) return;
      last = absl::StrJoin(nonzero, ", ");
    }
    if (Clock::now() >= deadline) break;
    std::this_thread::sleep_for(std::chrono::milliseconds(50));
  }
  violations->push_back(absl::StrCat("after the ", phase, " phase, ", o.settle_seconds, " s with no stream open: ",
                                     last));
}

std::optional<double> ErrorSessions(const LoadOptions& o) {
  absl::StatusOr<std::string> body = ScrapeMetrics(o.metrics_address);
  if (!body.ok()) return std::nullopt;
  return MetricSample(*body, kErrorSessions);
}

double Percentile(std::vector<double> v, double q) {
  if (v.empty()) return 0;
  std::sort(v.begin(), v.end());
  return v[std::min(v.size() - 1, static_cast<size_t>(static_cast<double>(v.size()) * q))];
}

absl::Status Validate(const LoadOptions& o, const v1::ModelInfo& info) {
  if (o.streams < 1 || o.turns < 1) return absl::InvalidArgumentError("streams and turns must be >= 1");
  if (o.min_prompt_tokens < 1 || o.max_prompt_tokens < o.min_prompt_tokens) {
    return absl::InvalidArgumentError("prompt lengths must satisfy 1 <= min_prompt_tokens <= max_prompt_tokens");
  }
  if (o.max_new_tokens < 1) return absl::InvalidArgumentError("max_new_tokens must be >= 1");
  if (o.cancel_probability < 0 || o.disconnect_probability < 0 ||
      o.cancel_probability + o.disconnect_probability > 1) {
    return absl::InvalidArgumentError("cancel and disconnect probabilities must be >= 0 and sum to <= 1");
  }
  if (!(o.deadline_seconds > 0) || !(o.settle_seconds >= 0)) {
    return absl::InvalidArgumentError("deadline_seconds must be > 0 and settle_seconds >= 0");
  }
  const int64_t need = int64_t{o.turns} * (o.max_prompt_tokens + o.max_new_tokens);
  if (need > info.session_context_length()) {
    return absl::InvalidArgumentError(absl::StrCat("turns x (max_prompt_tokens + max_new_tokens) = ", need,
                                                   " tokens exceed the daemon's session context of ",
                                                   info.session_context_length()));
  }
  if (o.streams > info.max_sessions()) {
    return absl::InvalidArgumentError(
        absl::StrCat("streams ", o.streams, " exceed the daemon's max_sessions ", info.max_sessions()));
  }
  return absl::OkStatus();
}

}  // namespace

std::string LoadReport::ToJson() const {
  nlohmann::json j = {{"streams", streams},
                      {"turns_sent", turns_sent},
                      {"turns_completed", turns_completed},
                      {"turns_cancelled", turns_cancelled},
                      {"cancels_sent", cancels_sent},
                      {"disconnects", disconnects},
                      {"turns_compared_with_solo", turns_compared},
                      {"tokens", tokens},
                      {"load_seconds", load_seconds},
                      {"solo_seconds", solo_seconds},
                      {"tokens_per_second", tokens_per_second},
                      {"inter_token_ms_p50", inter_token_ms_p50},
                      {"inter_token_ms_p99", inter_token_ms_p99},
                      {"ttft_ms_p50", ttft_ms_p50},
                      {"ttft_ms_p99", ttft_ms_p99},
                      {"gauges_checked", gauges_checked},
                      {"violations", violations}};
  return j.dump(-1, ' ', false, nlohmann::json::error_handler_t::replace);
}

absl::StatusOr<LoadReport> RunLoadTest(const std::shared_ptr<grpc::Channel>& channel, const LoadOptions& o) {
  auto stub = v1::Decoder::NewStub(channel);
  v1::ModelInfo info;
  {
    grpc::ClientContext ctx;
    ctx.set_deadline(DeadlineIn(30));
    if (grpc::Status st = stub->GetModelInfo(&ctx, v1::GetModelInfoRequest(), &info); !st.ok()) {
      return absl::Status(static_cast<absl::StatusCode>(st.error_code()), "GetModelInfo: " + st.error_message());
    }
  }
  if (absl::Status st = Validate(o, info); !st.ok()) return st;
  LoadReport report;
  report.streams = o.streams;
  report.gauges_checked = !o.metrics_address.empty();
  std::optional<double> errors_before;
  if (report.gauges_checked) {
    errors_before = ErrorSessions(o);
    if (!errors_before.has_value()) {
      return absl::UnavailableError("cannot read " + std::string(kErrorSessions) + " from " + o.metrics_address);
    }
  }

  // 1. Load: every stream at once.
  const std::vector<StreamPlan> plans = MakePlans(o, info);
  std::vector<StreamRecord> records(plans.size());
  const auto load_deadline = DeadlineIn(o.deadline_seconds);
  const auto t0 = Clock::now();
  {
    std::vector<std::thread> threads;
    for (size_t s = 0; s < plans.size(); ++s) {
      threads.emplace_back([&, s] { RunStream(stub.get(), plans[s], o, load_deadline, &records[s]); });
    }
    for (std::thread& t : threads) t.join();
  }
  report.load_seconds = Ms(t0, Clock::now()) / 1e3;
  std::vector<double> gaps, ttfts;
  for (size_t s = 0; s < plans.size(); ++s) {
    CheckStream(static_cast<int>(s), plans[s], records[s], o, &report.violations);
    for (const TurnRecord& r : records[s].turns) {
      ++report.turns_sent;
      report.cancels_sent += r.cancel_sent;
      report.disconnects += r.disconnected;
      report.tokens += static_cast<int64_t>(r.ids.size());
      if (r.ended) (r.end.finish_reason() == v1::CANCELLED ? report.turns_cancelled : report.turns_completed)++;
      gaps.insert(gaps.end(), r.gaps_ms.begin(), r.gaps_ms.end());
      if (r.ttft_ms >= 0) ttfts.push_back(r.ttft_ms);
    }
  }
  report.tokens_per_second = report.tokens / std::max(report.load_seconds, 1e-9);
  report.inter_token_ms_p50 = Percentile(gaps, 0.50);
  report.inter_token_ms_p99 = Percentile(gaps, 0.99);
  report.ttft_ms_p50 = Percentile(ttfts, 0.50);
  report.ttft_ms_p99 = Percentile(ttfts, 0.99);
  if (report.gauges_checked) CheckGaugesSettle(o, "load", &report.violations);

  // 2. Solo: each stream replayed alone.
  const auto t1 = Clock::now();
  bool corrupt_pending = o.corrupt_reference_for_testing;
  for (size_t s = 0; s < plans.size(); ++s) {
    report.turns_compared += ReplayAndCompare(stub.get(), static_cast<int>(s), plans[s], records[s], o, info,
                                              &corrupt_pending, &report.violations);
  }
  report.solo_seconds = Ms(t1, Clock::now()) / 1e3;
  if (o.corrupt_reference_for_testing && corrupt_pending) {
    report.violations.push_back("--corrupt_reference_for_testing: no turn with tokens was replayed to corrupt");
  }
  if (report.gauges_checked) {
    CheckGaugesSettle(o, "solo", &report.violations);
    std::optional<double> errors_after = ErrorSessions(o);
    if (!errors_after.has_value() || *errors_after != *errors_before) {
      report.violations.push_back(absl::StrCat(kErrorSessions, " went from ", *errors_before, " to ",
                                               errors_after.has_value() ? absl::StrCat(*errors_after) : "absent"));
    }
  }
  return report;
}

}  // namespace decoded::client
