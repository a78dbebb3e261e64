"""OpGraph: the model as the planner sees it — operators with shapes, FLOPs and bytes.

Produced by `qsync_opt.models.tracing`; consumed by the predictor and the solver. Plain,
frozen, JSON-serialisable data: nothing here holds a reference to the nn.Module.
"""

from __future__ import annotations

from dataclasses import asdict, dataclass, field, replace

#: Operator kinds whose precision the planner chooses. Everything else follows its inputs.
SELECTABLE_KINDS = frozenset({"conv1d", "conv2d", "linear", "matmul", "bmm", "embedding"})


@dataclass(frozen=True)
class OpNode:
    """One operator of the traced forward graph.

    Sizes are for the batch the graph was traced with (`OpGraph.batch_size`); quantities that
    scale with the batch are rescaled by `OpGraph.for_batch`.
    """

    name: str
    """Stable key: the module FQN for module calls, `<parent>.<fn>_<k>` for functional ops."""
    kind: str
    """conv2d, linear, matmul, bmm, embedding, batch_norm, layer_norm, relu, gelu, softmax, add, ..."""
    selectable: bool
    input_shapes: tuple[tuple[int, ...], ...]
    output_shape: tuple[int, ...]
    fwd_flops: int
    """Multiply-adds count as 2 FLOPs."""
    bwd_flops: int
    """Input gradient + weight gradient (about 2x forward for GEMMs)."""
    param_count: int = 0
    saved_bytes: int = 0
    """Bytes of tensors this op saves for backward, at FP32."""
    depth: int = 0
    """Breadth-first level in the forward graph (0 = reads the model input)."""
    weight_shape: tuple[int, ...] | None = None
    weight_fqn: str | None = None
    """Parameter FQN of a functional op's weight (e.g. `F.linear(x, self.weight)` -> 'weight');
    None for module ops, whose weight is `<name>.weight`."""

    @property
    def input_numel(self) -> int:
        return sum(_numel(s) for s in self.input_shapes)

    @property
    def output_numel(self) -> int:
        return _numel(self.output_shape)

    @property
    def param_bytes_fp32(self) -> int:
        return 4 * self.param_count


@dataclass(frozen=True)
class OpGraph:
    """Operators in topological order, their data-flow edges, and the selectable-op adjacency.

    `selectable_edges` connect selectable ops that exchange a tensor directly or through
    non-selectable ops only (norms, activations, adds); a cast is paid on such an edge when
    its two ends run at different precisions. `edge_numel[(a, b)]` is the element count of
    the tensor crossing that edge.
    """

    model: str
    batch_size: int
    nodes: tuple[OpNode, ...]
    edges: tuple[tuple[str, str], ...]
    selectable_edges: tuple[tuple[str, str], ...]
    edge_numel: dict[tuple[str, str], int] = field(default_factory=dict)
    depth: int = 0
    """Total depth L: one more than the largest node depth."""
    captured_by: str = "fx"
    """How the graph was captured: 'fx' (symbolic tracing) or 'export' (torch.export, for models fx
    cannot follow; the per-op profiler replays fx graphs only)."""

    def node(self, name: str) -> OpNode:
        for n in self.nodes:
            if n.name == name:
                return n
        raise KeyError(name)

    @property
    def selectable(self) -> tuple[OpNode, ...]:
        return tuple(n for n in self.nodes if n.selectable)

    @property
    def fixed(self) -> tuple[OpNode, ...]:
        return tuple(n for n in self.nodes if not n.selectable)

    @property
    def param_count(self) -> int:
        return sum(n.param_count for n in self.nodes)

    def for_batch(self, batch_size: int) -> "OpGraph":
        """The same graph at another batch size: FLOPs and activation bytes scale linearly."""
        if batch_size == self.batch_size:
            return self
        f = batch_size / self.batch_size

        def scale_shape(s: tuple[int, ...]) -> tuple[int, ...]:
            return (max(1, round(s[0] * f)), *s[1:]) if s else s

        nodes = tuple(
            replace(
                n,
                input_shapes=tuple(scale_shape(s) for s in n.input_shapes),
                output_shape=scale_shape(n.output_shape),
                fwd_flops=round(n.fwd_flops * f),
                bwd_flops=round(n.bwd_flops * f),
                saved_bytes=round(n.saved_bytes * f),
            )
            for n in self.nodes
        )
        numel = {e: round(v * f) for e, v in self.edge_numel.items()}
        return replace(self, batch_size=batch_size, nodes=nodes, edge_numel=numel)

    # --- serialisation -------------------------------------------------------------------
    def to_dict(self) -> dict:
        d = asdict(self)
        if d["captured_by"] == "fx":  # the default stays out: fx graphs serialise as before
            del d["captured_by"]
        d["edge_numel"] = [[a, b, n] for (a, b), n in self.edge_numel.items()]
        return d

    @classmethod
    def from_dict(cls, d: dict) -> "OpGraph":
        nodes = tuple(
            OpNode(
                **{
                    **n,
                    "input_shapes": tuple(tuple(s) for s in n["input_shapes"]),
                    "output_shape": tuple(n["output_shape"]),
                    "weight_shape": tuple(n["weight_shape"]) if n.get("weight_shape") else None,
                }
            )
            for n in d["nodes"]
        )
        return cls(
            model=d["model"],
            batch_size=d["batch_size"],
            nodes=nodes,
            edges=tuple(tuple(e) for e in d["edges"]),
            selectable_edges=tuple(tuple(e) for e in d["selectable_edges"]),
            edge_numel={(a, b): n for a, b, n in d["edge_numel"]},
            depth=d.get("depth", 0),
            captured_by=d.get("captured_by", "fx"),
        )


def _numel(shape: tuple[int, ...]) -> int:
    out = 1
    for s in shape:
        out *= s
    return out
