"""The router's ONNX export run with onnxruntime and numpy alone: its two passes.

The export is written and checked through torch (:mod:`condsearch.model.csr.onnx`); this module only reads
it, on the ONNX backend's sessions and runs (:mod:`condsearch.model.encoders.onnx.run`), so that a one-shot
query (:mod:`condsearch.model.csr.one_shot`) runs it without importing torch, and
:class:`~condsearch.model.csr.onnx.OnnxRouter` (torch tensors in and out) runs the same code for bulk work.
"""

from __future__ import annotations

from collections.abc import Mapping
from pathlib import Path
from typing import Any

import numpy as np

from condsearch.errors import ModelError
from condsearch.model.csr.keys import KIND, LOWER_FILE, ROUTE_FILE
from condsearch.model.encoders.onnx.cache import Precision
from condsearch.model.encoders.onnx.run import INPUTS, RUN_ROWS, open_export, runs


class RouterSessions:
    """A router export's sentence pass and routed pass on onnxruntime, on numpy arrays.

    A batch runs as runs of :data:`~condsearch.model.encoders.onnx.run.RUN_ROWS` rows of like length, each
    cut to its own longest row (as CASE's export runs), which changes float32 vectors by rounding only
    and int8 ones by their per-run activation scales.
    """

    backend = "onnxruntime"

    def __init__(self, lower: Any, route: Any, meta: Mapping[str, Any]) -> None:
        self.lower, self.route_session = lower, route
        self.precision: Precision = meta["precision"]
        self.variant = str(meta["variant"])
        self.runtime = f"onnxruntime {meta['runtime']['onnxruntime']}"
        self._lower_inputs = [i.name for i in lower.get_inputs()]
        self._route_inputs = {i.name for i in route.get_inputs()}  # the exporter drops unused ones (e, unprojected)
        self.run_rows = RUN_ROWS

    def hidden_size(self) -> int:
        """Return the width of the states the lower pass gives (a one-line ModelError if the graph does not say)."""
        width = self.lower.get_outputs()[0].shape[-1]
        if not isinstance(width, int):
            raise ModelError("the router's ONNX export does not fix its hidden size")
        return width

    def fits(self, code: Mapping[str, np.ndarray]) -> bool:
        """Return whether a code's arrays have the sizes the routed graph fixes (its routed layer count, width)."""
        for given in self.route_session.get_inputs():
            if given.name in code:
                shape = code[given.name].shape
                if len(shape) != len(given.shape) or any(
                    isinstance(want, int) and want != got for want, got in zip(given.shape[1:], shape[1:], strict=True)
                ):
                    return False
        return True

    def sentence_states(self, feeds: Mapping[str, np.ndarray]) -> list[np.ndarray]:
        """Return the lower layers' states of a right-padded tokenized batch: x (and k, c), each (b, L, hidden).

        ``feeds``: input_ids and attention_mask (token_type_ids optional), (b, L) int64.
        """
        mask = feeds["attention_mask"]
        named = {name: feeds[name] for name in INPUTS if name in feeds}
        named.setdefault("token_type_ids", np.zeros_like(mask))
        b, length = mask.shape
        outs: list[np.ndarray] = []
        for run, width in runs(mask.sum(axis=1), self.run_rows):
            got = self.lower.run(None, {name: named[name][run, :width] for name in self._lower_inputs})
            if not outs:
                outs = [np.zeros((b, length, g.shape[-1]), dtype=np.float32) for g in got]
            for full, g in zip(outs, got, strict=True):
                full[run, :width] = g
        return outs

    def route(self, states: Mapping[str, np.ndarray], mask: np.ndarray, code: Mapping[str, np.ndarray]) -> np.ndarray:
        """Finish padded states under condition codes: (b, hidden) float32, pooled (and projected).

        ``states``: x (and k, c), (b, L, hidden) float32; ``mask``: (b, L) int64; ``code``: h and
        condition_mask (context), or q and e (paper/extended), one per sentence or a batch of 1.
        """
        x = states["x"]
        one = next(iter(code.values())).shape[0] == 1
        out = np.empty((x.shape[0], x.shape[-1]), dtype=np.float32)
        for run, width in runs(mask.sum(axis=1), self.run_rows):
            feeds = {name: t[run, :width] for name, t in states.items()}
            feeds["mask"] = mask[run, :width]
            feeds |= code if one else {name: t[run] for name, t in code.items()}
            (out[run],) = self.route_session.run(None, {k: v for k, v in feeds.items() if k in self._route_inputs})
        return out


def read_router_sessions(folder: Path, meta: Mapping[str, Any], threads: int) -> RouterSessions | None:
    """Return the passes of an export whose files were checked, or None if onnxruntime cannot read it."""
    if meta.get("kind") != KIND:
        return None
    return open_export(folder, (LOWER_FILE, ROUTE_FILE), threads, lambda s: RouterSessions(s[0], s[1], meta))
