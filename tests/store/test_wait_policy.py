"""The CLI's torch threads sleep while they wait instead of spinning (issue 58, item 12).

`index` of 20,000 rows under continuous one-shot readers on a busy 2-core machine did not finish in
600 s. Readers take no lock (only writers of one index do); what they took was the CPU, and torch's
OpenMP threads, spinning at every barrier by default, then waited for a thread that their spinning
kept off its core: 1,000 rows took 76 s spinning and 21-25 s passive beside other work
(benchmarks/systems/hostile.md). The CLI sets ``OMP_WAIT_POLICY=PASSIVE`` before torch loads, unless the
environment names a policy.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

PROBE = """
import json, os, sys
{before}
from condsearch.cli import main
try:
    main(["list", "--index-dir", sys.argv[1]])
except SystemExit:
    pass
print(json.dumps([os.environ.get("OMP_WAIT_POLICY"), "torch" in sys.modules]))
"""


def _policy(tmp_path: Path, *, environment: str | None = None, before: str = "") -> list[object]:
    env = {k: v for k, v in os.environ.items() if k != "OMP_WAIT_POLICY"}
    if environment is not None:
        env["OMP_WAIT_POLICY"] = environment
    code = PROBE.format(before=before)
    done = subprocess.run(
        [sys.executable, "-c", code, str(tmp_path)], capture_output=True, text=True, env=env, timeout=120
    )
    assert done.returncode == 0, done.stderr
    return json.loads(done.stdout.splitlines()[-1])


def test_the_cli_makes_torchs_threads_wait_passively_before_torch_loads(tmp_path: Path) -> None:
    assert _policy(tmp_path) == ["PASSIVE", False]


def test_a_policy_the_environment_names_is_kept(tmp_path: Path) -> None:
    assert _policy(tmp_path, environment="ACTIVE") == ["ACTIVE", False]


def test_nothing_is_set_once_torch_is_loaded_when_it_would_no_longer_be_read(tmp_path: Path) -> None:
    assert _policy(tmp_path, before="import torch") == [None, True]


def test_the_writer_under_readers_benchmark_runs_in_smoke_mode(tiny_bert_dir: Path, tmp_path: Path) -> None:
    from benchmarks.systems import writer_readers

    out = tmp_path / "writer_readers.json"
    argv = ["--smoke", "--model", str(tiny_bert_dir), "--router", "none", "--work-dir", str(tmp_path / "w")]
    assert writer_readers.main([*argv, "--json-out", str(out)]) == 0
    result = json.loads(out.read_text())
    assert [(r["wait_policy"], r["readers"], r["ok"]) for r in result["runs"]] == [
        ("default", 0, True),
        ("default", 1, True),
    ]
    assert all(r["seconds"] > 0 and r["cpu_s"] > 0 for r in result["runs"])
