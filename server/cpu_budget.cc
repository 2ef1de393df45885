#include "server/cpu_budget.h"

#include <sched.h>

#include <cmath>
#include <fstream>
#include <optional>
#include <sstream>
#include <thread>
#include <vector>

#include "absl/status/status.h"
#include "absl/strings/ascii.h"
#include "absl/strings/escaping.h"
#include "absl/strings/match.h"
#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "absl/strings/str_join.h"
#include "absl/strings/str_split.h"
#include "absl/strings/strip.h"

namespace decoded::server {
namespace {

// The whole file, or nothing when it cannot be opened (absent: no limit).
std::optional<std::string> ReadFile(const std::string& path) {
  std::ifstream in(path, std::ios::binary);
  if (!in) return std::nullopt;
  std::stringstream text;
  text << in.rdbuf();
  return text.str();
}

absl::Status Malformed(const std::string& path, absl::string_view text, absl::string_view why) {
  return absl::InvalidArgumentError(
      absl::StrFormat("%s: %s (text \"%s\")", path, why, absl::CEscape(absl::StripAsciiWhitespace(text))));
}

absl::StatusOr<int64_t> PositiveInteger(const std::string& path, absl::string_view text, absl::string_view field) {
  int64_t value = 0;
  if (!absl::SimpleAtoi(field, &value) || value <= 0) {
    return Malformed(path, text, absl::StrCat("'", field, "' is not a positive integer"));
  }
  return value;
}

// A cgroup hierarchy of the process: where it is mounted, the cgroup's path
// below the mount point, and which files hold its quota.
struct Hierarchy {
  int version = 0;          // 1 or 2
  std::string mount_point;  // as /proc/self/mountinfo gives it (unescaped)
  std::string relative;     // the process's cgroup below the mount point ("" = the mount point itself)
};

// mountinfo escapes space, tab, newline and backslash as \ooo (octal).
std::string UnescapeMountField(absl::string_view field) {
  std::string out;
  for (size_t i = 0; i < field.size(); ++i) {
    if (field[i] == '\\' && i + 3 < field.size() && field[i + 1] >= '0' &&
        field[i + 1] <= '7' && field[i + 2] >= '0' && field[i + 2] <= '7' && field[i + 3] >= '0' &&
        field[i + 3] <= '7') {
      out.push_back(static_cast<char>((field[i + 1] - '0') * 64 + (field[i + 2] - '0') * 8 + (field[i + 3] - '0')));
      i += 3;
    } else {
      out.push_back(field[i]);
    }
  }
  return out;
}

struct CgroupPaths {
  std::optional<std::string> v2;  // the "0::PATH" line
  std::optional<std::string> v1;  // the line whose controllers include "cpu"
};

// /proc/self/cgroup: "ID:CONTROLLERS:PATH" per line (PATH may hold ':').
absl::StatusOr<CgroupPaths> ParseProcCgroup(const std::string& path, const std::string& text) {
  CgroupPaths paths;
  for (absl::string_view line : absl::StrSplit(text, '\n', absl::SkipWhitespace())) {
    std::vector<absl::string_view> fields = absl::StrSplit(line, absl::MaxSplits(':', 2));
    if (fields.size() != 3 || fields[2].empty() || fields[2][0] != '/') {
      return Malformed(path, line, "a line is not ID:CONTROLLERS:/PATH");
    }
    if (fields[0] == "0" && fields[1].empty()) {
      paths.v2 = std::string(fields[2]);
      continue;
    }
    for (absl::string_view controller : absl::StrSplit(fields[1], ',')) {
      if (controller == "cpu") paths.v1 = std::string(fields[2]);
    }
  }
  return paths;
}

struct Mount {
  std::string root;         // the hierarchy's path mounted there
  std::string mount_point;  // where
};

struct CgroupMounts {
  std::optional<Mount> v2;  // the first cgroup2 mount
  std::optional<Mount> v1;  // the first cgroup (v1) mount with the cpu controller
};

// /proc/self/mountinfo: "ID PARENT MAJ:MIN ROOT MOUNT_POINT OPTIONS [TAGS...]
// - FSTYPE SOURCE SUPER_OPTIONS" per line.
absl::StatusOr<CgroupMounts> ParseMountInfo(const std::string& path, const std::string& text) {
  CgroupMounts mounts;
  for (absl::string_view line : absl::StrSplit(text, '\n', absl::SkipWhitespace())) {
    std::vector<absl::string_view> fields = absl::StrSplit(line, ' ', absl::SkipEmpty());
    size_t dash = 6;  // the separator follows the six fixed fields and any optional tags
    while (dash < fields.size() && fields[dash] != "-") ++dash;
    if (dash + 3 >= fields.size()) {
      return Malformed(path, line, "a line lacks its fields or the '-' separator");
    }
    const absl::string_view fs_type = fields[dash + 1];
    Mount mount{UnescapeMountField(fields[3]), UnescapeMountField(fields[4])};
    if (fs_type == "cgroup2" && !mounts.v2) {
      mounts.v2 = mount;
    } else if (fs_type == "cgroup" && !mounts.v1) {
      for (absl::string_view option : absl::StrSplit(fields[dash + 3], ',')) {
        if (option == "cpu") mounts.v1 = mount;
      }
    }
  }
  return mounts;
}

// The process's cgroup below the mount point. A cgroup outside the mounted
// root (a bind mount of another subtree, or a path with "/.." that a cgroup
// namespace shows for a cgroup above its root) leaves the mount point itself.
std::string RelativeToMount(const Mount& mount, const std::string& cgroup) {
  if (cgroup == "/.." || absl::StrContains(cgroup, "/../") || absl::EndsWith(cgroup, "/..")) return "";
  if (mount.root == "/") return cgroup == "/" ? "" : cgroup;
  if (cgroup == mount.root) return "";
  if (cgroup.size() > mount.root.size() && cgroup.compare(0, mount.root.size(), mount.root) == 0 &&
      cgroup[mount.root.size()] == '/') {
    return cgroup.substr(mount.root.size());
  }
  return "";
}

// The smallest quota seen so far, in CPUs, and where it came from.
struct Quota {
  double cpus = 0;
  std::string source;
};

void Keep(std::optional<Quota>& best, Quota quota) {
  if (!best || quota.cpus < best->cpus) best = std::move(quota);
}

// cgroup v2 cpu.max of one directory.
absl::Status ReadV2(const std::string& dir, std::optional<Quota>& best) {
  const std::string path = dir + "/cpu.max";
  std::optional<std::string> text = ReadFile(path);
  if (!text) return absl::OkStatus();
  std::vector<absl::string_view> fields = absl::StrSplit(*text, absl::ByAnyChar(" \t\n"), absl::SkipEmpty());
  if (fields.size() != 2) return Malformed(path, *text, "expected \"$MAX $PERIOD\"");
  absl::StatusOr<int64_t> period = PositiveInteger(path, *text, fields[1]);
  if (!period.ok()) return period.status();
  if (fields[0] == "max") return absl::OkStatus();
  absl::StatusOr<int64_t> max = PositiveInteger(path, *text, fields[0]);
  if (!max.ok()) return max.status();
  const double cpus = static_cast<double>(*max) / static_cast<double>(*period);
  Keep(best, {cpus, absl::StrFormat("cgroup v2 %s \"%d %d\" = %.2f CPUs", path, *max, *period, cpus)});
  return absl::OkStatus();
}

// cgroup v1 cpu.cfs_quota_us / cpu.cfs_period_us of one directory.
absl::Status ReadV1(const std::string& dir, std::optional<Quota>& best) {
  const std::string quota_path = dir + "/cpu.cfs_quota_us";
  std::optional<std::string> quota_text = ReadFile(quota_path);
  if (!quota_text) return absl::OkStatus();
  const absl::string_view quota_field = absl::StripAsciiWhitespace(*quota_text);
  if (quota_field == "-1") return absl::OkStatus();
  absl::StatusOr<int64_t> quota = PositiveInteger(quota_path, *quota_text, quota_field);
  if (!quota.ok()) return quota.status();
  const std::string period_path = dir + "/cpu.cfs_period_us";
  std::optional<std::string> period_text = ReadFile(period_path);
  if (!period_text) return Malformed(quota_path, *quota_text, "a quota without cpu.cfs_period_us beside it");
  absl::StatusOr<int64_t> period =
      PositiveInteger(period_path, *period_text, absl::StripAsciiWhitespace(*period_text));
  if (!period.ok()) return period.status();
  const double cpus = static_cast<double>(*quota) / static_cast<double>(*period);
  Keep(best, {cpus, absl::StrFormat("cgroup v1 %s %d / cpu.cfs_period_us %d = %.2f CPUs", quota_path, *quota,
                                    *period, cpus)});
  return absl::OkStatus();
}

// Reads the quota files of the process's cgroup and of each ancestor up to
// the mount point.
absl::Status ReadHierarchy(const std::string& root, const Hierarchy& h, std::optional<Quota>& best) {
  std::string relative = h.relative;
  while (true) {
    const std::string dir = root + h.mount_point + relative;
    absl::Status s = h.version == 2 ? ReadV2(dir, best) : ReadV1(dir, best);
    if (!s.ok()) return s;
    if (relative.empty()) return absl::OkStatus();
    relative = relative.substr(0, relative.rfind('/'));
  }
}

}  // namespace

absl::StatusOr<CpuBudget> ReadCpuBudget(const std::string& root, int affinity_cpus, int hardware_cpus) {
  const std::string prefix(absl::StripSuffix(root, "/"));
  std::optional<Quota> best;
  const std::string cgroup_path = prefix + "/proc/self/cgroup";
  const std::string mountinfo_path = prefix + "/proc/self/mountinfo";
  std::optional<std::string> cgroup_text = ReadFile(cgroup_path);
  std::optional<std::string> mountinfo_text = ReadFile(mountinfo_path);
  if (cgroup_text && mountinfo_text) {
    absl::StatusOr<CgroupPaths> paths = ParseProcCgroup(cgroup_path, *cgroup_text);
    if (!paths.ok()) return paths.status();
    absl::StatusOr<CgroupMounts> mounts = ParseMountInfo(mountinfo_path, *mountinfo_text);
    if (!mounts.ok()) return mounts.status();
    std::vector<Hierarchy> hierarchies;
    if (paths->v2 && mounts->v2) {
      hierarchies.push_back({2, mounts->v2->mount_point, RelativeToMount(*mounts->v2, *paths->v2)});
    }
    if (paths->v1 && mounts->v1) {
      hierarchies.push_back({1, mounts->v1->mount_point, RelativeToMount(*mounts->v1, *paths->v1)});
    }
    for (const Hierarchy& h : hierarchies) {
      std::string mount_point = h.mount_point == "/" ? "" : h.mount_point;
      absl::Status s = ReadHierarchy(prefix, {h.version, mount_point, h.relative}, best);
      if (!s.ok()) return s;
    }
  }

  CpuBudget budget;
  std::vector<std::string> parts;
  int cpus = 0;
  if (best) {
    cpus = std::max(1, static_cast<int>(std::floor(best->cpus + 1e-9)));
    parts.push_back(absl::StrFormat("CPU quota %s, rounded down to %d", best->source, cpus));
  } else {
    parts.push_back("no cgroup CPU quota");
  }
  if (affinity_cpus > 0) {
    parts.push_back(absl::StrFormat("affinity mask %d CPUs", affinity_cpus));
    cpus = cpus > 0 ? std::min(cpus, affinity_cpus) : affinity_cpus;
  } else if (!best && hardware_cpus > 0) {
    parts.push_back(absl::StrFormat("hardware concurrency %d", hardware_cpus));
    cpus = hardware_cpus;
  }
  budget.cpus = std::max(1, cpus);
  budget.explanation = absl::StrJoin(parts, "; ");
  return budget;
}

CpuBudget DetectCpuBudget() {
  int affinity_cpus = 0;
  cpu_set_t set;
  CPU_ZERO(&set);
  if (sched_getaffinity(0, sizeof(set), &set) == 0) affinity_cpus = CPU_COUNT(&set);
  const int hardware_cpus = static_cast<int>(std::thread::hardware_concurrency());
  absl::StatusOr<CpuBudget> budget = ReadCpuBudget("/", affinity_cpus, hardware_cpus);
  if (budget.ok()) return *budget;
  CpuBudget fallback;
  fallback.cpus = std::max(1, affinity_cpus > 0 ? affinity_cpus : hardware_cpus);
  fallback.explanation = absl::StrCat("cgroup files unreadable (", budget.status().message(), "); ",
                                      affinity_cpus > 0 ? "affinity mask" : "hardware concurrency", " ",
                                      fallback.cpus, " CPUs");
  return fallback;
}

}  // namespace decoded::server
