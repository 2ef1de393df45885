// burst_bench: time to first token of a burst of clients arriving at once
// while other sessions decode, against the compute bound of the same prefill
// work sent as one prompt, through a running `decoded` (issue 18, part 6a).
//
// One repeat:
//   1. --background streams each send a token-id turn (--background_prompt_tokens,
//      greedy, ignore_eos, max_new_tokens up to the context) and decode until
//      the repeat ends (then they are cancelled). The burst waits until every
//      one of them has had --settle_tokens tokens.
//   2. The burst: --burst streams, opened beforehand, are released together
//      (a barrier); each writes a turn of --prompt_tokens ids (BOS, then ids
//      spread over the vocabulary, distinct per stream and repeat, so no two
//      prompts share a prefix past BOS) with max_new_tokens --burst_tokens.
//   3. The background is cancelled; then the bound: on the quiet daemon, one
//      stream sends the burst's prefill work as one prompt: BOS, then
//      burst * (prompt_tokens - 1) ids (new ids, sharing no prefix with the
//      burst's), max_new_tokens 1. Its TTFT is the compute bound of the
//      burst's last first token: the same prefill work packed as well as one
//      prompt's, with nothing else to do.
// Reported (JSON on stdout; the percentiles pool every repeat; last, bound
// and last/bound are medians over the repeats, last/bound of each repeat's
// own pair, with its min and max; the window rates are the median repeat's
// by last_ttft_ms):
//   ttft_ms_p50/p99     per burst stream: its write -> its first token.
//   last_ttft_ms        the burst's release -> the last burst stream's first token.
//   bound_ttft_ms       the bound stream's write -> its first token.
//   last_over_bound     last_ttft_ms / bound_ttft_ms of each repeat, median (issue
//                       target: <= 1.25); last_over_bound_min/max its range.
//   background_itl_ms_p99/max   gaps between consecutive tokens of a
//                       background stream that overlap the burst window
//                       (release, last burst first token]: how long decoding
//                       sessions waited while the burst was prefilled (with
//                       fewer than 100 gaps, p99 is the largest).
//   background_itl_ms_p50_before   the same streams' gaps wholly inside the
//                       --before_ms window that ends at the release, every
//                       background session decoding (their undisturbed rate).
//   burst_window_tok_s  every token event of every stream (background and
//                       burst) inside the burst window / its length.
//   background_tok_s_before   background token events in the before window /
//                       its length.
// Every burst stream must end with LENGTH after --burst_tokens tokens and the
// bound with LENGTH after 1; anything else fails the run (exit 1). Run the
// daemon with --max_sessions >= background + burst + 1 and --context_length >=
// burst * prompt_tokens + 1 (bench/run_burst_bench.py does).
#include <algorithm>
#include <atomic>
#include <barrier>
#include <chrono>
#include <cstdio>
#include <memory>
#include <string>
#include <thread>
#include <vector>

#include "absl/flags/flag.h"
#include "absl/flags/parse.h"
#include "absl/strings/str_cat.h"
#include "absl/synchronization/mutex.h"
#include "grpcpp/grpcpp.h"
#include "proto/decoded.grpc.pb.h"

ABSL_FLAG(std::string, server, "127.0.0.1:50051", "daemon address");
ABSL_FLAG(std::string, auth_token, "", "bearer token, if the daemon requires one");
ABSL_FLAG(int, burst, 16, "clients arriving at once");
ABSL_FLAG(int, prompt_tokens, 16, "prompt length of each burst client (BOS included)");
ABSL_FLAG(int, burst_tokens, 4, "tokens each burst client generates (max_new_tokens, ignore_eos)");
ABSL_FLAG(int, background, 8, "sessions decoding throughout (0: none)");
ABSL_FLAG(int, background_prompt_tokens, 16, "prompt length of each background session");
ABSL_FLAG(int, settle_tokens, 4, "tokens every background session has had before the burst is released");
ABSL_FLAG(int, before_ms, 2000, "the background's undisturbed window before each burst (its 'before' figures)");
ABSL_FLAG(int, repeats, 3, "bursts measured (each with its own background sessions and bound)");
ABSL_FLAG(bool, warmup, true, "one unmeasured burst first (the daemon builds the plans the sizes need)");

namespace {

using Clock = std::chrono::steady_clock;
namespace v1 = decoded::v1;

double Ms(Clock::time_point t, Clock::time_point epoch) {
  return std::chrono::duration<double, std::milli>(t - epoch).count();
}

double Percentile(std::vector<double> v, double q) {
  if (v.empty()) return 0;
  std::sort(v.begin(), v.end());
  return v[std::min(v.size() - 1, static_cast<size_t>(static_cast<double>(v.size()) * q))];
}

// BOS, then n - 1 ids spread over the vocabulary; `stream` picks the offset
// (the formula of bench/grpc_concurrency_bench.cc, with a 64-bit stride so
// large stream numbers stay distinct).
std::vector<int32_t> Prompt(const v1::ModelInfo& info, int n, int64_t stream) {
  const int64_t vocab = info.vocab_size();
  const int64_t spread = std::max<int64_t>(1, std::min<int64_t>(50000, vocab - 1000));
  std::vector<int32_t> ids = {std::max(0, info.bos_id())};
  for (int64_t i = 1; i < n; ++i) {
    ids.push_back(static_cast<int32_t>((1000 + (i * 7919 + stream * 104729) % spread) % vocab));
  }
  return ids;
}

v1::GenerateRequest TokenTurn(const std::vector<int32_t>& ids, int max_new_tokens) {
  v1::GenerateRequest req;
  v1::Turn* turn = req.mutable_turn();
  for (int32_t id : ids) turn->mutable_tokens()->add_ids(id);
  turn->mutable_stopping()->set_max_new_tokens(max_new_tokens);
  turn->mutable_stopping()->set_ignore_eos(true);  // sampling unset: greedy
  return req;
}

void Authorize(grpc::ClientContext* ctx) {
  const std::string token = absl::GetFlag(FLAGS_auth_token);
  if (!token.empty()) ctx->AddMetadata("authorization", "Bearer " + token);
}

// A stream's token arrivals (steady clock) and how its turn ended.
struct Record {
  Clock::time_point write;
  std::vector<Clock::time_point> arrivals;
  v1::TurnEnd end;
  bool ended = false;
  std::string error;
};

// Writes `req` and reads the turn to its TurnEnd (or until the call ends).
// `on_token` is called after each arrival is recorded.
template <typename OnToken>
void RunTurn(grpc::ClientReaderWriter<v1::GenerateRequest, v1::GenerateResponse>* stream,
             const v1::GenerateRequest& req, Record* r, OnToken on_token) {
  r->write = Clock::now();
  if (!stream->Write(req)) {
    r->error = "write failed";
    return;
  }
  v1::GenerateResponse resp;
  while (stream->Read(&resp)) {
    if (resp.has_token()) {
      r->arrivals.push_back(Clock::now());
      on_token();
    } else if (resp.has_turn_end()) {
      r->end = resp.turn_end();
      r->ended = true;
      return;
    }
  }
}

struct Repeat {
  std::vector<double> ttft_ms;  // per burst stream
  double last_ttft_ms = 0, bound_ttft_ms = 0;
  std::vector<double> background_gaps_during, background_gaps_before;
  double burst_window_tok_s = 0, background_tok_s_before = 0;
};

// One burst with its background and bound; false (message on stderr) when a
// stream failed. `salt` makes every prompt of this repeat new.
bool RunRepeat(v1::Decoder::Stub* stub, const v1::ModelInfo& info, int64_t salt, Repeat* out) {
  const int n_burst = absl::GetFlag(FLAGS_burst);
  const int n_prompt = std::max(1, absl::GetFlag(FLAGS_prompt_tokens));
  const int n_background = std::max(0, absl::GetFlag(FLAGS_background));
  const int settle = std::max(1, absl::GetFlag(FLAGS_settle_tokens));

  // 1. Background sessions: decode until cancelled.
  std::vector<std::unique_ptr<grpc::ClientContext>> bg_ctx;
  std::vector<Record> bg(static_cast<size_t>(n_background));
  absl::Mutex mu;
  int settled = 0;
  std::vector<std::thread> bg_threads;
  const int bg_prompt = std::max(1, absl::GetFlag(FLAGS_background_prompt_tokens));
  const int bg_tokens = std::max(16, info.session_context_length() - bg_prompt - 1);
  for (int s = 0; s < n_background; ++s) {
    bg_ctx.push_back(std::make_unique<grpc::ClientContext>());
    Authorize(bg_ctx.back().get());
  }
  for (int s = 0; s < n_background; ++s) {
    bg_threads.emplace_back([&, s] {
      Record& r = bg[static_cast<size_t>(s)];
      auto stream = stub->Generate(bg_ctx[static_cast<size_t>(s)].get());
      RunTurn(stream.get(), TokenTurn(Prompt(info, bg_prompt, salt + 900 + s), bg_tokens), &r, [&] {
        if (static_cast<int>(r.arrivals.size()) == settle) {
          absl::MutexLock lock(&mu);
          ++settled;
        }
      });
      stream->Finish();  // cancelled at the repeat's end: its status is not checked
    });
  }
  {
    absl::MutexLock lock(&mu);
    auto all_settled = [&] { return settled == n_background; };
    mu.AwaitWithTimeout(absl::Condition(&all_settled), absl::Seconds(300));
    if (settled != n_background) {
      std::fprintf(stderr, "burst_bench: the background sessions did not all start decoding within 300 s\n");
      for (auto& c : bg_ctx) c->TryCancel();
      for (auto& t : bg_threads) t.join();
      return false;
    }
  }
  // Every background session decodes from here: the "before" window, as
  // long as --before_ms, ends at the burst's release.
  const Clock::time_point settled_at = Clock::now();
  std::this_thread::sleep_for(std::chrono::milliseconds(std::max(1, absl::GetFlag(FLAGS_before_ms))));

  // 2. The burst.
  const int burst_tokens = std::max(1, absl::GetFlag(FLAGS_burst_tokens));
  std::vector<Record> burst(static_cast<size_t>(n_burst));
  Clock::time_point release;
  std::barrier sync(n_burst, [&release]() noexcept { release = Clock::now(); });
  std::vector<std::thread> burst_threads;
  for (int s = 0; s < n_burst; ++s) {
    burst_threads.emplace_back([&, s] {
      Record& r = burst[static_cast<size_t>(s)];
      grpc::ClientContext ctx;
      Authorize(&ctx);
      auto stream = stub->Generate(&ctx);
      const v1::GenerateRequest req = TokenTurn(Prompt(info, n_prompt, salt + s), burst_tokens);
      sync.arrive_and_wait();
      RunTurn(stream.get(), req, &r, [] {});
      stream->WritesDone();
      const grpc::Status st = stream->Finish();
      if (r.error.empty() && !st.ok()) r.error = absl::StrCat("status ", st.error_code(), ": ", st.error_message());
      if (r.error.empty() && (!r.ended || r.end.finish_reason() != v1::LENGTH ||
                              static_cast<int>(r.arrivals.size()) != burst_tokens)) {
        r.error = absl::StrCat("turn ended with finish_reason ", r.end.finish_reason(), " after ", r.arrivals.size(),
                               " of ", burst_tokens, " tokens");
      }
    });
  }
  for (auto& t : burst_threads) t.join();
  for (auto& c : bg_ctx) c->TryCancel();
  for (auto& t : bg_threads) t.join();

  // 3. The bound: the burst's prefill work as one prompt.
  Record bound;
  {
    std::vector<int32_t> ids = {std::max(0, info.bos_id())};
    for (int s = 0; s < n_burst; ++s) {
      std::vector<int32_t> part = Prompt(info, n_prompt, salt + 500 + s);
      ids.insert(ids.end(), part.begin() + 1, part.end());
    }
    grpc::ClientContext ctx;
    Authorize(&ctx);
    auto stream = stub->Generate(&ctx);
    RunTurn(stream.get(), TokenTurn(ids, 1), &bound, [] {});
    stream->WritesDone();
    const grpc::Status st = stream->Finish();
    if (!st.ok()) bound.error = absl::StrCat("status ", st.error_code(), ": ", st.error_message());
    if (bound.error.empty() && (!bound.ended || bound.arrivals.size() != 1)) bound.error = "no first token";
  }

  bool ok = true;
  Clock::time_point last_burst_first = release;
  for (const Record& r : burst) {
    if (!r.arrivals.empty()) last_burst_first = std::max(last_burst_first, r.arrivals.front());
  }
  for (int s = 0; s < n_burst; ++s) {
    if (!burst[static_cast<size_t>(s)].error.empty()) {
      std::fprintf(stderr, "burst_bench: burst stream %d: %s\n", s, burst[static_cast<size_t>(s)].error.c_str());
      ok = false;
    }
  }
  if (!bound.error.empty()) {
    std::fprintf(stderr, "burst_bench: the bound stream (%d prompt tokens): %s\n",
                 1 + n_burst * (n_prompt - 1), bound.error.c_str());
    ok = false;
  }
  for (int s = 0; s < n_background; ++s) {
    // A background session that stopped before the burst's last first token
    // (an error, or its turn ended) left part of the window without its load.
    const Record& r = bg[static_cast<size_t>(s)];
    if (r.ended || r.arrivals.empty() || r.arrivals.back() < last_burst_first) {
      std::fprintf(stderr, "burst_bench: background stream %d stopped decoding during the burst\n", s);
      ok = false;
    }
  }
  if (!ok) return false;

  Clock::time_point last_first = release;
  for (const Record& r : burst) {
    out->ttft_ms.push_back(Ms(r.arrivals.front(), r.write));
    last_first = std::max(last_first, r.arrivals.front());
  }
  out->last_ttft_ms = Ms(last_first, release);
  out->bound_ttft_ms = Ms(bound.arrivals.front(), bound.write);
  int64_t during_events = 0, before_events = 0;
  for (const Record& r : bg) {
    for (size_t i = 0; i < r.arrivals.size(); ++i) {
      const Clock::time_point t = r.arrivals[i];
      during_events += (t > release && t <= last_first) ? 1 : 0;
      before_events += (t > settled_at && t <= release) ? 1 : 0;
      if (i == 0) continue;
      const Clock::time_point prev = r.arrivals[i - 1];
      const double gap = Ms(t, prev);
      // A gap overlapping the burst window counts, so a stall that outlasts
      // the window is measured too.
      if (prev < last_first && t > release) out->background_gaps_during.push_back(gap);
      if (prev > settled_at && t <= release) out->background_gaps_before.push_back(gap);
    }
  }
  for (const Record& r : burst) {
    for (Clock::time_point t : r.arrivals) during_events += (t > release && t <= last_first) ? 1 : 0;
  }
  const double window_s = out->last_ttft_ms / 1e3;
  if (window_s > 0) {
    out->burst_window_tok_s = static_cast<double>(during_events) / window_s;
  }
  const double before_s = std::chrono::duration<double>(release - settled_at).count();
  if (before_s > 0) out->background_tok_s_before = static_cast<double>(before_events) / before_s;
  return true;
}

}  // namespace

int main(int argc, char** argv) {
  absl::ParseCommandLine(argc, argv);
  if (absl::GetFlag(FLAGS_burst) < 1 || absl::GetFlag(FLAGS_burst) > 256) {
    std::fprintf(stderr, "burst_bench: --burst must be 1..256\n");
    return 1;
  }
  if (absl::GetFlag(FLAGS_background) > 100) {  // its streams are salt + 900 + [0, 100)
    std::fprintf(stderr, "burst_bench: --background must be 0..100\n");
    return 1;
  }
  auto stub = v1::Decoder::NewStub(
      grpc::CreateChannel(absl::GetFlag(FLAGS_server), grpc::InsecureChannelCredentials()));
  v1::ModelInfo info;
  {
    grpc::ClientContext ctx;
    Authorize(&ctx);
    ctx.set_deadline(std::chrono::system_clock::now() + std::chrono::seconds(30));
    const grpc::Status st = stub->GetModelInfo(&ctx, v1::GetModelInfoRequest(), &info);
    if (!st.ok()) {
      std::fprintf(stderr, "burst_bench: GetModelInfo: %s\n", st.error_message().c_str());
      return 1;
    }
  }
  const int64_t bound_len = 1 + int64_t{absl::GetFlag(FLAGS_burst)} * (absl::GetFlag(FLAGS_prompt_tokens) - 1);
  if (bound_len >= info.session_context_length()) {
    std::fprintf(stderr, "burst_bench: the bound's prompt (%lld tokens) does not fit the daemon's context (%d)\n",
                 static_cast<long long>(bound_len), info.session_context_length());
    return 1;
  }

  int64_t salt = 0;
  if (absl::GetFlag(FLAGS_warmup)) {
    Repeat ignored;
    if (!RunRepeat(stub.get(), info, salt, &ignored)) return 1;
  }
  std::vector<Repeat> repeats;
  for (int i = 0; i < std::max(1, absl::GetFlag(FLAGS_repeats)); ++i) {
    // A repeat's streams are salt + [0, 1000): Prompt's ids differ between
    // stream numbers less than its spread (~50,000) apart, so up to ~50
    // repeats share no prompt (a step of 10,000 repeated the warmup's prompts
    // at the fifth repeat: the bound came from the prefix cache).
    salt += 1000;
    Repeat r;
    if (!RunRepeat(stub.get(), info, salt, &r)) return 1;
    repeats.push_back(std::move(r));
  }
  std::vector<double> ttft, during, before;
  for (const Repeat& r : repeats) {
    ttft.insert(ttft.end(), r.ttft_ms.begin(), r.ttft_ms.end());
    during.insert(during.end(), r.background_gaps_during.begin(), r.background_gaps_during.end());
    before.insert(before.end(), r.background_gaps_before.begin(), r.background_gaps_before.end());
  }
  std::vector<Repeat> sorted = repeats;
  std::sort(sorted.begin(), sorted.end(),
            [](const Repeat& a, const Repeat& b) { return a.last_ttft_ms < b.last_ttft_ms; });
  const Repeat& median = sorted[sorted.size() / 2];
  // last/bound per repeat: a burst and its own bound run seconds apart, so
  // the ratio cancels most of a noisy host's drift; its median and range.
  std::vector<double> lasts, bounds, ratios;
  for (const Repeat& r : repeats) {
    lasts.push_back(r.last_ttft_ms);
    bounds.push_back(r.bound_ttft_ms);
    if (r.bound_ttft_ms > 0) ratios.push_back(r.last_ttft_ms / r.bound_ttft_ms);
  }
  std::sort(ratios.begin(), ratios.end());
  std::printf(
      "{\"family\": \"%s\", \"cpu_isa\": \"%s\", \"burst\": %d, \"prompt_tokens\": %d, \"background\": %d, "
      "\"repeats\": %zu, \"ttft_ms_p50\": %.2f, \"ttft_ms_p99\": %.2f, \"last_ttft_ms\": %.2f, "
      "\"bound_ttft_ms\": %.2f, \"last_over_bound\": %.3f, \"last_over_bound_min\": %.3f, "
      "\"last_over_bound_max\": %.3f, \"background_itl_ms_p50_before\": %.2f, "
      "\"background_itl_ms_p99\": %.2f, \"background_itl_ms_max\": %.2f, \"burst_window_tok_s\": %.2f, "
      "\"background_tok_s_before\": %.2f}\n",
      info.family().c_str(), info.cpu_isa().c_str(), absl::GetFlag(FLAGS_burst), absl::GetFlag(FLAGS_prompt_tokens),
      absl::GetFlag(FLAGS_background), repeats.size(), Percentile(ttft, 0.5), Percentile(ttft, 0.99),
      Percentile(lasts, 0.5), Percentile(bounds, 0.5), ratios.empty() ? 0.0 : Percentile(ratios, 0.5),
      ratios.empty() ? 0.0 : ratios.front(), ratios.empty() ? 0.0 : ratios.back(), Percentile(before, 0.5),
      Percentile(during, 0.99), during.empty() ? 0.0 : *std::max_element(during.begin(), during.end()),
      median.burst_window_tok_s, median.background_tok_s_before);
  return 0;
}
