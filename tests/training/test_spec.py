"""The spec is the product's front door: bad input must be named precisely, good input must round-trip."""

import textwrap

import pytest

from qsync_opt.errors import SpecError
from qsync_opt.training.spec import JobSpec, load_spec

GOOD = textwrap.dedent(
    """\
    name: demo
    cluster:
      groups:
        - name: v100
          device: V100-16GB
          count: 2
        - name: t4
          device: T4
          count: 2
          precisions: [fp32, fp16, int8]
      interconnect: pcie3
    model:
      name: resnet50
    training:
      global_batch: 128
      optimizer: adam
    objective:
      minimize: accuracy_degradation
      max_iteration_time: auto
    solver:
      backend: cbc
      time_limit_s: 10
    """
)


def test_good_spec_loads_and_defaults():
    spec = load_spec(GOOD)
    assert spec.cluster.world_size == 4
    assert spec.local_batches() == {"v100": 32, "t4": 32}
    assert spec.cluster.groups[1].allowed_precisions == ("fp32", "fp16", "int8")
    assert spec.cluster.link.bandwidth_gbs == 16.0


def test_round_trip_yaml_and_dict():
    spec = load_spec(GOOD)
    assert load_spec(spec.to_yaml()) == spec
    assert load_spec(spec.model_dump(mode="json", by_alias=True)) == spec
    assert load_spec(spec) == spec


def test_overrides_use_dotted_paths():
    spec = load_spec(GOOD, **{"solver.backend": "highs", "training.global_batch": 64})
    assert spec.solver.backend == "highs"
    assert spec.training.global_batch == 64


def test_load_from_path(tmp_path):
    p = tmp_path / "s.yaml"
    p.write_text(GOOD)
    assert load_spec(p) == load_spec(str(p)) == load_spec(GOOD)


BAD = [
    # (id, edit applied to GOOD, expected fragments in the message)
    ("unknown-top-level-key", lambda s: s + "colour: red\n", ["colour", "unknown field", "line 23"]),
    ("typo-nested-key", lambda s: s.replace("optimizer: adam", "optimzer: adam"), ["training.optimzer", "did you mean 'optimizer'"]),
    ("unknown-device", lambda s: s.replace("device: T4", "device: T5"), ["cluster.groups.1.device", "T5", "T4"]),
    ("unsupported-precision", lambda s: s.replace("[fp32, fp16, int8]", "[fp32, bf16]"), ["cluster.groups.1.precisions", "bf16", "T4"]),
    ("unknown-precision", lambda s: s.replace("[fp32, fp16, int8]", "[fp32, int3]"), ["cluster.groups.1.precisions.1", "int3", "int4"]),
    ("zero-count", lambda s: s.replace("count: 2\n    - name: t4", "count: 0\n    - name: t4"), ["cluster.groups.0.count", "greater than or equal to 1", "line 6"]),
    ("wrong-type", lambda s: s.replace("global_batch: 128", "global_batch: lots"), ["training.global_batch", "lots"]),
    ("missing-training", lambda s: s.replace("training:\n  global_batch: 128\n  optimizer: adam\n", ""), ["training", "global_batch"]),
    ("two-model-sources", lambda s: s.replace("name: resnet50", "name: resnet50\n  import: 'pkg.mod:make'"), ["model", "exactly one"]),
    ("import-without-shape", lambda s: s.replace("name: resnet50", "import: 'pkg.mod:make'"), ["model", "input_shape"]),
    ("bad-interconnect", lambda s: s.replace("pcie3", "pcie9"), ["cluster.interconnect", "pcie9", "pcie4"]),
    ("duplicate-groups", lambda s: s.replace("name: t4", "name: v100"), ["cluster", "unique", "v100"]),
    ("negative-bound", lambda s: s.replace("max_iteration_time: auto", "max_iteration_time: -5"), ["objective.max_iteration_time", "positive"]),
    ("time-objective-needs-budget", lambda s: s.replace("minimize: accuracy_degradation", "minimize: iteration_time"), ["max_accuracy_degradation"]),
    ("bad-objective", lambda s: s.replace("minimize: accuracy_degradation", "minimize: loss"), ["objective.minimize", "loss", "iteration_time"]),
    ("batches-disagree", lambda s: s.replace("count: 2\n    - name: t4", "count: 2\n      local_batch: 40\n    - name: t4").replace("precisions: [fp32, fp16, int8]", "precisions: [fp32, fp16, int8]\n      local_batch: 40"), ["160", "global_batch", "128"]),
    ("bad-group-name", lambda s: s.replace("name: t4", "name: 't 4'"), ["cluster.groups.1.name", "t 4"]),
    ("empty-groups", lambda s: s.replace(s[s.index("  groups:"):s.index("  interconnect")], "  groups: []\n"), ["cluster.groups", "at least 1"]),
]


@pytest.mark.parametrize("edit,fragments", [b[1:] for b in BAD], ids=[b[0] for b in BAD])
def test_bad_input_names_the_field(edit, fragments):
    text = edit(GOOD)
    assert text != GOOD, "the edit must change the spec"
    with pytest.raises(SpecError) as err:
        load_spec(text)
    msg = str(err.value)
    for frag in fragments:
        assert frag in msg, f"{frag!r} not in:\n{msg}"


def test_yaml_syntax_error_is_a_spec_error():
    with pytest.raises(SpecError, match="not valid YAML"):
        load_spec("cluster: [unclosed\n")


def test_non_mapping_is_rejected():
    with pytest.raises(SpecError, match="must be a mapping"):
        load_spec("- just\n- a list\n")


def test_missing_file_names_the_path():
    with pytest.raises(SpecError, match="nope.yaml.*does not exist"):
        load_spec("nope.yaml")


def test_inline_custom_device_is_validated_like_the_catalog():
    spec = load_spec(GOOD.replace("device: T4", "device: {name: X1, memory_gb: 8, bandwidth_gbs: 100, peak_tflops: {fp32: 5, int8: 40}}").replace("[fp32, fp16, int8]", "[fp32, int8]"))
    assert spec.cluster.groups[1].device_spec.precisions == ("fp32", "int8")
    with pytest.raises(SpecError, match="peak_tflops"):
        load_spec(GOOD.replace("device: T4", "device: {name: X1, memory_gb: 8, bandwidth_gbs: 100, peak_tflops: {int8: 40}}").replace("precisions: [fp32, fp16, int8]", "role: auto"))


def test_spec_is_frozen():
    spec = load_spec(GOOD)
    with pytest.raises(Exception):
        spec.name = "other"
    assert isinstance(spec, JobSpec)


def test_digest_changes_with_content():
    assert load_spec(GOOD).digest() == load_spec(GOOD).digest()
    assert load_spec(GOOD).digest() != load_spec(GOOD, **{"training.global_batch": 64}).digest()


def test_duplicate_keys_are_an_error_naming_the_line():
    with pytest.raises(SpecError, match=r"line 10: key 'count' is given twice in one mapping \(first on line 9\)"):
        load_spec(GOOD.replace("      precisions: [fp32, fp16, int8]", "      count: 3"))
    with pytest.raises(SpecError, match="key 'groups' is given twice"):
        load_spec(GOOD.replace("  interconnect: pcie3", "  groups: []\n  interconnect: pcie3"))


def test_code_loading_env_needs_allow_code_env():
    bad = GOOD.replace("      count: 2\n    - name: t4", "      count: 2\n      env: {LD_PRELOAD: x.so}\n"
                       "    - name: t4")
    with pytest.raises(SpecError, match=r"cluster.groups.0.env.LD_PRELOAD \(line \d+\): this env key makes every rank load code"):
        load_spec(bad)
    assert load_spec("allow_code_env: true\n" + bad).cluster.groups[0].env == {"LD_PRELOAD": "x.so"}


def test_local_batch_that_leaves_nothing_names_the_field_and_the_fix():
    text = GOOD.replace("      count: 2\n    - name: t4", "      count: 2\n      local_batch: 100\n"
                        "    - name: t4")
    with pytest.raises(SpecError, match=r"local_batch: the groups that set it take 200 samples \(v100 2 x 100\) of "
                                        r"training.global_batch=128, leaving 0 for the 2 device\(s\) of t4") as e:
        load_spec(text)
    assert "-72" not in str(e.value)


def test_a_memory_override_below_the_runtime_overhead_names_memory_gb():
    text = GOOD.replace("precisions: [fp32, fp16, int8]", "memory_gb: 0.1")
    with pytest.raises(SpecError, match=r"cluster.groups.1.memory_gb \(line \d+\): 0.1 GB leaves no usable memory"):
        load_spec(text)


def test_inline_device_errors_do_not_start_with_the_string_branch():
    text = GOOD.replace("device: T4", "device: {name: X, memory_gb: 8, bandwidth_gbs: 100, peak_tflops: {fp32: x}}")
    with pytest.raises(SpecError) as e:
        load_spec(text.replace("precisions: [fp32, fp16, int8]", "role: auto"))
    assert "valid string" not in str(e.value) and "cluster.groups.1.device.peak_tflops.fp32" in str(e.value)


def test_inline_devices_accept_the_fp8_precision_names():
    dev = "{name: X8, sm: 90, memory_gb: 80, bandwidth_gbs: 2000, peak_tflops: {fp32: 60, fp8_e4m3: 1000, fp8_e5m2: 1000}}"
    spec = load_spec(GOOD.replace("device: T4", f"device: {dev}").replace("precisions: [fp32, fp16, int8]",
                                                                         "precisions: [fp32, fp8_e4m3, fp8_e5m2]"))
    assert spec.cluster.groups[1].device_spec.precisions == ("fp32", "fp8_e4m3", "fp8_e5m2")
    with pytest.raises(SpecError, match="share one tensor-core rate"):
        load_spec(GOOD.replace("device: T4", f"device: {dev.replace('fp8_e5m2: 1000', 'fp8_e5m2: 900')}")
                  .replace("precisions: [fp32, fp16, int8]", "role: auto"))
