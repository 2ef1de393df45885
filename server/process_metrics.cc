#include "server/process_metrics.h"

#include <dirent.h>
#include <sys/resource.h>
#include <unistd.h>

#include <fstream>
#include <optional>
#include <sstream>
#include <string>

#include "absl/strings/numbers.h"
#include "absl/strings/str_split.h"
#include "server/one_value_family.h"

namespace decoded::server {
namespace {

std::optional<std::string> ReadFile(const char* path) {
  std::ifstream in(path);
  if (!in) return std::nullopt;
  std::stringstream s;
  s << in.rdbuf();
  return s.str();
}

// The fields of /proc/self/stat after the command name, which is in
// parentheses and may hold spaces: field 3 (state) is fields[0] (proc(5)).
std::optional<std::vector<std::string>> StatFields() {
  std::optional<std::string> stat = ReadFile("/proc/self/stat");
  if (!stat) return std::nullopt;
  const size_t close = stat->rfind(')');
  if (close == std::string::npos) return std::nullopt;
  return absl::StrSplit(stat->substr(close + 1), ' ', absl::SkipEmpty());
}

std::optional<double> BootTimeSeconds() {
  std::optional<std::string> stat = ReadFile("/proc/stat");
  if (!stat) return std::nullopt;
  for (absl::string_view line : absl::StrSplit(*stat, '\n')) {
    if (!absl::ConsumePrefix(&line, "btime ")) continue;
    double btime = 0;
    if (absl::SimpleAtod(line, &btime)) return btime;
  }
  return std::nullopt;
}

std::optional<int> OpenFds() {
  DIR* dir = opendir("/proc/self/fd");
  if (dir == nullptr) return std::nullopt;
  int n = 0;
  while (const dirent* e = readdir(dir)) {
    if (e->d_name[0] != '.') ++n;
  }
  closedir(dir);
  return n - 1;  // not the descriptor opendir holds
}

}  // namespace

std::vector<prometheus::MetricFamily> ProcessCollectable::Collect() const {
  using prometheus::MetricType;
  std::vector<prometheus::MetricFamily> out;
  const double ticks = static_cast<double>(sysconf(_SC_CLK_TCK));
  const double page = static_cast<double>(sysconf(_SC_PAGESIZE));
  // proc(5) field numbers: utime 14, stime 15, starttime 22, vsize 23, rss 24;
  // fields[i] is field i + 3.
  if (std::optional<std::vector<std::string>> f = StatFields(); f && f->size() > 21 && ticks > 0) {
    double utime = 0, stime = 0, start = 0, vsize = 0, rss = 0;
    if (absl::SimpleAtod((*f)[11], &utime) && absl::SimpleAtod((*f)[12], &stime)) {
      out.push_back(OneValue("process_cpu_seconds_total", "Total user and system CPU time spent in seconds.",
                           MetricType::Counter, (utime + stime) / ticks));
    }
    if (absl::SimpleAtod((*f)[20], &vsize)) {
      out.push_back(OneValue("process_virtual_memory_bytes", "Virtual memory size in bytes.", MetricType::Gauge, vsize));
    }
    if (absl::SimpleAtod((*f)[21], &rss)) {
      out.push_back(OneValue("process_resident_memory_bytes", "Resident memory size in bytes.", MetricType::Gauge,
                           rss * page));
    }
    if (std::optional<double> boot = BootTimeSeconds(); boot && absl::SimpleAtod((*f)[19], &start)) {
      out.push_back(OneValue("process_start_time_seconds", "Start time of the process since unix epoch in seconds.",
                           MetricType::Gauge, *boot + start / ticks));
    }
  }
  if (std::optional<int> fds = OpenFds()) {
    out.push_back(OneValue("process_open_fds", "Number of open file descriptors.", MetricType::Gauge, *fds));
  }
  rlimit limit{};
  if (getrlimit(RLIMIT_NOFILE, &limit) == 0 && limit.rlim_cur != RLIM_INFINITY) {
    out.push_back(OneValue("process_max_fds", "Maximum number of open file descriptors.", MetricType::Gauge,
                         static_cast<double>(limit.rlim_cur)));
  }
  return out;
}

}  // namespace decoded::server
