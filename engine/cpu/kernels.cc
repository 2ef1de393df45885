// kernels.h: each kernel forwards to the copy of the process's tier
// (engine/cpu_isa.h; the copies are kernels_isa.cc compiled per tier).
#include "engine/cpu/kernels.h"

#include "engine/cpu/kernels_isa.h"
#include "engine/cpu_isa.h"
#include "engine/isa_dispatch.h"

namespace decoded::cpu {

DECODED_CPU_KERNELS(DECODED_DEFINE_ISA_DISPATCH)

}  // namespace decoded::cpu
