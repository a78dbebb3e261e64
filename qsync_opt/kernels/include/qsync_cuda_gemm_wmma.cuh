// Tensor-core integer GEMMs through WMMA with the fused dequantising epilogue:
//   C[m, n] = Out((float(sum_k A[m, k] * B[n, k]) * (sx * sw[n])) + bias[n])
// A is (M, K) row-major, B is (N, K) row-major (a weight matrix, i.e. B^T col-major), both int8,
// or int4 packed two per byte (int4 kernel; K counts elements). Accumulation is exact int32.
// Shared-memory layout: [k_chunk][row][16 bytes], so every fragment is one contiguous 256-byte
// (int8) or 128-byte (int4) block: aligned for load_matrix_sync and free of bank conflicts.
#pragma once

#include <mma.h>

#include "qsync_cuda_common.cuh"

namespace qsync::cuda {

template <int BM, int BN, int BK, int WARPS_M, int WARPS_N>
struct Tile {
  static constexpr int kBM = BM, kBN = BN, kBK = BK, kWarpsM = WARPS_M, kWarpsN = WARPS_N;
  static constexpr int kWarps = WARPS_M * WARPS_N;
  static constexpr int kThreads = kWarps * 32;
  static constexpr int kWarpM = BM / WARPS_M;  // rows of C one warp owns
  static constexpr int kWarpN = BN / WARPS_N;
};

// Copy 16 bytes of row `row` (byte offset `kb`) of a (rows, ld) byte matrix into smem; zero-fill
// whatever lies outside the matrix. `vec` says whether 16-byte vector loads are aligned.
__device__ __forceinline__ void load_chunk16(uint8_t* __restrict__ dst, const uint8_t* __restrict__ src, int row,
                                             int rows, int64_t kb, int64_t ld, bool vec) {
  if (row < rows && kb + 16 <= ld && vec) {
    *reinterpret_cast<int4*>(dst) = *reinterpret_cast<const int4*>(src + row * ld + kb);
    return;
  }
#pragma unroll
  for (int t = 0; t < 16; ++t) dst[t] = (row < rows && kb + t < ld) ? src[row * ld + kb + t] : uint8_t{0};
}

// Stage a (ROWS x BYTES) slice of a byte matrix at k-byte offset kb0 into smem[BYTES / 16][ROWS][16].
template <int ROWS, int BYTES, int THREADS>
__device__ __forceinline__ void stage(uint8_t (*smem)[ROWS][16], const uint8_t* __restrict__ g, int row0, int rows,
                                      int64_t kb0, int64_t ld, bool vec) {
  constexpr int kChunks = BYTES / 16;
  for (int c = threadIdx.x; c < ROWS * kChunks; c += THREADS) {
    const int r = c / kChunks, kc = c % kChunks;
    load_chunk16(&smem[kc][r][0], g, row0 + r, rows, kb0 + kc * 16, ld, vec);
  }
}

// One warp's accumulator tile -> global, through a per-warp smem staging square of FRAG x FRAG ints.
template <typename Out, bool kPerChannel, int FRAG>
__device__ __forceinline__ void store_dequant(const int* stage, Out* __restrict__ C, int row0, int col0, int M, int N,
                                              const float* sx, const float* sw, const float* bias) {
  const int lane = threadIdx.x % 32;
  for (int e = lane; e < FRAG * FRAG; e += 32) {
    const int m = row0 + e / FRAG, n = col0 + e % FRAG;
    if (m < M && n < N)
      C[static_cast<int64_t>(m) * N + n] = dequant<Out, kPerChannel>(__int2float_rn(stage[e]), sx, sw, bias, n);
  }
}

// ---- int8: wmma m16n16k16, s8 x s8 -> s32 (sm_72+) -------------------------------------------------
template <class T, typename Out, bool kPerChannel>
__global__ void __launch_bounds__(T::kThreads)
int8_gemm_wmma_kernel(const int8_t* __restrict__ A, const int8_t* __restrict__ B, Out* __restrict__ C, int M, int N,
                      int K, const float* __restrict__ sx, const float* __restrict__ sw,
                      const float* __restrict__ bias) {
  using namespace nvcuda;
  constexpr int F = 16, FM = T::kWarpM / F, FN = T::kWarpN / F, KC = T::kBK / 16;
  static_assert(T::kBK % 16 == 0 && T::kWarpM % F == 0 && T::kWarpN % F == 0, "tile does not divide into 16x16x16");
  __shared__ __align__(128) uint8_t As[KC][T::kBM][16];
  __shared__ __align__(128) uint8_t Bs[KC][T::kBN][16];
  __shared__ __align__(128) int Cs[T::kWarps][F * F];

  const int warp = threadIdx.x / 32, wm = warp / T::kWarpsN, wn = warp % T::kWarpsN;
  const int m0 = blockIdx.y * T::kBM, n0 = blockIdx.x * T::kBN;
  const bool vec = (K % 16 == 0) && (reinterpret_cast<uintptr_t>(A) % 16 == 0) &&
                   (reinterpret_cast<uintptr_t>(B) % 16 == 0);
  const auto* a8 = reinterpret_cast<const uint8_t*>(A);
  const auto* b8 = reinterpret_cast<const uint8_t*>(B);

  wmma::fragment<wmma::accumulator, F, F, F, int> acc[FM][FN];
#pragma unroll
  for (int i = 0; i < FM; ++i)
#pragma unroll
    for (int j = 0; j < FN; ++j) wmma::fill_fragment(acc[i][j], 0);

  for (int k0 = 0; k0 < K; k0 += T::kBK) {
    stage<T::kBM, T::kBK, T::kThreads>(As, a8, m0, M, k0, K, vec);
    stage<T::kBN, T::kBK, T::kThreads>(Bs, b8, n0, N, k0, K, vec);
    __syncthreads();
#pragma unroll
    for (int kc = 0; kc < KC; ++kc) {
      wmma::fragment<wmma::matrix_a, F, F, F, signed char, wmma::row_major> a[FM];
      wmma::fragment<wmma::matrix_b, F, F, F, signed char, wmma::col_major> b[FN];
#pragma unroll
      for (int i = 0; i < FM; ++i)
        wmma::load_matrix_sync(a[i], reinterpret_cast<const signed char*>(&As[kc][wm * T::kWarpM + i * F][0]), 16);
#pragma unroll
      for (int j = 0; j < FN; ++j)
        wmma::load_matrix_sync(b[j], reinterpret_cast<const signed char*>(&Bs[kc][wn * T::kWarpN + j * F][0]), 16);
#pragma unroll
      for (int i = 0; i < FM; ++i)
#pragma unroll
        for (int j = 0; j < FN; ++j) wmma::mma_sync(acc[i][j], a[i], b[j], acc[i][j]);
    }
    __syncthreads();
  }
#pragma unroll
  for (int i = 0; i < FM; ++i)
#pragma unroll
    for (int j = 0; j < FN; ++j) {
      wmma::store_matrix_sync(Cs[warp], acc[i][j], F, wmma::mem_row_major);
      __syncwarp();
      store_dequant<Out, kPerChannel, F>(Cs[warp], C, m0 + wm * T::kWarpM + i * F, n0 + wn * T::kWarpN + j * F, M, N,
                                         sx, sw, bias);
      __syncwarp();
    }
}

// ---- int4: wmma m8n8k32, s4 x s4 -> s32 (sm_75..sm_89; experimental sub-byte WMMA) --------------------
// A: (M, ceil(K/2)) bytes, B: (N, ceil(K/2)) bytes, packed by pack_int4_kernel; BK counts elements.
template <class T, typename Out, bool kPerChannel>
__global__ void __launch_bounds__(T::kThreads)
int4_gemm_wmma_kernel(const uint8_t* __restrict__ A, const uint8_t* __restrict__ B, Out* __restrict__ C, int M, int N,
                      int K, const float* __restrict__ sx, const float* __restrict__ sw,
                      const float* __restrict__ bias) {
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 750 && __CUDA_ARCH__ < 900
  using namespace nvcuda;
  namespace wx = nvcuda::wmma::experimental;
  constexpr int FMN = 8, FK = 32, FM = T::kWarpM / FMN, FN = T::kWarpN / FMN, KC = T::kBK / FK;
  static_assert(T::kBK % FK == 0 && T::kWarpM % FMN == 0 && T::kWarpN % FMN == 0, "tile does not divide into 8x8x32");
  __shared__ __align__(128) uint8_t As[KC][T::kBM][16];
  __shared__ __align__(128) uint8_t Bs[KC][T::kBN][16];
  __shared__ __align__(128) int Cs[T::kWarps][FMN * FMN];

  const int warp = threadIdx.x / 32, wm = warp / T::kWarpsN, wn = warp % T::kWarpsN;
  const int m0 = blockIdx.y * T::kBM, n0 = blockIdx.x * T::kBN;
  const int64_t ld = (K + 1) / 2;
  const bool vec = (ld % 16 == 0) && (reinterpret_cast<uintptr_t>(A) % 16 == 0) &&
                   (reinterpret_cast<uintptr_t>(B) % 16 == 0);

  wmma::fragment<wmma::accumulator, FMN, FMN, FK, int> acc[FM][FN];
#pragma unroll
  for (int i = 0; i < FM; ++i)
#pragma unroll
    for (int j = 0; j < FN; ++j) wmma::fill_fragment(acc[i][j], 0);

  for (int64_t kb0 = 0; kb0 < ld; kb0 += T::kBK / 2) {
    stage<T::kBM, T::kBK / 2, T::kThreads>(As, A, m0, M, kb0, ld, vec);
    stage<T::kBN, T::kBK / 2, T::kThreads>(Bs, B, n0, N, kb0, ld, vec);
    __syncthreads();
#pragma unroll
    for (int kc = 0; kc < KC; ++kc) {
      wmma::fragment<wmma::matrix_a, FMN, FMN, FK, wx::precision::s4, wmma::row_major> a[FM];
      wmma::fragment<wmma::matrix_b, FMN, FMN, FK, wx::precision::s4, wmma::col_major> b[FN];
#pragma unroll
      for (int i = 0; i < FM; ++i) wmma::load_matrix_sync(a[i], &As[kc][wm * T::kWarpM + i * FMN][0], FK);
#pragma unroll
      for (int j = 0; j < FN; ++j) wmma::load_matrix_sync(b[j], &Bs[kc][wn * T::kWarpN + j * FMN][0], FK);
#pragma unroll
      for (int i = 0; i < FM; ++i)
#pragma unroll
        for (int j = 0; j < FN; ++j) wmma::mma_sync(acc[i][j], a[i], b[j], acc[i][j]);
    }
    __syncthreads();
  }
#pragma unroll
  for (int i = 0; i < FM; ++i)
#pragma unroll
    for (int j = 0; j < FN; ++j) {
      wmma::store_matrix_sync(Cs[warp], acc[i][j], FMN, wmma::mem_row_major);
      __syncwarp();
      store_dequant<Out, kPerChannel, FMN>(Cs[warp], C, m0 + wm * T::kWarpM + i * FMN, n0 + wn * T::kWarpN + j * FMN,
                                           M, N, sx, sw, bias);
      __syncwarp();
    }
#else
  __trap();  // int4 WMMA exists on sm_75..sm_89 only; tiles.yaml lists it only there.
#endif
}

}  // namespace qsync::cuda
