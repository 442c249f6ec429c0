"""Knowledge-graph completion data in the SimKGC conventions (WN18RR-shaped folders), and a tiny
synthetic one for smoke runs (:func:`write_synthetic_kg`).

A folder holds ``entity2text.txt`` (``id \\t name, definition``), ``relation2text.txt``
(``relation \\t text``), optional ``entities.txt``/``relations.txt`` id lists, and
``train.tsv``/``dev.tsv``/``test.tsv`` triples (``head \\t relation \\t tail``). Everything
is mapped to integer rows: entity i is row i of every entity matrix; relation r < R is a
relation read forwards and r + R the same relation read backwards (``inverse <text>``).
"""

from __future__ import annotations

from collections import deque
from collections.abc import Iterable
from dataclasses import dataclass, field
from pathlib import Path

import numpy as np

from condsearch.errors import CorpusError

SPLITS = ("train", "dev", "test")
INVERSE_PREFIX = "inverse "
Answers = dict[tuple[int, int], set[int]]


@dataclass(frozen=True)
class KgData:
    """Entities, relations and triples of one knowledge graph, as integer rows."""

    entity_ids: list[str]
    entity_texts: list[str]  # "name: definition", the text each entity is encoded from
    relations: list[str]  # relation ids as in the files, e.g. "_hypernym"
    relation_texts: list[str]  # readable text of each relation, e.g. "hypernym"
    splits: dict[str, np.ndarray] = field(default_factory=dict)  # name -> (n, 3) int64 (head, rel, tail)
    entity_names: list[str] = field(default_factory=list)  # "name" of each entity, e.g. "stool"
    entity_descriptions: list[str] = field(default_factory=list)  # its definition, as read

    @property
    def n_entities(self) -> int:
        return len(self.entity_ids)

    @property
    def n_relations(self) -> int:
        return len(self.relations)

    @property
    def conditions(self) -> list[str]:
        """Return the 2R condition texts: each relation forwards, then each one inverted."""
        return list(self.relation_texts) + [INVERSE_PREFIX + t for t in self.relation_texts]


def entity_text(name: str, description: str) -> str:
    """Return SimKGC's entity text ``name: description`` (a description that repeats the
    name first loses that copy; the name alone when nothing is left)."""
    name, description = name.strip(), description.strip()
    if description.startswith(name):
        description = description[len(name) :].strip()
    return f"{name}: {description}" if description else name


def relation_text(relation: str) -> str:
    """Return the readable text of a relation id: ``_member_meronym`` -> ``member meronym``."""
    return relation.replace("_", " ").strip()


def _read_tsv(path: Path, n_columns: int) -> list[list[str]]:
    try:
        lines = path.read_text(encoding="utf-8").splitlines()
    except (OSError, UnicodeDecodeError) as exc:
        raise CorpusError(f"{path}: cannot read ({type(exc).__name__})") from exc
    rows = []
    for number, line in enumerate(lines, start=1):
        if not line.strip():
            continue
        parts = line.split("\t")
        if len(parts) < n_columns:
            raise CorpusError(f"{path}:{number}: expected {n_columns} tab-separated columns")
        rows.append(parts[:n_columns])
    return rows


def read_kg(folder: Path | str, splits: Iterable[str] = SPLITS) -> KgData:
    """Read a WN18RR-shaped folder (see the module docstring)."""
    folder = Path(folder)
    if not folder.is_dir():
        raise CorpusError(f"{folder}: no such data folder")
    texts: dict[str, str] = {}
    parts: dict[str, tuple[str, str]] = {}
    for eid, raw in _read_tsv(folder / "entity2text.txt", 2):
        name, _, description = raw.partition(", ")
        texts[eid] = entity_text(name, description)
        parts[eid] = (name.strip(), description.strip())
    order_file = folder / "entities.txt"
    entity_ids = [row[0] for row in _read_tsv(order_file, 1)] if order_file.is_file() else list(texts)
    missing = [e for e in entity_ids if e not in texts]
    if missing:
        raise CorpusError(f"{folder}: {len(missing)} entities have no text (e.g. {missing[0]})")
    rel_text = {rel: text.strip() for rel, text in _read_tsv(folder / "relation2text.txt", 2)}
    rel_file = folder / "relations.txt"
    relations = [row[0] for row in _read_tsv(rel_file, 1)] if rel_file.is_file() else list(rel_text)
    row_of = {e: i for i, e in enumerate(entity_ids)}
    rel_of = {r: i for i, r in enumerate(relations)}
    out: dict[str, np.ndarray] = {}
    for split in splits:
        path = folder / f"{split}.tsv"
        triples = np.empty((0, 3), dtype=np.int64)
        rows = _read_tsv(path, 3)
        try:
            triples = np.array([[row_of[h], rel_of[r], row_of[t]] for h, r, t in rows], dtype=np.int64)
        except KeyError as exc:
            raise CorpusError(f"{path}: unknown entity or relation {exc.args[0]!r}") from exc
        out[split] = triples.reshape(-1, 3)
    return KgData(
        entity_ids=entity_ids,
        entity_texts=[texts[e] for e in entity_ids],
        relations=relations,
        relation_texts=[rel_text.get(r) or relation_text(r) for r in relations],
        splits=out,
        entity_names=[parts[e][0] for e in entity_ids],
        entity_descriptions=[parts[e][1] for e in entity_ids],
    )


def with_inverse(triples: np.ndarray, n_relations: int) -> np.ndarray:
    """Return the triples followed by their inverses (t, r + R, h): (2n, 3) int64."""
    inverse = np.stack([triples[:, 2], triples[:, 1] + n_relations, triples[:, 0]], axis=1)
    return np.concatenate([triples, inverse]).astype(np.int64)


def known_answers(triple_sets: Iterable[np.ndarray], n_relations: int) -> Answers:
    """Map (head, relation) to every tail seen in any of the sets, inverses included."""
    answers: Answers = {}
    for triples in triple_sets:
        for h, r, t in with_inverse(triples, n_relations).tolist():
            answers.setdefault((h, r), set()).add(t)
    return answers


def link_graph(triples: np.ndarray, n_entities: int) -> list[np.ndarray]:
    """Return each entity's neighbours in the undirected graph of the triples (sorted rows)."""
    pairs = np.concatenate([triples[:, [0, 2]], triples[:, [2, 0]]])
    pairs = np.unique(pairs, axis=0)
    bounds = np.searchsorted(pairs[:, 0], np.arange(n_entities + 1))
    return [pairs[bounds[i] : bounds[i + 1], 1] for i in range(n_entities)]


def n_hop(graph: list[np.ndarray], start: int, hops: int, max_nodes: int = 100_000) -> np.ndarray:
    """Return the entities within ``hops`` edges of ``start``, itself included (SimKGC's
    re-ranking set); empty when more than ``max_nodes`` are reached."""
    seen = {start}
    frontier = deque([start])
    for _ in range(hops):
        for _ in range(len(frontier)):
            node = frontier.popleft()
            for nb in graph[node].tolist():
                if nb not in seen:
                    seen.add(nb)
                    frontier.append(nb)
                    if len(seen) > max_nodes:
                        return np.empty(0, dtype=np.int64)
    return np.fromiter(seen, dtype=np.int64, count=len(seen))


#: SimKGC's ``--use-link-graph``: a description under this many words gains neighbours' names
SHORT_DESCRIPTION_WORDS = 20
#: ... the names of at most this many neighbours, the first by entity id
NEIGHBOUR_NAMES = 10


@dataclass(frozen=True)
class LinkedTexts:
    """Entity texts with the training graph's neighbours in them, as SimKGC's ``--use-link-graph``.

    An entity whose description has fewer than 20 words is encoded from ``name: description
    n1 n2 ...``, the names of its first 10 neighbours (by entity id) in the undirected training
    graph. In training, each side of a triple leaves the other out of its list (SimKGC: no label
    leak); in evaluation nothing is left out, as in SimKGC's evaluation.
    """

    names: list[str]
    descriptions: list[str]
    neighbours: list[np.ndarray]  # each entity's first NEIGHBOUR_NAMES neighbours, rows sorted by entity id

    def text(self, row: int, leave_out: int = -1) -> str:
        """Return entity ``row``'s text, without ``leave_out`` among its neighbours."""
        description = self.descriptions[row]
        if len(description.split()) < SHORT_DESCRIPTION_WORDS:
            names = [self.names[n] for n in self.neighbours[row].tolist() if n != leave_out]
            description = " ".join([description, *names])
        return entity_text(self.names[row], description)

    def texts(self) -> list[str]:
        """Return every entity's text as evaluation encodes it (nothing left out)."""
        return [self.text(row) for row in range(len(self.names))]


def linked_texts(data: KgData) -> LinkedTexts:
    """Return SimKGC's link-graph entity texts of ``data`` (neighbours from its training triples)."""
    if len(data.entity_names) != data.n_entities:
        raise ValueError("link-graph texts need each entity's name and description (read_kg)")
    graph = link_graph(data.splits["train"], data.n_entities)
    ids = data.entity_ids
    first = [np.array(sorted(g.tolist(), key=lambda r: ids[r])[:NEIGHBOUR_NAMES], dtype=np.int64) for g in graph]
    return LinkedTexts(list(data.entity_names), list(data.entity_descriptions), first)


def write_synthetic_kg(folder: Path, n_entities: int = 60, seed: int = 0) -> Path:
    """Write a tiny WN18RR-shaped graph: a colour taxonomy with three relations."""
    rng = np.random.default_rng(seed)
    folder.mkdir(parents=True, exist_ok=True)
    words = ["red", "blue", "green", "orange", "black", "white", "pink", "brown", "gray", "yellow"]
    things = ["dress", "shirt", "hat", "coat", "ball", "car", "bicycle", "dog", "cat", "horse"]
    ids = [f"{i:08d}" for i in range(n_entities)]
    lines = [
        f"{e}\t{words[i % 10]} {things[(i // 10) % 10]}, a {things[(i // 10) % 10]} coloured {words[i % 10]}"
        for i, e in enumerate(ids)
    ]
    (folder / "entity2text.txt").write_text("\n".join(lines) + "\n")
    (folder / "entities.txt").write_text("\n".join(ids) + "\n")
    rels = ["_hypernym", "_similar_to", "_has_part"]
    (folder / "relations.txt").write_text("\n".join(rels) + "\n")
    (folder / "relation2text.txt").write_text("\n".join(f"{r}\t{r.strip('_').replace('_', ' ')}" for r in rels) + "\n")
    triples = set()
    while len(triples) < 3 * n_entities:
        h, t = rng.integers(0, n_entities, size=2)
        if h != t:
            triples.add((ids[h], rels[int(rng.integers(0, 3))], ids[t]))
    rows = ["\t".join(x) for x in sorted(triples)]
    rng.shuffle(rows)
    n_eval = max(4, len(rows) // 10)
    for name, part in (("train", rows[2 * n_eval :]), ("dev", rows[:n_eval]), ("test", rows[n_eval : 2 * n_eval])):
        (folder / f"{name}.tsv").write_text("\n".join(part) + "\n")
    return folder
