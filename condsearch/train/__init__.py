"""Training what condsearch ships: the CASE head, fine-tuned encoders (LoRA or full) and CSR routers.

Each trainer has the same shape: ``fit_<thing>(…, train, config, *, dev=None, on_epoch=None, …)``
trains in memory, keeps the best dev epoch and returns the per-epoch history (``fit_router``: the
history, the router trained in place; ``fit_head``: the head and the history; ``fit_encoder``: a
``FinetuneResult`` holding the jointly trained head, the history and the best epoch), and
``fit_and_save_<thing>(train_csv, out, config, *, dev_csv=None, model=None, device=None, …)`` reads
the C-STS files, fits, writes the artifact into ``out`` and returns a JSON summary (what
``condsearch train … --json`` prints).

- ``head``: :class:`HeadTrainConfig`, ``fit_head``, ``fit_and_save_head`` (frozen encoder, cached outputs);
- ``finetune``: :class:`FinetuneConfig`, ``fit_encoder``; ``finetune_save``: ``fit_and_save_encoder`` (``train lora`` /
  ``train full``);
- ``router``: :class:`RouterTrainConfig`, ``fit_router``, ``fit_and_save_router`` (``train router``).

Their shared parts: ``losses`` (the objectives and pair batching), ``schedule`` (the one LR
schedule), ``best_epoch`` (the one best-epoch keeper), ``checkpoint`` (resumable per-epoch state and
where it lives), ``lora`` (the adapter layers), ``adapter`` (writing adapter folders) and ``lowrank``
(a full fine-tune's weight changes at reduced rank). Importing this package loads none of them.
"""
