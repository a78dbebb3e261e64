"""`qsync-opt profile`'s parent imports no torch: its measuring processes start as soon as the spec is read, and
it merges and writes their profiles with JSON alone. What it skips asking torch (is there a GPU, which torch) it
answers as torch would."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from qsync_opt.hardware.machine import cuda_possible

ROOT = Path(__file__).resolve().parents[3]

#: `qsync-opt profile` with the measuring processes replaced by what they leave behind (a part section per
#: profiling group, the collectives' results), so that only the parent runs.
PROBE = """
import sys
from qsync_opt.training.predictor import profile_run
from qsync_opt.training.predictor.collective_results import Collectives
from qsync_opt.training.predictor.profile import Profile, Section, load_profile

def fake_run_colocated(spec, jobs, path, progress, key_of, *, allreduce=False, ddp=False):
    prof = load_profile(path) if path.exists() else Profile.new()
    for g, profiles in jobs:
        if profiles:
            prof.sections[key_of(g)] = Section(dict(g.env), 1, {"conv2d|probe|fp32": {"fwd_ms": 1.0, "bwd_ms": 2.0}})
    prof.save(path)
    return Collectives({"alpha_ms": 0.1, "beta_ms_per_byte": 1e-6} if allreduce else None, 90.0 if ddp else None)

profile_run.run_colocated = fake_run_colocated
from qsync_opt.cli.commands import main
rc = main(sys.argv[1:])
print("RESULT", rc, "torch" in sys.modules, file=sys.stderr)
"""


def test_the_profile_command_s_parent_runs_without_torch(tmp_path):
    out = tmp_path / "p.json"
    r = subprocess.run([sys.executable, "-c", PROBE, "profile", str(ROOT / "examples/cpu_tiny.yaml"), "-o", str(out),
                        "--quiet"], capture_output=True, text=True, cwd=tmp_path, timeout=300,
                       env={**os.environ, "QSYNC_OPT_PROFILE_DIR": str(tmp_path / "cache")})
    assert "RESULT 0 False" in r.stderr, r.stderr[-2000:]
    saved = json.loads(out.read_text())
    assert set(saved["sections"]) == {"threads=1,ranks=2", "threads=1,ONEDNN_MAX_CPU_ISA=SSE41,ranks=2"}
    assert saved["allreduce"]["gloo/2"] == {"alpha_ms": 0.1, "beta_ms_per_byte": 1e-6}
    assert [v for k, v in saved["allreduce"].items() if k.startswith("ddp/2|")] == [{"fp32_ms": 90.0}]
    assert "fp32 DDP step 90.00 ms" in r.stdout


def test_the_machine_and_versions_read_without_torch_are_torch_s():
    """Where cuda_possible() says no GPU, torch says so too; the torch version recorded without importing torch is
    torch.__version__; and the description is the same before and after torch is imported."""
    probe = ("import json, sys\nfrom qsync_opt.training.predictor.profile import machine_description, library_versions\n"
             "before = machine_description(), library_versions()\nassert 'torch' not in sys.modules\n"
             "import torch\nfrom qsync_opt.hardware.machine import cuda_possible\n"
             "print(json.dumps({'before': before, 'after': [machine_description(), library_versions()],"
             " 'torch': str(torch.__version__), 'possible': cuda_possible(), 'cuda': torch.cuda.is_available()}))")
    r = subprocess.run([sys.executable, "-c", probe], capture_output=True, text=True, timeout=300)
    assert r.returncode == 0, r.stderr[-2000:]
    got = json.loads(r.stdout)
    assert got["before"] == got["after"]
    assert got["before"][1]["torch"] == got["torch"]
    assert got["possible"] or not got["cuda"]
    assert got["before"][0]["kind"] == ("cuda" if got["cuda"] else "cpu")


@pytest.mark.skipif(sys.platform != "linux", reason="elsewhere cuda_possible() always leaves the answer to torch")
def test_cuda_is_possible_exactly_where_a_driver_file_exists(tmp_path):
    present = tmp_path / "nvidiactl"
    present.touch()
    assert cuda_possible((str(present),)) is True
    assert cuda_possible((str(tmp_path / "absent"), str(present))) is True
    assert cuda_possible((str(tmp_path / "absent"),)) is False


def test_an_unknown_group_is_named_with_the_spec_s_groups(tmp_path, capsys):
    from qsync_opt.cli.commands import main

    rc = main(["profile", str(ROOT / "examples/cpu_tiny.yaml"), "--groups", "native,nope", "-o", str(tmp_path / "p.json")])
    assert rc == 2
    assert "profile --groups: 'nope' is not in cluster.groups (native, sse41)" in capsys.readouterr().err
    assert list(tmp_path.iterdir()) == []  # neither the profile nor its lock


def test_groups_whose_device_is_not_here_are_named_with_their_device(tmp_path):
    from qsync_opt.errors import SpecError
    from qsync_opt.training.predictor.profile_run import profile_spec
    from qsync_opt.training.spec import load_spec

    from qsync_opt.training.predictor.measuring import is_local

    spec = load_spec(ROOT / "examples/hybrid_v100_t4_resnet50.yaml")
    if any(is_local(g.device_spec) for g in spec.cluster.groups):
        pytest.skip("a V100 or T4 is this machine's device")
    with pytest.raises(SpecError) as e:
        profile_spec(spec, tmp_path / "p.json", progress=False, log=lambda s: None)
    names = [g.name for g in spec.cluster.groups]
    assert all(n in str(e.value) for n in names) and "cluster.groups[].profile" in str(e.value)
    assert list(tmp_path.iterdir()) == []


def test_a_folder_given_as_the_profile_file_is_named_as_a_folder(tmp_path, capsys):
    from qsync_opt.cli.commands import main

    assert main(["profile", str(ROOT / "examples/cpu_tiny.yaml"), "-o", str(tmp_path), "--quiet"]) == 2
    err = capsys.readouterr().err
    assert f"profile {tmp_path}: a folder, not a profile file; give a file in it, e.g. {tmp_path / 'profile.json'}" in err
    assert "delete" not in err and list(tmp_path.iterdir()) == []
    assert not tmp_path.with_name(tmp_path.name + ".lock").exists()
