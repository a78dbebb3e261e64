"""qsync_opt.lazy: a package's names are imported on first use, then kept; an unknown name is an AttributeError."""

from __future__ import annotations

import subprocess
import sys


def test_a_name_is_imported_on_first_use_and_kept():
    code = ("import sys, qsync_opt.runtime as r\n"
            "assert 'qsync_opt.runtime.apply' not in sys.modules and 'apply_plan' not in vars(r)\n"
            "assert 'apply_plan' in dir(r)\n"
            "f = r.apply_plan\n"
            "from qsync_opt.runtime.apply import apply_plan\n"
            "assert f is apply_plan and vars(r)['apply_plan'] is apply_plan\n"
            "try:\n    r.nosuch\nexcept AttributeError as e:\n    assert 'nosuch' in str(e) and 'qsync_opt.runtime' in str(e)\n"
            "else:\n    raise SystemExit('no AttributeError')\n"
            "print('ok')")
    r = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120)
    assert r.returncode == 0 and r.stdout.strip() == "ok", r.stderr[-2000:]


def test_the_trace_name_stays_the_function_after_its_module_is_imported():
    code = ("import qsync_opt.models.tracing\nfrom qsync_opt.models import trace\n"
            "assert callable(trace) and trace is qsync_opt.models.tracing.trace\nprint('ok')")
    r = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120)
    assert r.returncode == 0 and r.stdout.strip() == "ok", r.stderr[-2000:]
