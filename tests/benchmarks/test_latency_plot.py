"""benchmarks/paper/latency.py --plot: a plot that is asked for is made, or the run is refused up front."""

from __future__ import annotations

import sys
from pathlib import Path

import pytest

from tests.benchmarks.test_benchmarks import load_script


def test_plot_without_matplotlib_exits_2_before_measuring(
    monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str], tmp_path: Path
) -> None:
    latency = load_script("latency")
    monkeypatch.setitem(sys.modules, "matplotlib", None)  # makes `import matplotlib` raise ImportError
    monkeypatch.setattr(latency, "run", lambda *a: pytest.fail("measured before refusing the missing plotter"))
    with pytest.raises(SystemExit) as info:
        latency.main(["--smoke", "--plot", str(tmp_path / "p.png")])
    assert info.value.code == 2
    err = capsys.readouterr().err.strip()
    assert "matplotlib" in err and "\n" not in err
    assert not (tmp_path / "p.png").exists()
