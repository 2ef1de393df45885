// decoded-loadgen: a bounded load test of a running daemon (see
// client/load_generator.h for what it does and checks).
//
//   decoded-loadgen --server 127.0.0.1:50051 --metrics 127.0.0.1:9464
//       --streams 8 --turns 3 --max_new_tokens 16      (one command line)
//
// Prints a summary on stderr and the report as one JSON object on stdout.
// Exit status: 0 no violation; 1 violations (listed); 2 the test could not
// run (bad flags, daemon unreachable, options that do not fit the daemon).
#include <iostream>
#include <string>

#include "absl/flags/flag.h"
#include "absl/flags/parse.h"
#include "absl/flags/usage.h"
#include "client/load_generator.h"
#include "grpcpp/grpcpp.h"

ABSL_FLAG(std::string, server, "127.0.0.1:50051", "daemon address");
ABSL_FLAG(std::string, metrics, "", "daemon's /metrics address (host:port); empty: gauges are not checked");
ABSL_FLAG(int, streams, 8, "concurrent Generate streams");
ABSL_FLAG(int, turns, 3, "turns per stream");
ABSL_FLAG(int, min_prompt_tokens, 4, "shortest prompt of a turn (token ids)");
ABSL_FLAG(int, max_prompt_tokens, 48, "longest prompt of a turn (token ids)");
ABSL_FLAG(int, max_new_tokens, 16, "tokens generated per turn (greedy, ignore_eos)");
ABSL_FLAG(double, cancel_probability, 0.15, "per turn: send Cancel while it runs");
ABSL_FLAG(double, disconnect_probability, 0.05, "per turn: drop the stream while it runs");
ABSL_FLAG(double, acknowledge_fraction, 0.5, "fraction of streams using acknowledge_events flow control");
ABSL_FLAG(uint64_t, seed, 1, "seed of the prompts and of the cancel/disconnect choices");
ABSL_FLAG(double, deadline_seconds, 120, "deadline of every stream of a phase (load, then solo replay)");
ABSL_FLAG(double, settle_seconds, 10, "time for the gauges to return to 0 once the streams are gone");
ABSL_FLAG(bool, corrupt_reference_for_testing, false,
          "alter one id of the solo reference: the run must then fail (a control of the check)");

int main(int argc, char** argv) {
  absl::SetProgramUsageMessage("decoded-loadgen [--server ADDR] [--metrics ADDR] [--streams N] [--turns M] ...");
  std::vector<char*> rest = absl::ParseCommandLine(argc, argv);
  if (rest.size() > 1) {
    std::cerr << "decoded-loadgen: unexpected argument '" << rest[1] << "'\n";
    return 2;
  }
  decoded::client::LoadOptions o;
  o.streams = absl::GetFlag(FLAGS_streams);
  o.turns = absl::GetFlag(FLAGS_turns);
  o.min_prompt_tokens = absl::GetFlag(FLAGS_min_prompt_tokens);
  o.max_prompt_tokens = absl::GetFlag(FLAGS_max_prompt_tokens);
  o.max_new_tokens = absl::GetFlag(FLAGS_max_new_tokens);
  o.cancel_probability = absl::GetFlag(FLAGS_cancel_probability);
  o.disconnect_probability = absl::GetFlag(FLAGS_disconnect_probability);
  o.acknowledge_fraction = absl::GetFlag(FLAGS_acknowledge_fraction);
  o.seed = absl::GetFlag(FLAGS_seed);
  o.deadline_seconds = absl::GetFlag(FLAGS_deadline_seconds);
  o.settle_seconds = absl::GetFlag(FLAGS_settle_seconds);
  o.metrics_address = absl::GetFlag(FLAGS_metrics);
  o.corrupt_reference_for_testing = absl::GetFlag(FLAGS_corrupt_reference_for_testing);
  auto channel = grpc::CreateChannel(absl::GetFlag(FLAGS_server), grpc::InsecureChannelCredentials());
  absl::StatusOr<decoded::client::LoadReport> report = decoded::client::RunLoadTest(channel, o);
  if (!report.ok()) {
    std::cerr << "decoded-loadgen: " << report.status() << "\n";
    return 2;
  }
  const decoded::client::LoadReport& r = *report;
  std::cerr << "decoded-loadgen: " << r.streams << " streams, " << r.turns_sent << " turns sent ("
            << r.turns_completed << " completed, " << r.turns_cancelled << " cancelled, " << r.disconnects
            << " disconnects; " << r.cancels_sent << " cancels sent), " << r.tokens << " tokens in "
            << r.load_seconds << " s = " << r.tokens_per_second << " tok/s; inter-token p50 " << r.inter_token_ms_p50
            << " ms p99 " << r.inter_token_ms_p99 << " ms; TTFT p50 " << r.ttft_ms_p50 << " ms p99 " << r.ttft_ms_p99
            << " ms; " << r.turns_compared << " turns equal to their solo replay check"
            << (r.gauges_checked ? "ed, gauges checked" : "ed, gauges NOT checked (no --metrics)") << "\n";
  for (const std::string& v : r.violations) std::cerr << "VIOLATION: " << v << "\n";
  std::cout << r.ToJson() << "\n";
  if (!r.violations.empty()) {
    std::cerr << "decoded-loadgen: FAILED, " << r.violations.size() << " violations\n";
    return 1;
  }
  std::cerr << "decoded-loadgen: PASSED\n";
  return 0;
}
