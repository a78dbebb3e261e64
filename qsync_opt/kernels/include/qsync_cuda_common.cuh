// Shared device helpers for the qsync CUDA kernels: conversions, reductions, the RNG, the epilogue.
// Self-contained (CUDA toolkit headers only) so a rendered .cu compiles with plain nvcc.
#pragma once

#include <cuda_bf16.h>
#include <cuda_fp16.h>
#include <cuda_fp8.h>
#include <cuda_runtime.h>

#include <cstdint>

namespace qsync::cuda {

__device__ __forceinline__ float to_float(float v) { return v; }
__device__ __forceinline__ float to_float(__half v) { return __half2float(v); }
__device__ __forceinline__ float to_float(__nv_bfloat16 v) { return __bfloat162float(v); }

template <typename T> __device__ __forceinline__ T from_float(float v);
template <> __device__ __forceinline__ float from_float<float>(float v) { return v; }
template <> __device__ __forceinline__ __half from_float<__half>(float v) { return __float2half_rn(v); }
template <> __device__ __forceinline__ __nv_bfloat16 from_float<__nv_bfloat16>(float v) { return __float2bfloat16_rn(v); }

// Bits of |x|: unsigned order = order of magnitudes for non-NaN floats, so atomicMax works on them.
__device__ __forceinline__ unsigned abs_bits(float v) { return __float_as_uint(v) & 0x7fffffffu; }

__device__ __forceinline__ unsigned warp_max(unsigned v) {
  for (int o = 16; o > 0; o >>= 1) v = max(v, __shfl_xor_sync(0xffffffffu, v, o));
  return v;
}

// Max over the block; the result is valid in every thread. Safe to call repeatedly in a loop.
template <int kThreads>
__device__ __forceinline__ unsigned block_max(unsigned v) {
  __shared__ unsigned partial[kThreads / 32];
  v = warp_max(v);
  if (threadIdx.x % 32 == 0) partial[threadIdx.x / 32] = v;
  __syncthreads();
  unsigned m = 0;
#pragma unroll
  for (int w = 0; w < kThreads / 32; ++w) m = max(m, partial[w]);
  __syncthreads();
  return m;
}

// The CPU kernels' counter-based RNG (qsync_cpu_kernels.h), so stochastic rounding is reproducible
// across targets: lowbias32 twice over (seed, index mod 2**32), 24 bits -> [0, 1).
__device__ __forceinline__ uint32_t hash32(uint32_t x) {
  x ^= x >> 16;
  x *= 0x7feb352du;
  x ^= x >> 15;
  x *= 0x846ca68bu;
  x ^= x >> 16;
  return x;
}

__device__ __forceinline__ float uniform01(uint64_t seed, uint64_t index) {
  const uint32_t h = hash32(hash32(static_cast<uint32_t>(index) ^ static_cast<uint32_t>(seed)) ^
                            static_cast<uint32_t>(seed >> 32));
  return static_cast<float>(static_cast<int32_t>(h >> 8)) * 0x1p-24f;
}

// Dequantising epilogue, in the reference order: (float(acc) * (sx * sw[n])) + bias[n], each step
// rounded (explicit _rn intrinsics, so nvcc cannot contract them into an FMA).
template <typename Out, bool kPerChannel>
__device__ __forceinline__ Out dequant(float acc, const float* __restrict__ sx, const float* __restrict__ sw,
                                       const float* __restrict__ bias, int n) {
  const float s = __fmul_rn(sx[0], kPerChannel ? sw[n] : sw[0]);
  float v = __fmul_rn(acc, s);
  if (bias != nullptr) v = __fadd_rn(v, bias[n]);
  return from_float<Out>(v);
}

inline int64_t ceil_div(int64_t a, int64_t b) { return (a + b - 1) / b; }

inline int grid_for(int64_t n, int threads, int per_thread) {
  const int64_t blocks = ceil_div(n, static_cast<int64_t>(threads) * per_thread);
  return static_cast<int>(blocks < 1 ? 1 : (blocks > 65535 * 8 ? 65535 * 8 : blocks));
}

}  // namespace qsync::cuda
