"""A model's shapes without its weights, and its weights one tensor at a time.

`build_recorded(build, seed)` builds the model on the meta device (no weight memory) while a
TorchDispatchMode writes down every aten op the build runs: each factory, each random draw,
each in-place write. `Recording.tensor_stats(names, stats)` then replays that log on the CPU
with a private generator seeded with `seed`, in the same order, so the generator's stream is
the one a real build under `private_rng(seed)` (or `torch.manual_seed(seed)`) consumes: every
draw is repeated with the same op, shape and strides, into a scratch buffer when its values are
not wanted. A tensor is materialised only from the last write that covers it whole to its
last write, `stats` reads it, and it is freed: peak memory is a few tensors, not the model.

The values are bit for bit those of the real build (tests/models/test_lazy_weights.py), or
the replay refuses (`None`) and the caller builds the model for real:
- an init that does nothing on meta tensors (`nn.init.trunc_normal_`, `orthogonal_`,
  `dirac_`, `sparse_` return early on meta) would leave the log short (transformers'
  `init_weights` skips on meta too: it is told the CPU while the build records, see
  `_hf_inits_run_on_meta`);
- a draw with the caller's own generator, a tensor made outside the build, or a tensor
  whose storage is read under two dtypes, has no faithful replay here;
- a wanted tensor that nothing wrote whole (torch.empty, never initialised) has no defined value.
"""

from __future__ import annotations

import sys
import threading
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field

import torch
from torch import nn
from torch.utils._python_dispatch import TorchDispatchMode
from torch.utils._pytree import tree_flatten, tree_map

_META_SKIPPING_INITS = tuple(getattr(nn.init, n) for n in ("trunc_normal_", "orthogonal_", "dirac_", "sparse_")
                             if hasattr(nn.init, n))
_SKIP_CODES = frozenset(getattr(f, "__code__", None) for f in _META_SKIPPING_INITS) - {None}
_RANDOM_OPS = frozenset({
    "uniform_", "normal_", "bernoulli_", "random_", "exponential_", "geometric_", "log_normal_", "cauchy_",
    "rand", "randn", "randint", "randperm", "normal", "bernoulli", "multinomial", "poisson", "rand_like",
    "randn_like", "randint_like",
})
_OVERWRITE_OPS = frozenset({"fill_", "zero_", "copy_"})
"""In-place writes whose result does not depend on the old values (besides the random ones)."""
POOL_MAX_BYTES = 16 << 20
"""Draws nobody reads go to one reused buffer up to this size; bigger ones get their own, freed at once."""
SPARE_MAX_BYTES = 64 << 20
"""Tensors already read are kept, up to this many bytes, as memory for the next tensor of their size (a
model repeats its layers' shapes): a fresh allocation faults in every page, again for every layer."""
_EMPTY_OPS = frozenset({"empty", "empty_like", "empty_strided", "new_empty", "new_empty_strided"})


@dataclass(frozen=True)
class _Ref:
    """A tensor seen in the log: which storage, and which part of it."""

    storage: int
    size: tuple[int, ...]
    stride: tuple[int, ...]
    offset: int
    dtype: torch.dtype


@dataclass
class _Op:
    func: object
    args: tuple
    kwargs: dict
    reads: tuple[int, ...]
    """Storages whose values the op reads (its tensor inputs, mutated ones included unless overwritten)."""
    writes: tuple[int, ...]
    """Storages the op writes (created or mutated)."""
    outputs: object = None
    """The op's result with tensors as _Refs (to bind created storages at replay)."""
    whole: tuple[int, ...] = ()
    """Written storages it overwrites entirely, whatever they held."""
    random: bool = False


class _Unfaithful(Exception):
    """The build did something the replay cannot reproduce exactly."""


@dataclass
class Recording:
    seed: int
    ops: list[_Op] = field(default_factory=list)
    storages: dict[int, tuple[torch.dtype, int]] = field(default_factory=dict)  # key -> (dtype, numel)
    refused: str = ""
    opaque: set[int] = field(default_factory=set)
    """Storages that appeared without a recorded factory: their values are unknown until written whole."""
    _alive: list = field(default_factory=list)  # meta tensors kept alive so storage keys stay unique

    def tensor_stats(self, named: dict[str, torch.Tensor], stats: Callable[[torch.Tensor], object]) -> dict | None:
        """{name: stats(value)} for meta tensors `named` (parameters of the recorded model), None if
        the replay cannot be exact (then build the model for real)."""
        if self.refused:
            return None
        want = {name: self._ref(t) for name, t in named.items()}
        if any(r.storage not in self.storages for r in want.values()):
            return None
        try:
            return self._replay(want, stats)
        except _Unfaithful:
            return None

    # --- recording ------------------------------------------------------------------------
    def _key(self, t: torch.Tensor, create: bool = False) -> int:
        s = t.untyped_storage()
        key = s._cdata
        seen = self.storages.get(key)
        if seen is None:
            if not create:  # made by a factory the mode does not see (torch.tensor, some zeros)
                self.opaque.add(key)
            self.storages[key] = (t.dtype, s.nbytes() // t.element_size())
            self._alive.append(t)  # keeps the storage, so its address stays its key
        elif seen[0] != t.dtype:
            raise _Unfaithful(f"a storage read as {seen[0]} and {t.dtype}")
        return key

    def _ref(self, t: torch.Tensor) -> _Ref:
        return _Ref(self._key(t), tuple(t.shape), tuple(t.stride()), t.storage_offset(), t.dtype)

    def record(self, func, args, kwargs, out) -> None:
        name = func.overloadpacket.__name__
        if kwargs.get("generator") is not None:
            raise _Unfaithful(f"{name} drew with the build's own generator")
        if "out" in kwargs:
            raise _Unfaithful(f"{name} wrote through out=")
        ins = [t for t in tree_flatten((args, kwargs))[0] if isinstance(t, torch.Tensor)]
        if any(t.device.type != "meta" for t in ins):
            raise _Unfaithful(f"{name} read a tensor that is not on the meta device")
        in_keys = {self._key(t) for t in ins}
        targets = [t for a, t in zip(func._schema.arguments, args)
                   if a.alias_info is not None and a.alias_info.is_write and isinstance(t, torch.Tensor)]
        created = [t for t in tree_flatten(out)[0]
                   if isinstance(t, torch.Tensor) and t.untyped_storage()._cdata not in in_keys]
        if func.is_view or (not targets and not created):
            return  # a view or an alias writes no value (the replay addresses storages directly)
        random = name in _RANDOM_OPS
        created_keys = [self._key(t, create=True) for t in created]
        whole = [] if name in _EMPTY_OPS else list(created_keys)  # torch.empty defines no value
        if random or name in _OVERWRITE_OPS:
            for t in targets:
                k = self._key(t)
                if t.is_contiguous() and t.storage_offset() == 0 and t.numel() == self.storages[k][1]:
                    whole.append(k)
        to_ref = lambda x: self._ref(x) if isinstance(x, torch.Tensor) else x  # noqa: E731
        writes = tuple(dict.fromkeys([self._key(t) for t in targets] + created_keys))
        reads = tuple(k for k in dict.fromkeys(self._key(t) for t in ins) if k not in whole)
        self.ops.append(_Op(func, tree_map(to_ref, args), tree_map(to_ref, kwargs), reads, writes,
                            tree_map(to_ref, out), tuple(whole), random))

    # --- replay ---------------------------------------------------------------------------
    def _replay(self, want: dict[str, _Ref], stats) -> dict:
        wanted = {r.storage for r in want.values()}
        # backward: an op is run for its values ("need") if it writes a storage whose value is
        # needed later; a draw nobody needs is still run ("stream"), into scratch, for the stream
        needed, kind = set(wanted), [""] * len(self.ops)
        for i in range(len(self.ops) - 1, -1, -1):
            op = self.ops[i]
            if any(k in needed for k in op.writes):
                kind[i] = "need"
                needed.difference_update(op.whole)
                needed.update(op.reads)
            elif op.random:
                kind[i] = "stream"
                needed.update(op.reads)
        if wanted & needed:
            raise _Unfaithful("a wanted tensor is never written whole (it would be uninitialised memory)")
        if self.opaque & needed:
            raise _Unfaithful("a value made by a factory the recording does not see is read")
        last: dict[int, int] = {}
        for i, op in enumerate(self.ops):
            if kind[i]:
                for k in (*op.reads, *(op.writes if kind[i] == "need" else ())):
                    last[k] = i
        names_of: dict[int, list[str]] = {}
        for name, r in want.items():
            names_of.setdefault(r.storage, []).append(name)
        g = torch.Generator().manual_seed(self.seed)
        real: dict[int, torch.UntypedStorage] = {}
        pool: dict[torch.dtype, torch.UntypedStorage] = {}  # one reused buffer per dtype for unwanted draws
        spare: dict[tuple[torch.dtype, int], list[torch.UntypedStorage]] = {}  # read and dropped: memory for the next
        spare_bytes = 0  # tensor of that size (a fresh allocation faults in every page again)

        def pooled(dtype: torch.dtype, numel: int) -> torch.UntypedStorage:
            if numel * dtype.itemsize > POOL_MAX_BYTES:  # kept for the whole replay: only small ones
                return torch.empty(numel, dtype=dtype).untyped_storage()
            st = pool.get(dtype)
            if st is None or st.nbytes() < numel * dtype.itemsize:
                st = pool[dtype] = torch.empty(numel, dtype=dtype).untyped_storage()
            return st
        out: dict[str, object] = {}

        def as_tensor(st, ref: _Ref) -> torch.Tensor:
            return torch.empty(0, dtype=ref.dtype).set_(st, ref.offset, ref.size, ref.stride)

        for i, op in enumerate(self.ops):
            if not kind[i]:
                continue
            keep = lambda k: kind[i] == "need" and (last.get(k, -1) > i or k in wanted)  # noqa: E731
            scratch: dict[int, torch.UntypedStorage] = {}

            def view(ref):
                nonlocal spare_bytes
                if not isinstance(ref, _Ref):
                    return ref
                st = real.get(ref.storage) or scratch.get(ref.storage)
                if st is None:
                    dtype, numel = self.storages[ref.storage]
                    if kind[i] == "stream" and ref.storage in op.writes and ref.storage not in op.reads:
                        st = pooled(dtype, numel)  # only advances the generator: any memory will do
                    elif spare.get((dtype, numel)):
                        st = spare[(dtype, numel)].pop()  # its old values count as uninitialised memory
                        spare_bytes -= st.nbytes()
                    else:
                        st = torch.empty(numel, dtype=dtype).untyped_storage()
                    (real if keep(ref.storage) else scratch)[ref.storage] = st
                return as_tensor(st, ref)

            args, kwargs = tree_map(view, op.args), tree_map(view, op.kwargs)
            if "device" in kwargs:
                kwargs["device"] = torch.device("cpu")
            func = op.func
            if op.random:
                if not any(a.name == "generator" for a in func._schema.arguments):
                    # e.g. aten.randn.default from torch.randn(...) in a constructor: the same draw
                    # through the overload that takes a generator (aten.randn.generator)
                    func = getattr(func.overloadpacket, "generator", None)
                    if func is None:
                        raise _Unfaithful(f"{op.func} takes no generator")
                kwargs["generator"] = g
            with torch.no_grad():
                result = func(*args, **kwargs)
            for ref, t in zip(tree_flatten(op.outputs)[0], tree_flatten(result)[0]):
                if isinstance(ref, _Ref) and isinstance(t, torch.Tensor) and ref.storage not in real and keep(ref.storage):
                    real[ref.storage] = t.untyped_storage()
            for k in [k for k in real if last.get(k, -1) <= i]:
                for name in names_of.get(k, ()):
                    out[name] = stats(as_tensor(real[k], want[name]))
                st = real.pop(k)
                dtype, numel = self.storages[k]
                kept = any(isinstance(v, torch.Tensor) and v.untyped_storage().data_ptr() == st.data_ptr()
                           for n in names_of.get(k, ()) for v in tree_flatten(out[n])[0])  # stats kept the tensor
                if not kept and spare_bytes + st.nbytes() <= SPARE_MAX_BYTES:
                    spare.setdefault((dtype, numel), []).append(st)
                    spare_bytes += st.nbytes()
        missing = [n for n in want if n not in out]
        if missing:
            raise _Unfaithful(f"no value for {missing[:3]}")
        return out


def _draw_into_meta(func, args) -> bool:
    """An in-place random draw (normal_, uniform_, ...) into a meta tensor: it changes nothing."""
    name = func.overloadpacket.__name__
    return name.endswith("_") and name in _RANDOM_OPS and bool(args) and getattr(args[0], "is_meta", False)


class _Recorder(TorchDispatchMode):
    @classmethod
    def _should_skip_dynamo(cls) -> bool:
        return False  # nothing is compiled in here; wrapping would import torch._dynamo (seconds) on first use

    def __init__(self, rec: Recording):
        super().__init__()
        self.rec = rec

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        kwargs = kwargs or {}
        if _draw_into_meta(func, args):
            out = args[0]  # a draw into a meta tensor changes nothing (and torch's meta normal_ imports dynamo)
        else:
            out = func(*args, **kwargs)
        if not self.rec.refused:
            try:
                self.rec.record(func, args, kwargs, out)
            except _Unfaithful as e:
                self.rec.refused = str(e)
        return out


_RECORDING = threading.local()
_HF_PATCH = threading.Lock()
_hf_users = 0


@contextmanager
def _hf_inits_run_on_meta() -> Iterator[bool]:
    """transformers' `PreTrainedModel.init_weights` skips the model's own init (`_init_weights`: the
    normal(0, 0.02) draws of BERT, GPT-2, Llama, ...) when the default device is meta, so a recorded
    build would hold the constructors' init instead. While this thread records, transformers is told
    the default device is the CPU (its only use in `init_weights`); other threads see the real answer.
    Yields whether the hook is in place; without it (transformers not imported yet, or a version
    without that function) a transformers model's recording refuses (build_recorded)."""
    global _hf_users
    mu = sys.modules.get("transformers.modeling_utils")
    if mu is None or not hasattr(mu, "get_torch_context_manager_or_global_device"):
        yield False  # not imported yet (the build imports it: warm it first) or no such hook
        return
    with _HF_PATCH:
        if _hf_users == 0:
            original = mu.get_torch_context_manager_or_global_device

            def device_for_init():
                got = original()
                return torch.device("cpu") if getattr(_RECORDING, "on", False) and got == torch.device("meta") else got

            device_for_init.__wrapped__ = original
            mu.get_torch_context_manager_or_global_device = device_for_init
        _hf_users += 1
    _RECORDING.on = True
    try:
        yield True
    finally:
        _RECORDING.on = False
        with _HF_PATCH:
            _hf_users -= 1
            if _hf_users == 0:
                mu.get_torch_context_manager_or_global_device = mu.get_torch_context_manager_or_global_device.__wrapped__


def _hf_init_skipped(module: nn.Module, hooked: bool) -> bool:
    """A transformers model built while its init_weights was not told the CPU (see above)."""
    mu = sys.modules.get("transformers.modeling_utils")
    pretrained = getattr(mu, "PreTrainedModel", None) if mu is not None else None
    return pretrained is not None and not hooked and any(isinstance(m, pretrained) for m in module.modules())


def build_recorded(build: Callable[[], nn.Module], seed: int,
                   warm: Callable[[], None] | None = None) -> tuple[nn.Module, Recording]:
    """`build()` on the meta device, its init recorded for `Recording.tensor_stats` (see the module doc).

    `warm()` runs first, unwatched: the watch below (sys.setprofile, to see an init that skips meta
    tensors) costs on every Python call, so imports the build triggers belong in `warm`."""
    if warm is not None:
        warm()
    rec = Recording(seed)
    previous = sys.getprofile()

    def watch(frame, event, arg):  # this thread only (sys.setprofile is per thread)
        if event == "call" and frame.f_code in _SKIP_CODES and not rec.refused:
            rec.refused = f"{frame.f_code.co_name} does nothing on the meta device"

    sys.setprofile(watch)
    try:
        with torch.device("meta"), _hf_inits_run_on_meta() as hooked, _Recorder(rec):
            module = build()
    finally:
        sys.setprofile(previous)
    if not rec.refused and _hf_init_skipped(module, hooked):
        rec.refused = "transformers' init_weights does nothing on the meta device"
    return module, rec


class _SkipMetaDraws(TorchDispatchMode):
    """A draw into a meta tensor changes nothing; torch's meta `normal_` imports torch._dynamo
    (seconds, ~200 MB) on first use, so a shapes-only build skips them."""

    @classmethod
    def _should_skip_dynamo(cls) -> bool:
        return False

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        return args[0] if _draw_into_meta(func, args) else func(*args, **(kwargs or {}))


def meta_parameter_bytes(build: Callable[[], nn.Module]) -> int:
    """Bytes of the parameters `build()` creates, built on the meta device (nothing recorded)."""
    with torch.device("meta"), _SkipMetaDraws():
        module = build()
    return sum(p.numel() * p.element_size() for p in module.parameters())


def zero_stride_twin(module: nn.Module) -> dict[int, torch.Tensor]:
    """Swap `module`'s meta parameters and buffers, in place, for CPU zeros of their shapes that
    take one element each (stride 0), so that it runs on real CPU inputs for its shapes (a trace
    at batch 1) without its weights; an op that needs a weight contiguous copies that one alone,
    for the time of that op. (Meta inputs would do too, but torch's meta kernels for batch norm
    and others import torch._dynamo: seconds and ~200 MB.) Returns {id(placeholder): meta tensor}."""
    swapped: dict[int, torch.Tensor] = {}
    memo: dict[int, torch.Tensor] = {}  # tied weights stay one tensor
    for m in module.modules():
        for table, as_param in ((m._parameters, True), (m._buffers, False)):
            for name, t in list(table.items()):
                if t is None or t.device.type != "meta":
                    continue
                if id(t) not in memo:
                    z = torch.zeros((), dtype=t.dtype).expand(t.shape)
                    memo[id(t)] = nn.Parameter(z, requires_grad=t.requires_grad) if as_param else z
                    swapped[id(memo[id(t)])] = t
                table[name] = memo[id(t)]
    return swapped


@contextmanager
def dense_during_calls(module: nn.Module) -> Iterator[None]:
    """While a submodule runs (not while fx traces or torch.export captures it), its zero-stride placeholders are swapped
    for contiguous zeros: CPU kernels (oneDNN convolution) take a slow path on stride-0 weights.
    One module's tensors at a time, freed when its forward returns. Parameters are views of one
    zero buffer per dtype, zeroed once (a forward only reads them, and fresh zeros per tensor
    are slow on large models: docs/concurrency.md); buffers, which a forward may update in place (batch-norm statistics),
    get their own zeros."""
    pools: dict[torch.dtype, torch.Tensor] = {}

    def placeholder(t) -> bool:
        return isinstance(t, torch.Tensor) and t.numel() > 1 and 0 in t.stride()

    def zeros_param(t: torch.Tensor) -> torch.Tensor:
        pool = pools.get(t.dtype)
        if pool is None or pool.numel() < t.numel():
            pool = pools[t.dtype] = torch.zeros(t.numel(), dtype=t.dtype)
        return pool[:t.numel()].view(t.shape)

    def pre(m, args):
        if any(isinstance(a, torch.fx.Proxy) for a in args):
            return  # symbolic tracing: the graph must see the module's own parameters
        if torch.compiler.is_exporting():
            return  # torch.export runs on fake tensors: zeros would only cost time (half of BERT-base's export)
        saved = []
        for table, as_param in ((m._parameters, True), (m._buffers, False)):
            for name, t in list(table.items()):
                if placeholder(t):
                    saved.append((table, name, t))
                    table[name] = (nn.Parameter(zeros_param(t), requires_grad=False) if as_param
                                   else torch.zeros(t.shape, dtype=t.dtype))
        m.__dict__.setdefault("_qsync_dense", []).append(saved)

    def post(m, args, out):
        stack = m.__dict__.get("_qsync_dense")
        if stack:
            for table, name, t in stack.pop():
                table[name] = t

    handles = []
    for m in module.modules():
        if any(placeholder(t) for t in (*m._parameters.values(), *m._buffers.values())):
            handles += [m.register_forward_pre_hook(pre), m.register_forward_hook(post)]
    try:
        yield
    finally:
        for h in handles:
            h.remove()


__all__ = ["Recording", "build_recorded", "dense_during_calls", "meta_parameter_bytes", "zero_stride_twin"]
