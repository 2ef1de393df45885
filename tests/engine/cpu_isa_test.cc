// engine/cpu_isa.h: tier names, the choice from CPU support and the
// DECODED_CPU_ISA override. The CPU's support is checked against the flags
// the Linux kernel reports in /proc/cpuinfo (its own CPUID reading, with
// features whose register state it does not enable cleared), an independent
// source from libgcc's __builtin_cpu_supports that cpu_isa.cc uses.
#include "engine/cpu_isa.h"

#include <cstdlib>
#include <fstream>
#include <set>
#include <sstream>
#include <string>

#include "absl/status/status.h"
#include "engine/cpu/kernels.h"
#include "engine/quant/quant.h"
#include "gtest/gtest.h"

namespace decoded {
namespace {

std::set<std::string> ProcCpuFlags() {
  std::ifstream in("/proc/cpuinfo");
  std::string line;
  while (std::getline(in, line)) {
    if (line.rfind("flags", 0) != 0) continue;
    std::istringstream words(line.substr(line.find(':') + 1));
    std::set<std::string> flags;
    for (std::string w; words >> w;) flags.insert(w);
    return flags;
  }
  return {};
}

bool HasAll(const std::set<std::string>& flags, std::initializer_list<const char*> names) {
  for (const char* n : names) {
    if (flags.count(n) == 0) return false;
  }
  return true;
}

TEST(CpuIsaTest, NamesRoundTripAndUnknownNamesAreRefused) {
  for (CpuIsa isa : kCpuIsas) {
    absl::StatusOr<CpuIsa> parsed = ParseCpuIsa(CpuIsaName(isa));
    ASSERT_TRUE(parsed.ok()) << CpuIsaName(isa);
    EXPECT_EQ(*parsed, isa);
  }
  for (const char* bad : {"", "AVX2", "avx512", "sse2", "native", "avx2 "}) {
    absl::StatusOr<CpuIsa> parsed = ParseCpuIsa(bad);
    ASSERT_FALSE(parsed.ok()) << bad;
    EXPECT_EQ(parsed.status().code(), absl::StatusCode::kInvalidArgument);
    EXPECT_NE(parsed.status().message().find("avx512vnni, avx2 or scalar"), std::string::npos)
        << parsed.status().message();
  }
}

TEST(CpuIsaTest, DetectionAgreesWithTheKernelsCpuFlags) {
  const std::set<std::string> flags = ProcCpuFlags();
  if (flags.empty()) GTEST_SKIP() << "no /proc/cpuinfo flags";
  const CpuIsaSupport s = DetectCpuIsaSupport();
  // x86-64-v3 and v4 as the psABI defines them; /proc/cpuinfo spells LZCNT
  // "abm" and AVX512-VNNI "avx512_vnni".
  EXPECT_EQ(s.x86_64_v3, HasAll(flags, {"avx", "avx2", "bmi1", "bmi2", "f16c", "fma", "abm", "movbe", "xsave"}));
  EXPECT_EQ(s.x86_64_v4,
            s.x86_64_v3 && HasAll(flags, {"avx512f", "avx512bw", "avx512cd", "avx512dq", "avx512vl"}));
  EXPECT_EQ(s.avx512vnni, HasAll(flags, {"avx512_vnni"}));
}

TEST(CpuIsaTest, TheBestSupportedTierIsChosenByDefault) {
  const CpuIsa best = BestSupportedCpuIsa();
  EXPECT_TRUE(CpuSupports(best));
  EXPECT_TRUE(CpuSupports(CpuIsa::kScalar));
  // No better tier is supported: kCpuIsas is ordered best first.
  for (CpuIsa isa : kCpuIsas) {
    if (isa == best) break;
    EXPECT_FALSE(CpuSupports(isa)) << CpuIsaName(isa) << " is supported but " << CpuIsaName(best) << " was chosen";
  }
  const CpuIsaSupport here = DetectCpuIsaSupport();
  for (const char* unset : {static_cast<const char*>(nullptr), ""}) {
    absl::StatusOr<CpuIsa> isa = ResolveCpuIsa(unset, here);
    ASSERT_TRUE(isa.ok());
    EXPECT_EQ(*isa, best);
  }
}

// Hypothetical CPUs: a Zen 4 / Sapphire Rapids (everything), an AVX2-only
// client part (Alder Lake: x86-64-v3, no AVX-512), AVX-512 without VNNI
// (Skylake-SP), and a pre-AVX2 or QEMU qemu64 CPU.
TEST(CpuIsaTest, EachCpuGetsItsBestTierAndRefusesTiersItLacks) {
  const CpuIsaSupport all{true, true, true}, avx2_only{true, false, false}, skx{true, true, false}, old{};
  EXPECT_EQ(*ResolveCpuIsa(nullptr, all), CpuIsa::kAvx512Vnni);
  EXPECT_EQ(*ResolveCpuIsa(nullptr, avx2_only), CpuIsa::kAvx2);
  EXPECT_EQ(*ResolveCpuIsa(nullptr, skx), CpuIsa::kAvx2);
  EXPECT_EQ(*ResolveCpuIsa(nullptr, old), CpuIsa::kScalar);
  // Overrides down to a lower tier are honoured.
  EXPECT_EQ(*ResolveCpuIsa("avx2", all), CpuIsa::kAvx2);
  EXPECT_EQ(*ResolveCpuIsa("scalar", all), CpuIsa::kScalar);
  EXPECT_EQ(*ResolveCpuIsa("scalar", old), CpuIsa::kScalar);
  // Overrides up to a tier the CPU lacks are refused, naming what is missing.
  struct Refusal {
    const char* name;
    CpuIsaSupport cpu;
    const char* missing;
  };
  for (const Refusal& r : {Refusal{"avx512vnni", avx2_only, "x86-64-v4"}, Refusal{"avx512vnni", skx, "AVX512-VNNI"},
                           Refusal{"avx2", old, "x86-64-v3"}, Refusal{"avx512vnni", old, "x86-64-v4"}}) {
    absl::StatusOr<CpuIsa> isa = ResolveCpuIsa(r.name, r.cpu);
    ASSERT_FALSE(isa.ok()) << r.name;
    EXPECT_EQ(isa.status().code(), absl::StatusCode::kFailedPrecondition);
    EXPECT_NE(isa.status().message().find(r.missing), std::string::npos) << isa.status().message();
    EXPECT_NE(isa.status().message().find(std::string("DECODED_CPU_ISA=") + r.name), std::string::npos);
  }
  EXPECT_EQ(ResolveCpuIsa("avx-512", all).status().code(), absl::StatusCode::kInvalidArgument);
}

TEST(CpuIsaTest, EnvironmentOverrideSelectsTheTierAndBadValuesAreReported) {
  const CpuIsa before = ActiveCpuIsa();
  for (CpuIsa isa : kCpuIsas) {
    if (!CpuSupports(isa)) continue;
    ASSERT_EQ(setenv(kCpuIsaEnv, CpuIsaName(isa), 1), 0);
    ASSERT_TRUE(InitCpuIsaFromEnvironment().ok()) << CpuIsaName(isa);
    EXPECT_EQ(ActiveCpuIsa(), isa);
    EXPECT_STREQ(quant::KernelVariant(), CpuIsaName(isa));
  }
  // A bad value is an error and leaves the selection as it was.
  ASSERT_EQ(setenv(kCpuIsaEnv, "scalar", 1), 0);
  ASSERT_TRUE(InitCpuIsaFromEnvironment().ok());
  ASSERT_EQ(setenv(kCpuIsaEnv, "avx9000", 1), 0);
  EXPECT_EQ(InitCpuIsaFromEnvironment().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_EQ(ActiveCpuIsa(), CpuIsa::kScalar);
  for (CpuIsa isa : kCpuIsas) {
    if (CpuSupports(isa)) continue;
    ASSERT_EQ(setenv(kCpuIsaEnv, CpuIsaName(isa), 1), 0);
    EXPECT_EQ(InitCpuIsaFromEnvironment().code(), absl::StatusCode::kFailedPrecondition);
    EXPECT_EQ(SetActiveCpuIsa(isa).code(), absl::StatusCode::kFailedPrecondition);
    EXPECT_EQ(ActiveCpuIsa(), CpuIsa::kScalar);
  }
  ASSERT_EQ(unsetenv(kCpuIsaEnv), 0);
  ASSERT_TRUE(InitCpuIsaFromEnvironment().ok());
  EXPECT_EQ(ActiveCpuIsa(), BestSupportedCpuIsa());
  ASSERT_TRUE(SetActiveCpuIsa(before).ok());
}

// Without InitCpuIsaFromEnvironment, the first kernel call selects the tier
// itself and ends the process with the message on a bad value. The death
// test's child re-runs only this test, so nothing has selected a tier yet.
void FirstKernelCallWithABadOverride() {
  setenv(kCpuIsaEnv, "avx9000", 1);
  const float a[4] = {1, 2, 3, 4};
  (void)cpu::DotF32(a, a, 4);
}

TEST(CpuIsaDeathTest, FirstKernelCallExitsOnABadOverride) {
  GTEST_FLAG_SET(death_test_style, "threadsafe");
  EXPECT_EXIT(FirstKernelCallWithABadOverride(), ::testing::ExitedWithCode(EXIT_FAILURE),
              "DECODED_CPU_ISA=\"avx9000\" is not a kernel tier");
}

}  // namespace
}  // namespace decoded
