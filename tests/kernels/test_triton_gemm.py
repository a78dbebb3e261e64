"""The Triton int8 GEMM, executed on CPU by Triton's interpreter: tiling, ragged-edge masks and the
epilogue's order against the reference, bit for bit, with the interpreter's tiles and each GPU's (skipped without
triton)."""

from __future__ import annotations

import os
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
pytest.importorskip("triton")

# (M, K, N): one tile; ragged M, K and N over several tiles; and a K whose exact sum exceeds 2**24
# with odd tile sums (a 126 every 32 elements), where an fp32 accumulator would already have
# rounded: exact 17737455 -> fp32 17737456, per-tile fp32 accumulation gives 17737452.
CHECK = textwrap.dedent("""
    import torch
    from qsync_opt.kernels import reference, triton_gemm
    g = torch.Generator().manual_seed(0)
    bad = []
    one = torch.tensor(1.0)
    big_x = torch.full((2, 1100), 127, dtype=torch.int8)
    big_w = torch.full((3, 1100), 127, dtype=torch.int8)
    big_w[1, ::3] = -127
    big_w[2, ::32] = 126
    for tiles in (triton_gemm.INTERPRETER_TILES, *triton_gemm.CUDA_TILES.values()):  # the GPUs' tiles too
        for m, k, n in [(1, 16, 8), (70, 101, 40), (150, 200, 140)]:
            xq = torch.randint(-127, 128, (m, k), dtype=torch.int8, generator=g)
            wq = torch.randint(-127, 128, (n, k), dtype=torch.int8, generator=g)
            sx, sw, b = torch.tensor(0.02), torch.rand(n, generator=g) + 0.01, torch.randn(n, generator=g)
            for sww, bb in ((sw, b), (torch.tensor(0.5), None)):
                y = triton_gemm.int8_linear(xq, sx, wq, sww, bb, tiles=tiles)
                if not torch.equal(y, reference.int8_linear(xq, sx, wq, sww, bb, torch.float32)):
                    bad.append((tiles, m, k, n, sww.numel(), bb is None))
        y = triton_gemm.int8_linear(big_x, one, big_w, one, tiles=tiles)
        exact = (big_x.long() @ big_w.long().t()).float()
        if not torch.equal(y, exact) or y[0, 2].item() != 17737456.0:
            bad.append((tiles, "large K"))
    print("BAD", bad)
""")



def test_triton_int8_gemm_is_bit_exact_under_the_interpreter():
    env = {**os.environ, "TRITON_INTERPRET": "1", "PYTHONPATH": str(ROOT)}
    p = subprocess.run([sys.executable, "-c", CHECK], capture_output=True, text=True, env=env, timeout=600)
    assert p.returncode == 0, p.stderr[-3000:]
    assert "BAD []" in p.stdout, p.stdout[-2000:]
