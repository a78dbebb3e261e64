"""The CPU's int8 GEMM is exact on every CPU: torch._int_mm (oneDNN) where it is exact (VNNI), else fp32 GEMMs on the
codes in slices of K whose sums stay below 2**24. Without VNNI (or with oneDNN capped below it, as
examples/cpu_tiny.yaml's second group is) oneDNN's u8 x s8 pairs saturate at int16, so the probe must say so, the
default paths must stay exact, and impl='templated' (the rendered kernel over that GEMM) must refuse, naming why."""

from __future__ import annotations

import os
import platform
import subprocess
import sys

import pytest
import torch

from qsync_opt.kernels import ops, reference

X86 = platform.machine().lower() in ("x86_64", "amd64")


def test_fp32_slices_give_the_exact_integer_product_past_the_fp32_limit():
    g = torch.Generator().manual_seed(0)
    k = 3 * reference.FP32_EXACT_K + 17  # three full slices and a partial one; 127² x K > 2**24
    a = torch.randint(-127, 128, (9, k), dtype=torch.int8, generator=g)
    b = torch.randint(-127, 128, (5, k), dtype=torch.int8, generator=g)
    a[0], b[0] = 127, 127  # one row at the largest sum, far beyond 2**24
    want = (a.long() @ b.long().t()).to(torch.int32)
    got = reference.fp32_int_mm(a, b)
    assert got.dtype == torch.int32 and torch.equal(got, want)
    assert int(want[0, 0]) == k * 127 * 127 > reference.FP32_EXACT


def test_the_default_int8_linear_is_exact_here_on_extreme_codes():
    a = torch.full((8, 512), 127, dtype=torch.int8)
    b = torch.cat([torch.full((4, 512), 127, dtype=torch.int8), torch.full((4, 512), -127, dtype=torch.int8)])
    one = torch.tensor(1.0)
    want = (a.double() @ b.double().t()).float()
    for impl in ("auto", "torch"):
        assert torch.equal(ops.int8_linear(a, one, b, one, None, impl=impl), want)


@pytest.mark.skipif(not X86, reason="ONEDNN_MAX_CPU_ISA=SSE41 names an x86 ISA")
def test_below_vnni_the_probe_refuses_the_default_stays_exact_and_templated_says_why():
    probe = """
import torch
from qsync_opt.errors import SpecError
from qsync_opt.kernels import ops, reference
print(reference.cpu_int_mm_exact())
a = torch.full((8, 512), 127, dtype=torch.int8); b = torch.full((6, 512), -127, dtype=torch.int8); one = torch.tensor(1.0)
want = (a.double() @ b.double().t()).float()
print(all(torch.equal(ops.int8_linear(a, one, b, one, None, impl=i), want) for i in ("auto", "torch")))
if ops.available("templated"):
    try:
        ops.int8_linear(a, one, b, one, None, impl="templated")
        print("no error")
    except SpecError as e:
        print("VNNI" in str(e) and "impl='auto'" in str(e))
else:
    print(True)
"""
    r = subprocess.run([sys.executable, "-c", probe], capture_output=True, text=True, timeout=600,
                       env={**os.environ, "ONEDNN_MAX_CPU_ISA": "SSE41"})
    assert r.returncode == 0, r.stderr[-2000:]
    assert r.stdout.split() == ["False", "True", "True"]
