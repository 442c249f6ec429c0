"""A router.json's recorded shape facts are checked against the weights themselves (issue 58, item 11a).

The sha256 record ties router.safetensors to router.json, but not router.json's other fields: a
recorded rank that differs from the float16 factors the shipped router holds must not load.
"""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import pytest
from safetensors.torch import load_file

from condsearch.base.artifact_files import DEFAULT_ROUTER_DIR, ROUTER_CONFIG, ROUTER_WEIGHTS
from condsearch.errors import ModelError
from condsearch.model.artifacts.router_delta import check_delta_record
from condsearch.model.artifacts.routers import read_router_config


def _shipped() -> tuple[dict[str, object], dict[str, object]]:
    return read_router_config(DEFAULT_ROUTER_DIR), load_file(str(DEFAULT_ROUTER_DIR / ROUTER_WEIGHTS))


def test_the_shipped_router_holds_float16_factors_at_its_recorded_rank() -> None:
    meta, state = _shipped()
    rank = meta["backbone_delta"]["rank"]  # type: ignore[index]
    factors = [t for k, t in state.items() if k.endswith(".delta_b")]
    assert factors and all(t.shape[1] == rank for t in factors)  # type: ignore[union-attr]
    check_delta_record(meta, state, DEFAULT_ROUTER_DIR)


@pytest.mark.parametrize("rank", [66, 68, 1])
def test_a_recorded_rank_other_than_the_float_factors_is_refused(rank: int) -> None:
    meta, state = _shipped()
    meta["backbone_delta"] = {**meta["backbone_delta"], "rank": rank}  # type: ignore[dict-item]
    with pytest.raises(ModelError, match=f"rank {rank}") as exc:
        check_delta_record(meta, state, DEFAULT_ROUTER_DIR)
    assert "\n" not in str(exc.value)


def test_float_factors_where_no_rank_is_recorded_are_refused() -> None:
    meta, state = _shipped()
    meta["backbone_delta"] = {**meta["backbone_delta"], "rank": None}  # type: ignore[dict-item]
    with pytest.raises(ModelError, match="rank"):
        check_delta_record(meta, state, DEFAULT_ROUTER_DIR)


def test_a_decoded_router_may_hold_float_factors_without_a_rank() -> None:
    meta, state = _shipped()  # benchmarks/studies/wise.py writes its factors decoded, with no rank
    meta["backbone_delta"] = {**meta["backbone_delta"], "rank": None, "encoding": "decoded"}  # type: ignore[dict-item]
    check_delta_record(meta, state, DEFAULT_ROUTER_DIR)


def test_the_default_router_with_another_recorded_rank_does_not_load(tmp_path: Path) -> None:
    from condsearch.model.csr import load_csr_encoder

    folder = tmp_path / "router"
    shutil.copytree(DEFAULT_ROUTER_DIR, folder)
    meta = json.loads((folder / ROUTER_CONFIG).read_text())
    meta["backbone_delta"]["rank"] = 64  # the weights' sha256 record still matches: only the rank is wrong
    (folder / ROUTER_CONFIG).write_text(json.dumps(meta))
    with pytest.raises(ModelError, match="rank 64") as exc:
        load_csr_encoder(router=str(folder), device="cpu", cache_dir=tmp_path / "cache")
    assert "\n" not in str(exc.value)


def test_the_torch_free_check_reads_the_shapes_from_the_header(tmp_path: Path) -> None:
    from condsearch.model.artifacts.router_delta import weights_shapes
    from condsearch.model.artifacts.routers import checked_router_checksum

    meta, state = _shipped()
    shapes = weights_shapes(DEFAULT_ROUTER_DIR / ROUTER_WEIGHTS)
    assert {k: (tuple(t.shape), t.nbytes) for k, t in state.items()} == {
        k: (s.shape, s.nbytes) for k, s in shapes.items()
    }
    folder = tmp_path / "router"
    shutil.copytree(DEFAULT_ROUTER_DIR, folder)
    meta["backbone_delta"] = {**meta["backbone_delta"], "rank": 66}  # type: ignore[dict-item]
    (folder / ROUTER_CONFIG).write_text(json.dumps(meta))
    # what the one-shot (onnxruntime) query checks before it answers: the same refusal as torch's loader
    with pytest.raises(ModelError, match="rank 66"):
        checked_router_checksum(folder)
