"""The serving benchmarks' model: a byte-level transformers Llama trained on `pysource` by the product's own
training kind, cached in a folder, and a serving spec whose `serving.model` is its shape.

    from serving_model import trained_llama, serving_spec     # with benchmarks/ on sys.path
    ckpt = trained_llama(Path(out) / "model")                  # trains once; later calls reuse the checkpoint
    spec = serving_spec(ckpt)                                  # a serving job dict (two cpu-local stages)

The training spec is examples/cpu_hf_llama_pysource.yaml with `layers` decoder layers (hf-tiny-llama:
hidden 64, GQA 4/2 heads, FFN 128, vocabulary 256) and `steps` steps, run as
`python -m qsync_opt.cli run train.yaml -o FOLDER` (two CPU groups, one of them bf16/int8 only).
"""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import yaml

ROOT = Path(__file__).resolve().parents[1]
HIDDEN, FFN, HEADS, KV_HEADS, VOCAB, MAX_POSITIONS = 64, 128, 4, 2, 256, 128
"""hf-tiny-llama's shape (qsync_opt/models/zoo_hf.py) at vocabulary 256."""
SEQ_LEN = 64
"""Training window; the serving spec's prompt_len + gen_tokens equals it, so quality is scored on windows the
model was trained at."""


def training_spec(layers: int = 4, steps: int = 240) -> dict:
    """examples/cpu_hf_llama_pysource.yaml with `layers` decoder layers and `steps` steps."""
    spec = yaml.safe_load((ROOT / "examples" / "cpu_hf_llama_pysource.yaml").read_text())
    spec["name"] = f"serving-llama-{layers}l"
    spec["model"]["kwargs"] = {"vocab_size": VOCAB, "num_hidden_layers": layers}
    spec["training"].update(steps=steps, seq_len=SEQ_LEN)
    spec["data"]["eval_every"] = max(1, steps // 2)
    return spec


def trained_llama(folder: Path, *, layers: int = 4, steps: int = 240, log=print) -> Path:
    """The training run's output folder (a `serving.runtime.checkpoint`), trained now unless `folder` already holds
    a run of the same spec with a checkpoint. Raises RuntimeError with the run's output tail if training fails."""
    folder = Path(folder)
    spec = training_spec(layers, steps)
    spec_path = folder / "train.yaml"
    text = yaml.safe_dump(spec, sort_keys=False)
    if spec_path.exists() and spec_path.read_text() == text and any((folder / "checkpoints").glob("*/state.pt")):
        log(f"reusing the trained model in {folder}")
        return folder
    folder.mkdir(parents=True, exist_ok=True)
    spec_path.write_text(text)
    log(f"training a {layers}-layer byte-level Llama on pysource ({steps} steps) into {folder} (load {os.getloadavg()[0]:.2f})")
    env = {**os.environ, "PYTHONPATH": str(ROOT)}
    p = subprocess.run([sys.executable, "-m", "qsync_opt.cli", "run", str(spec_path), "-o", str(folder)], cwd=ROOT,
                       env=env, capture_output=True, text=True)
    (folder / "train.log").write_text(p.stdout + p.stderr)
    if p.returncode != 0:
        spec_path.unlink()  # not a cache hit next time
        raise RuntimeError(f"training exited {p.returncode}:\n{(p.stdout + p.stderr)[-3000:]}")
    return folder


def serving_spec(checkpoint: Path | None, *, layers: int = 4, bits=(2, 3, 4, 8, 16), windows: int = 64,
                 prompt_len: int = 48, global_batch: int = 8) -> dict:
    """A serving job dict for the trained model: two cpu-local stages, prompts of `prompt_len` bytes and
    SEQ_LEN − prompt_len generated tokens, `windows` perplexity windows of the pysource test split; no checkpoint:
    random weights."""
    return {
        "kind": "serving", "name": f"serving-llama-{layers}l",
        "cluster": {"groups": [{"name": "a", "device": "cpu-local", "count": 1},
                               {"name": "b", "device": "cpu-local", "count": 1}], "interconnect": "loopback"},
        "serving": {
            "model": {"layers": layers, "hidden": HIDDEN, "ffn": FFN, "heads": HEADS, "kv_heads": KV_HEADS,
                      "vocab": VOCAB, "max_positions": MAX_POSITIONS, "ffn_matrices": 3, "tied_embeddings": False},
            "prompt_len": prompt_len, "gen_tokens": SEQ_LEN - prompt_len, "global_batch": global_batch,
            "bits": list(bits),
            "runtime": {"family": "llama", "checkpoint": None if checkpoint is None else str(checkpoint),
                        "prompts": "pysource",
                        "perplexity_windows": windows},
        },
        "solver": {"backend": "default", "time_limit_s": 20},
    }
