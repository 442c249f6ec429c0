"""The compact backbone change (ours): int8 factors and sign-coded token rows, and what decoding refuses."""

from __future__ import annotations

import pytest
import torch

from condsearch.model.csr.compact_delta import (
    decode,
    encode_factors,
    encode_sign_rows,
    factor_bytes,
    sign_rows_bytes,
)


def _low_rank(out: int, inner: int, rank: int, seed: int = 0) -> torch.Tensor:
    g = torch.Generator().manual_seed(seed)
    return torch.randn(out, rank, generator=g) @ torch.randn(rank, inner, generator=g) * 1e-3


def test_int8_factors_hold_a_low_rank_change_to_within_rounding() -> None:
    delta = _low_rank(48, 20, rank=3)
    state = encode_factors("w", delta, rank=3)
    assert state["w.qdelta_b"].dtype == state["w.qdelta_a"].dtype == torch.int8
    assert state["w.qdelta_b_scale"].shape == state["w.qdelta_a_scale"].shape == (3,)
    assert sum(t.numel() * t.element_size() for t in state.values()) == factor_bytes((48, 20), 3)
    back = decode(state, {"w": (48, 20)})
    assert set(back) == {"w.delta_b", "w.delta_a"}
    product = back["w.delta_b"] @ back["w.delta_a"]
    assert torch.linalg.norm(product - delta) <= 0.01 * torch.linalg.norm(delta)


def test_components_the_change_lacks_are_stored_as_zeros() -> None:
    delta = _low_rank(12, 8, rank=1)  # rank 1, asked for 3: the last two components are (nearly) zero
    back = decode(encode_factors("w", delta, rank=3), {"w": (12, 8)})
    product = back["w.delta_b"] @ back["w.delta_a"]
    assert torch.isfinite(product).all()
    assert torch.linalg.norm(product - delta) <= 0.01 * torch.linalg.norm(delta)


def test_a_rank_above_the_matrix_is_cut_to_it() -> None:
    state = encode_factors("w", _low_rank(6, 4, rank=4), rank=50)
    assert state["w.qdelta_b"].shape == (6, 4) and state["w.qdelta_a"].shape == (4, 4)


def test_sign_rows_keep_each_changed_row_as_signs_times_its_mean_magnitude() -> None:
    delta = torch.zeros(10, 13)  # 13 columns: the packed bits do not fill their last byte
    g = torch.Generator().manual_seed(1)
    delta[[2, 7]] = torch.randn(2, 13, generator=g)
    state = encode_sign_rows("table", delta)
    assert state["table.sdelta_rows"].tolist() == [2, 7]
    assert state["table.sdelta_signs"].shape == (2, 2)
    assert sum(t.numel() * t.element_size() for t in state.values()) == sign_rows_bytes(2, 13)
    back = decode(state, {"table": (10, 13)})["table.delta"]
    expected = delta.sign() * delta.abs().mean(dim=1, keepdim=True)
    torch.testing.assert_close(back, expected, atol=1e-3, rtol=1e-3)
    assert not back[[0, 1, 3, 4, 5, 6, 8, 9]].any()


def test_tensors_already_in_float_form_pass_through() -> None:
    state = {"bias.delta": torch.ones(3), **encode_factors("w", _low_rank(5, 4, rank=2), rank=2)}
    back = decode(state, {"w": (5, 4), "bias": (3,)})
    assert back["bias.delta"] is state["bias.delta"] and {"w.delta_b", "w.delta_a"} <= set(back)


@pytest.mark.parametrize(
    ("spoil", "message"),
    [
        (lambda s: s.pop("w.qdelta_a_scale"), "w.qdelta_a_scale is missing"),
        (lambda s: s.pop("w.qdelta_b"), "its other parts are missing"),
        (lambda s: s.update({"w.qdelta_b_scale": torch.ones(5, dtype=torch.float16)}), "do not fit together"),
        (lambda s: s.update({"t.sdelta_rows": torch.tensor([0, 9], dtype=torch.int32)}), "out of range"),
        (lambda s: s.update({"t.sdelta_scale": torch.ones(3, dtype=torch.float16)}), "do not fit together"),
    ],
    ids=["scale-missing", "factor-missing", "scale-shape", "row-out-of-range", "row-scale-shape"],
)
def test_damaged_parts_are_refused_in_one_line(spoil, message: str) -> None:
    table = torch.zeros(4, 8)
    table[[0, 3]] = 1.0
    state = {**encode_factors("w", _low_rank(5, 4, rank=2), rank=2), **encode_sign_rows("t", table)}
    spoil(state)
    with pytest.raises(ValueError, match=message):
        decode(state, {"w": (5, 4), "t": (4, 8)})


def test_sign_rows_of_a_tensor_the_model_lacks_are_refused() -> None:
    state = encode_sign_rows("t", torch.ones(2, 8))
    with pytest.raises(ValueError, match="unexpected 't'"):
        decode(state, {})
