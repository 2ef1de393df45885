// kernels.h: each kernel forwards to the copy of the process's tier
// (engine/cpu_isa.h; the copies are kernels_isa.cc compiled per tier).
#include "engine/cpu/kernels.h"

#include "engine/cpu/kernels_isa.h"
#include "engine/cpu_isa.h"

namespace decoded::cpu {

#define DECODED_CPU_DISPATCH_KERNEL(ret, name, params, args) \
  ret name params {                                           \
    switch (ActiveCpuIsa()) {                                 \
      case CpuIsa::kAvx512Vnni:                               \
        return avx512vnni::name args;                         \
      case CpuIsa::kAvx2:                                     \
        return avx2::name args;                               \
      case CpuIsa::kScalar:                                   \
        break;                                                \
    }                                                         \
    return scalar::name args;                                 \
  }
DECODED_CPU_KERNELS(DECODED_CPU_DISPATCH_KERNEL)
#undef DECODED_CPU_DISPATCH_KERNEL

}  // namespace decoded::cpu
