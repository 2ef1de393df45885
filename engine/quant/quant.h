// Quantized matrix-vector kernels for the CPU backend.
//
// Weights stay in their GGUF block format (ggml-common.h layouts; see
// docs/gguf.md). A matrix W has `rows` rows of `k` elements, row r starting at
// `w + r * row_bytes`. Activations are first converted once per op into the
// weight type's *activation type* (ActivationType(): Q8_0 for Q4_0 / Q4_1 /
// Q5_0 / Q5_1 / Q8_0, Q8_K for the K-quants, F32 for F32/F16/BF16), then every
// output element is a dot product of one weight row with the converted
// activation row, computed on integer blocks where the format allows (the
// approach of llama.cpp's ggml_vec_dot_*: activation quantization is part of
// the numerics, and matches what llama.cpp computes up to summation order;
// for Q4_1 / Q5_1, whose activations llama.cpp converts to Q8_1 with an fp16
// d*sum(q), our min term uses the exact integer sum instead).
//
// All functions are pure, allocation-free and thread-safe; callers split the
// row range [r0, r1) across threads.
#ifndef DECODED_ENGINE_QUANT_QUANT_H_
#define DECODED_ENGINE_QUANT_QUANT_H_

#include <cstddef>
#include <cstdint>

#include "engine/dtype.h"

namespace decoded::quant {

// True if MatMul/DequantizeRow support weight type `t` (on every tier).
bool IsSupportedWeightType(DType t);

// Type activations are converted to before multiplying with weights of type `t`.
DType ActivationType(DType weight_type);

// Bytes needed for one converted activation row of `k` elements
// (k must be a multiple of the weight type's block size).
size_t ActivationRowBytes(DType weight_type, int64_t k);

// Converts one f32 activation row of `k` elements into ActivationType(w) at `out`
// (ActivationRowBytes(w, k) bytes, no alignment needed). Q8_0 and Q8_K follow
// ggml's reference quantizers bit for bit (quantize_row_q8_0_ref: d = amax/127
// as fp16, round half away from zero; quantize_row_q8_K_ref: d = -max/127 as
// f32 for the signed element of largest magnitude, round half to even, int16
// bsums of 16); F32 is a copy. Precondition: k is a multiple of the block size.
void QuantizeActivationRow(DType weight_type, const float* x, int64_t k, void* out);

// Activation rows per tile of the tiled quantized matmuls (prefill and
// batched steps): m - m % kMatMulActivationTile rows go in tiles that decode
// each weight block once for all of them; the rest one row at a time. A row's
// result is the same bits either way.
inline constexpr int kMatMulActivationTile = 4;

// y[i * ldy + r] = dot(W row r, activation row i) for r in [r0, r1), i in [0, m).
// `xq` holds m converted activation rows, `xq_row_bytes` apart. Rows of any
// alignment; k a multiple of the block size. An unsupported weight type
// writes NaN to every output it owns.
void MatMul(DType weight_type, const void* w, size_t w_row_bytes, int64_t k,
            const void* xq, size_t xq_row_bytes, int64_t m,
            float* y, int64_t ldy, int64_t r0, int64_t r1);

// Dequantizes one row of `k` elements of type `t` into f32 (reference path,
// embedding lookups and tests). Supports the weight types plus Q8_K; other
// types write NaN.
void DequantizeRow(DType t, const void* src, float* dst, int64_t k);

// fp16 / bf16 scalar conversions (IEEE binary16, bfloat16 truncation-free RNE).
float F16ToF32(uint16_t h);
uint16_t F32ToF16(float f);
float BF16ToF32(uint16_t h);
// f32 -> bf16 rounding to nearest even; NaN stays a (quiet) NaN.
uint16_t F32ToBF16(float f);

// Instruction-set tier the kernels run on in this process: "avx512vnni",
// "avx2" or "scalar" (CpuIsaName(ActiveCpuIsa()); engine/cpu_isa.h selects
// it at run time from the CPU, or DECODED_CPU_ISA).
const char* KernelVariant();

}  // namespace decoded::quant

#endif  // DECODED_ENGINE_QUANT_QUANT_H_
