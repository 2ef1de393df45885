// DECODED_ISA_NS: the namespace of code compiled for one kernel tier
// (engine/cpu_isa.h). The build compiles each kernel source once per tier
// with that tier's -march and -DDECODED_ISA_NS=<tier name> (avx512vnni, avx2,
// scalar); every other file is compiled for the x86-64 baseline and sees
// `baseline`.
//
// Why headers need it: an inline function defined in a header (blocks.h's
// fp16 helpers, kernels.h's Share) that the compiler emits out of line in
// several objects is one weak symbol, and the linker keeps one copy: the
// AVX-512 object's copy could then serve a baseline caller and fault on a
// CPU without AVX-512. Wrapping such helpers in `inline namespace
// DECODED_ISA_NS` gives each tier's copy its own symbol while callers keep
// writing the unqualified name. Code in the kernel sources themselves lives
// in namespace ...::DECODED_ISA_NS or an anonymous namespace for the same
// reason; tests/isa_symbols_check.cmake verifies the kernel objects define
// no other external symbol.
#ifndef DECODED_ENGINE_ISA_NAMESPACE_H_
#define DECODED_ENGINE_ISA_NAMESPACE_H_

#ifndef DECODED_ISA_NS
#define DECODED_ISA_NS baseline
#endif

#endif  // DECODED_ENGINE_ISA_NAMESPACE_H_
