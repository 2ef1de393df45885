// quant.h dispatch: weight type -> activation type and kernel.
#include "engine/quant/quant.h"

#include <cstring>
#include <limits>

#include "engine/quant/kernels.h"

namespace decoded::quant {
namespace {

using MatMulFn = void (*)(const uint8_t*, size_t, int64_t, const uint8_t*, size_t, int64_t, float*, int64_t, int64_t,
                          int64_t);

MatMulFn KernelFor(DType t) {
  switch (t) {
    case DType::kF32: return internal::MatMulF32;
    case DType::kF16: return internal::MatMulF16;
    case DType::kBF16: return internal::MatMulBF16;
    case DType::kQ4_0: return internal::MatMulQ4_0;
    case DType::kQ4_1: return internal::MatMulQ4_1;
    case DType::kQ5_0: return internal::MatMulQ5_0;
    case DType::kQ5_1: return internal::MatMulQ5_1;
    case DType::kQ8_0: return internal::MatMulQ8_0;
    case DType::kQ4_K: return internal::MatMulQ4_K;
    case DType::kQ5_K: return internal::MatMulQ5_K;
    case DType::kQ6_K: return internal::MatMulQ6_K;
    default: return nullptr;
  }
}

}  // namespace

bool IsSupportedWeightType(DType t) { return KernelFor(t) != nullptr; }

DType ActivationType(DType weight_type) {
  switch (weight_type) {
    case DType::kQ4_0:
    case DType::kQ4_1:  // min term from sums of the Q8_0 codes: matmul_q8_0.cc
    case DType::kQ5_0:
    case DType::kQ5_1:
    case DType::kQ8_0:
      return DType::kQ8_0;
    case DType::kQ4_K:
    case DType::kQ5_K:
    case DType::kQ6_K:
      return DType::kQ8_K;
    default:
      return DType::kF32;
  }
}

size_t ActivationRowBytes(DType weight_type, int64_t k) {
  const auto bytes = RowBytes(ActivationType(weight_type), k);
  return bytes ? *bytes : 0;
}

void QuantizeActivationRow(DType weight_type, const float* x, int64_t k, void* out) {
  switch (ActivationType(weight_type)) {
    case DType::kQ8_0:
      return internal::QuantizeRowQ8_0(x, k, out);
    case DType::kQ8_K:
      return internal::QuantizeRowQ8_K(x, k, out);
    default:
      std::memcpy(out, x, static_cast<size_t>(k) * sizeof(float));
      return;
  }
}

void MatMul(DType weight_type, const void* w, size_t w_row_bytes, int64_t k, const void* xq, size_t xq_row_bytes,
            int64_t m, float* y, int64_t ldy, int64_t r0, int64_t r1) {
  const MatMulFn fn = KernelFor(weight_type);
  if (fn == nullptr) {
    for (int64_t i = 0; i < m; ++i) {
      for (int64_t r = r0; r < r1; ++r) y[i * ldy + r] = std::numeric_limits<float>::quiet_NaN();
    }
    return;
  }
  fn(static_cast<const uint8_t*>(w), w_row_bytes, k, static_cast<const uint8_t*>(xq), xq_row_bytes, m, y, ldy, r0, r1);
}

const char* KernelVariant() { return internal::KernelVariant(); }

}  // namespace decoded::quant
