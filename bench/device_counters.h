// Device-side counters of the Vulkan backend for the benchmarks' --device
// reports (all zero on the CPU, or in a build without Vulkan): what a step
// costs besides its time, the figures docs/vulkan.md reports for lavapipe.
#ifndef DECODED_BENCH_DEVICE_COUNTERS_H_
#define DECODED_BENCH_DEVICE_COUNTERS_H_

#include <cstdint>

#if DECODED_HAVE_VULKAN
#include "engine/vulkan/vulkan_backend.h"
#include "engine/vulkan/vulkan_plan.h"
#endif

namespace decoded::bench {

struct DeviceCounters {
  int64_t dispatches = 0;   // kernel dispatches written into recordings
  int64_t submissions = 0;  // plan runs submitted to the queue
  int64_t recordings = 0;   // command buffers recorded
  int64_t uploaded = 0;     // bytes the host wrote into device buffers
};

inline DeviceCounters ReadDeviceCounters() {
  DeviceCounters c;
#if DECODED_HAVE_VULKAN
  const vulkan::PlanStats s = vulkan::GetPlanStats();
  c.dispatches = s.dispatches_recorded;
  c.submissions = s.submissions;
  c.recordings = s.recordings;
  c.uploaded = vulkan::UploadedDataBytes();
#endif
  return c;
}

// b - a, counter by counter.
inline DeviceCounters operator-(const DeviceCounters& b, const DeviceCounters& a) {
  return {b.dispatches - a.dispatches, b.submissions - a.submissions, b.recordings - a.recordings,
          b.uploaded - a.uploaded};
}

}  // namespace decoded::bench

#endif  // DECODED_BENCH_DEVICE_COUNTERS_H_
