// The per-tier copies of kernels.h's functions (kernels_isa.cc, compiled once
// per tier of engine/cpu_isa.h); kernels.cc forwards each public function to
// the copy of ActiveCpuIsa(). Internal to engine/cpu.
#ifndef DECODED_ENGINE_CPU_KERNELS_ISA_H_
#define DECODED_ENGINE_CPU_KERNELS_ISA_H_

#include <cstddef>
#include <cstdint>

#include "absl/functional/function_ref.h"
#include "engine/cpu/kernels.h"
#include "engine/isa_dispatch.h"

// X(return type, name, (parameters), (arguments)) for every kernel of
// kernels.h (Share, inline, excepted).
#define DECODED_CPU_KERNELS(X)                                                                                        \
  X(float, DotF32, (const float* a, const float* b, int64_t n), (a, b, n))                                            \
  X(void, RmsNormRows,                                                                                                \
    (const float* x, const float* w, float* out, int64_t rows, int64_t cols, int64_t group, float eps, int ith,       \
     int nth),                                                                                                        \
    (x, w, out, rows, cols, group, eps, ith, nth))                                                                    \
  X(void, LayerNormRows,                                                                                              \
    (const float* x, const float* w, const float* b, float* out, int64_t rows, int64_t cols, int64_t group,          \
     float eps, int ith, int nth),                                                                                    \
    (x, w, b, out, rows, cols, group, eps, ith, nth))                                                                 \
  X(void, GeluMul, (const float* a, const float* b, float* out, int64_t n, int ith, int nth),                         \
    (a, b, out, n, ith, nth))                                                                                         \
  X(void, Gelu, (const float* x, float* out, int64_t n, int ith, int nth), (x, out, n, ith, nth))                     \
  X(void, SiluMul, (const float* a, const float* b, float* out, int64_t n, int ith, int nth),                         \
    (a, b, out, n, ith, nth))                                                                                         \
  X(void, AddRow, (const float* x, const float* bias, float* out, int64_t rows, int64_t cols, int ith, int nth),      \
    (x, bias, out, rows, cols, ith, nth))                                                                             \
  X(void, Add, (const float* a, const float* b, float* out, int64_t n, int ith, int nth), (a, b, out, n, ith, nth))   \
  X(void, Scale, (const float* x, float s, float* out, int64_t n, int ith, int nth), (x, s, out, n, ith, nth))        \
  X(void, Softcap, (const float* x, float cap, float* out, int64_t n, int ith, int nth), (x, cap, out, n, ith, nth))  \
  X(void, RopeNeox,                                                                                                   \
    (const float* x, const float* cos, const float* sin, float* out, int64_t seq, int32_t n_heads, int32_t head_dim,  \
     int32_t rot_dim, int ith, int nth),                                                                              \
    (x, cos, sin, out, seq, n_heads, head_dim, rot_dim, ith, nth))                                                    \
  X(void, RopeAdjacent,                                                                                               \
    (const float* x, const float* cos, const float* sin, float* out, int64_t seq, int32_t n_heads, int32_t head_dim,  \
     int32_t rot_dim, int ith, int nth),                                                                              \
    (x, cos, sin, out, seq, n_heads, head_dim, rot_dim, ith, nth))                                                    \
  X(void, Attention,                                                                                                  \
    (const float* q, const int32_t* bounds, const int64_t* kv_rows, int64_t kv_row_stride, int32_t layer, float* out, \
     int64_t seq, int32_t n_heads, int32_t n_kv_heads, int32_t k_dim, int32_t v_dim, int32_t v_stride, float scale,   \
     float softcap, int ith, int nth),                                                                                \
    (q, bounds, kv_rows, kv_row_stride, layer, out, seq, n_heads, n_kv_heads, k_dim, v_dim, v_stride, scale, softcap, \
     ith, nth))                                                                                                       \
  X(void, HeadSlice,                                                                                                  \
    (const float* x, float* out, int64_t rows, int32_t n_groups, int32_t width, int32_t begin, int32_t count,         \
     int ith, int nth),                                                                                               \
    (x, out, rows, n_groups, width, begin, count, ith, nth))                                                          \
  X(void, HeadConcat,                                                                                                 \
    (const float* a, const float* b, float* out, int64_t rows, int32_t n_groups, int32_t wa, int32_t wb, int ith,     \
     int nth),                                                                                                        \
    (a, b, out, rows, n_groups, wa, wb, ith, nth))                                                                    \
  X(void, MoeRoute,                                                                                                   \
    (const float* logits, const float* bias, const MoeRouting& r, float* scratch, int32_t* experts, float* weights),  \
    (logits, bias, r, scratch, experts, weights))                                                                     \
  X(size_t, MoeFfnWorkspaceBytes, (const MoeFfnArgs& a), (a))                                                         \
  X(void, MoeFfn, (const MoeFfnArgs& a, int ith, int nth, absl::FunctionRef<void()> barrier), (a, ith, nth, barrier))

namespace decoded::cpu {
DECODED_DECLARE_ISA_KERNELS(DECODED_CPU_KERNELS)
}  // namespace decoded::cpu

#endif  // DECODED_ENGINE_CPU_KERNELS_ISA_H_
