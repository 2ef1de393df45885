// A metric family of one unlabelled counter or gauge, as the collectables
// that read their figures at scrape time build them (server/metrics.cc,
// server/process_metrics.cc).
#ifndef DECODED_SERVER_ONE_VALUE_FAMILY_H_
#define DECODED_SERVER_ONE_VALUE_FAMILY_H_

#include <string>

#include "prometheus/metric_family.h"

namespace decoded::server {

inline prometheus::MetricFamily OneValue(const std::string& name, const std::string& help,
                                         prometheus::MetricType type, double value) {
  prometheus::MetricFamily family;
  family.name = name;
  family.help = help;
  family.type = type;
  prometheus::ClientMetric m;
  if (type == prometheus::MetricType::Counter) {
    m.counter.value = value;
  } else {
    m.gauge.value = value;
  }
  family.metric.push_back(m);
  return family;
}

}  // namespace decoded::server

#endif  // DECODED_SERVER_ONE_VALUE_FAMILY_H_
