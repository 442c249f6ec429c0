"""Artifact names, shipped folders, file names and format versions; which artifact a folder holds."""

from __future__ import annotations

import fnmatch
import hashlib
import json
import os
import stat
from collections.abc import Callable
from pathlib import Path

from condsearch.base.regular_files import open_regular_file
from condsearch.errors import CondsearchError, ModelError

ASSETS_DIR = Path(__file__).resolve().parent.parent / "assets"
#: the shipped LoRA adapter + head fine-tuned on C-STS for the default model (profile ``lora``)
LORA_PROFILE_DIR = ASSETS_DIR / "minilm-case-lora"
#: the shipped full fine-tune of the default model, as a rank-64 delta adapter without a head (profile ``full``,
#: the default: see ``condsearch.model.artifacts.profiles.DEFAULT_PROFILE``)
FULL_PROFILE_DIR = ASSETS_DIR / "minilm-case-full-r64"
#: the shipped head trained on the frozen default model (profile ``frozen``)
FROZEN_HEAD_DIR = ASSETS_DIR / "minilm-case-head"
#: the shipped router for the default model (``--router default``)
DEFAULT_ROUTER_DIR = ASSETS_DIR / "minilm-csr-router"

HEAD_FORMAT_VERSION = 1
HEAD_WEIGHTS = "head.safetensors"
HEAD_CONFIG = "head.json"

#: PEFT's own file names (what PEFT, TEI and vLLM load) and condsearch's settings beside them
PEFT_CONFIG = "adapter_config.json"
PEFT_WEIGHTS = "adapter_model.safetensors"
ADAPTER_SIDECAR = "condsearch_adapter.json"
#: format 2: PEFT's files + the sidecar, for LoRA adapters
ADAPTER_FORMAT_VERSION = 2
#: format 1, condsearch's own: adapter.json + adapter.safetensors. ``delta`` adapters (a kind PEFT has not; the
#: shipped ``full`` profile, the default) are written in it, and LoRA adapters were before PEFT's was adopted
NATIVE_ADAPTER_FORMAT_VERSION = 1
NATIVE_ADAPTER_WEIGHTS = "adapter.safetensors"
NATIVE_ADAPTER_CONFIG = "adapter.json"

ROUTER_FORMAT_VERSION = 2
ROUTER_WEIGHTS = "router.safetensors"
#: what ``condsearch adapt`` measured of the router it wrote (held-row precision@10), beside its weights
ADAPT_REPORT = "report.json"
ROUTER_CONFIG = "router.json"
#: a two-tower router (benchmarks/paper/kgc.py) keeps its candidate tower, itself a router folder, here
ROUTER_TAIL = "tail"

CHECKPOINT_FORMAT_VERSION = 1
CHECKPOINT_STATE = "checkpoint.json"
CHECKPOINT_TRAINABLE = "trainable.safetensors"
CHECKPOINT_BEST = "best.safetensors"
CHECKPOINT_OPTIMIZER = "optimizer.safetensors"
CHECKPOINT_EPOCHS = "epoch-*.safetensors"  # each kept epoch's trainable parameters
#: a full fine-tune's model folder: the summary ``train --finetune full`` writes beside the weights
MODEL_SUMMARY = "finetune.json"

#: The file that marks a folder as each kind of artifact, checked in this order: a full model
#: folder and an adapter folder may hold a head beside them, so the head comes last.
ARTIFACT_MARKERS: dict[str, str] = {
    "checkpoint": CHECKPOINT_STATE,
    "router": ROUTER_CONFIG,
    "model": MODEL_SUMMARY,
    "adapter": PEFT_CONFIG,
    "head": HEAD_CONFIG,
}
#: markers of the same kinds in another format: condsearch's own adapter format (``delta`` adapters, older LoRA ones)
_OTHER_MARKERS: dict[str, tuple[str, ...]] = {"adapter": (NATIVE_ADAPTER_CONFIG,)}


_HEAD_FILES = (HEAD_CONFIG, HEAD_WEIGHTS)
#: Every name (a glob) each kind of artifact writes into its folder. A folder is replaced by a new
#: artifact only if it holds nothing else: a file of someone else's beside ours is never deleted.
ARTIFACT_FILES: dict[str, tuple[str, ...]] = {
    "checkpoint": (CHECKPOINT_STATE, CHECKPOINT_TRAINABLE, CHECKPOINT_BEST, CHECKPOINT_OPTIMIZER, CHECKPOINT_EPOCHS),
    "router": (ROUTER_CONFIG, ROUTER_WEIGHTS, ADAPT_REPORT),
    # transformers' save_pretrained (weights, config, the tokenizer's files) + ours
    "model": (
        MODEL_SUMMARY,
        "sentence_bert_config.json",
        "config.json",
        "generation_config.json",
        "model.safetensors",
        "model-*-of-*.safetensors",
        "model.safetensors.index.json",
        "tokenizer.json",
        "tokenizer_config.json",
        "special_tokens_map.json",
        "added_tokens.json",
        "chat_template.jinja",
        "chat_template.json",
        "vocab.txt",
        "vocab.json",
        "merges.txt",
        "spiece.model",
        "sentencepiece.bpe.model",
        "tokenizer.model",
        *_HEAD_FILES,
    ),
    "adapter": (
        PEFT_CONFIG,
        PEFT_WEIGHTS,
        ADAPTER_SIDECAR,
        NATIVE_ADAPTER_CONFIG,
        NATIVE_ADAPTER_WEIGHTS,
        *_HEAD_FILES,
    ),
    "head": _HEAD_FILES,
}
#: folders an artifact may hold, each itself an artifact of the same kind
ARTIFACT_SUBFOLDERS: dict[str, tuple[str, ...]] = {"router": (ROUTER_TAIL,)}
#: the largest config file read to tell whether a folder is ours (ours are a few kB)
_MAX_CONFIG_BYTES = 1 << 20
#: the largest artifact config file loaded (a router.json with a long training history is tens of kB)
_MAX_JSON_BYTES = 16 << 20


class ArtifactFolderError(CondsearchError):
    """A folder that condsearch was asked to write an artifact into holds something that is not its to replace."""


def _is_int(value: object) -> bool:
    return isinstance(value, int) and not isinstance(value, bool)


#: What each of our config files holds, so that a file of the same name written by another tool (PEFT's
#: ``adapter_config.json``, an empty ``head.json``) does not pass for ours. PEFT's config is no proof:
#: our sidecar beside it is.
_OURS: dict[str, Callable[[dict[str, object]], bool]] = {
    HEAD_CONFIG: lambda m: (
        m.get("format_version") == HEAD_FORMAT_VERSION and _is_int(m.get("input_dim")) and _is_int(m.get("dim"))
    ),
    ADAPTER_SIDECAR: lambda m: m.get("format_version") == ADAPTER_FORMAT_VERSION and isinstance(m.get("kind"), str),
    PEFT_CONFIG: lambda m: m.get("peft_type") == "LORA",
    NATIVE_ADAPTER_CONFIG: lambda m: (
        m.get("format_version") == NATIVE_ADAPTER_FORMAT_VERSION and (m.get("kind") in ("lora", "delta") or "rank" in m)
    ),
    ROUTER_CONFIG: lambda m: m.get("format_version") in (1, ROUTER_FORMAT_VERSION) and _is_int(m.get("layer")),
    MODEL_SUMMARY: lambda m: m.get("finetune") == "full" and isinstance(m.get("config"), dict),
    CHECKPOINT_STATE: lambda m: (
        m.get("format_version") == CHECKPOINT_FORMAT_VERSION
        and _is_int(m.get("epoch"))
        and isinstance(m.get("config"), dict)
    ),
}


def artifact_kind(folder: Path | str) -> str | None:
    """Return which kind of artifact folder's marker files name (a key of ARTIFACT_MARKERS), or None.

    This reads file names only: a folder of someone else's with a file of that name passes. Before
    replacing or deleting a folder, use :func:`check_own_artifact`, which reads the content too.
    """
    folder = Path(folder)
    for kind, marker in ARTIFACT_MARKERS.items():
        if any((folder / m).is_file() for m in (marker, *_OTHER_MARKERS.get(kind, ()))):
            return kind
    return None


def _read_config(path: Path) -> dict[str, object] | None:
    """Return a small regular JSON file's object, or None (missing, special, huge, unreadable, not an object).

    Opened without blocking and checked to be a regular file first: a FIFO named ``head.json`` must
    not hang a training run's last step.
    """
    try:
        fd = os.open(path, os.O_RDONLY | os.O_NONBLOCK)
    except OSError:
        return None
    try:
        info = os.fstat(fd)
        if not stat.S_ISREG(info.st_mode) or info.st_size > _MAX_CONFIG_BYTES:
            return None
        with os.fdopen(fd, "rb", closefd=False) as fh:
            meta = json.loads(fh.read(_MAX_CONFIG_BYTES + 1))
    except (OSError, ValueError):
        return None
    finally:
        os.close(fd)
    return meta if isinstance(meta, dict) else None


def _foreign_config(folder: Path, names: set[str]) -> str | None:
    """Return why one of our config file names in folder is not a file condsearch wrote, or None."""
    if PEFT_CONFIG in names and ADAPTER_SIDECAR not in names:
        return f"{PEFT_CONFIG} without condsearch's {ADAPTER_SIDECAR}: another tool's adapter"
    for name in sorted(names & set(_OURS)):
        meta = _read_config(folder / name)
        if meta is None or not _OURS[name](meta):
            return f"{name} is not one condsearch wrote"
    return None


def _foreign_files(kind: str, names: set[str], folder: Path) -> list[str]:
    """Return the entries of folder that an artifact of kind does not write (folders and special files too)."""
    allowed = ARTIFACT_FILES[kind]
    subfolders = ARTIFACT_SUBFOLDERS.get(kind, ())
    foreign = []
    for name in names:
        try:
            mode = (folder / name).lstat().st_mode
        except OSError:
            continue  # gone since the folder was listed
        if name in subfolders and stat.S_ISDIR(mode):
            continue
        if not stat.S_ISREG(mode) or not any(fnmatch.fnmatchcase(name, pattern) for pattern in allowed):
            foreign.append(name)
    return sorted(foreign)


def check_own_artifact(folder: Path | str, kind: str) -> None:
    """Raise ArtifactFolderError unless folder may be replaced by a new artifact of kind.

    That is: folder is missing or empty, or it holds a condsearch artifact of that kind (its
    config files' content says so, not only their names) and no file that such an artifact does
    not write. The message names the folder and the reason; nothing is touched either way.
    """
    if kind not in ARTIFACT_FILES:
        raise ValueError(f"unknown artifact kind {kind!r}")
    folder = Path(os.path.abspath(folder))
    try:
        if not folder.exists():
            return
        if not folder.is_dir():
            raise ArtifactFolderError(f"{folder}: exists and is not a folder; refusing to replace it")
        names = {entry.name for entry in os.scandir(folder)}
    except OSError as exc:
        raise ArtifactFolderError(f"{folder}: cannot read it ({exc.strerror or type(exc).__name__})") from exc
    if not names:
        return
    found = artifact_kind(folder)
    if found is None:
        raise ArtifactFolderError(
            f"{folder}: not empty and not a condsearch artifact; refusing to replace it (name a new folder)"
        )
    reason = _foreign_config(folder, names)
    if reason is not None:
        raise ArtifactFolderError(
            f"{folder}: not a condsearch artifact ({reason}); refusing to replace it (name a new folder)"
        )
    if found != kind:
        article = "an" if kind[0] in "aeiou" else "a"
        raise ArtifactFolderError(f"{folder}: holds a condsearch {found}, not {article} {kind}; refusing to replace it")
    foreign = _foreign_files(kind, names, folder)
    if foreign:
        shown = ", ".join(foreign[:3]) + (f" and {len(foreign) - 3} more" if len(foreign) > 3 else "")
        raise ArtifactFolderError(
            f"{folder}: holds what a condsearch {kind} does not write ({shown}); refusing to replace it "
            "(move those or name a new folder)"
        )
    for sub in ARTIFACT_SUBFOLDERS.get(kind, ()):
        if sub in names:
            check_own_artifact(folder / sub, kind)


def file_checksum(path: Path, what: str) -> str:
    """Return the sha256 of a regular file, or a one-line ModelError naming ``what`` when it cannot be read.

    A FIFO or a device is refused before any read: ``/dev/zero`` as a router's weights would never end.
    """
    h = hashlib.sha256()
    try:
        with open_regular_file(path, ModelError) as fh:
            for block in iter(lambda: fh.read(1 << 20), b""):
                h.update(block)
    except OSError as exc:
        raise ModelError(f"{Path(path).parent}: {what} unreadable ({type(exc).__name__})") from exc
    return h.hexdigest()


def read_json(path: Path, what: str) -> dict[str, object]:
    """Return a JSON object from an artifact's config file, or a one-line ModelError.

    Only a regular file of at most 16 MiB is read (ours are a few kB): not a FIFO, not ``/dev/zero``.
    """
    try:
        with open_regular_file(path, ModelError) as fh:
            raw = fh.read(_MAX_JSON_BYTES + 1)
        if len(raw) > _MAX_JSON_BYTES:
            raise ValueError("too large")
        meta = json.loads(raw)
    except (OSError, ValueError) as exc:  # a JSONDecodeError or UnicodeDecodeError is a ValueError
        raise ModelError(f"{Path(path).parent}: not a condsearch {what} ({Path(path).name} unreadable)") from exc
    if not isinstance(meta, dict):
        raise ModelError(f"{Path(path).parent}: not a condsearch {what} ({Path(path).name} is not an object)")
    return meta


def write_json(path: Path, meta: dict[str, object]) -> None:
    """Write an artifact's config file as indented JSON."""
    Path(path).write_text(json.dumps(meta, indent=2) + "\n")
