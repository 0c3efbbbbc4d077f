"""The Python API example fine-tunes, compares and exports the tiny model in-process (no Ray)."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

pytestmark = pytest.mark.integration

SCRIPT = Path(__file__).resolve().parents[2] / "examples" / "python_api" / "finetune_eval_export.py"


def test_python_api_example_trains_compares_and_exports(tmp_path: Path) -> None:
    env = {**os.environ, "RAY_ADDRESS": ""}  # num_workers=0 needs no Ray; never join the test session's
    proc = subprocess.run(
        [sys.executable, str(SCRIPT), "--size", "tiny", "--out", str(tmp_path)],
        check=False,
        capture_output=True,
        text=True,
        timeout=180,
        env=env,
    )
    assert proc.returncode == 0, proc.stderr[-3000:]
    assert "trained 3 steps" in proc.stdout

    final = tmp_path / "run" / "final"
    assert (final / "rayft_checkpoint.json").is_file()
    compare = json.loads((tmp_path / "run" / "compare" / "compare.json").read_text())
    assert "base" in json.dumps(compare) and "tuned" in json.dumps(compare)

    from transformers import AutoModelForCausalLM, AutoTokenizer

    export = tmp_path / "export"
    model = AutoModelForCausalLM.from_pretrained(export)
    tokenizer = AutoTokenizer.from_pretrained(export)
    assert model.config.vocab_size == len(tokenizer)
    assert f"exported (merged): {export}" in proc.stdout
