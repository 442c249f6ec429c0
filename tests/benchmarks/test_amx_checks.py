"""benchmarks/systems/amx_checks.sh, issue 42's prepared script for an AMX host: its plumbing, in --smoke sizes."""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
STEPS = ("serve_100k_amx", "serve_100k_csr_amx", "encode_paths_amx_one", "csr_paths_amx")


@pytest.mark.slow
@pytest.mark.skipif(shutil.which("taskset") is None, reason="taskset (util-linux) is not installed")
def test_each_step_runs_pinned_and_writes_its_json(tmp_path: Path) -> None:
    env = {**os.environ, "QUICK": "1", "PY": sys.executable, "CORES": "0"}
    script = ROOT / "benchmarks" / "systems" / "amx_checks.sh"
    done = subprocess.run(
        [str(script), "unused", str(tmp_path)], cwd=ROOT, env=env, capture_output=True, text=True, timeout=600
    )
    assert done.returncode == 0, done.stderr
    for step in STEPS:
        assert f"[amx] {step} rc=0" in done.stdout, (done.stdout, (tmp_path / f"{step}.log").read_text())
        assert (tmp_path / f"{step}.json").stat().st_size > 0
