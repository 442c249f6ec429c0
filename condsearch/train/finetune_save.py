"""Fine-tuning from the C-STS files to a saved artifact: ``train lora`` / ``train full``.

:func:`fit_and_save_encoder` loads the bare model, trains it with
:func:`condsearch.train.finetune.fit_encoder` and writes an adapter folder (lora) or a whole model
folder (full), atomically, with the run's summary.
"""

from __future__ import annotations

import json
from collections.abc import Mapping
from dataclasses import replace
from pathlib import Path
from typing import Any

from condsearch.base.artifact_files import MODEL_SUMMARY, check_own_artifact
from condsearch.base.atomic import replacing_dir
from condsearch.errors import CondsearchError, ModelError, os_reason
from condsearch.model.artifacts.weights import check_finite
from condsearch.model.encoders.base import ENCODE_BATCH_SIZE
from condsearch.model.head import write_head_files
from condsearch.train.checkpoint import check_checkpoint_dir, default_checkpoint_dir, kept_checkpoint
from condsearch.train.finetune import EpochCallback, FinetuneConfig, FinetuneResult, TrainableEncoder, fit_encoder
from condsearch.train.finite import dumps_record, finite_record
from condsearch.train.mixture import TrainData, describe_sources

FULL_SUMMARY_FILE = MODEL_SUMMARY  # the marker of a model folder


def resolve_init_head(spec: str | None, model: str | None) -> str | None:
    """Return the folder of the frozen-encoder head that ``--init-head`` names (a folder or a shipped name).

    None stays None; 'none' and a head that goes with an adapter are refused with a ProfileError.
    """
    if spec is None:
        return None
    from condsearch.base.model_sources import resolve_model
    from condsearch.model.artifacts.adapters import has_adapter
    from condsearch.model.artifacts.profiles import ProfileError
    from condsearch.model.vectorizer import head_folder

    try:
        folder = head_folder(spec, resolve_model(model).model_id)
    except CondsearchError as exc:
        raise ProfileError(f"--init-head: {exc}") from exc
    if folder is None:
        raise ProfileError("--init-head none: leave the option out for a fresh head")
    if has_adapter(folder):
        raise ProfileError(f"--init-head {spec}: that head goes with a LoRA adapter; name a frozen-encoder head")
    return str(folder)


def fit_and_save_encoder(
    train_csv: TrainData,
    out: Path,
    config: FinetuneConfig,
    *,
    dev_csv: Path | None = None,
    model: str | None = None,
    device: str | None = None,
    max_length: int | None = None,
    trust_remote_code: bool = False,
    checkpoint_dir: Path | None = None,
    resume: bool = False,
    checkpoint_every: int = 0,
    keep_epochs: bool = False,
    eval_batch_size: int = ENCODE_BATCH_SIZE,
    progress: bool = True,
    on_epoch: EpochCallback | None = None,
    encoder_settings: Mapping[str, Any] | None = None,
) -> dict[str, object]:
    """Fine-tune the model on train_csv (epoch chosen on dev_csv), save into out; return a summary.

    lora writes ``adapter.safetensors`` + ``adapter.json`` (and the head, with head_on_top)
    for ``--profile OUT``; full writes a whole model folder for ``--model OUT``.
    ``encoder_settings`` (pooling, prompt_template, unconditional_template,
    bidirectional_layers, preset) go to :func:`condsearch.model.encoders.load_encoder`: a BERT-style
    model trains with condition-mean pooling, a decoder embedder (LoRA only) with its prompts,
    in float32 either way.

    Checkpoints go to ``checkpoint_dir`` (apart from ``out``: checked before anything loads), by
    default to a folder under the cache named after ``out``, which a successful save removes
    unless ``keep_epochs`` keeps it; the summary's ``checkpoint_dir`` names the folder kept (None:
    none). A failed or interrupted run keeps its checkpoints, for ``resume``.
    """
    from condsearch.corpus.csts import read_csts
    from condsearch.model.encoders import load_encoder
    from condsearch.model.encoders.bert import BertStyleEncoder
    from condsearch.model.encoders.decoder import PromptEncoder
    from condsearch.model.encoders.spec import EncoderSpec, Runtime
    from condsearch.train.adapter import save_adapter
    from condsearch.train.mixture import read_training

    keep = checkpoint_dir is not None or keep_epochs
    checkpoint_dir = Path(checkpoint_dir) if checkpoint_dir is not None else default_checkpoint_dir(out)
    check_checkpoint_dir(out, checkpoint_dir)
    train = read_training(train_csv, config.seed)
    dev = read_csts(dev_csv) if dev_csv is not None else None
    settings = {"pooling": "auto", **(encoder_settings or {})}
    encoder = load_encoder(
        EncoderSpec(
            model,
            profile="none",  # the bare model is what trains
            max_length=max_length,
            dtype="float32",
            **settings,
            runtime=Runtime(device=device, trust_remote_code=trust_remote_code),
        )
    )
    trainable: TrainableEncoder
    if isinstance(encoder, PromptEncoder) and encoder.family == "decoder":
        if config.kind != "lora":
            # a full copy of an LLM would also lose its bidirectional layers, which live outside the weights
            raise ModelError("decoder embedders fine-tune with train lora")
        trainable = encoder
    elif isinstance(encoder, BertStyleEncoder):
        trainable = encoder
    else:
        raise ModelError(
            "fine-tuning needs one device and a BERT-style encoder (condition-mean pooling) or a decoder embedder"
        )
    result = fit_encoder(
        trainable,
        train,
        config,
        dev=dev,
        checkpoint_dir=checkpoint_dir,
        resume=resume,
        checkpoint_every=checkpoint_every,
        keep_epochs=keep_epochs,
        eval_batch_size=eval_batch_size,
        progress=progress,
        on_epoch=on_epoch,
    )
    summary: dict[str, object] = finite_record(_summary(out, config, result, train_csv, dev_csv, len(train)))
    extra: dict[str, object] = {"training": dict(summary)}
    if config.kind == "lora":
        summary["adapter_checksum"] = save_adapter(trainable, config.lora, out, head=result.head, extra=extra)
    else:
        _save_full(trainable, result, out, extra)
    summary["checkpoint_dir"] = kept_checkpoint(checkpoint_dir, keep)
    return summary


def _summary(
    out: Path,
    config: FinetuneConfig,
    result: FinetuneResult,
    train_csv: TrainData,
    dev_csv: Path | None,
    n_train: int,
) -> dict[str, object]:
    summary: dict[str, object] = {
        "out": str(out),
        "finetune": config.kind,
        "train_rows": n_train,
        "train_csv": describe_sources(train_csv),
        "config": config.record(),
        "history": result.history,
        "best_epoch": result.best_epoch,
        "train_seconds": round(sum(float(r.get("train_seconds", 0.0)) for r in result.history), 1),
    }
    if result.resumed_from:
        summary["resumed_after_epoch"] = result.resumed_from
    if dev_csv is not None and result.history:
        best = next((r for r in result.history if int(r["epoch"]) == result.best_epoch), {})
        summary.update({"dev_csv": Path(dev_csv).name, "dev_spearman": best.get("dev_spearman")})
    if result.head is not None:
        summary["dim"] = result.head.config.dim
    return summary


def _save_full(encoder: TrainableEncoder, result: FinetuneResult, out: Path, extra: dict[str, object]) -> None:
    """Write a loadable model folder (weights, tokenizer, token limit) and the head, atomically."""
    out = Path(out)
    check_own_artifact(out, "model")
    # transformers writes the weights itself: check them before it does
    check_finite(encoder.model.state_dict(), f"{out}: model weights")  # type: ignore[operator]
    try:
        with replacing_dir(out) as tmp:
            encoder.model.save_pretrained(str(tmp))  # type: ignore[operator]  # a transformers model
            encoder.tokenizer.save_pretrained(str(tmp))
            (tmp / "sentence_bert_config.json").write_text(json.dumps({"max_seq_length": encoder.max_length}) + "\n")
            (tmp / FULL_SUMMARY_FILE).write_text(dumps_record(extra["training"], indent=2) + "\n")
            if result.head is not None:
                # the head answers to the model folder's own identity, which --model OUT resolves to
                head = result.head
                head.config = replace(head.config, model_id=str(out.resolve()), model_revision="")
                write_head_files(head, tmp, extra, shown=out)
    except OSError as exc:
        raise CondsearchError(f"{out}: cannot write the model folder ({os_reason(exc)})") from exc
