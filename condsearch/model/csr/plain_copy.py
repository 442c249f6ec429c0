"""The context router's bfloat16 passes without transformers: its plain torch copy, cached beside its export.

On a CPU kind whose router path is torch bfloat16 (AMX: :data:`condsearch.base.cpu_kind.PATHS`), an index is
built with :class:`~condsearch.model.csr.bfloat16.Bfloat16Router`, the router's own transformers layers under
autocast, and a re-index of a few changed rows must run the same path. Loading it cost more than the rows:
importing transformers alone took about 3.6 s of a 10 s re-index (issue 61). The copy is the backbone's
weights as :class:`~condsearch.model.encoders.onnx.trace.PlainBert` names them (``backbone.safetensors``,
float32) and the tokenizer, in a folder of the export cache named like the router's exports
(:meth:`~condsearch.model.csr.keys.RouterIdentity.export_folder`, kind
:data:`~condsearch.model.csr.keys.PLAIN_KIND`). Its passes are the modules the ONNX export traces
(:class:`~condsearch.model.csr.onnx.LowerPass`, :class:`~condsearch.model.csr.onnx.ContextRoute`) under
the same autocast. It is written where a bulk build routes in bfloat16 and checked there against
the router it copies: its probe vectors must agree within float32 rounding, or it is refused (and the
refusal cached). A re-index then loads it through :func:`condsearch.model.csr.one_shot.load_one_shot_router`,
so it imports torch but not transformers.
"""

from __future__ import annotations

import logging
from collections.abc import Mapping
from pathlib import Path
from typing import TYPE_CHECKING, Any

import numpy as np
import torch

from condsearch.errors import CondsearchError, first_line
from condsearch.model.csr.context import ContextCode, ContextRouter
from condsearch.model.csr.keys import PLAIN_FILE, PLAIN_FILES, PLAIN_KIND
from condsearch.model.csr.onnx import ContextRoute, LowerPass, routed_pairs
from condsearch.model.csr.router import SentenceStates
from condsearch.model.encoders.onnx.cache import checked_meta, read_meta
from condsearch.model.encoders.onnx.export import disagreement, write_checked, write_meta
from condsearch.model.encoders.onnx.trace import CONFIG_KEYS, PlainBert, plain_bert

if TYPE_CHECKING:
    from condsearch.model.csr.encoder import CsrEncoder

log = logging.getLogger(__name__)


class PlainRouter:
    """A context router's two passes on PlainBert's modules under bfloat16 autocast, as the torch router runs them."""

    precision = "bfloat16"

    def __init__(self, plain: PlainBert, layer: int, routed: list[int]) -> None:
        self.hidden = int(plain.config.hidden_size)
        self.k = len(routed)
        self.lower = LowerPass(plain, layer, keys=False)
        self.routed = ContextRoute(plain, routed)

    def sentence_states(self, inputs: Mapping[str, torch.Tensor]) -> SentenceStates:
        """Run the lower layers on a tokenized batch of sentences; the states come back in float32."""
        ids, mask = inputs["input_ids"], inputs["attention_mask"]
        types = inputs.get("token_type_ids")
        with torch.autocast("cpu", dtype=torch.bfloat16):
            x = self.lower(ids, mask, types if types is not None else torch.zeros_like(ids))
        return SentenceStates(x.float(), None, None, mask.bool())

    def route(self, states: SentenceStates, code: ContextCode) -> torch.Tensor:
        """Finish each sentence's forward pass under its condition: (b, hidden) float32."""
        with torch.autocast("cpu", dtype=torch.bfloat16):
            out = self.routed(states.x, states.mask.long(), code.h, code.mask.long())
        return out.float()


class PlainSessions:
    """A :class:`PlainRouter` on numpy arrays, as :class:`~condsearch.model.csr.onnx_run.RouterSessions` runs an export.

    Each batch runs whole, padded to its longest row, as the torch bulk path runs it.
    """

    backend = "torch"
    precision = "bfloat16"

    def __init__(self, router: PlainRouter) -> None:
        self.router = router
        self.runtime = f"torch {torch.__version__}"

    def hidden_size(self) -> int:
        return self.router.hidden

    def fits(self, code: Mapping[str, np.ndarray]) -> bool:
        """Return whether a context code (h: (1, k, length, hidden)) fits this router."""
        h = code.get("h")
        return h is not None and h.ndim == 4 and (h.shape[1], h.shape[3]) == (self.router.k, self.router.hidden)

    @torch.inference_mode()
    def sentence_states(self, feeds: Mapping[str, np.ndarray]) -> list[np.ndarray]:
        """Return the lower layers' states x, (b, L, hidden) float32, of a right-padded tokenized batch."""
        states = self.router.sentence_states({name: torch.from_numpy(a) for name, a in feeds.items()})
        return [states.x.numpy()]

    @torch.inference_mode()
    def route(self, states: Mapping[str, np.ndarray], mask: np.ndarray, code: Mapping[str, np.ndarray]) -> np.ndarray:
        """Finish padded states x under a code (h, condition_mask): (b, hidden) float32, pooled."""
        real = torch.from_numpy(mask).bool()
        cached = SentenceStates(torch.from_numpy(states["x"]), None, None, real)
        condition = ContextCode(torch.from_numpy(code["h"]), torch.from_numpy(code["condition_mask"]).bool())
        return self.router.route(cached, condition).numpy()


def read_plain_sessions(folder: Path, meta: Mapping[str, Any], threads: int | None = None) -> PlainSessions | None:
    """Return the passes of a plain copy whose files were checked, or None where its meta file does not describe one."""
    from safetensors.torch import load_file

    config, layer, routed = meta.get("plain_config"), meta.get("layer"), meta.get("routed")
    if meta.get("kind") != PLAIN_KIND or not isinstance(config, dict) or not isinstance(layer, int):
        return None
    if not isinstance(routed, list) or set(config) != set(CONFIG_KEYS):
        return None
    if threads:
        torch.set_num_threads(threads)
    try:
        plain = PlainBert(config).load(load_file(folder / PLAIN_FILE))
        router = PlainRouter(plain, layer, [int(j) for j in routed])
    except (RuntimeError, TypeError, ValueError, IndexError, OSError) as exc:  # not what PlainBert computes
        log.info("the router's plain copy in %s cannot be read (%s)", folder, first_line(exc))
        return None
    return PlainSessions(router)


def _write(encoder: CsrEncoder, router: ContextRouter, plain: PlainBert, folder: Path, cache_name: str | None) -> None:
    from safetensors.torch import save_file

    save_file({name: t.contiguous() for name, t in plain.state_dict().items()}, str(folder / PLAIN_FILE))
    fields = {
        "kind": PLAIN_KIND,
        "variant": router.config.variant,
        "layer": router.layer,
        "routed": list(router.routed),
        "plain_config": {k: getattr(plain.config, k) for k in CONFIG_KEYS},
    }
    write_meta(folder, encoder.tokenizer, "float32", cache_name, PLAIN_FILES, **fields)


def _read_back(folder: Path) -> PlainRouter | None:
    sessions = read_plain_sessions(folder, read_meta(folder) or {})
    return sessions.router if sessions is not None else None


def plain_copy_folder(encoder: CsrEncoder) -> Path | None:
    """Return where an encoder's router's plain copy is cached, or None (an untrained router, revision 'main')."""
    if not encoder.router_checksum:  # an untrained router or one trained in memory: no index finds it again
        return None
    return encoder.identity.export_folder(encoder.cache_root, "float32", kind=PLAIN_KIND)


def cache_plain_copy(encoder: CsrEncoder) -> None:
    """Write and check the plain copy of an encoder's context router where none is cached; a failure is a warning.

    Called where a bulk build routes in bfloat16 (:func:`condsearch.model.policy.load_bulk_vectorizer`), so
    that a re-index of the index it builds runs the same passes without transformers.
    """
    from condsearch.model.csr.bfloat16 import Bfloat16Router

    router = encoder.router
    if not isinstance(router, ContextRouter) or encoder.device.type != "cpu":
        return
    folder = plain_copy_folder(encoder)
    if folder is None or checked_meta(folder, PLAIN_FILES, PLAIN_KIND) is not None:  # cached, or refused before
        return
    plain = plain_bert(router.model)
    if plain is None:
        return
    reference = Bfloat16Router(router)
    try:
        _, refused = write_checked(
            folder,
            write=lambda tmp, cache_name: _write(encoder, router, plain, tmp, cache_name),
            read=_read_back,
            check=lambda copy: disagreement(
                router.model,
                lambda: routed_pairs(reference, encoder)[0],
                lambda: routed_pairs(copy, encoder)[0],
                "float32",
            ),
            graphs=(PLAIN_FILE,),
            what="the router's plain copy",
            model_id=encoder.model_id,
        )
    except (CondsearchError, OSError) as exc:
        log.warning("a re-index of this index will load transformers: %s", first_line(exc))
        return
    if refused is not None:
        log.warning("a re-index of this index will load transformers: the router's plain copy differs (%s)", refused)
