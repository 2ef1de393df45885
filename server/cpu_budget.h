// How many CPUs this process may keep busy: the smallest of its scheduler
// affinity mask (which a cpuset cgroup narrows too) and its CFS bandwidth
// quota, read from the cgroup file systems as the kernel documents them:
//   cgroup v2 `cpu.max`: "$MAX $PERIOD" (microseconds) or "max $PERIOD"
//     (Documentation/admin-guide/cgroup-v2.rst, "CPU Interface Files");
//   cgroup v1 `cpu.cfs_quota_us` (-1: none) and `cpu.cfs_period_us`
//     (Documentation/scheduler/sched-bwc.rst).
// The process's cgroup comes from /proc/self/cgroup and each hierarchy's mount
// point and root from /proc/self/mountinfo (proc(5)); the quota of every
// cgroup from the process's own up to the mount point applies (a parent's
// quota caps its children), so the smallest is taken. A container's runtime
// (Kubernetes `resources.limits.cpu`, `podman run --cpus`) sets exactly these
// files.
//
// Why the quota is rounded down: compute teams spin at barriers, so a thread
// that the quota throttles mid-step stalls its whole team until the next
// period; a fractional CPU is not worth a thread. At least 1.
#ifndef DECODED_SERVER_CPU_BUDGET_H_
#define DECODED_SERVER_CPU_BUDGET_H_

#include <string>

#include "absl/status/statusor.h"

namespace decoded::server {

struct CpuBudget {
  int cpus = 1;             // >= 1
  std::string explanation;  // the limits found and where, for the daemon's log
};

// Reads the files named above under `root` ("/" for the live process; a fake
// tree in tests: root + "/proc/self/cgroup", root + mount point + cgroup path
// + "/cpu.max", ...). `affinity_cpus`: CPUs in the process's affinity mask,
// `hardware_cpus`: the machine's (0: unknown, each).
// Absent files (no /proc, no cgroup mount, a hierarchy without the cpu
// controller, as cgroup v2 in a hybrid setup often is) mean no limit from
// them; with no limit at all the budget is the affinity mask, else the
// hardware's, else 1.
// Errors: INVALID_ARGUMENT naming the file and its text when a file that is
// present does not parse (a quota or period that is not a positive integer,
// a line of /proc/self/cgroup or /proc/self/mountinfo without its fields).
absl::StatusOr<CpuBudget> ReadCpuBudget(const std::string& root, int affinity_cpus, int hardware_cpus);

// The live process's budget (root "/", sched_getaffinity,
// std::thread::hardware_concurrency). A malformed cgroup file does not stop
// the daemon: the budget falls back to the affinity mask (else the hardware)
// and the explanation carries the error.
CpuBudget DetectCpuBudget();

}  // namespace decoded::server

#endif  // DECODED_SERVER_CPU_BUDGET_H_
