"""The CLI starts without torch where the command does not need it: help, the device catalog, the spec reference,
and planning a serving, rollout or loading spec."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
PROBE = ("import sys\nfrom qsync_opt.cli.commands import main\n"
         "try:\n    rc = main(sys.argv[1:])\nexcept SystemExit as e:\n    rc = e.code\n"
         "print('RESULT', rc, 'torch' in sys.modules, file=sys.stderr)\n")


@pytest.mark.parametrize("argv", [["--help"], ["devices"], ["spec", "--kind", "rollout"],
                                  ["solve", "examples/rollout_cpu_tiny.yaml"],
                                  ["solve", "examples/serving_opt30b_t4_v100.yaml"],
                                  ["solve", "examples/loading_cpu_mix.yaml"]])
def test_commands_that_need_no_tensor_do_not_import_torch(argv, tmp_path):
    argv = [str(ROOT / a) if a.startswith("examples/") else a for a in argv]
    if argv[0] == "solve":
        argv += ["-o", str(tmp_path / "plan.json")]
    r = subprocess.run([sys.executable, "-c", PROBE, *argv], capture_output=True, text=True, cwd=tmp_path,
                       timeout=300)
    assert "RESULT 0 False" in r.stderr, r.stderr[-2000:]
