"""A builtin source's kwargs that its generator cannot use are a SpecError naming the source's field (exit 2 in
the CLI), never a traceback from numpy: a training spec's data.sources and a loading spec's sources alike."""

from __future__ import annotations

import pytest

from qsync_opt.data.sources import SourceSpec
from qsync_opt.errors import SpecError
from qsync_opt.loading.sources import MAX_SYNTHETIC_SAMPLES, open_source


@pytest.mark.parametrize("kwargs, named", [
    ({"num_samples": 10, "seed": -1}, "seed must be an integer >= 0"),
    ({"num_samples": MAX_SYNTHETIC_SAMPLES + 1}, "num_samples=100,000,001 is more than"),
    ({"num_samples": 10, "median": -5}, "finite median > 0"),
    ({"num_samples": 10, "sigma": float("nan")}, "finite sigma >= 0"),
    ({"num_samples": 10, "median": float("inf")}, "finite median > 0"),
    ({"num_samples": 10, "seed": 1.5}, "seed must be an integer"),
])
def test_synthetic_lm_kwargs_it_cannot_use_name_the_field(kwargs, named):
    with pytest.raises(SpecError) as e:
        open_source(SourceSpec(name="x", builtin="synthetic-lm", kwargs=kwargs), 2)
    assert str(e.value).startswith("data.sources.2.kwargs: ") and named in str(e.value)


def test_a_generator_error_the_source_does_not_check_is_named_too(monkeypatch):
    from qsync_opt.loading import sources

    class Refuses:
        def __init__(self, **kw):
            raise MemoryError("Unable to allocate 7.11 PiB")

    monkeypatch.setitem(sources.BUILTIN_CLASSES, "synthetic-lm", (Refuses, "num_samples, ..."))
    with pytest.raises(SpecError, match=r"data.sources.0.kwargs: builtin synthetic-lm refused .*MemoryError"):
        open_source(SourceSpec(name="x", builtin="synthetic-lm", kwargs={"num_samples": 10}), 0)


def test_the_valid_defaults_still_open():
    src = open_source(SourceSpec(name="x", builtin="synthetic-lm", kwargs={"num_samples": 16, "seed": 3}), 0)
    assert len(src.lengths) == 16
