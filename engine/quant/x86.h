// <immintrin.h> for the quant kernels. Internal to engine/quant.
//
// GCC 12 reports the self-initialised "undefined" operands inside its own
// AVX-512 intrinsics as uninitialised at every inlining site (GCC PR 105593),
// so translation units that include this header silence those two warnings.
#ifndef DECODED_ENGINE_QUANT_X86_H_
#define DECODED_ENGINE_QUANT_X86_H_

#if defined(__AVX2__) || defined(__F16C__) || defined(__AVX512F__)
#include <immintrin.h>
#endif

#if defined(__GNUC__) && !defined(__clang__) && __GNUC__ < 13
#pragma GCC diagnostic ignored "-Wuninitialized"
#pragma GCC diagnostic ignored "-Wmaybe-uninitialized"
#endif

#endif  // DECODED_ENGINE_QUANT_X86_H_
