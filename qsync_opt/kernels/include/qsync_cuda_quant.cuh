// Elementwise CUDA kernels: absmax, scale, quantize (nearest-even or stochastic), dequantize,
// fp8 quantize, int4 packing. Same arithmetic as the CPU kernels (division, rintf, clamp).
#pragma once

#include "qsync_cuda_common.cuh"

namespace qsync::cuda {

// Per-tensor absmax into *amax_bits (which the launcher zeroes first).
template <typename T, int kThreads>
__global__ void __launch_bounds__(kThreads) absmax_tensor_kernel(const T* __restrict__ x, int64_t n,
                                                                 unsigned* __restrict__ amax_bits) {
  unsigned m = 0;
  for (int64_t i = blockIdx.x * static_cast<int64_t>(kThreads) + threadIdx.x; i < n;
       i += static_cast<int64_t>(gridDim.x) * kThreads)
    m = max(m, abs_bits(to_float(x[i])));
  m = block_max<kThreads>(m);
  if (threadIdx.x == 0) atomicMax(amax_bits, m);
}

// Per-channel absmax of x viewed as (outer, channels, inner); one block per channel at a time.
template <typename T, int kThreads>
__global__ void __launch_bounds__(kThreads) absmax_channel_kernel(const T* __restrict__ x, int64_t outer,
                                                                  int64_t channels, int64_t inner,
                                                                  unsigned* __restrict__ amax_bits) {
  const int64_t per = outer * inner;
  for (int64_t c = blockIdx.x; c < channels; c += gridDim.x) {
    unsigned m = 0;
    for (int64_t j = threadIdx.x; j < per; j += kThreads) {
      const int64_t o = j / inner, i = j - o * inner;
      m = max(m, abs_bits(to_float(x[(o * channels + c) * inner + i])));
    }
    m = block_max<kThreads>(m);
    if (threadIdx.x == 0) amax_bits[c] = m;
  }
}

// scale = amax / qmax, or 1 where amax == 0.
__global__ void scale_from_amax_kernel(const unsigned* __restrict__ amax_bits, float* __restrict__ scale, int64_t n,
                                       float qmax) {
  const int64_t i = blockIdx.x * static_cast<int64_t>(blockDim.x) + threadIdx.x;
  if (i < n) {
    const float s = __fdiv_rn(__uint_as_float(amax_bits[i]), qmax);
    scale[i] = s == 0.0f ? 1.0f : s;
  }
}

template <bool kPerChannel>
__device__ __forceinline__ float scale_at(const float* __restrict__ scale, int64_t i, int64_t channels,
                                          int64_t inner) {
  return kPerChannel ? scale[(i / inner) % channels] : scale[0];
}

// q = clamp(rint(x / s), -qmax, qmax), or clamp(floor(x / s + u), ...) when kStochastic.
template <typename T, int kThreads, bool kPerChannel, bool kStochastic>
__global__ void __launch_bounds__(kThreads) quantize_kernel(const T* __restrict__ x, int8_t* __restrict__ q,
                                                            const float* __restrict__ scale, int64_t n,
                                                            int64_t channels, int64_t inner, float qmax,
                                                            uint64_t seed) {
  for (int64_t i = blockIdx.x * static_cast<int64_t>(kThreads) + threadIdx.x; i < n;
       i += static_cast<int64_t>(gridDim.x) * kThreads) {
    float v = __fdiv_rn(to_float(x[i]), scale_at<kPerChannel>(scale, i, channels, inner));
    v = kStochastic ? floorf(__fadd_rn(v, uniform01(seed, static_cast<uint64_t>(i)))) : rintf(v);
    v = fminf(fmaxf(v, -qmax), qmax);
    q[i] = static_cast<int8_t>(__float2int_rn(v));
  }
}

// y = q * s in fp32, rounded once to Out.
template <typename Out, int kThreads, bool kPerChannel>
__global__ void __launch_bounds__(kThreads) dequantize_kernel(const int8_t* __restrict__ q, Out* __restrict__ y,
                                                              const float* __restrict__ scale, int64_t n,
                                                              int64_t channels, int64_t inner) {
  for (int64_t i = blockIdx.x * static_cast<int64_t>(kThreads) + threadIdx.x; i < n;
       i += static_cast<int64_t>(gridDim.x) * kThreads)
    y[i] = from_float<Out>(__fmul_rn(static_cast<float>(q[i]), scale_at<kPerChannel>(scale, i, channels, inner)));
}

// fp8 quantize: x / s saturated to the format's finite range, round to nearest even (satfinite cvt).
template <typename T, int kThreads, __nv_fp8_interpretation_t kFmt>
__global__ void __launch_bounds__(kThreads) quantize_fp8_kernel(const T* __restrict__ x,
                                                                __nv_fp8_storage_t* __restrict__ q,
                                                                const float* __restrict__ scale, int64_t n) {
  const float s = scale[0];
  for (int64_t i = blockIdx.x * static_cast<int64_t>(kThreads) + threadIdx.x; i < n;
       i += static_cast<int64_t>(gridDim.x) * kThreads)
    q[i] = __nv_cvt_float_to_fp8(__fdiv_rn(to_float(x[i]), s), __NV_SATFINITE, kFmt);
}

// Pack int4 values (int8 in [-8, 7]) two per byte, element 2j in the low nibble; rows of k elements
// become rows of ceil(k / 2) bytes, an odd tail padded with a zero nibble.
template <int kThreads>
__global__ void __launch_bounds__(kThreads) pack_int4_kernel(const int8_t* __restrict__ q, uint8_t* __restrict__ packed,
                                                             int64_t rows, int64_t k) {
  const int64_t kb = (k + 1) / 2;
  for (int64_t i = blockIdx.x * static_cast<int64_t>(kThreads) + threadIdx.x; i < rows * kb;
       i += static_cast<int64_t>(gridDim.x) * kThreads) {
    const int64_t r = i / kb, j = i - r * kb;
    const uint8_t lo = static_cast<uint8_t>(q[r * k + 2 * j]) & 0xF;
    const uint8_t hi = 2 * j + 1 < k ? static_cast<uint8_t>(q[r * k + 2 * j + 1]) & 0xF : 0;
    packed[i] = static_cast<uint8_t>(lo | (hi << 4));
  }
}

}  // namespace qsync::cuda
