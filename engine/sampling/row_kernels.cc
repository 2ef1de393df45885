// row_kernels.h: each kernel forwards to the copy of the process's tier.
#include "engine/sampling/row_kernels.h"

#include "engine/cpu_isa.h"

namespace decoded::sampling_internal {

#define DECODED_SAMPLING_DISPATCH_KERNEL(ret, name, params, args) \
  ret name params {                                               \
    switch (ActiveCpuIsa()) {                                     \
      case CpuIsa::kAvx512Vnni:                                   \
        return avx512vnni::name args;                             \
      case CpuIsa::kAvx2:                                         \
        return avx2::name args;                                   \
      case CpuIsa::kScalar:                                       \
        break;                                                    \
    }                                                             \
    return scalar::name args;                                     \
  }
DECODED_SAMPLING_ROW_KERNELS(DECODED_SAMPLING_DISPATCH_KERNEL)
#undef DECODED_SAMPLING_DISPATCH_KERNEL

}  // namespace decoded::sampling_internal
