// Per-format kernels behind quant.h's dispatch. Internal to engine/quant.
//
// Each MatMul* has MatMul's contract for one weight type. The kernel sources
// (matmul_q8_0.cc, matmul_k.cc, matmul_float.cc, quantize_activation.cc) are
// compiled once per tier of engine/cpu_isa.h, each copy in namespace
// internal::<tier> and choosing its code path from that compile's
// __AVX512VNNI__ / __AVX2__ / __F16C__; quant.cc calls the copy of
// ActiveCpuIsa().
#ifndef DECODED_ENGINE_QUANT_KERNELS_H_
#define DECODED_ENGINE_QUANT_KERNELS_H_

#include <cstddef>
#include <cstdint>

#include "engine/isa_namespace.h"

namespace decoded::quant::internal {

// This compile's tier (the helpers of blocks.h live there); declared inline
// here so whichever header comes first declares it inline.
inline namespace DECODED_ISA_NS {}

#define DECODED_QUANT_MATMUL_ARGS                                                     \
  const uint8_t *w, size_t w_row_bytes, int64_t k, const uint8_t *xq,                 \
      size_t xq_row_bytes, int64_t m, float *y, int64_t ldy, int64_t r0, int64_t r1

// The functions of one tier.
#define DECODED_QUANT_DECLARE_KERNELS                                                 \
  /* Weights Q4_0 / Q4_1 / Q5_0 / Q5_1 / Q8_0, activations Q8_0 (matmul_q8_0.cc). */ \
  void MatMulQ4_0(DECODED_QUANT_MATMUL_ARGS);                                         \
  void MatMulQ4_1(DECODED_QUANT_MATMUL_ARGS);                                         \
  void MatMulQ5_0(DECODED_QUANT_MATMUL_ARGS);                                         \
  void MatMulQ5_1(DECODED_QUANT_MATMUL_ARGS);                                         \
  void MatMulQ8_0(DECODED_QUANT_MATMUL_ARGS);                                         \
  /* Weights Q4_K / Q5_K / Q6_K, activations Q8_K (matmul_k.cc). */                   \
  void MatMulQ4_K(DECODED_QUANT_MATMUL_ARGS);                                         \
  void MatMulQ5_K(DECODED_QUANT_MATMUL_ARGS);                                         \
  void MatMulQ6_K(DECODED_QUANT_MATMUL_ARGS);                                         \
  /* Weights F32 / F16 / BF16, activations F32 (matmul_float.cc). */                  \
  void MatMulF32(DECODED_QUANT_MATMUL_ARGS);                                          \
  void MatMulF16(DECODED_QUANT_MATMUL_ARGS);                                          \
  void MatMulBF16(DECODED_QUANT_MATMUL_ARGS);                                         \
  /* Activation converters (quantize_activation.cc); k is a multiple of the */        \
  /* block size (32 / 256). */                                                        \
  void QuantizeRowQ8_0(const float* x, int64_t k, void* out);                         \
  void QuantizeRowQ8_K(const float* x, int64_t k, void* out);

namespace avx512vnni {
DECODED_QUANT_DECLARE_KERNELS
}  // namespace avx512vnni
namespace avx2 {
DECODED_QUANT_DECLARE_KERNELS
}  // namespace avx2
namespace scalar {
DECODED_QUANT_DECLARE_KERNELS
}  // namespace scalar

#undef DECODED_QUANT_DECLARE_KERNELS

}  // namespace decoded::quant::internal

#endif  // DECODED_ENGINE_QUANT_KERNELS_H_
