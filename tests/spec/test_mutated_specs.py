"""The front door under fuzzing: every example in examples/, mutated one field at a time, through
`qsync-opt solve` in-process, and wrong files given wherever a command takes a path.

What a user depends on: a bad input is exit 2 with a message that names what was wrong (the
mutated field, the flag, the file), never a traceback; a mutant that still makes sense plans
(0), is proven infeasible (3) or misses a bound (5).
"""

from __future__ import annotations

import copy
import json
from pathlib import Path

import pytest
import yaml

from qsync_opt import jobs
from qsync_opt.cli.commands import main

ROOT = Path(__file__).resolve().parents[2]
EXAMPLES = sorted((ROOT / "examples").glob("*.yaml"))
ALLOWED = {0, 2, 3, 5}

def _paths(node, prefix=()):
    if isinstance(node, dict):
        for key, value in node.items():
            yield prefix + (key,), value
            yield from _paths(value, prefix + (key,))
    elif isinstance(node, list):
        for i, value in enumerate(node):
            yield prefix + (i,), value
            yield from _paths(value, prefix + (i,))


def _mutations(value) -> list[tuple[str, object]]:
    """(name, new value) pairs for one field; 'delete' and 'rename' change the key instead."""
    out: list[tuple[str, object]] = [("delete", None)]
    if isinstance(value, bool):
        out.append(("string", "maybe"))
    elif isinstance(value, (int, float)):
        out += [("negative", -7), ("zero", 0), ("huge", 10**15), ("string", "abc"), ("list", [1, 2])]
    elif isinstance(value, str):
        out += [("unknown-name", "no-such-thing"), ("number", 3)]
    elif isinstance(value, list):
        out += [("emptied", []), ("scalar", 7)]
    elif isinstance(value, dict):
        out += [("scalar", 7), ("rename", None)]
    return out


def _cheap(doc: dict, kind: str) -> dict:
    """The example on its cheap path: a rollout simulates one trainer step."""
    doc = copy.deepcopy(doc)
    if kind == "rollout":
        doc["rollout"]["steps"] = 1
    return doc


def mutants(example: Path) -> list[tuple[str, tuple, str, dict, str]]:
    """(id, path, mutation, mutated document, the word the message must hold) for every field of `example`."""
    base = yaml.safe_load(example.read_text())
    kind = base.get("kind", "training")
    base = _cheap(base, kind)
    out = []
    for path, value in list(_paths(base)):
        if path == ("kind",):
            continue
        for name, new in _mutations(value):
            doc = copy.deepcopy(base)
            parent = doc
            for p in path[:-1]:
                parent = parent[p]
            last = path[-1]
            word = next((str(p) for p in reversed(path) if isinstance(p, str)), "")
            if name == "delete":
                del parent[last]
            elif name == "rename":
                key = next(iter(parent[last]), None)
                if key is None:
                    continue
                parent[last][f"{key}_typo"] = parent[last].pop(key)
                word = f"{key}_typo"
            else:
                parent[last] = new
            out.append((f"{example.stem}:{'.'.join(map(str, path))}:{name}", path, name, doc, word))
    return out


ALL = [m for ex in EXAMPLES for m in mutants(ex)]


#: The fast set: six mutants of each example that validation refuses (milliseconds apiece), spread over
#: its fields and the kinds of mutation, and a few valid ones that plan (a small model, a one-step
#: rollout, a serving plan).
FAST_IDS = [
    "gpu_gpt2_small:cluster.groups.0.device:unknown-name",
    "gpu_gpt2_small:cluster.groups.0.count:negative",
    "gpu_gpt2_small:training.seq_len:zero",
    "gpu_gpt2_small:training.lr:string",
    "gpu_gpt2_small:indicator.method:unknown-name",
    "gpu_gpt2_small:objective:scalar",
    "cpu_hf_llama_pysource:cluster:delete",
    "cpu_hf_llama_pysource:cluster.groups.1.precisions:emptied",
    "cpu_hf_llama_pysource:cluster.groups.0.local_batch:huge",
    "cpu_hf_llama_pysource:data.eval_every:list",
    "cpu_hf_llama_pysource:cluster.groups.1.count:negative",
    "cpu_hf_llama_pysource:cluster.groups.0.device:number",
    "cpu_tiny:cluster:delete",
    "cpu_tiny:cluster.groups:emptied",
    "cpu_tiny:cluster.groups.1.count:list",
    "cpu_tiny:training.steps:negative",
    "cpu_tiny:runtime.boundary:number",
    "cpu_tiny:runtime:rename",
    "cpu_tiny:objective:scalar",
    "cpu_tiny:model.name:unknown-name",
    "cpu_tiny:cluster.groups.0.count:zero",
    "cpu_tiny:training.lr:huge",
    "cpu_tiny:training.global_batch:string",
    "cpu_tiny_gpt2_sources:cluster:delete",
    "cpu_tiny_gpt2_sources:data.sources:emptied",
    "cpu_tiny_gpt2_sources:training.seed:list",
    "cpu_tiny_gpt2_sources:data.loader_cpus:negative",
    "cpu_tiny_gpt2_sources:data.sources.1.name:number",
    "cpu_tiny_gpt2_sources:data:rename",
    "hybrid_a100_t4_bert_base:cluster:delete",
    "hybrid_a100_t4_bert_base:cluster.groups.0.precisions:emptied",
    "hybrid_a100_t4_bert_base:cluster.groups.0.local_batch:huge",
    "hybrid_a100_t4_bert_base:cluster.groups.1.local_batch:list",
    "hybrid_a100_t4_bert_base:cluster.groups.0.count:negative",
    "hybrid_a100_t4_bert_base:cluster.groups.0.name:number",
    "hybrid_v100_t4_resnet50:cluster:delete",
    "hybrid_v100_t4_resnet50:cluster.groups:emptied",
    "hybrid_v100_t4_resnet50:cluster.groups.0.local_batch:huge",
    "hybrid_v100_t4_resnet50:training.global_batch:list",
    "hybrid_v100_t4_resnet50:cluster.groups.1.count:negative",
    "hybrid_v100_t4_resnet50:cluster.groups.0.role:number",
    "rollout_cpu_tiny:cluster:delete",
    "rollout_cpu_tiny:rollout.workers:emptied",
    "rollout_cpu_tiny:rollout.model.vocab:huge",
    "rollout_cpu_tiny:rollout.workload.prompts_per_step:list",
    "rollout_cpu_tiny:rollout.workload.response.median:negative",
    "rollout_cpu_tiny:cluster.interconnect:number",
    "rollout_cpu_tiny:rollout.model.heads:huge",
    "rollout_cpu_tiny:name:unknown-name",
    "rollout_laminar:rollout.workers:emptied",
    "rollout_laminar:rollout.model.preset:unknown-name",
    "rollout_laminar:rollout.policy.kind:number",
    "rollout_laminar:rollout:scalar",
    "serving_opt30b_t4_v100:cluster:delete",
    "serving_opt30b_t4_v100:serving.bits:emptied",
    "serving_opt30b_t4_v100:serving.prompt_len:huge",
    "serving_opt30b_t4_v100:cluster.groups.0.count:list",
    "serving_opt30b_t4_v100:serving.gen_tokens:negative",
    "serving_opt30b_t4_v100:serving.model.preset:number",
    "serving_opt30b_t4_v100:serving:rename",
    "serving_opt30b_t4_v100:name:unknown-name",
    "serving_cpu_llama:cluster:delete",
    "serving_cpu_llama:serving.bits:emptied",
    "serving_cpu_llama:serving.prompt_len:huge",
    "serving_cpu_llama:cluster.groups.1.count:list",
    "serving_cpu_llama:serving.gen_tokens:negative",
    "serving_cpu_llama:serving.costs:unknown-name",
    "serving_cpu_llama:serving.model.hidden:huge",
    "loading_cpu_mix:ranks:emptied",
    "loading_cpu_mix:ranks.2.speed:negative",
    "loading_cpu_mix:ranks.3.device:unknown-name",
    "loading_cpu_mix:global_batch:huge",
    "loading_cpu_mix:cost:delete",
    "loading_cpu_mix:balancer.policy:number",
    "loading_cpu_mix:balancer:rename",
    "loading_cpu_mix:sources.0.kwargs:scalar",
]
BY_ID = {m[0]: m for m in ALL}
FAST = [BY_ID[i] for i in FAST_IDS]


def _solve(tmp_path, capsys, doc: dict) -> tuple[int, str]:
    spec = tmp_path / "mutant.yaml"
    spec.write_text(yaml.safe_dump(doc, sort_keys=False))
    extra = ["--time-limit", "2"] if jobs.KINDS[doc.get("kind", "training")].no_solver_section is None else []
    capsys.readouterr()
    code = main(["solve", str(spec), *extra])  # a traceback would raise out of main
    return code, capsys.readouterr().err


def _check(tmp_path, capsys, mutant) -> None:
    ident, path, name, doc, word = mutant
    code, err = _solve(tmp_path, capsys, doc)
    assert code in ALLOWED, f"{ident}: exit {code}\n{err}"
    assert "Traceback" not in err, f"{ident}\n{err}"
    if code == 2:  # the mutated field, or the section it sits in ("a smaller model" for rollout.model.vocab)
        names = {word, *(p for p in path if isinstance(p, str))}
        assert any(n in err for n in names), f"{ident}: exit 2 naming none of {sorted(names)}:\n{err}"



def test_the_fast_set_covers_every_example_kind_and_mutation():
    assert len(FAST) >= 45
    assert {m[0].split(":")[0] for m in FAST} == {ex.stem for ex in EXAMPLES}
    kinds = {yaml.safe_load(ex.read_text()).get("kind", "training") for ex in EXAMPLES}
    assert kinds == set(jobs.KINDS)
    assert {"delete", "negative", "zero", "huge", "string", "unknown-name", "emptied", "scalar", "rename"} <= {
        m[2] for m in FAST}


@pytest.mark.parametrize("mutant", FAST, ids=[m[0] for m in FAST])
def test_a_mutated_example_exits_cleanly(tmp_path, capsys, mutant):
    _check(tmp_path, capsys, mutant)


# ---- the defects found by hand (issue 40), each named --------------------------------------------

def _example(name: str) -> dict:
    return yaml.safe_load((ROOT / "examples" / name).read_text())


def test_rollout_heads_above_hidden_is_a_field_error(tmp_path, capsys):
    doc = _cheap(_example("rollout_cpu_tiny.yaml"), "rollout")
    doc["rollout"]["model"]["heads"] = 10**11  # head_dim 0: the KV size was 0 and costs divided by it
    code, err = _solve(tmp_path, capsys, doc)
    assert code == 2 and "rollout.model" in err and "heads" in err and "divide hidden" in err


def test_model_kwargs_the_constructor_refuses_name_model_kwargs(tmp_path, capsys):
    doc = _example("cpu_tiny_gpt2_sources.yaml")
    doc["model"]["kwargs"]["vocab_size"] = -7  # torch: "Trying to create tensor with negative dimension"
    code, err = _solve(tmp_path, capsys, doc)
    assert code == 2 and "model.kwargs" in err and "negative dimension" in err


def test_a_zero_vocabulary_is_a_field_error(tmp_path, capsys):
    doc = _example("cpu_tiny_gpt2_sources.yaml")
    doc["model"]["kwargs"]["vocab_size"] = 0  # token ids were drawn from an empty range
    code, err = _solve(tmp_path, capsys, doc)
    assert code == 2 and "model.kwargs.vocab_size" in err


@pytest.mark.parametrize("field, value", [("steps", 10**12), ("policy.eta", 10**15),
                                          ("workload.prompts_per_step", 10**15), ("repack.batch_cap", 10**15)])
def test_a_rollout_too_big_to_simulate_is_refused_before_simulating(tmp_path, capsys, field, value):
    doc = _example("rollout_cpu_tiny.yaml")
    *parents, leaf = field.split(".")
    node = doc["rollout"]
    for p in parents:
        node = node[p]
    node[leaf] = value
    code, err = _solve(tmp_path, capsys, doc)
    assert code == 2 and f"rollout.{field}" in err


def test_a_rollout_with_huge_worker_groups_is_refused(tmp_path, capsys):
    doc = _example("rollout_cpu_tiny.yaml")
    doc["cluster"]["groups"][1]["count"] = 10**15  # one event-loop worker each: it never finished
    code, err = _solve(tmp_path, capsys, doc)
    assert code == 2 and "cluster.groups.1.count" in err


def test_a_training_batch_no_memory_holds_is_infeasible(tmp_path, capsys):
    doc = _example("cpu_tiny.yaml")
    doc["training"]["global_batch"] = 10**15  # the backend failed ('Empty'): exit 1, "raise time_limit_s"
    code, err = _solve(tmp_path, capsys, doc)
    assert code == 3 and "memory" in err


# ---- wrong files wherever a command takes a path -------------------------------------------------

@pytest.fixture(scope="module")
def files(tmp_path_factory):
    d = tmp_path_factory.mktemp("files")
    (d / "binary.yaml").write_bytes(bytes(range(256)) * 4)
    (d / "binary.json").write_bytes(bytes(range(256)) * 4)
    (d / "folder.json").mkdir()
    plans = {
        "training": {"format_version": 1, "job": "j", "groups": {}, "fingerprint": "f", "iteration_ms": 1.0},
        "rollout": {"version": 1, "name": "n", "recommended": "sync", "policies": [], "spec_policy": "sync"},
        "serving": {"version": 1, "kind": "serving", "stages": [], "spec_digest": "d", "prediction": {}},
    }
    for kind, plan in plans.items():
        (d / f"{kind}_plan.json").write_text(json.dumps(plan))
    return d


SPEC = str(ROOT / "examples" / "cpu_tiny.yaml")
WRONG = {"directory": ("examples", "is a directory"), "folder.json": ("{d}/folder.json", "is a directory"),
         "binary": ("{d}/binary.yaml", "binary"), "binary.json": ("{d}/binary.json", "binary"),
         "training plan": ("{d}/training_plan.json", "training plan"),
         "rollout plan": ("{d}/rollout_plan.json", "rollout plan"),
         "serving plan": ("{d}/serving_plan.json", "serving plan"),
         "missing": ("examples/cpu_tiny", "does not exist")}
COMMANDS = {
    "solve SPEC": lambda x, d: ["solve", x],
    "solve --problem": lambda x, d: ["solve", "--problem", x],
    "train SPEC": lambda x, d: ["train", x, "--plan", f"{d}/training_plan.json"],
    "train --plan": lambda x, d: ["train", SPEC, "--plan", x],
    "predict SPEC": lambda x, d: ["predict", x, "--plan", f"{d}/training_plan.json"],
    "predict --plan": lambda x, d: ["predict", SPEC, "--plan", x],
    "run SPEC": lambda x, d: ["run", x, "-o", f"{d}/out"],
    "profile SPEC": lambda x, d: ["profile", x, "-o", f"{d}/profile.json"],
    "indicate SPEC": lambda x, d: ["indicate", x],
}


@pytest.mark.parametrize("what", WRONG)
@pytest.mark.parametrize("command", COMMANDS)
def test_a_wrong_file_is_named_wherever_a_path_is_taken(files, capsys, monkeypatch, command, what):
    given, says = WRONG[what]
    if command.endswith("--plan") and what == "training plan":
        pytest.skip("a training plan is what --plan takes")
    if command == "solve --problem" and what == "missing":
        says = "does not exist"
    monkeypatch.chdir(ROOT)
    x = given.format(d=files)
    capsys.readouterr()
    code = main(COMMANDS[command](x, files))
    err = capsys.readouterr().err
    assert code == 2, err
    assert x in err and says in err, err
    assert not (files / "out").exists()


def test_a_spec_given_as_plan_says_so(capsys):
    assert main(["predict", SPEC, "--plan", SPEC]) == 2
    assert "is a job spec, not a plan" in capsys.readouterr().err


# ---- the message blames what is wrong -----------------------------------------------------------

def test_a_flag_is_blamed_for_its_own_value_not_the_spec_line(capsys):
    assert main(["solve", SPEC, "--backend", "gurobi"]) == 2
    err = capsys.readouterr().err
    assert "--backend gurobi" in err and "unknown backend 'gurobi'" in err
    assert "line" not in err  # the spec's `backend: default` line is not at fault


def test_a_library_override_is_blamed_by_its_key():
    from qsync_opt import jobs
    from qsync_opt.errors import SpecError

    with pytest.raises(SpecError) as e:
        jobs.solve(SPEC, backend="gurobi")
    assert "backend='gurobi'" in str(e.value) and "line" not in str(e.value)


def test_a_solver_flag_on_a_rollout_spec_points_at_rollout_solver(capsys):
    assert main(["solve", str(ROOT / "examples" / "rollout_cpu_tiny.yaml"), "--backend", "cbc"]) == 2
    err = capsys.readouterr().err
    assert "--backend cbc" in err and "rollout.solver" in err and "unknown field" not in err


def test_yaml_text_stays_a_spec_and_a_bare_word_is_a_missing_file():
    from qsync_opt.errors import SpecError
    from qsync_opt.jobs import load_spec

    assert load_spec(Path(SPEC).read_text()).name == "cpu-tiny"
    with pytest.raises(SpecError, match="does not exist; did you mean"):
        load_spec(str(ROOT / "examples" / "cpu_tiny"))
