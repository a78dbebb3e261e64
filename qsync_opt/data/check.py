"""Check before any rank starts that the data loads and fits the model: bad input exits 2, not a traceback."""

from __future__ import annotations

import torch

from qsync_opt.errors import SpecError
from qsync_opt.data.task import DataJob, build_task
from qsync_opt.models.from_spec import build_from_spec


def check_data(spec: DataJob):
    """Build the task, run two training samples through the plain model; return the task.

    Raises SpecError naming `data...` when the data cannot be loaded, its samples do not fit the
    model's input, or its labels are out of range of the model's outputs.
    """
    task = build_task(spec)
    where = "data" if getattr(spec, "data", None) is not None else "data (synthetic default)"
    try:
        inputs, targets = task.samples(0, 2)
        next(iter(task.test_batches(2)))
    except SpecError:
        raise
    except Exception as e:  # noqa: BLE001 - a user's Dataset failed while reading a sample
        raise SpecError(f"{where}: reading samples failed with {type(e).__name__}: {e}") from None
    if spec.model.input_shape is not None and inputs and tuple(inputs[0].shape[1:]) != tuple(spec.model.input_shape):
        raise SpecError(
            f"data: samples have shape {list(inputs[0].shape[1:])} but model.input_shape is {spec.model.input_shape}; "
            "set data.input_shape to reshape them, or fix model.input_shape")
    state = torch.random.get_rng_state()
    try:
        model = build_from_spec(spec).eval()
        with torch.no_grad():
            out = model(*inputs)
    except SpecError:
        raise
    except Exception as e:  # noqa: BLE001
        shapes = [list(t.shape) for t in inputs]
        raise SpecError(f"data: samples of shape {shapes} (batch first) do not fit the model's input: "
                        f"{type(e).__name__}: {str(e).splitlines()[0]}; set data.input_shape or change the model") from None
    finally:
        torch.random.set_rng_state(state)
    if not isinstance(out, torch.Tensor) or out.dim() < 2:
        raise SpecError(f"data: the model returned {type(out).__name__}, not class scores (batch, classes)")
    classes = out.size(-1)
    if targets.numel() and (targets.min() < 0 or targets.max() >= classes):
        raise SpecError(f"data: labels range {int(targets.min())}..{int(targets.max())} but the model has {classes} outputs; "
                        "labels must be class indices 0..classes-1")
    if out.reshape(-1, classes).size(0) != targets.numel():
        raise SpecError(f"data: the model gives {out.reshape(-1, classes).size(0)} predictions for {targets.numel()} "
                        "labels; classification needs one label per sample (or per token)")
    return task
