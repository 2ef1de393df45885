#include "engine/cpu_isa.h"

#include <atomic>
#include <cstdio>
#include <cstdlib>
#include <mutex>

#include "absl/strings/str_cat.h"

namespace decoded {
namespace {

// -1 until a tier is selected.
std::atomic<int> g_active{-1};
std::mutex g_select_mu;

const CpuIsaSupport& ThisCpu() {
  static const CpuIsaSupport support = DetectCpuIsaSupport();
  return support;
}

}  // namespace

const char* CpuIsaName(CpuIsa isa) {
  switch (isa) {
    case CpuIsa::kAvx512Vnni: return "avx512vnni";
    case CpuIsa::kAvx2: return "avx2";
    case CpuIsa::kScalar: return "scalar";
  }
  return "unknown";
}

absl::StatusOr<CpuIsa> ParseCpuIsa(absl::string_view name) {
  for (CpuIsa isa : kCpuIsas) {
    if (name == CpuIsaName(isa)) return isa;
  }
  return absl::InvalidArgumentError(
      absl::StrCat(kCpuIsaEnv, "=\"", name, "\" is not a kernel tier; use avx512vnni, avx2 or scalar"));
}

CpuIsaSupport DetectCpuIsaSupport() {
  __builtin_cpu_init();
  CpuIsaSupport s;
  s.x86_64_v3 = __builtin_cpu_supports("x86-64-v3");
  s.x86_64_v4 = __builtin_cpu_supports("x86-64-v4");
  s.avx512vnni = __builtin_cpu_supports("avx512vnni");
  return s;
}

const char* MissingForCpuIsa(CpuIsa isa, const CpuIsaSupport& support) {
  switch (isa) {
    case CpuIsa::kAvx512Vnni:
      if (!support.x86_64_v4) return "x86-64-v4 (AVX-512 F/BW/CD/DQ/VL with OS support)";
      if (!support.avx512vnni) return "AVX512-VNNI";
      return "";
    case CpuIsa::kAvx2:
      if (!support.x86_64_v3) return "x86-64-v3 (AVX2, FMA, F16C, BMI1/2 with OS support)";
      return "";
    case CpuIsa::kScalar:
      return "";
  }
  return "a known tier";
}

namespace {
CpuIsa BestFor(const CpuIsaSupport& support) {
  for (CpuIsa isa : kCpuIsas) {
    if (*MissingForCpuIsa(isa, support) == '\0') return isa;
  }
  return CpuIsa::kScalar;
}
}  // namespace

bool CpuSupports(CpuIsa isa) { return *MissingForCpuIsa(isa, ThisCpu()) == '\0'; }

CpuIsa BestSupportedCpuIsa() { return BestFor(ThisCpu()); }

absl::StatusOr<CpuIsa> ResolveCpuIsa(const char* override_name, const CpuIsaSupport& support) {
  if (override_name == nullptr || *override_name == '\0') return BestFor(support);
  absl::StatusOr<CpuIsa> isa = ParseCpuIsa(override_name);
  if (!isa.ok()) return isa.status();
  const char* missing = MissingForCpuIsa(*isa, support);
  if (*missing != '\0') {
    return absl::FailedPreconditionError(absl::StrCat(kCpuIsaEnv, "=", override_name,
                                                      " asks for kernels this CPU cannot run: it lacks ", missing,
                                                      "; the best tier it supports is ",
                                                      CpuIsaName(BestFor(support))));
  }
  return *isa;
}

absl::Status InitCpuIsaFromEnvironment() {
  absl::StatusOr<CpuIsa> isa = ResolveCpuIsa(std::getenv(kCpuIsaEnv), ThisCpu());
  if (!isa.ok()) return isa.status();
  std::lock_guard<std::mutex> lock(g_select_mu);
  g_active.store(static_cast<int>(*isa), std::memory_order_release);
  return absl::OkStatus();
}

CpuIsa ActiveCpuIsa() {
  int v = g_active.load(std::memory_order_acquire);
  if (v >= 0) return static_cast<CpuIsa>(v);
  std::lock_guard<std::mutex> lock(g_select_mu);
  v = g_active.load(std::memory_order_acquire);
  if (v >= 0) return static_cast<CpuIsa>(v);
  absl::StatusOr<CpuIsa> isa = ResolveCpuIsa(std::getenv(kCpuIsaEnv), ThisCpu());
  if (!isa.ok()) {
    std::fprintf(stderr, "decoded: %s\n", isa.status().ToString().c_str());
    std::exit(EXIT_FAILURE);
  }
  g_active.store(static_cast<int>(*isa), std::memory_order_release);
  return *isa;
}

absl::Status SetActiveCpuIsa(CpuIsa isa) {
  const char* missing = MissingForCpuIsa(isa, ThisCpu());
  if (*missing != '\0') {
    return absl::FailedPreconditionError(
        absl::StrCat("this CPU cannot run the ", CpuIsaName(isa), " kernels: it lacks ", missing));
  }
  std::lock_guard<std::mutex> lock(g_select_mu);
  g_active.store(static_cast<int>(isa), std::memory_order_release);
  return absl::OkStatus();
}

}  // namespace decoded
