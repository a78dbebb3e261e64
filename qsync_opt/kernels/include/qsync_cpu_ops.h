// ATen glue for the CPU kernels: checks, output allocation, thread split, dtype dispatch.
// The arithmetic lives in qsync_cpu_kernels.h; the rendered translation unit supplies a
// Config (types and constants) and registers these functions under its own op namespace.
#pragma once

#include <ATen/ATen.h>
#include <ATen/Parallel.h>
#include <omp.h>

#include <algorithm>
#include <optional>
#include <tuple>
#include <type_traits>
#include <vector>

#include "qsync_cpu_kernels.h"

namespace qsync::cpu {

template <typename... Ts> struct TypeList {};

// Calls f(T*) for the T in Ts whose ScalarType is st; fails loudly for a dtype this build lacks.
template <typename... Ts, typename F>
void dispatch(TypeList<Ts...>, at::ScalarType st, const char* what, F&& f) {
  const bool done = ((st == c10::CppTypeToScalarType<Ts>::value ? (f(static_cast<Ts*>(nullptr)), true) : false) || ...);
  TORCH_CHECK(done, what, ": dtype ", st, " is not instantiated in this kernel build; "
              "render a spec that lists it, or use impl='torch'");
}

// A tensor seen as (outer, channels, inner) around `axis`; axis < 0 means one channel (per tensor).
struct Layout {
  int64_t outer = 1, channels = 1, inner = 1;
};

inline Layout layout_of(const at::Tensor& x, std::optional<int64_t> axis) {
  Layout l;
  if (!axis.has_value()) { l.inner = x.numel(); return l; }
  const int64_t a = *axis;
  TORCH_CHECK(a >= 0 && a < x.dim(), "axis ", a, " out of range for a ", x.dim(), "-d tensor");
  for (int64_t d = 0; d < a; ++d) l.outer *= x.size(d);
  l.channels = x.size(a);
  for (int64_t d = a + 1; d < x.dim(); ++d) l.inner *= x.size(d);
  return l;
}

inline int64_t rows_per_task(int64_t grain_elems, int64_t row_elems) {
  return std::max<int64_t>(1, grain_elems / std::max<int64_t>(1, row_elems));
}

// amax bits per channel (one entry when axis is empty).
template <typename T, int64_t kGrain>
std::vector<typename Elem<T>::Bits> absmax_channels(const T* x, const Layout& l) {
  using Bits = typename Elem<T>::Bits;
  std::vector<Bits> acc(static_cast<size_t>(l.channels), Bits{0});
  if (l.outer == 1 && l.channels == 1) {  // per tensor: parallel reduction over the flat range
    acc[0] = at::parallel_reduce(
        int64_t{0}, l.inner, kGrain, Bits{0},
        [&](int64_t b, int64_t e, Bits ident) { return std::max(ident, absmax_bits(x + b, e - b)); },
        [](Bits a, Bits b) { return std::max(a, b); });
  } else if (l.inner == 1) {  // channels along the last axis: vector max over columns, split by channel
    at::parallel_for(0, l.channels, rows_per_task(kGrain, l.outer), [&](int64_t c0, int64_t c1) {
      for (int64_t o = 0; o < l.outer; ++o) absmax_bits_columns(x + o * l.channels + c0, acc.data() + c0, c1 - c0);
    });
  } else {  // channels with contiguous inner rows (e.g. weight rows, axis 0)
    at::parallel_for(0, l.channels, rows_per_task(kGrain, l.outer * l.inner), [&](int64_t c0, int64_t c1) {
      for (int64_t c = c0; c < c1; ++c)
        for (int64_t o = 0; o < l.outer; ++o)
          acc[c] = std::max(acc[c], absmax_bits(x + (o * l.channels + c) * l.inner, l.inner));
    });
  }
  return acc;
}

// Quantize one contiguous range with one scale (nearest-even or stochastic; `first` = RNG counter).
template <typename T>
inline void quantize_range(const T* x, int8_t* q, int64_t n, const float* s, float qmax, bool stochastic,
                           uint64_t seed, int64_t first) {
  if (stochastic) quantize_stochastic<T, false>(x, q, n, s, qmax, seed, first);
  else quantize_rne(x, q, n, s[0], qmax);
}

// Per-tensor absmax + quantize in ONE parallel region: each thread scans its chunk, a barrier,
// one thread turns the maximum into the scale, then each thread quantizes the chunk it just read
// (still warm in its cache). One fork/join instead of two; the result does not depend on the split.
template <typename T, int64_t kGrain>
float quantize_tensor_fused(const T* x, int8_t* q, int64_t n, float qmax, bool stochastic, uint64_t seed) {
  using Bits = typename Elem<T>::Bits;
  if (n < 2 * kGrain || omp_get_max_threads() == 1 || at::in_parallel_region()) {
    const float s = scale_from_amax(Elem<T>::from_bits(absmax_bits(x, n)), qmax);
    quantize_range(x, q, n, &s, qmax, stochastic, seed, 0);
    return s;
  }
  std::vector<Bits> partial(static_cast<size_t>(omp_get_max_threads()), Bits{0});
  float s = 1.0f;
#pragma omp parallel
  {
    const int64_t nt = omp_get_num_threads(), tid = omp_get_thread_num();
    const int64_t chunk = (n + nt - 1) / nt, b = std::min(n, tid * chunk), e = std::min(n, b + chunk);
    partial[tid] = absmax_bits(x + b, e - b);
#pragma omp barrier
#pragma omp single
    {
      Bits m = 0;
      for (int64_t t = 0; t < nt; ++t) m = std::max(m, partial[t]);
      s = scale_from_amax(Elem<T>::from_bits(m), qmax);
    }  // implicit barrier: everyone sees s
    quantize_range(x + b, q + b, e - b, &s, qmax, stochastic, seed, b);
  }
  return s;
}

// Per-channel absmax + quantize when each channel is one contiguous row (axis 0 of a weight):
// row by row, so the second read of a row comes from L1/L2. Writes one scale per row.
template <typename T, int64_t kGrain>
void quantize_rows_fused(const T* x, int8_t* q, float* scale, int64_t rows, int64_t n, float qmax, bool stochastic,
                         uint64_t seed) {
  at::parallel_for(0, rows, rows_per_task(kGrain, n), [&](int64_t r0, int64_t r1) {
    for (int64_t r = r0; r < r1; ++r) {
      scale[r] = scale_from_amax(Elem<T>::from_bits(absmax_bits(x + r * n, n)), qmax);
      quantize_range(x + r * n, q + r * n, n, scale + r, qmax, stochastic, seed, r * n);
    }
  });
}

template <class Cfg>
at::Tensor absmax(const at::Tensor& x_in, std::optional<int64_t> axis) {
  TORCH_CHECK(x_in.device().is_cpu(), "absmax: expected a CPU tensor");
  const at::Tensor x = x_in.contiguous();
  const Layout l = layout_of(x, axis);
  at::Tensor out = axis.has_value() ? at::empty({l.channels}, x.options().dtype(at::kFloat))
                                    : at::empty({}, x.options().dtype(at::kFloat));
  dispatch(typename Cfg::InTypes{}, x.scalar_type(), "absmax", [&](auto* tag) {
    using T = std::remove_pointer_t<decltype(tag)>;
    const auto bits = absmax_channels<T, Cfg::kGrain>(x.const_data_ptr<T>(), l);
    float* o = out.data_ptr<float>();
    for (int64_t c = 0; c < l.channels; ++c) o[c] = Elem<T>::from_bits(bits[c]);
  });
  return out;
}

// Fused absmax + quantize: when `scale` is absent the scale is amax / qmax per channel.
template <class Cfg>
std::tuple<at::Tensor, at::Tensor> quantize(const at::Tensor& x_in, const std::optional<at::Tensor>& scale_in,
                                            int64_t qmax_i, std::optional<int64_t> axis, bool stochastic,
                                            int64_t seed) {
  TORCH_CHECK(x_in.device().is_cpu(), "quantize: expected a CPU tensor");
  const at::Tensor x = x_in.contiguous();
  const Layout l = layout_of(x, axis);
  const float qmax = static_cast<float>(qmax_i);
  at::Tensor q = at::empty(x.sizes(), x.options().dtype(at::kChar));
  at::Tensor scale;
  dispatch(typename Cfg::InTypes{}, x.scalar_type(), "quantize", [&](auto* tag) {
    using T = std::remove_pointer_t<decltype(tag)>;
    const T* xp = x.const_data_ptr<T>();
    const uint64_t useed = static_cast<uint64_t>(seed);
    int8_t* qp = q.data_ptr<int8_t>();
    if (scale_in.has_value()) {
      scale = scale_in->to(at::kFloat).contiguous();
      TORCH_CHECK(scale.numel() == l.channels, "quantize: scale has ", scale.numel(), " elements, expected ", l.channels);
    } else if (!axis.has_value()) {
      const float s = quantize_tensor_fused<T, Cfg::kGrain>(xp, qp, l.inner, qmax, stochastic, useed);
      scale = at::full({}, s, x.options().dtype(at::kFloat));
      return;
    } else if (l.outer == 1 && l.inner > 1) {
      scale = at::empty({l.channels}, x.options().dtype(at::kFloat));
      quantize_rows_fused<T, Cfg::kGrain>(xp, qp, scale.data_ptr<float>(), l.channels, l.inner, qmax, stochastic, useed);
      return;
    } else {
      scale = at::empty({l.channels}, x.options().dtype(at::kFloat));
      const auto bits = absmax_channels<T, Cfg::kGrain>(xp, l);
      float* sp = scale.data_ptr<float>();
      for (int64_t c = 0; c < l.channels; ++c) sp[c] = scale_from_amax(Elem<T>::from_bits(bits[c]), qmax);
    }
    const float* s = scale.const_data_ptr<float>();
    if (l.outer == 1 && l.channels == 1) {
      at::parallel_for(0, l.inner, Cfg::kGrain, [&](int64_t b, int64_t e) {
        quantize_range(xp + b, qp + b, e - b, s, qmax, stochastic, useed, b);
      });
    } else if (l.inner == 1) {
      const int64_t C = l.channels;
      at::parallel_for(0, l.outer, rows_per_task(Cfg::kGrain, C), [&](int64_t r0, int64_t r1) {
        for (int64_t r = r0; r < r1; ++r) {
          if (stochastic) quantize_stochastic<T, true>(xp + r * C, qp + r * C, C, s, qmax, useed, r * C);
          else quantize_rne_columns(xp + r * C, qp + r * C, C, s, qmax);
        }
      });
    } else {
      const int64_t n = l.inner;
      at::parallel_for(0, l.outer * l.channels, rows_per_task(Cfg::kGrain, n), [&](int64_t r0, int64_t r1) {
        for (int64_t r = r0; r < r1; ++r) {
          const int64_t c = r % l.channels;
          quantize_range(xp + r * n, qp + r * n, n, s + c, qmax, stochastic, useed, r * n);
        }
      });
    }
  });
  return {q, scale};
}

// Combined scale sx * sw (fp32), one value or one per output channel.
inline at::Tensor combined_scale(const at::Tensor& sx, const at::Tensor& sw, int64_t n) {
  TORCH_CHECK(sx.numel() == 1, "sx must hold one value, got ", sx.numel());
  TORCH_CHECK(sw.numel() == 1 || sw.numel() == n, "sw must hold 1 or ", n, " values, got ", sw.numel());
  return (sx.to(at::kFloat).reshape({}) * sw.to(at::kFloat).reshape({sw.numel()})).contiguous();
}

// y = Out(float(acc) * (sx * sw) + bias), rows split across threads; `y` is written in place.
template <class Cfg>
void dequant_into(const at::Tensor& acc, const at::Tensor& s, const std::optional<at::Tensor>& bias, at::Tensor& y,
                  int64_t row0, int64_t rows) {
  const int64_t n = acc.size(1);
  const float* sp = s.const_data_ptr<float>();
  const int64_t s_stride = s.numel() == 1 ? 0 : 1;
  const float* bp = bias.has_value() ? bias->const_data_ptr<float>() : nullptr;
  const int32_t* ap = acc.const_data_ptr<int32_t>();
  dispatch(typename Cfg::OutTypes{}, y.scalar_type(), "dequant_epilogue", [&](auto* tag) {
    using Out = std::remove_pointer_t<decltype(tag)>;
    Out* yp = y.data_ptr<Out>() + row0 * n;
    at::parallel_for(0, rows, rows_per_task(Cfg::kGrain, n), [&](int64_t r0, int64_t r1) {
      for (int64_t r = r0; r < r1; ++r) {
        if (bp) dequant_row<Out, true>(ap + r * n, yp + r * n, n, sp, s_stride, bp);
        else dequant_row<Out, false>(ap + r * n, yp + r * n, n, sp, s_stride, nullptr);
      }
    });
  });
}

inline std::optional<at::Tensor> bias_f32(const std::optional<at::Tensor>& bias, int64_t n) {
  if (!bias.has_value()) return std::nullopt;
  TORCH_CHECK(bias->numel() == n, "bias must hold ", n, " values, got ", bias->numel());
  return bias->to(at::kFloat).contiguous();
}

template <class Cfg>
at::Tensor dequant_epilogue(const at::Tensor& acc_in, const at::Tensor& sx, const at::Tensor& sw,
                            const std::optional<at::Tensor>& bias, at::ScalarType out_dtype) {
  TORCH_CHECK(acc_in.dim() == 2 && acc_in.scalar_type() == at::kInt, "dequant_epilogue: acc must be 2-d int32");
  const at::Tensor acc = acc_in.contiguous();
  const int64_t n = acc.size(1);
  at::Tensor y = at::empty(acc.sizes(), acc.options().dtype(out_dtype));
  dequant_into<Cfg>(acc, combined_scale(sx, sw, n), bias_f32(bias, n), y, 0, acc.size(0));
  return y;
}

// int8 GEMM (oneDNN through at::_int_mm, exact int32) with the fused dequantising epilogue.
// Rows are processed in blocks of Cfg::kLinearRows so that each block's int32 result is still in
// cache when the epilogue reads it; kLinearRows <= 0 means one block.
template <class Cfg>
at::Tensor int8_linear(const at::Tensor& xq, const at::Tensor& sx, const at::Tensor& wq, const at::Tensor& sw,
                       const std::optional<at::Tensor>& bias, at::ScalarType out_dtype) {
  TORCH_CHECK(xq.dim() == 2 && wq.dim() == 2 && xq.size(1) == wq.size(1), "int8_linear: shapes ", xq.sizes(), " and ",
              wq.sizes(), " do not form (M, K) x (N, K)");
  TORCH_CHECK(xq.scalar_type() == at::kChar && wq.scalar_type() == at::kChar, "int8_linear: xq and wq must be int8");
  const int64_t m = xq.size(0), n = wq.size(0);
  const at::Tensor s = combined_scale(sx, sw, n);
  const auto b = bias_f32(bias, n);
  at::Tensor y = at::empty({m, n}, xq.options().dtype(out_dtype));
  const at::Tensor wt = wq.t();
  const int64_t block = Cfg::kLinearRows > 0 ? Cfg::kLinearRows : m;
  at::Tensor acc = at::empty({std::min(block, m), n}, xq.options().dtype(at::kInt));
  for (int64_t r0 = 0; r0 < m; r0 += block) {
    const int64_t rows = std::min(block, m - r0);
    at::Tensor acc_blk = acc.narrow(0, 0, rows);
    at::_int_mm_out(acc_blk, xq.narrow(0, r0, rows), wt);
    dequant_into<Cfg>(acc_blk, s, b, y, r0, rows);
  }
  return y;
}

}  // namespace qsync::cpu
