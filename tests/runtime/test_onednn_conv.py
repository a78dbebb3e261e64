"""int8/int4 convolutions on a CPU run oneDNN's int8 convolution where it is exact there (VNNI), else its fp32
convolution on the codes' values where no partial sum can pass 2**24, and give what the im2col path gives, bit for
bit (random scales and bias: the epilogue's rounding is compared too). Below VNNI (AVX2, or oneDNN capped by
ONEDNN_MAX_CPU_ISA) the int8 probe says no and the fp32 convolution runs, also exact."""

from __future__ import annotations

import os
import platform
import subprocess
import sys

import pytest
import torch
from torch import nn

from qsync_opt.kernels import ops as kops
from qsync_opt.runtime.qmodules import SWAPPABLE
from qsync_opt.runtime.recipe import Recipe

EXACT = kops.onednn_conv_exact() or kops.fp32_conv_exact()
X86 = platform.machine().lower() in ("x86_64", "amd64")

CASES = {
    "3x3": (nn.Conv2d(16, 24, 3, padding=1), (4, 16, 12, 12)),
    "stride-dilation": (nn.Conv2d(8, 8, 3, stride=2, padding=2, dilation=2), (3, 8, 15, 15)),
    "1x1-groups": (nn.Conv2d(16, 32, 1, groups=4, bias=False), (2, 16, 9, 9)),
    "1d": (nn.Conv1d(6, 10, 5, padding=2), (3, 6, 31)),
    "first-layer": (nn.Conv2d(3, 16, 7, stride=2, padding=3), (2, 3, 32, 32)),
}


@pytest.mark.skipif(not EXACT, reason="neither oneDNN convolution is exact on this CPU: the im2col path runs")
@pytest.mark.parametrize("gran", ["per_tensor", "per_channel"])
@pytest.mark.parametrize("precision", ["int8", "int4"])
@pytest.mark.parametrize("case", list(CASES))
def test_onednn_convolution_equals_the_im2col_path_bit_for_bit(case, precision, gran, monkeypatch):
    torch.manual_seed(0)
    conv, shape = CASES[case]
    x = torch.randn(shape) * 3
    mod = SWAPPABLE[type(conv)].from_float(conv, Recipe(precision, "fp32", granularity=gran))
    called = []
    real = kops.int8_conv2d
    monkeypatch.setattr(kops, "int8_conv2d", lambda *a, **k: called.append(1) or real(*a, **k))
    with torch.no_grad():
        fast = mod(x)
    assert called, "the integer convolution was not asked"
    monkeypatch.setattr(kops, "int8_conv2d", lambda *a, **k: None)  # im2col and the int8 GEMM
    with torch.no_grad():
        slow = mod(x)
    assert fast.dtype == slow.dtype == torch.float32 and fast.shape == slow.shape and fast.is_contiguous()
    assert torch.equal(fast, slow)


def test_the_path_is_taken_exactly_where_the_probe_proves_it_exact():
    xq = torch.randint(-127, 128, (2, 8, 6, 6), dtype=torch.int8)
    wq = torch.randint(-127, 128, (4, 8, 3, 3), dtype=torch.int8)
    y = kops.int8_conv2d(xq, torch.tensor(0.1), wq, torch.rand(4), None, (1, 1), (1, 1), (1, 1), 1)
    assert (y is not None) == EXACT
    assert kops.int8_conv2d(xq, torch.tensor(0.1), wq, torch.rand(4), None, (1, 1), (1, 1), (1, 1), 1,
                            impl="templated") is None


@pytest.mark.skipif(not X86, reason="ONEDNN_MAX_CPU_ISA=SSE41 names an x86 ISA")
def test_below_vnni_the_int8_probe_refuses_and_the_fp32_convolution_is_exact():
    """Capped at SSE4.1 (as examples/cpu_tiny.yaml's second group is), oneDNN's u8 x s8 products saturate at int16
    and its int8 convolution is not exact: the probe must say so. The fp32 convolution on the codes then runs, and the
    module's output is the exact integer convolution times the scales (powers of two: exact in fp32), including a
    layer whose input channels are split (256 x 3 x 3 x 127² > 2**24)."""
    probe = """
import torch, torch.nn.functional as F
from torch import nn
from qsync_opt.kernels import ops
from qsync_opt.runtime.qmodules import SWAPPABLE
from qsync_opt.runtime.recipe import Recipe
print(ops.onednn_conv_exact(), ops.fp32_conv_exact())
g = torch.Generator().manual_seed(0)
for cin in (8, 256):
    conv = nn.Conv2d(cin, 6, 3, padding=1, bias=False)
    xi = torch.randint(-127, 128, (2, cin, 7, 7), generator=g).float(); xi.view(-1)[0] = 127
    wi = torch.randint(-127, 128, (6, cin, 3, 3), generator=g).float(); wi.view(6, -1)[:, 0] = 127
    with torch.no_grad():
        conv.weight.copy_(wi * 2.0**-6)
    mod = SWAPPABLE[type(conv)].from_float(conv, Recipe("int8", "fp32", granularity="per_channel"))
    with torch.no_grad():
        y = mod(xi * 2.0**-5)
    want = F.conv2d(xi.double(), wi.double(), padding=1) * 2.0**-11
    print(cin, torch.equal(y.double(), want))
"""
    r = subprocess.run([sys.executable, "-c", probe], capture_output=True, text=True, timeout=300,
                       env={**os.environ, "ONEDNN_MAX_CPU_ISA": "SSE41"})
    assert r.returncode == 0, r.stderr[-2000:]
    assert r.stdout.split() == ["False", "True", "8", "True", "256", "True"]
