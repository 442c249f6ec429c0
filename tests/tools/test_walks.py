"""tools/walks.py (issue 60): a traced walk reports its rooms, transitions and climbs; `pairs` climbs no layer."""

from __future__ import annotations

import json
from pathlib import Path

from tools import import_graph, walks


def test_the_pairs_walk_is_counted_and_climbs_no_layer(tmp_path: Path, capsys) -> None:
    out = tmp_path / "walks.json"
    assert walks.main(["--walk", "pairs", "--work", str(tmp_path / "work"), "--json-out", str(out)]) == 0
    (walk,) = json.loads(out.read_text(encoding="utf-8"))
    assert walk["name"] == "pairs"
    counts = walk["counts"]
    assert set(counts) == {
        "rooms",
        "rooms_above_base",
        "units",
        "units_above_base",
        "climbs",
        "crossings",
        "crossings_back",
    }
    assert all(isinstance(n, int) and n >= 0 for n in counts.values())
    assert counts["rooms"] == len(walk["rooms"]) > counts["rooms_above_base"] > 0
    assert {"cli", "train"} <= set(walk["rooms"])  # the front end, and the job it calls
    for unit in walk["units"]:
        import_graph.layer_of(unit)  # every unit is a package some layer names
    # a room is the top-level package of the units entered (model for model.encoders)
    assert walk["rooms"] == list(dict.fromkeys(import_graph.folder_of(u) for u in walk["units"]))
    assert counts["units_above_base"] >= counts["rooms_above_base"]
    for transition in walk["transitions"]:
        a, b = transition.split("→")
        assert a != b and {a, b} <= set(walk["units"]) | {"condsearch"}
    assert walk["sites"] and all(" → condsearch." in s for s in walk["sites"])
    assert counts["climbs"] == 0 and walk["climbs"] == []  # pairs calls only down the layers
    assert counts["crossings"] == counts["crossings_back"] == 0
    table = capsys.readouterr().out
    assert table.startswith("| walk | rooms |") and "\n| pairs | " in table
