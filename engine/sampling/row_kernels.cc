// row_kernels.h: each kernel forwards to the copy of the process's tier.
#include "engine/sampling/row_kernels.h"

#include "engine/cpu_isa.h"
#include "engine/isa_dispatch.h"

namespace decoded::sampling_internal {

DECODED_SAMPLING_ROW_KERNELS(DECODED_DEFINE_ISA_DISPATCH)

}  // namespace decoded::sampling_internal
