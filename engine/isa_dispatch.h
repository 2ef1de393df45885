// Forwarding a kernel list to the process's tier (engine/cpu_isa.h).
//
// A component whose kernels are compiled once per tier (cmake/DecodedIsa.cmake)
// lists them once as an X-macro, X(return type, name, (parameters),
// (arguments)), and uses these two macros with that list, inside its own
// namespace:
//   LIST(DECODED_DECLARE_ISA_KERNEL)    declares each kernel (e.g. the
//                                       public, dispatching ones);
//   DECODED_DECLARE_ISA_KERNELS(LIST)   declares LIST in namespaces
//                                       avx512vnni, avx2 and scalar;
//   LIST(DECODED_DEFINE_ISA_DISPATCH)   defines each kernel in the current
//                                       namespace as a call of the copy of
//                                       ActiveCpuIsa().
// Used by engine/cpu (f32 op kernels) and engine/sampling (row kernels). The
// per-tier sources include this header too, so it includes nothing: a file
// expanding DECODED_DEFINE_ISA_DISPATCH includes engine/cpu_isa.h itself.
#ifndef DECODED_ENGINE_ISA_DISPATCH_H_
#define DECODED_ENGINE_ISA_DISPATCH_H_

#define DECODED_DECLARE_ISA_KERNEL(ret, name, params, args) ret name params;

#define DECODED_DECLARE_ISA_KERNELS(LIST)  \
  namespace avx512vnni {                   \
  LIST(DECODED_DECLARE_ISA_KERNEL)           \
  }                                        \
  namespace avx2 {                         \
  LIST(DECODED_DECLARE_ISA_KERNEL)           \
  }                                        \
  namespace scalar {                       \
  LIST(DECODED_DECLARE_ISA_KERNEL)           \
  }

#define DECODED_DEFINE_ISA_DISPATCH(ret, name, params, args) \
  ret name params {                                          \
    switch (::decoded::ActiveCpuIsa()) {                     \
      case ::decoded::CpuIsa::kAvx512Vnni:                   \
        return avx512vnni::name args;                        \
      case ::decoded::CpuIsa::kAvx2:                         \
        return avx2::name args;                              \
      case ::decoded::CpuIsa::kScalar:                       \
        break;                                               \
    }                                                        \
    return scalar::name args;                                \
  }

#endif  // DECODED_ENGINE_ISA_DISPATCH_H_
