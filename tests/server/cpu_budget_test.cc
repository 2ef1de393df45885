// ReadCpuBudget against fake cgroup trees laid out as the kernel and the
// container runtimes lay them out (cgroup v2 with and without a cgroup
// namespace, nested Kubernetes-style cgroups, cgroup v1 as podman/runc on a
// v1 host mount it, a hybrid host), and against malformed files. Expected CPU
// counts follow from the kernel's documented formula (quota / period) and the
// rounding rule of cpu_budget.h.
#include "server/cpu_budget.h"

#include <sched.h>
#include <unistd.h>

#include <atomic>
#include <filesystem>
#include <fstream>
#include <string>

#include "absl/status/status.h"
#include "absl/strings/match.h"
#include "gtest/gtest.h"

namespace decoded::server {
namespace {

// A fresh directory standing for "/".
class FakeRoot {
 public:
  FakeRoot() {
    static std::atomic<int> count{0};
    root_ = ::testing::TempDir() + "cpu_budget_" + std::to_string(getpid()) + "_" + std::to_string(++count);
    std::filesystem::remove_all(root_);
    std::filesystem::create_directories(root_);
  }
  ~FakeRoot() { std::filesystem::remove_all(root_); }

  // Writes `text` to root + `path`, making its folders.
  void Write(const std::string& path, const std::string& text) const {
    const std::filesystem::path full = root_ + path;
    std::filesystem::create_directories(full.parent_path());
    std::ofstream(full, std::ios::binary) << text;
  }
  const std::string& root() const { return root_; }

 private:
  std::string root_;
};

// The mountinfo line of a cgroup2 mount.
std::string V2Mount(const std::string& root, const std::string& mount_point) {
  return "35 24 0:30 " + root + " " + mount_point + " rw,nosuid,nodev,noexec,relatime shared:9 - cgroup2 cgroup2 rw\n";
}
// The mountinfo line of a cgroup v1 mount of the given controllers.
std::string V1Mount(const std::string& root, const std::string& mount_point, const std::string& controllers) {
  return "32 31 0:29 " + root + " " + mount_point + " rw,nosuid,nodev,noexec,relatime - cgroup cgroup rw," +
         controllers + "\n";
}
constexpr char kRootMount[] = "22 1 254:0 / / rw,relatime - ext4 /dev/vda rw\n";

TEST(CpuBudgetTest, CgroupV2InItsOwnNamespaceUsesCpuMax) {
  FakeRoot fs;
  fs.Write("/proc/self/cgroup", "0::/\n");
  fs.Write("/proc/self/mountinfo", std::string(kRootMount) + V2Mount("/", "/sys/fs/cgroup"));
  fs.Write("/sys/fs/cgroup/cpu.max", "200000 100000\n");
  absl::StatusOr<CpuBudget> b = ReadCpuBudget(fs.root(), 8, 8);
  ASSERT_TRUE(b.ok()) << b.status();
  EXPECT_EQ(b->cpus, 2);
  EXPECT_TRUE(absl::StrContains(b->explanation, "cgroup v2")) << b->explanation;
  EXPECT_TRUE(absl::StrContains(b->explanation, "\"200000 100000\" = 2.00 CPUs")) << b->explanation;
  EXPECT_TRUE(absl::StrContains(b->explanation, "affinity mask 8 CPUs")) << b->explanation;
}

TEST(CpuBudgetTest, CgroupV2MaxMeansNoQuota) {
  FakeRoot fs;
  fs.Write("/proc/self/cgroup", "0::/\n");
  fs.Write("/proc/self/mountinfo", V2Mount("/", "/sys/fs/cgroup"));
  fs.Write("/sys/fs/cgroup/cpu.max", "max 100000\n");
  absl::StatusOr<CpuBudget> b = ReadCpuBudget(fs.root(), 6, 16);
  ASSERT_TRUE(b.ok()) << b.status();
  EXPECT_EQ(b->cpus, 6);
  EXPECT_TRUE(absl::StrContains(b->explanation, "no cgroup CPU quota")) << b->explanation;
}

// Kubernetes without a cgroup namespace: the pod's quota sits on the pod's
// cgroup, the container's own says max; the parent caps the child.
TEST(CpuBudgetTest, CgroupV2TakesTheSmallestQuotaUpToTheMountPoint) {
  FakeRoot fs;
  fs.Write("/proc/self/cgroup", "0::/kubepods.slice/pod1/ctr\n");
  fs.Write("/proc/self/mountinfo", V2Mount("/", "/sys/fs/cgroup"));
  fs.Write("/sys/fs/cgroup/cpu.max", "max 100000\n");
  fs.Write("/sys/fs/cgroup/kubepods.slice/cpu.max", "800000 100000\n");
  fs.Write("/sys/fs/cgroup/kubepods.slice/pod1/cpu.max", "150000 100000\n");
  fs.Write("/sys/fs/cgroup/kubepods.slice/pod1/ctr/cpu.max", "max 100000\n");
  absl::StatusOr<CpuBudget> b = ReadCpuBudget(fs.root(), 16, 16);
  ASSERT_TRUE(b.ok()) << b.status();
  EXPECT_EQ(b->cpus, 1);  // 1.5 CPUs, rounded down
  EXPECT_TRUE(absl::StrContains(b->explanation, "/sys/fs/cgroup/kubepods.slice/pod1/cpu.max")) << b->explanation;
  EXPECT_TRUE(absl::StrContains(b->explanation, "= 1.50 CPUs, rounded down to 1")) << b->explanation;
}

TEST(CpuBudgetTest, QuotaBelowOneCpuGivesOne) {
  FakeRoot fs;
  fs.Write("/proc/self/cgroup", "0::/\n");
  fs.Write("/proc/self/mountinfo", V2Mount("/", "/sys/fs/cgroup"));
  fs.Write("/sys/fs/cgroup/cpu.max", "50000 100000\n");
  absl::StatusOr<CpuBudget> b = ReadCpuBudget(fs.root(), 4, 4);
  ASSERT_TRUE(b.ok()) << b.status();
  EXPECT_EQ(b->cpus, 1);
}

// podman/runc on a cgroup v1 host without a cgroup namespace: the
// container's cgroup is bind-mounted as the cpu hierarchy's mount point.
TEST(CpuBudgetTest, CgroupV1ContainerMountRootIsTheProcessCgroup) {
  FakeRoot fs;
  fs.Write("/proc/self/cgroup",
           "4:memory:/libpod_parent/libpod-abc\n3:cpu,cpuacct:/libpod_parent/libpod-abc\n0::/\n");
  fs.Write("/proc/self/mountinfo", std::string(kRootMount) +
                                       V1Mount("/libpod_parent/libpod-abc", "/sys/fs/cgroup/cpu,cpuacct",
                                               "cpu,cpuacct") +
                                       V1Mount("/libpod_parent/libpod-abc", "/sys/fs/cgroup/memory", "memory"));
  fs.Write("/sys/fs/cgroup/cpu,cpuacct/cpu.cfs_quota_us", "300000\n");
  fs.Write("/sys/fs/cgroup/cpu,cpuacct/cpu.cfs_period_us", "100000\n");
  absl::StatusOr<CpuBudget> b = ReadCpuBudget(fs.root(), 16, 16);
  ASSERT_TRUE(b.ok()) << b.status();
  EXPECT_EQ(b->cpus, 3);
  EXPECT_TRUE(absl::StrContains(b->explanation, "cgroup v1")) << b->explanation;
  EXPECT_TRUE(absl::StrContains(b->explanation, "300000 / cpu.cfs_period_us 100000 = 3.00 CPUs")) << b->explanation;
}

TEST(CpuBudgetTest, AffinityMaskSmallerThanQuotaWins) {
  FakeRoot fs;
  fs.Write("/proc/self/cgroup", "3:cpu,cpuacct:/\n");
  fs.Write("/proc/self/mountinfo", V1Mount("/", "/sys/fs/cgroup/cpu,cpuacct", "cpu,cpuacct"));
  fs.Write("/sys/fs/cgroup/cpu,cpuacct/cpu.cfs_quota_us", "400000\n");
  fs.Write("/sys/fs/cgroup/cpu,cpuacct/cpu.cfs_period_us", "100000\n");
  absl::StatusOr<CpuBudget> b = ReadCpuBudget(fs.root(), 2, 16);
  ASSERT_TRUE(b.ok()) << b.status();
  EXPECT_EQ(b->cpus, 2);
}

TEST(CpuBudgetTest, CgroupV1MinusOneMeansNoQuota) {
  FakeRoot fs;
  fs.Write("/proc/self/cgroup", "3:cpu,cpuacct:/user.slice\n");
  fs.Write("/proc/self/mountinfo", V1Mount("/", "/sys/fs/cgroup/cpu,cpuacct", "cpu,cpuacct"));
  fs.Write("/sys/fs/cgroup/cpu,cpuacct/user.slice/cpu.cfs_quota_us", "-1\n");
  fs.Write("/sys/fs/cgroup/cpu,cpuacct/user.slice/cpu.cfs_period_us", "100000\n");
  fs.Write("/sys/fs/cgroup/cpu,cpuacct/cpu.cfs_quota_us", "-1\n");
  fs.Write("/sys/fs/cgroup/cpu,cpuacct/cpu.cfs_period_us", "100000\n");
  // No affinity mask known: the hardware's count.
  absl::StatusOr<CpuBudget> b = ReadCpuBudget(fs.root(), 0, 12);
  ASSERT_TRUE(b.ok()) << b.status();
  EXPECT_EQ(b->cpus, 12);
  EXPECT_TRUE(absl::StrContains(b->explanation, "hardware concurrency 12")) << b->explanation;
}

// A hybrid host: cgroup2 mounted at .../unified without the cpu controller
// (no cpu.max), the cpu controller on v1.
TEST(CpuBudgetTest, HybridHostReadsTheV1CpuController) {
  FakeRoot fs;
  fs.Write("/proc/self/cgroup", "1:cpu:/batch\n0::/batch\n");
  fs.Write("/proc/self/mountinfo",
           V1Mount("/", "/sys/fs/cgroup/cpu", "cpu") + V2Mount("/", "/sys/fs/cgroup/unified"));
  fs.Write("/sys/fs/cgroup/unified/batch/cgroup.procs", "1\n");
  fs.Write("/sys/fs/cgroup/cpu/batch/cpu.cfs_quota_us", "250000\n");
  fs.Write("/sys/fs/cgroup/cpu/batch/cpu.cfs_period_us", "50000\n");
  absl::StatusOr<CpuBudget> b = ReadCpuBudget(fs.root(), 32, 32);
  ASSERT_TRUE(b.ok()) << b.status();
  EXPECT_EQ(b->cpus, 5);
}

TEST(CpuBudgetTest, BothHierarchiesTakeTheSmallerQuota) {
  FakeRoot fs;
  fs.Write("/proc/self/cgroup", "1:cpu:/\n0::/\n");
  fs.Write("/proc/self/mountinfo",
           V1Mount("/", "/sys/fs/cgroup/cpu", "cpu") + V2Mount("/", "/sys/fs/cgroup/unified"));
  fs.Write("/sys/fs/cgroup/unified/cpu.max", "700000 100000\n");
  fs.Write("/sys/fs/cgroup/cpu/cpu.cfs_quota_us", "400000\n");
  fs.Write("/sys/fs/cgroup/cpu/cpu.cfs_period_us", "100000\n");
  absl::StatusOr<CpuBudget> b = ReadCpuBudget(fs.root(), 32, 32);
  ASSERT_TRUE(b.ok()) << b.status();
  EXPECT_EQ(b->cpus, 4);
}

// A cgroup namespace shows a cgroup above its root as "/../..."; the files
// read are the mount point's, never a path outside it.
TEST(CpuBudgetTest, CgroupAboveTheNamespaceRootReadsTheMountPoint) {
  FakeRoot fs;
  fs.Write("/proc/self/cgroup", "0::/../sibling\n");
  fs.Write("/proc/self/mountinfo", V2Mount("/", "/sys/fs/cgroup"));
  fs.Write("/sys/fs/cgroup/cpu.max", "300000 100000\n");
  fs.Write("/sibling/cpu.max", "100000 100000\n");  // outside the mount: must not be read
  fs.Write("/sys/fs/sibling/cpu.max", "100000 100000\n");
  absl::StatusOr<CpuBudget> b = ReadCpuBudget(fs.root(), 8, 8);
  ASSERT_TRUE(b.ok()) << b.status();
  EXPECT_EQ(b->cpus, 3);
}

// mountinfo writes a space in a path as \040.
TEST(CpuBudgetTest, EscapedMountPoint) {
  FakeRoot fs;
  fs.Write("/proc/self/cgroup", "0::/\n");
  fs.Write("/proc/self/mountinfo", V2Mount("/", "/cg\\040root"));
  fs.Write("/cg root/cpu.max", "300000 100000\n");
  absl::StatusOr<CpuBudget> b = ReadCpuBudget(fs.root(), 8, 8);
  ASSERT_TRUE(b.ok()) << b.status();
  EXPECT_EQ(b->cpus, 3);
}

TEST(CpuBudgetTest, NoProcFallsBackToAffinityThenHardware) {
  FakeRoot fs;
  absl::StatusOr<CpuBudget> b = ReadCpuBudget(fs.root(), 3, 8);
  ASSERT_TRUE(b.ok()) << b.status();
  EXPECT_EQ(b->cpus, 3);
  b = ReadCpuBudget(fs.root(), 0, 8);
  ASSERT_TRUE(b.ok()) << b.status();
  EXPECT_EQ(b->cpus, 8);
  b = ReadCpuBudget(fs.root(), 0, 0);
  ASSERT_TRUE(b.ok()) << b.status();
  EXPECT_EQ(b->cpus, 1);
}

// Each malformed file: INVALID_ARGUMENT naming the file and what is wrong.
struct MalformedCase {
  std::string name;
  std::string file;  // relative to the fake root
  std::string text;
  std::string message;  // expected in the status message
};

class CpuBudgetMalformedTest : public ::testing::TestWithParam<MalformedCase> {};

TEST_P(CpuBudgetMalformedTest, IsInvalidArgumentNamingTheFile) {
  const MalformedCase& c = GetParam();
  FakeRoot fs;
  fs.Write("/proc/self/cgroup", "1:cpu:/\n0::/\n");
  fs.Write("/proc/self/mountinfo",
           V1Mount("/", "/sys/fs/cgroup/cpu", "cpu") + V2Mount("/", "/sys/fs/cgroup/unified"));
  fs.Write("/sys/fs/cgroup/cpu/cpu.cfs_quota_us", "200000\n");
  fs.Write("/sys/fs/cgroup/cpu/cpu.cfs_period_us", "100000\n");
  fs.Write(c.file, c.text);
  absl::StatusOr<CpuBudget> b = ReadCpuBudget(fs.root(), 4, 4);
  ASSERT_FALSE(b.ok()) << b->explanation;
  EXPECT_EQ(b.status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_TRUE(absl::StrContains(b.status().message(), fs.root() + c.file)) << b.status();
  EXPECT_TRUE(absl::StrContains(b.status().message(), c.message)) << b.status();
}

INSTANTIATE_TEST_SUITE_P(
    Files, CpuBudgetMalformedTest,
    ::testing::Values(
        MalformedCase{"V2NotANumber", "/sys/fs/cgroup/unified/cpu.max", "abc 100000\n",
                      "'abc' is not a positive integer"},
        MalformedCase{"V2OneField", "/sys/fs/cgroup/unified/cpu.max", "100000\n", "expected \"$MAX $PERIOD\""},
        MalformedCase{"V2ZeroPeriod", "/sys/fs/cgroup/unified/cpu.max", "max 0\n", "'0' is not a positive integer"},
        MalformedCase{"V1ZeroQuota", "/sys/fs/cgroup/cpu/cpu.cfs_quota_us", "0\n", "'0' is not a positive integer"},
        MalformedCase{"V1NegativePeriod", "/sys/fs/cgroup/cpu/cpu.cfs_period_us", "-5\n",
                      "'-5' is not a positive integer"},
        MalformedCase{"ProcCgroupLine", "/proc/self/cgroup", "garbage\n", "a line is not ID:CONTROLLERS:/PATH"},
        MalformedCase{"MountInfoLine", "/proc/self/mountinfo", "35 24 0:30 / /sys/fs/cgroup rw\n",
                      "a line lacks its fields or the '-' separator"}),
    [](const ::testing::TestParamInfo<MalformedCase>& info) { return info.param.name; });

// The quota on v1 needs its period; the message names the quota file.
TEST(CpuBudgetTest, V1QuotaWithoutPeriodIsInvalid) {
  FakeRoot fs;
  fs.Write("/proc/self/cgroup", "1:cpu:/\n");
  fs.Write("/proc/self/mountinfo", V1Mount("/", "/sys/fs/cgroup/cpu", "cpu"));
  fs.Write("/sys/fs/cgroup/cpu/cpu.cfs_quota_us", "200000\n");
  absl::StatusOr<CpuBudget> b = ReadCpuBudget(fs.root(), 4, 4);
  ASSERT_FALSE(b.ok());
  EXPECT_EQ(b.status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_TRUE(absl::StrContains(b.status().message(), "without cpu.cfs_period_us")) << b.status();
}

// The live process: whatever this machine's limits are, at least one CPU and
// no more than the affinity mask allows.
TEST(CpuBudgetTest, DetectOnThisMachineIsWithinTheAffinityMask) {
  const CpuBudget b = DetectCpuBudget();
  cpu_set_t set;
  CPU_ZERO(&set);
  ASSERT_EQ(sched_getaffinity(0, sizeof(set), &set), 0);
  EXPECT_GE(b.cpus, 1);
  EXPECT_LE(b.cpus, CPU_COUNT(&set));
  EXPECT_FALSE(b.explanation.empty());
}

}  // namespace
}  // namespace decoded::server
