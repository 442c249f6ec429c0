"""The bottom layer: files, digests, atomic writes, model sources, caches, FAISS primitives, CPU kinds.

Holds what every other package stands on and nothing that knows about indexes, models or front ends:
regular-file checks (``regular_files``), atomic writes and replacements (``atomic``), cached file
digests (``file_digest``), trained artifacts' file names and checked reads (``artifact_files``), where a
model's files come from (``model_sources``), the on-disk embedding cache (``output_cache``), the CPU's
kind (``cpu_kind``), and FAISS: the approximate-index choice (``ann``) and index primitives
(``faiss_indexes``); and the packages' front doors' lazy names (``front_door``). It imports only the
standard library, NumPy, FAISS and the top-level leaf modules
(``errors``, ``defaults``, ``progress``, ``version``); docs/architecture.md says what sits above it.
"""
