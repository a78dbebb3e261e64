"""`pysource`: byte-level language modelling on the Python standard library's own source files.

Every machine that runs qsync-opt has them, so this real text set needs no download and no
package. Rule (fixed, the same everywhere for the same Python version):

- files: the top-level `*.py` modules of `sysconfig.get_paths()["stdlib"]`, sorted by name;
  a file is a test file when the first byte of SHA-256(file name) is below 26 (about 1 in 10),
  else a training file: the split is by file, so no test text is ever seen in training;
- each split's files are concatenated in name order and read up to `train_bytes` / `test_bytes`;
- samples are consecutive, non-overlapping windows of `seq_len + 1` bytes: input the first
  `seq_len` bytes, target the next byte at every position (int64 ids 0..255, vocabulary 256).

A model trains on it as a causal language model (GPT-2, Llama, the zoo's gpt2 entries); the
loss and evaluation are per token, and `train` reports test loss, perplexity and next-byte
accuracy. The text differs between Python versions; `describe()` names the one read.
"""

from __future__ import annotations

import hashlib
import sys
import sysconfig
from pathlib import Path
from typing import TYPE_CHECKING

from qsync_opt.errors import SpecError

if TYPE_CHECKING:
    import torch

VOCAB = 256
TEST_CUT = 26  # SHA-256 first byte < 26: ~10% of files


def stdlib_files() -> list[Path]:
    root = Path(sysconfig.get_paths()["stdlib"])
    files = sorted(root.glob("*.py"), key=lambda p: p.name)
    if not files:
        raise SpecError(f"data.name: 'pysource' found no *.py files in the standard library folder {root}; "
                        "this Python installation ships without sources (use another data set)")
    return files


def is_test_file(name: str) -> bool:
    return hashlib.sha256(name.encode()).digest()[0] < TEST_CUT


def read_files(files: list[Path], budget: int) -> bytes:
    """The first `budget` bytes of `files` read one after another (all of them, if shorter)."""
    out, have = [], 0
    for f in files:
        if have >= budget:
            break
        b = f.read_bytes()[: budget - have]
        out.append(b)
        have += len(b)
    return b"".join(out)


def _windows(blob: bytes, seq_len: int, what: str) -> tuple[torch.Tensor, torch.Tensor]:
    n = len(blob) // (seq_len + 1)
    if n < 1:
        raise SpecError(f"data.kwargs.{what}: {len(blob)} bytes hold no window of seq_len + 1 = {seq_len + 1} bytes; "
                        "raise it or lower seq_len")
    import torch  # import cost: the byte-level file lists are read by the loading planner without torch

    ids = torch.frombuffer(bytearray(blob[: n * (seq_len + 1)]), dtype=torch.uint8).to(torch.int64)
    w = ids.reshape(n, seq_len + 1)
    return w[:, :-1].contiguous(), w[:, 1:].contiguous()


def pysource(seq_len: int = 64, train_bytes: int = 1_000_000, test_bytes: int = 100_000):
    """(x_train, y_train, x_test, y_test): int64 (N, seq_len) inputs and next-byte targets."""
    for field, v, lo in (("seq_len", seq_len, 1), ("train_bytes", train_bytes, 2), ("test_bytes", test_bytes, 2)):
        if isinstance(v, bool) or not isinstance(v, int) or v < lo:
            raise SpecError(f"data.kwargs.{field}: got {v!r}; need an integer >= {lo} for 'pysource'")
    files = stdlib_files()
    train = [f for f in files if not is_test_file(f.name)]
    test = [f for f in files if is_test_file(f.name)]
    xtr, ytr = _windows(read_files(train, train_bytes), seq_len, "train_bytes")
    xte, yte = _windows(read_files(test, test_bytes), seq_len, "test_bytes")
    return xtr, ytr, xte, yte


def describe() -> str:
    files = stdlib_files()
    n_test = sum(is_test_file(f.name) for f in files)
    return (f"pysource: Python {sys.version_info.major}.{sys.version_info.minor} stdlib, "
            f"{len(files) - n_test} training / {n_test} test files")
