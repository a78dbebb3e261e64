// Plain C++ loops over raw pointers: absmax, quantize, dequantising epilogue.
// Written so that gcc -O3 -march=native auto-vectorises them without -ffast-math,
// and so that every result is bit-identical to the PyTorch reference in ops.py:
//  * division, not multiplication by a reciprocal, for x / scale;
//  * std::nearbyint (round half to even) like torch.round;
//  * the epilogue computes float(acc) * s + b in exactly that order; the build
//    passes -ffp-contract=off so the compiler cannot fuse it into an FMA.
#pragma once

#include <c10/util/BFloat16.h>
#include <c10/util/Half.h>

#include <cmath>
#include <cstdint>
#include <cstring>

namespace qsync::cpu {

// ---- element traits: bits of |x|, and the way back to float ---------------------------------
// For non-NaN values the unsigned order of |x|'s bits equals the order of magnitudes, so a max
// over bits is an absmax that vectorises as an integer reduction (NaN sorts above inf and wins).
template <typename T> struct Elem;

template <> struct Elem<float> {
  using Bits = uint32_t;
  static constexpr Bits kAbsMask = 0x7fffffffu;
  static inline Bits abs_bits(float v) { Bits b; std::memcpy(&b, &v, 4); return b & kAbsMask; }
  static inline float from_bits(Bits b) { float v; std::memcpy(&v, &b, 4); return v; }
  static inline float to_float(float v) { return v; }
};

template <> struct Elem<c10::BFloat16> {
  using Bits = uint16_t;
  static constexpr Bits kAbsMask = 0x7fff;
  static inline Bits abs_bits(c10::BFloat16 v) { return static_cast<Bits>(v.x & kAbsMask); }
  static inline float from_bits(Bits b) { return Elem<float>::from_bits(static_cast<uint32_t>(b) << 16); }
  static inline float to_float(c10::BFloat16 v) { return from_bits(v.x); }
};

template <> struct Elem<c10::Half> {
  using Bits = uint16_t;
  static constexpr Bits kAbsMask = 0x7fff;
  static inline Bits abs_bits(c10::Half v) { return static_cast<Bits>(v.x & kAbsMask); }
  static inline float from_bits(Bits b) { return static_cast<float>(c10::Half(b, c10::Half::from_bits())); }
  static inline float to_float(c10::Half v) { return static_cast<float>(v); }
};

// ---- absmax ------------------------------------------------------------------------------------
template <typename T>
inline typename Elem<T>::Bits absmax_bits(const T* x, int64_t n) {
  typename Elem<T>::Bits m = 0;
  for (int64_t i = 0; i < n; ++i) {
    const auto b = Elem<T>::abs_bits(x[i]);
    m = b > m ? b : m;
  }
  return m;
}

// acc[c] = max(acc[c], |x[c]|) for c in [0, n): one row of a (rows, channels) layout.
template <typename T>
inline void absmax_bits_columns(const T* x, typename Elem<T>::Bits* acc, int64_t n) {
  for (int64_t c = 0; c < n; ++c) {
    const auto b = Elem<T>::abs_bits(x[c]);
    acc[c] = b > acc[c] ? b : acc[c];
  }
}

// scale = amax / qmax in fp32; an all-zero slice gets scale 1 so that nothing divides by zero.
inline float scale_from_amax(float amax, float qmax) {
  const float s = amax / qmax;
  return s == 0.0f ? 1.0f : s;
}

// ---- quantize ----------------------------------------------------------------------------------
inline float clampf(float v, float lo, float hi) {
  v = v < lo ? lo : v;
  return v > hi ? hi : v;
}

// Round to nearest even: q = clamp(nearbyint(x / s), -qmax, qmax). One scale for the whole row.
template <typename T>
inline void quantize_rne(const T* x, int8_t* q, int64_t n, float s, float qmax) {
  for (int64_t i = 0; i < n; ++i) {
    const float v = std::nearbyint(Elem<T>::to_float(x[i]) / s);
    q[i] = static_cast<int8_t>(static_cast<int32_t>(clampf(v, -qmax, qmax)));
  }
}

// Same, with one scale per element of the row (per-channel scales along the last axis).
template <typename T>
inline void quantize_rne_columns(const T* x, int8_t* q, int64_t n, const float* s, float qmax) {
  for (int64_t i = 0; i < n; ++i) {
    const float v = std::nearbyint(Elem<T>::to_float(x[i]) / s[i]);
    q[i] = static_cast<int8_t>(static_cast<int32_t>(clampf(v, -qmax, qmax)));
  }
}

// Counter-based uniform in [0, 1) with 24 random bits: two rounds of a 32-bit integer hash
// (Wellons' lowbias32) over (seed, index mod 2**32), so element i's noise depends only on (seed, i)
// and any thread split gives the same result. 32-bit lanes keep the loop vectorisable; the noise
// pattern repeats every 2**32 elements of one tensor.
inline uint32_t hash32(uint32_t x) {
  x ^= x >> 16;
  x *= 0x7feb352du;
  x ^= x >> 15;
  x *= 0x846ca68bu;
  x ^= x >> 16;
  return x;
}

inline float uniform01(uint32_t seed_lo, uint32_t seed_hi, uint32_t index) {
  return static_cast<float>(static_cast<int32_t>(hash32(hash32(index ^ seed_lo) ^ seed_hi) >> 8)) * 0x1p-24f;
}

// Stochastic rounding: q = clamp(floor(x / s + u), -qmax, qmax), u ~ U[0, 1); E[q] = x / s inside the range.
// `first` is the flat index of x[0] in the whole tensor (the RNG counter). kColumns: s holds one scale
// per element of the row; otherwise s[0] is the row's scale. (Two loops, so that both vectorise.)
template <typename T, bool kColumns>
inline void quantize_stochastic(const T* x, int8_t* q, int64_t n, const float* s, float qmax, uint64_t seed,
                                int64_t first) {
  const uint32_t lo = static_cast<uint32_t>(seed), hi = static_cast<uint32_t>(seed >> 32);
  const uint32_t base = static_cast<uint32_t>(first);
  const float s0 = s[0];
  for (int64_t i = 0; i < n; ++i) {
    const float u = uniform01(lo, hi, base + static_cast<uint32_t>(i));
    const float v = std::floor(Elem<T>::to_float(x[i]) / (kColumns ? s[i] : s0) + u);
    q[i] = static_cast<int8_t>(static_cast<int32_t>(clampf(v, -qmax, qmax)));
  }
}

// ---- dequantising epilogue ---------------------------------------------------------------------
// fp32 -> bf16 with round-to-nearest-even; the same arithmetic as c10::BFloat16's constructor
// (NaN -> 0x7FC0), written branch-free so that it vectorises.
inline uint16_t bf16_bits_rne(float f) {
  uint32_t u;
  std::memcpy(&u, &f, 4);
  const uint32_t rounded = (u + (((u >> 16) & 1u) + 0x7fffu)) >> 16;
  const bool nan = (u & 0x7fffffffu) > 0x7f800000u;
  return nan ? uint16_t{0x7fc0} : static_cast<uint16_t>(rounded);
}

template <typename Out> inline Out store_as(float v);
template <> inline float store_as<float>(float v) { return v; }
template <> inline c10::BFloat16 store_as<c10::BFloat16>(float v) {
  return c10::BFloat16(bf16_bits_rne(v), c10::BFloat16::from_bits());
}

// y[j] = Out(float(acc[j]) * s[j * s_stride] + bias[j]) for one output row.
// s_stride is 0 for a per-tensor combined scale and 1 for per-output-channel scales.
template <typename Out, bool kBias>
inline void dequant_row(const int32_t* acc, Out* y, int64_t n, const float* s, int64_t s_stride,
                        const float* bias) {
  if (s_stride == 0) {
    const float s0 = s[0];
    for (int64_t j = 0; j < n; ++j) {
      float v = static_cast<float>(acc[j]) * s0;
      if constexpr (kBias) v = v + bias[j];
      y[j] = store_as<Out>(v);
    }
  } else {
    for (int64_t j = 0; j < n; ++j) {
      float v = static_cast<float>(acc[j]) * s[j];
      if constexpr (kBias) v = v + bias[j];
      y[j] = store_as<Out>(v);
    }
  }
}

}  // namespace qsync::cpu
