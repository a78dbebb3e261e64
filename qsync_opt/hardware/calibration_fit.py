"""Fitting calibration.yaml (hardware/calibration.py) from gpu_check results files: which device a
file was measured on, each module's FLOPs, the factors and their deterministic rendering.
Used by benchmarks/fit_calibration.py and the test that refits the committed file."""

from __future__ import annotations

import json
import re
import statistics
from pathlib import Path

import yaml

from qsync_opt.errors import SpecError
from qsync_opt.hardware.calibration import HEADER, RESULTS_GLOB, CalibrationError, Factor, Source
from qsync_opt.hardware.device import catalog, find_device
from qsync_opt.kernels.dispatch import KERNELS, SCALED_MM_FAST, Target, fp8_training_forward_impl, implementation
from qsync_opt.precision import PRECISIONS

_LINEAR = re.compile(r"^linear (\d+)x(\d+)->(\d+)$")
_GEMM = re.compile(r"^(\S+) (\d+)x(\d+)x(\d+)$")
#: gemm_choices timing field -> the `kernels` setting whose GEMM it timed (triton_ms, bf16_out_ms: no dispatch runs
#: them); fast_accum_ms: the forward GEMM of fp8 training (dispatch.fp8_training_forward_impl).
_GEMM_TIMES = {"torch_ms": "torch", "templated_ms": "templated", "auto_ms": "auto", "fast_accum_ms": "auto"}
_CONV = re.compile(r"^conv(\d+)x(\d+) b(\d+) (\d+)->(\d+) (\d+)x(\d+)$")


def shape_flops(label: str) -> tuple[str, float]:
    """(op kind, forward FLOPs) of a gpu_check `ratios` shape label.

    'linear MxK->N': 2·M·K·N. 'convKxK bB Cin->Cout HxW' (stride 1, 'same' padding, as gpu_check
    builds it): 2·B·Cout·H·W·Cin·K·K.
    """
    if m := _LINEAR.match(label):
        mm, k, n = map(int, m.groups())
        return "linear", 2.0 * mm * k * n
    if m := _CONV.match(label):
        kh, kw, b, cin, cout, h, w = map(int, m.groups())
        return "conv", 2.0 * b * cout * h * w * cin * kh * kw
    raise ValueError(f"shape {label!r} is neither 'linear MxK->N' nor 'convKxK bB Cin->Cout HxW'")


def record_device(record: dict, path: Path):
    """The catalog device a results file was measured on: the record's `device` (or header.device)
    name when it has one, else the file name's prefix (`h200-gpu-check-results.json` -> H200);
    its sm must agree with the record's dispatch target."""
    named = record.get("device") or (record.get("header") or {}).get("device")
    if isinstance(named, dict):
        named = named.get("name")
    dev = None
    if isinstance(named, str):
        tokens = set(re.findall(r"[a-z0-9]+", named.lower()))
        hits = [d for n, d in catalog().items() if d.kind == "gpu" and n.lower().split("-")[0] in tokens]
        dev = hits[0] if len(hits) == 1 else None
    if dev is None:
        prefix = path.name[: -len(RESULTS_GLOB) + 1] if path.name.endswith(RESULTS_GLOB[1:]) else path.stem
        try:
            dev = find_device(prefix)
        except KeyError as e:
            raise CalibrationError(f"{path}: cannot tell the device ({e.args[0]}); name the file "
                                   f"<catalog device>{RESULTS_GLOB[1:]} or give the record a 'device' field") from None
    target = (record.get("dispatch") or {}).get("target")
    if target and target != f"sm_{dev.sm}":
        raise CalibrationError(f"{path}: dispatch target {target} but catalog device {dev.name} is sm_{dev.sm}")
    return dev


def fit_files(paths, root: Path) -> tuple[tuple[Factor, ...], list[str]]:
    """Factors from gpu_check results files (paths recorded relative to `root`), and the rows skipped (why)."""
    rows: dict[tuple, list[Source]] = {}
    meta: dict[tuple, str] = {}
    skipped: list[str] = []
    for path in sorted(Path(p) for p in paths):
        try:
            record = json.loads(path.read_text())
        except (OSError, json.JSONDecodeError) as e:
            raise CalibrationError(f"{path}: not a readable JSON record ({e})") from None
        dev = record_device(record, path)
        rel = path.resolve().relative_to(root.resolve()).as_posix() if path.resolve().is_relative_to(root.resolve()) \
            else path.as_posix()
        for row in record.get("ratios") or []:
            where = f"{rel}: {row.get('shape')} {row.get('precision')}"
            ms = row.get("fwd_bwd_ms")
            if not isinstance(ms, (int, float)) or not ms > 0:
                skipped.append(f"{where}: no time ({row.get('error', 'fwd_bwd_ms missing')})")
                continue
            try:
                op, flops = shape_flops(row["shape"])
            except ValueError as e:
                raise CalibrationError(f"{rel}: ratios row {row.get('precision')}: {e}") from None
            p, label = row["precision"], row.get("implementation", "")
            backward = "fp8" if row.get("backward") == "fp8" and op == "linear" else None  # conv: 16-bit anyway
            label = label.split("; backward ")[0]  # the forward GEMM's label; the backward's follows from it
            impl = next((implementation(dev, p, k) for k in KERNELS if implementation(dev, p, k).label == label), None)
            if impl is None or impl.rate not in dev.peak_tflops:
                skipped.append(f"{where}: implementation {label!r} is not one dispatch prices on {dev.name}")
                continue
            factor = 3 * flops / (ms / 1e3) / (dev.peak_tflops[impl.rate] * 1e12)
            key = (dev.sm, p, op, label, backward)
            meta[key] = impl.rate
            rows.setdefault(key, []).append(Source(rel, dev.name, row["shape"], _round(ms), _round(factor)))
        for key, rate, src in _gemm_sources(record.get("gemm_choices") or [], dev, rel, skipped):
            meta[key] = rate
            rows.setdefault(key, []).append(src)
    order = lambda kv: (kv[0][0], kv[0][2], _order(kv[0][1]), kv[0][4] or "")  # noqa: E731
    out = tuple(Factor(sm, p, op, label, meta[(sm, p, op, label, bwd)],
                       _round(statistics.median(s.factor for s in srcs)), tuple(srcs), bwd)
                for (sm, p, op, label, bwd), srcs in sorted(rows.items(), key=order))
    return out, skipped


def _gemm_sources(rows: list[dict], dev, rel: str, skipped: list[str]):
    """(key, rate, Source) of each GEMM gemm_choices timed alone ('<precision> MxKxN', per implementation):
    op 'gemm', factor = 2·M·K·N / its time / the peak of its rate. The same implementation timed twice (fp8_e5m2's
    'auto' is its templated kernel) gives two sources of one factor."""
    for row in rows:
        m = _GEMM.match(str(row.get("gemm", "")))
        if m is None or m.group(1) not in PRECISIONS:
            skipped.append(f"{rel}: gemm_choices row {row.get('gemm')!r}: not '<precision> MxKxN'")
            continue
        p, (mm, k, n) = m.group(1), map(int, m.groups()[1:])
        for field, kernels in _GEMM_TIMES.items():
            ms = row.get(field)
            if not isinstance(ms, (int, float)) or not ms > 0:
                continue
            try:
                impl = implementation(dev, p, kernels)
                if field == "fast_accum_ms":
                    impl = fp8_training_forward_impl(Target.of_device_spec(dev), p, kernels)
                    if impl.op != SCALED_MM_FAST:
                        skipped.append(f"{rel}: {row['gemm']} {field}: fp8 training's forward here is {impl.label}")
                        continue
            except SpecError as e:  # a setting this device's dispatch refuses
                skipped.append(f"{rel}: {row['gemm']} {field}: {e}")
                continue
            if impl.kind == "emulation" or impl.rate not in dev.peak_tflops:
                skipped.append(f"{rel}: {row['gemm']} {field}: {impl.label} is not a GEMM of its own rate here")
                continue
            factor = 2.0 * mm * k * n / (ms / 1e3) / (dev.peak_tflops[impl.rate] * 1e12)
            yield ((dev.sm, p, "gemm", impl.label, None), impl.rate,
                   Source(rel, dev.name, row["gemm"], _round(ms), _round(factor)))


def _order(p: str) -> int:
    return PRECISIONS.index(p) if p in PRECISIONS else len(PRECISIONS)


def _round(x: float) -> float:
    return float(f"{x:.4g}")


def render(fs: tuple[Factor, ...]) -> str:
    """calibration.yaml's text for `fs` (deterministic: refitting the same files gives the same bytes)."""
    body = {"factors": [{"sm": f.sm, "precision": f.precision, **({"backward": f.backward} if f.backward else {}),
                         "op": f.op, "implementation": f.implementation, "rate": f.rate, "factor": f.factor,
                         "sources": [s.__dict__ for s in f.sources]} for f in fs]}
    return HEADER + yaml.safe_dump(body, sort_keys=False, allow_unicode=True, width=120)
