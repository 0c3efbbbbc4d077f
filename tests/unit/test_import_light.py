"""`import rayft` and `rayft --help` must not import torch or ray (they cost seconds)."""

from __future__ import annotations

import subprocess
import sys

CHECK = (
    "import sys, runpy\n"
    "sys.argv = ['rayft', '--help']\n"
    "try:\n"
    "    runpy.run_module('rayft', run_name='__main__')\n"
    "except SystemExit:\n"
    "    pass\n"
    "heavy = sorted(m for m in ('torch', 'ray', 'transformers', 'peft', 'datasets') if m in sys.modules)\n"
    "print('HEAVY=' + ','.join(heavy))\n"
)


def test_import_and_help_stay_light() -> None:
    out = subprocess.run([sys.executable, "-c", CHECK], capture_output=True, text=True, check=True)
    assert "Usage: rayft" in out.stdout
    assert "HEAVY=\n" in out.stdout, out.stdout
