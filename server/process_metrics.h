// The standard Prometheus process metrics (the client libraries' "process
// collector": https://prometheus.io/docs/instrumenting/writing_clientlibs/
// #process-metrics), which prometheus-cpp does not provide, read from /proc
// at scrape time:
//   process_cpu_seconds_total       user + system CPU time (/proc/self/stat utime, stime)
//   process_resident_memory_bytes   RSS (/proc/self/stat rss pages)
//   process_virtual_memory_bytes    vsize (/proc/self/stat)
//   process_start_time_seconds      since the Unix epoch (starttime + /proc/stat btime)
//   process_open_fds                entries of /proc/self/fd
//   process_max_fds                 RLIMIT_NOFILE's soft limit
// A figure /proc does not give (another OS, a restricted /proc) is left out,
// never reported as 0.
#ifndef DECODED_SERVER_PROCESS_METRICS_H_
#define DECODED_SERVER_PROCESS_METRICS_H_

#include <vector>

#include "prometheus/collectable.h"
#include "prometheus/metric_family.h"

namespace decoded::server {

class ProcessCollectable final : public prometheus::Collectable {
 public:
  std::vector<prometheus::MetricFamily> Collect() const override;
};

}  // namespace decoded::server

#endif  // DECODED_SERVER_PROCESS_METRICS_H_
