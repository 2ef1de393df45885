// Per-format kernels behind quant.h's dispatch. Internal to engine/quant.
//
// Each MatMul* has MatMul's contract for one weight type; each is compiled
// once, for the best instruction set the build enables (AVX-512 VNNI, AVX2 or
// portable C++, chosen by __AVX512VNNI__ / __AVX2__), so a binary carries
// exactly one variant of each.
#ifndef DECODED_ENGINE_QUANT_KERNELS_H_
#define DECODED_ENGINE_QUANT_KERNELS_H_

#include <cstddef>
#include <cstdint>

namespace decoded::quant::internal {

#define DECODED_QUANT_MATMUL_ARGS                                                     \
  const uint8_t *w, size_t w_row_bytes, int64_t k, const uint8_t *xq,                 \
      size_t xq_row_bytes, int64_t m, float *y, int64_t ldy, int64_t r0, int64_t r1

// Weights Q4_0 / Q4_1 / Q5_0 / Q5_1 / Q8_0, activations Q8_0 (matmul_q8_0.cc).
void MatMulQ4_0(DECODED_QUANT_MATMUL_ARGS);
void MatMulQ4_1(DECODED_QUANT_MATMUL_ARGS);
void MatMulQ5_0(DECODED_QUANT_MATMUL_ARGS);
void MatMulQ5_1(DECODED_QUANT_MATMUL_ARGS);
void MatMulQ8_0(DECODED_QUANT_MATMUL_ARGS);
// Weights Q4_K / Q5_K / Q6_K, activations Q8_K (matmul_k.cc).
void MatMulQ4_K(DECODED_QUANT_MATMUL_ARGS);
void MatMulQ5_K(DECODED_QUANT_MATMUL_ARGS);
void MatMulQ6_K(DECODED_QUANT_MATMUL_ARGS);
// Weights F32 / F16 / BF16, activations F32 (matmul_float.cc).
void MatMulF32(DECODED_QUANT_MATMUL_ARGS);
void MatMulF16(DECODED_QUANT_MATMUL_ARGS);
void MatMulBF16(DECODED_QUANT_MATMUL_ARGS);

// Activation converters (quantize_activation.cc); k is a multiple of the
// block size (32 / 256).
void QuantizeRowQ8_0(const float* x, int64_t k, void* out);
void QuantizeRowQ8_K(const float* x, int64_t k, void* out);

// Name of the compiled variant: "avx512vnni", "avx2" or "scalar".
const char* KernelVariant();

}  // namespace decoded::quant::internal

#endif  // DECODED_ENGINE_QUANT_KERNELS_H_
