// Host-side launchers: grid shapes, scratch zeroing, error codes. The rendered .cu wraps these in
// extern "C" functions (raw pointers, an opaque stream) for the torch binding and the ctypes harness.
// Every launcher returns a cudaError_t as int (0 = success).
#pragma once

#include "qsync_cuda_common.cuh"
#include "qsync_cuda_gemm_fp8.cuh"
#include "qsync_cuda_gemm_wmma.cuh"
#include "qsync_cuda_quant.cuh"

namespace qsync::cuda {

inline cudaStream_t as_stream(void* s) { return reinterpret_cast<cudaStream_t>(s); }

// amax of x viewed as (outer, channels, inner) into `amax` (channels floats; 1 for per tensor).
template <typename In, int kThreads, int kItems>
int launch_absmax(const void* x, int64_t outer, int64_t channels, int64_t inner, float* amax, void* stream) {
  auto* bits = reinterpret_cast<unsigned*>(amax);  // same storage: the bits of a non-negative float
  const auto* xp = static_cast<const In*>(x);
  if (channels == 1) {
    cudaMemsetAsync(bits, 0, sizeof(unsigned), as_stream(stream));
    absmax_tensor_kernel<In, kThreads><<<grid_for(outer * inner, kThreads, kItems), kThreads, 0, as_stream(stream)>>>(
        xp, outer * inner, bits);
  } else {
    const int blocks = static_cast<int>(channels < 65535 ? channels : 65535);
    absmax_channel_kernel<In, kThreads><<<blocks, kThreads, 0, as_stream(stream)>>>(xp, outer, channels, inner, bits);
  }
  return static_cast<int>(cudaGetLastError());
}

// Fused absmax + quantize when compute_scale != 0 (scale is then written), else quantize with `scale`.
template <typename In, int kThreads, int kItems>
int launch_quantize(const void* x, int8_t* q, float* scale, int64_t outer, int64_t channels, int64_t inner,
                    int compute_scale, float qmax, int stochastic, uint64_t seed, void* stream) {
  if (compute_scale) {
    if (int err = launch_absmax<In, kThreads, kItems>(x, outer, channels, inner, scale, stream)) return err;
    scale_from_amax_kernel<<<static_cast<int>(ceil_div(channels, 128)), 128, 0, as_stream(stream)>>>(
        reinterpret_cast<const unsigned*>(scale), scale, channels, qmax);
  }
  const int64_t n = outer * channels * inner;
  const int grid = grid_for(n, kThreads, kItems);
  const auto* xp = static_cast<const In*>(x);
  auto s = as_stream(stream);
  if (channels == 1) {
    if (stochastic) quantize_kernel<In, kThreads, false, true><<<grid, kThreads, 0, s>>>(xp, q, scale, n, 1, n, qmax, seed);
    else quantize_kernel<In, kThreads, false, false><<<grid, kThreads, 0, s>>>(xp, q, scale, n, 1, n, qmax, seed);
  } else {
    if (stochastic) quantize_kernel<In, kThreads, true, true><<<grid, kThreads, 0, s>>>(xp, q, scale, n, channels, inner, qmax, seed);
    else quantize_kernel<In, kThreads, true, false><<<grid, kThreads, 0, s>>>(xp, q, scale, n, channels, inner, qmax, seed);
  }
  return static_cast<int>(cudaGetLastError());
}

template <typename Out, int kThreads, int kItems>
int launch_dequantize(const int8_t* q, void* y, const float* scale, int64_t outer, int64_t channels, int64_t inner,
                      void* stream) {
  const int64_t n = outer * channels * inner;
  const int grid = grid_for(n, kThreads, kItems);
  auto* yp = static_cast<Out*>(y);
  if (channels == 1) dequantize_kernel<Out, kThreads, false><<<grid, kThreads, 0, as_stream(stream)>>>(q, yp, scale, n, 1, n);
  else dequantize_kernel<Out, kThreads, true><<<grid, kThreads, 0, as_stream(stream)>>>(q, yp, scale, n, channels, inner);
  return static_cast<int>(cudaGetLastError());
}

template <int kThreads, int kItems>
int launch_pack_int4(const int8_t* q, uint8_t* packed, int64_t rows, int64_t k, void* stream) {
  pack_int4_kernel<kThreads><<<grid_for(rows * ((k + 1) / 2), kThreads, kItems), kThreads, 0, as_stream(stream)>>>(
      q, packed, rows, k);
  return static_cast<int>(cudaGetLastError());
}

// fp8 quantize with a per-tensor scale; compute_scale != 0 sets scale = amax / fmax first.
template <typename In, int kThreads, int kItems, __nv_fp8_interpretation_t kFmt>
int launch_quantize_fp8(const void* x, uint8_t* q, float* scale, int64_t n, int compute_scale, float fmax,
                        void* stream) {
  if (compute_scale) {
    if (int err = launch_absmax<In, kThreads, kItems>(x, 1, 1, n, scale, stream)) return err;
    scale_from_amax_kernel<<<1, 32, 0, as_stream(stream)>>>(reinterpret_cast<const unsigned*>(scale), scale, 1, fmax);
  }
  quantize_fp8_kernel<In, kThreads, kFmt><<<grid_for(n, kThreads, kItems), kThreads, 0, as_stream(stream)>>>(
      static_cast<const In*>(x), reinterpret_cast<__nv_fp8_storage_t*>(q), scale, n);
  return static_cast<int>(cudaGetLastError());
}

template <class T>
inline dim3 gemm_grid(int M, int N) {
  return dim3(static_cast<unsigned>(ceil_div(N, T::kBN)), static_cast<unsigned>(ceil_div(M, T::kBM)));
}

template <class T, typename Out, bool kPerChannel>
int launch_int8_gemm(const int8_t* A, const int8_t* B, void* C, int M, int N, int K, const float* sx, const float* sw,
                     const float* bias, void* stream) {
  int8_gemm_wmma_kernel<T, Out, kPerChannel><<<gemm_grid<T>(M, N), T::kThreads, 0, as_stream(stream)>>>(
      A, B, static_cast<Out*>(C), M, N, K, sx, sw, bias);
  return static_cast<int>(cudaGetLastError());
}

template <class T, typename Out, bool kPerChannel>
int launch_int4_gemm(const uint8_t* A, const uint8_t* B, void* C, int M, int N, int K, const float* sx, const float* sw,
                     const float* bias, void* stream) {
  int4_gemm_wmma_kernel<T, Out, kPerChannel><<<gemm_grid<T>(M, N), T::kThreads, 0, as_stream(stream)>>>(
      A, B, static_cast<Out*>(C), M, N, K, sx, sw, bias);
  return static_cast<int>(cudaGetLastError());
}

template <class T, typename Out, bool kPerChannel, Fp8 kFmt>
int launch_fp8_gemm(const uint8_t* A, const uint8_t* B, void* C, int M, int N, int K, const float* sx, const float* sw,
                    const float* bias, void* stream) {
  fp8_gemm_mma_kernel<T, Out, kPerChannel, kFmt><<<gemm_grid<T>(M, N), T::kThreads, 0, as_stream(stream)>>>(
      A, B, static_cast<Out*>(C), M, N, K, sx, sw, bias);
  return static_cast<int>(cudaGetLastError());
}

}  // namespace qsync::cuda
