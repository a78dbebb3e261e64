// fp8 GEMM on sm_89+ tensor cores: mma.sync m16n8k32 (e4m3 or e5m2 operands, fp32 accumulation),
// with the same fused dequantising epilogue as the integer GEMMs:
//   C[m, n] = Out((sum_k A[m, k] * B[n, k]) * (sx * sw[n]) + bias[n]).
// A (M, K) and B (N, K) hold fp8 bytes, row-major. Fragment layout (PTX ISA, m16n8k32 8-bit):
//   g = lane / 4, t = lane % 4;  A regs: (g, 4t..4t+3), (g+8, 4t..), (g, 16+4t..), (g+8, 16+4t..)
//   B regs: (k 4t..4t+3, n g), (k 16+4t.., n g);  C: (g, 2t), (g, 2t+1), (g+8, 2t), (g+8, 2t+1).
#pragma once

#include "qsync_cuda_common.cuh"
#include "qsync_cuda_gemm_wmma.cuh"  // Tile, load_chunk16

namespace qsync::cuda {

enum class Fp8 { e4m3, e5m2 };

template <Fp8 kFmt>
__device__ __forceinline__ void mma_fp8_16832(float (&d)[4], const uint32_t (&a)[4], const uint32_t (&b)[2]) {
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 890
  if constexpr (kFmt == Fp8::e4m3) {
    asm volatile("mma.sync.aligned.m16n8k32.row.col.f32.e4m3.e4m3.f32 {%0,%1,%2,%3}, {%4,%5,%6,%7}, {%8,%9}, "
                 "{%0,%1,%2,%3};\n"
                 : "+f"(d[0]), "+f"(d[1]), "+f"(d[2]), "+f"(d[3])
                 : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "r"(b[0]), "r"(b[1]));
  } else {
    asm volatile("mma.sync.aligned.m16n8k32.row.col.f32.e5m2.e5m2.f32 {%0,%1,%2,%3}, {%4,%5,%6,%7}, {%8,%9}, "
                 "{%0,%1,%2,%3};\n"
                 : "+f"(d[0]), "+f"(d[1]), "+f"(d[2]), "+f"(d[3])
                 : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "r"(b[0]), "r"(b[1]));
  }
#else
  __trap();  // fp8 mma.sync needs sm_89 or newer; tiles.yaml lists fp8 only there.
#endif
}

template <class T, typename Out, bool kPerChannel, Fp8 kFmt>
__global__ void __launch_bounds__(T::kThreads)
fp8_gemm_mma_kernel(const uint8_t* __restrict__ A, const uint8_t* __restrict__ B, Out* __restrict__ C, int M, int N,
                    int K, const float* __restrict__ sx, const float* __restrict__ sw,
                    const float* __restrict__ bias) {
  constexpr int MT = T::kWarpM / 16, NT = T::kWarpN / 8, LDS = T::kBK + 16;  // +16 bytes: no bank conflicts
  static_assert(T::kBK % 32 == 0 && T::kWarpM % 16 == 0 && T::kWarpN % 8 == 0, "tile does not divide into m16n8k32");
  __shared__ __align__(16) uint8_t As[T::kBM][LDS];
  __shared__ __align__(16) uint8_t Bs[T::kBN][LDS];

  const int lane = threadIdx.x % 32, warp = threadIdx.x / 32, g = lane / 4, t = lane % 4;
  const int wm = warp / T::kWarpsN, wn = warp % T::kWarpsN;
  const int m0 = blockIdx.y * T::kBM, n0 = blockIdx.x * T::kBN;
  const bool vec = (K % 16 == 0) && (reinterpret_cast<uintptr_t>(A) % 16 == 0) &&
                   (reinterpret_cast<uintptr_t>(B) % 16 == 0);
  float acc[MT][NT][4] = {};

  constexpr int kChunks = T::kBK / 16;
  for (int k0 = 0; k0 < K; k0 += T::kBK) {
    for (int c = threadIdx.x; c < (T::kBM + T::kBN) * kChunks; c += T::kThreads) {
      const int r = c / kChunks, kc = c % kChunks;
      if (r < T::kBM) load_chunk16(&As[r][kc * 16], A, m0 + r, M, k0 + kc * 16, K, vec);
      else load_chunk16(&Bs[r - T::kBM][kc * 16], B, n0 + r - T::kBM, N, k0 + kc * 16, K, vec);
    }
    __syncthreads();
#pragma unroll
    for (int kk = 0; kk < T::kBK; kk += 32) {
      uint32_t a[MT][4], b[NT][2];
#pragma unroll
      for (int i = 0; i < MT; ++i) {
        const int r = wm * T::kWarpM + i * 16 + g;
        a[i][0] = *reinterpret_cast<const uint32_t*>(&As[r][kk + 4 * t]);
        a[i][1] = *reinterpret_cast<const uint32_t*>(&As[r + 8][kk + 4 * t]);
        a[i][2] = *reinterpret_cast<const uint32_t*>(&As[r][kk + 16 + 4 * t]);
        a[i][3] = *reinterpret_cast<const uint32_t*>(&As[r + 8][kk + 16 + 4 * t]);
      }
#pragma unroll
      for (int j = 0; j < NT; ++j) {
        const int n = wn * T::kWarpN + j * 8 + g;
        b[j][0] = *reinterpret_cast<const uint32_t*>(&Bs[n][kk + 4 * t]);
        b[j][1] = *reinterpret_cast<const uint32_t*>(&Bs[n][kk + 16 + 4 * t]);
      }
#pragma unroll
      for (int i = 0; i < MT; ++i)
#pragma unroll
        for (int j = 0; j < NT; ++j) mma_fp8_16832<kFmt>(acc[i][j], a[i], b[j]);
    }
    __syncthreads();
  }
#pragma unroll
  for (int i = 0; i < MT; ++i)
#pragma unroll
    for (int j = 0; j < NT; ++j)
#pragma unroll
      for (int h = 0; h < 4; ++h) {
        const int m = m0 + wm * T::kWarpM + i * 16 + g + (h >= 2 ? 8 : 0);
        const int n = n0 + wn * T::kWarpN + j * 8 + 2 * t + (h & 1);
        if (m < M && n < N) C[static_cast<int64_t>(m) * N + n] = dequant<Out, kPerChannel>(acc[i][j][h], sx, sw, bias, n);
      }
}

}  // namespace qsync::cuda
