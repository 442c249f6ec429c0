"""Trained artifacts on disk: heads, adapters, routers, checkpoints and the profiles that combine them.

The ones condsearch ships live in ``condsearch/assets/`` (each at most 10 MB; docs/training.md and
docs/csr.md hold the commands that regenerate them).

One package answers "what is this folder, may it be used with this model, and what does it
weigh?" without importing torch: :mod:`condsearch.base.artifact_files` (names, shipped folders,
file names, format versions, which artifact a folder holds; in the bottom layer, since atomic writes
check it), ``heads``, ``adapters`` (PEFT's format and the old one),
``routers``, ``profiles`` (a base model + adapter + head, or + router, resolved once) and
``convert`` (old adapter folders to PEFT's format). The weights' maths stays with what uses it:
:mod:`condsearch.model.head`, :mod:`condsearch.csr.router`, :mod:`condsearch.encoders.lora`.
"""
