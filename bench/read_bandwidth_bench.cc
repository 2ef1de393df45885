// read_bandwidth_bench: streaming read bandwidth of this machine with N
// threads, the ceiling of a memory-bound decode step.
//
// A decode step reads every weight once, so tokens/s can reach at most
// bandwidth / weight bytes per token (times the batch, when one step serves
// several rows). This measures the bandwidth for each --threads count: the
// threads sum disjoint equal slices of one buffer (each thread first touches
// its own slice), all released together; the time is from the release to the
// last thread's end, and the best of --repeats runs is reported, as GB/s
// (1e9 bytes). The default buffer (1 GiB) is several times the last-level
// cache of the machines we run on, so the figure is DRAM's; --mib can add a
// buffer the size of a model's weights, which may partly stay in a large LLC.
//
// Prints one JSON object:
//   {"buffers": [{"mib": 1024, "read_gb_s": {"1": 11.2, "2": 19.8}}, ...]}
// bench/run_bench.py reads it to give each decode rate as a fraction of the
// limit for its thread count.
#include <algorithm>
#include <barrier>
#include <chrono>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <memory>
#include <string>
#include <thread>
#include <vector>

#include "absl/flags/flag.h"
#include "absl/flags/parse.h"
#include "absl/strings/numbers.h"

ABSL_FLAG(std::vector<std::string>, threads, std::vector<std::string>({"1", "2"}), "thread counts, comma-separated");
ABSL_FLAG(std::vector<std::string>, mib, std::vector<std::string>({"1024"}), "buffer sizes in MiB, comma-separated");
ABSL_FLAG(int, repeats, 7, "runs per (buffer, thread count); the fastest is reported");

namespace decoded {
namespace {

using Clock = std::chrono::steady_clock;

// Sums `n` words with eight independent accumulators, so the adds never wait
// on each other and the loop is bound by the loads alone.
uint64_t SumWords(const uint64_t* p, size_t n) {
  uint64_t a[8] = {};
  size_t i = 0;
  for (; i + 8 <= n; i += 8) {
    for (int k = 0; k < 8; ++k) a[k] += p[i + k];
  }
  for (; i < n; ++i) a[0] += p[i];
  uint64_t s = 0;
  for (uint64_t v : a) s += v;
  return s;
}

// Best read bandwidth (GB/s) of `threads` threads over `words` words.
double Measure(size_t words, int threads, int repeats, uint64_t* checksum) {
  std::unique_ptr<uint64_t[]> buf(new uint64_t[words]);  // not zeroed: each thread touches its slice
  const size_t slice = words / threads;
  std::vector<double> seconds(static_cast<size_t>(repeats), 0);
  std::barrier start(threads + 1), done(threads + 1);
  std::vector<uint64_t> sums(static_cast<size_t>(threads));
  std::vector<std::thread> pool;
  for (int t = 0; t < threads; ++t) {
    pool.emplace_back([&, t] {
      uint64_t* p = buf.get() + t * slice;
      for (size_t i = 0; i < slice; ++i) p[i] = i ^ static_cast<uint64_t>(t);  // first touch: pages local to t
      sums[t] += SumWords(p, slice);                                           // warm the TLB and page tables
      for (int r = 0; r < repeats; ++r) {
        start.arrive_and_wait();
        sums[t] += SumWords(p, slice);
        done.arrive_and_wait();
      }
    });
  }
  for (int r = 0; r < repeats; ++r) {
    start.arrive_and_wait();
    const auto t0 = Clock::now();
    done.arrive_and_wait();
    seconds[r] = std::chrono::duration<double>(Clock::now() - t0).count();
  }
  for (std::thread& t : pool) t.join();
  for (uint64_t s : sums) *checksum += s;
  const double best = *std::min_element(seconds.begin(), seconds.end());
  return static_cast<double>(slice * threads * sizeof(uint64_t)) / best / 1e9;
}

std::vector<int> ParseCounts(const std::vector<std::string>& values, const char* flag) {
  std::vector<int> out;
  for (const std::string& v : values) {
    int n = 0;
    if (!absl::SimpleAtoi(v, &n) || n < 1) {
      std::fprintf(stderr, "read_bandwidth_bench: --%s: \"%s\" is not a positive integer\n", flag, v.c_str());
      std::exit(2);
    }
    out.push_back(n);
  }
  return out;
}

int Run() {
  const std::vector<int> thread_counts = ParseCounts(absl::GetFlag(FLAGS_threads), "threads");
  const std::vector<int> sizes = ParseCounts(absl::GetFlag(FLAGS_mib), "mib");
  const int repeats = absl::GetFlag(FLAGS_repeats);
  if (repeats < 1) {
    std::fprintf(stderr, "read_bandwidth_bench: --repeats must be >= 1\n");
    return 2;
  }
  uint64_t checksum = 0;
  std::string json = "{\"repeats\": " + std::to_string(repeats) + ", \"buffers\": [";
  for (size_t b = 0; b < sizes.size(); ++b) {
    const size_t words = static_cast<size_t>(sizes[b]) * (1 << 20) / sizeof(uint64_t);
    json += (b ? ", " : "") + std::string("{\"mib\": ") + std::to_string(sizes[b]) + ", \"read_gb_s\": {";
    for (size_t i = 0; i < thread_counts.size(); ++i) {
      const double gbs = Measure(words, thread_counts[i], repeats, &checksum);
      char item[64];
      std::snprintf(item, sizeof(item), "%s\"%d\": %.2f", i ? ", " : "", thread_counts[i], gbs);
      json += item;
    }
    json += "}}";
  }
  // The checksum keeps the sums observable, so the compiler cannot drop them.
  json += "], \"checksum\": " + std::to_string(checksum % 1000) + "}";
  std::printf("%s\n", json.c_str());
  return 0;
}

}  // namespace
}  // namespace decoded

int main(int argc, char** argv) {
  absl::ParseCommandLine(argc, argv);
  return decoded::Run();
}
