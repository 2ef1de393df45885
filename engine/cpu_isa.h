// Run-time choice of the instruction set the CPU kernels use.
//
// The kernel sources (engine/quant's matmuls and activation quantizers,
// engine/cpu's f32 op kernels) are compiled once per tier into the same
// binary, each copy in its own namespace (engine/quant/kernels.h,
// engine/cpu/kernels_isa.h); everything else is compiled for the x86-64
// baseline. One tier is selected per process, from what the CPU reports
// (CPUID, including the OS's XSAVE support for the wider register state, as
// GCC's __builtin_cpu_supports checks it) unless DECODED_CPU_ISA names one,
// and every kernel call goes through that tier's functions.
//
// Tiers, best first; each names the -march its copy is compiled with, and a
// CPU supports a tier when it has every feature of that level:
//   avx512vnni  x86-64-v4 (AVX-512 F/BW/CD/DQ/VL) + AVX512-VNNI
//               (Intel Ice Lake server / Sapphire Rapids and later, AMD Zen 4/5)
//   avx2        x86-64-v3 (AVX2, FMA, F16C, BMI1/2, LZCNT, MOVBE)
//   scalar      x86-64 (SSE2): portable C++, runs on any x86-64 CPU
// Results are deterministic within a tier but differ in the last bits between
// tiers (summation order, FMA), so a session's numerics depend on the tier
// the process runs: benchmarks and logs name it (CpuIsaName(ActiveCpuIsa())).
#ifndef DECODED_ENGINE_CPU_ISA_H_
#define DECODED_ENGINE_CPU_ISA_H_

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/strings/string_view.h"

namespace decoded {

enum class CpuIsa { kScalar = 0, kAvx2 = 1, kAvx512Vnni = 2 };

// Every tier, best first.
inline constexpr CpuIsa kCpuIsas[] = {CpuIsa::kAvx512Vnni, CpuIsa::kAvx2, CpuIsa::kScalar};

// Environment variable that overrides the automatic choice with a tier name.
inline constexpr char kCpuIsaEnv[] = "DECODED_CPU_ISA";

// "avx512vnni", "avx2" or "scalar".
const char* CpuIsaName(CpuIsa isa);

// The tier named `name` (CpuIsaName spelling); INVALID_ARGUMENT listing the
// names otherwise.
absl::StatusOr<CpuIsa> ParseCpuIsa(absl::string_view name);

// The x86-64 levels the tiers need, as this CPU reports them.
struct CpuIsaSupport {
  bool x86_64_v3 = false;   // AVX2, FMA, F16C, BMI1/2, LZCNT, MOVBE, OS-enabled YMM state
  bool x86_64_v4 = false;   // AVX-512 F/BW/CD/DQ/VL, OS-enabled ZMM state
  bool avx512vnni = false;  // AVX512-VNNI, OS-enabled ZMM state
};

// This CPU's levels from CPUID and XCR0 (GCC's __builtin_cpu_supports, which
// reports AVX / AVX-512 features absent unless the OS enables their state).
CpuIsaSupport DetectCpuIsaSupport();

// What `isa` needs that `support` lacks, as a phrase for messages ("" when
// nothing is missing).
const char* MissingForCpuIsa(CpuIsa isa, const CpuIsaSupport& support);

// True when this CPU (and the OS, for the register state) supports `isa`.
bool CpuSupports(CpuIsa isa);

// The best tier CpuSupports.
CpuIsa BestSupportedCpuIsa();

// The tier `override_name` asks for (DECODED_CPU_ISA's value; null or empty:
// the best tier `support` allows) on a CPU with `support`. INVALID_ARGUMENT
// for an unknown name, FAILED_PRECONDITION naming the missing level for a
// tier the CPU lacks.
absl::StatusOr<CpuIsa> ResolveCpuIsa(const char* override_name, const CpuIsaSupport& support);

// Selects the process's tier from DECODED_CPU_ISA (ResolveCpuIsa) and returns
// the error without selecting anything when the variable is invalid. Entry
// points (the daemon, benchmarks) call it first so a bad value is reported as
// a startup error; when nothing selected a tier before the first kernel call,
// ActiveCpuIsa() does this itself and exits the process with the message on
// error (there is no caller to hand a Status to, and running other kernels
// than the operator asked for would be worse).
absl::Status InitCpuIsaFromEnvironment();

// The process's tier (selected on first use as above).
CpuIsa ActiveCpuIsa();

// Switches the process's tier to `isa`: FAILED_PRECONDITION if this CPU
// lacks it. For tests and benchmarks that compare tiers; kernels started
// before the switch finish on the old tier, so do not switch while a decode
// session is open (its plans would mix tiers and lose D2 == D1 identity).
absl::Status SetActiveCpuIsa(CpuIsa isa);

}  // namespace decoded

#endif  // DECODED_ENGINE_CPU_ISA_H_
