"""Shared fixtures: offline stand-ins for real models, small corpora, an isolated cache."""

from __future__ import annotations

import csv
import hashlib
import os
import string
from collections.abc import Callable, Iterator, Sequence
from pathlib import Path

import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq
import pytest

# huggingface_hub reads these when first imported; set them before anything imports it.
os.environ["HF_HUB_OFFLINE"] = "1"
os.environ["TRANSFORMERS_OFFLINE"] = "1"
os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")

from condsearch.model.encoders import Encoder  # noqa: E402
from condsearch.model.encoders.base import Pair  # noqa: E402

# Words the test sentences use; anything else still tokenizes through the letter pieces.
_WORDS = """
a an the and or of in on at to with by for from under over is are was be being its their his her
girl girls woman women man men boy child dog cat horse people person player players team crowd
orange red blue green yellow black white pink purple brown gray grey golden color colour
dress shirt hat coat jacket skirt shoes uniform suit scarf
serves serve ball tennis court soccer football basketball golf swimming pool field game match
sport played plays playing play rides riding bicycle walks walking runs running street beach park
kicks hits throws catches jumps swims ground clay grass goal net hoop race track bike road
mood weather place animal vehicle car bus train city quiet busy sunny rainy happy sad
""".split()
_PUNCT = list(".,!?'\"-:;()/&")


def _vocab() -> list[str]:
    special = ["[PAD]", "[UNK]", "[CLS]", "[SEP]", "[MASK]"]
    chars = list(string.ascii_lowercase) + list(string.digits)
    pieces = ["##" + ch for ch in chars]
    return list(dict.fromkeys(special + chars + _PUNCT + pieces + _WORDS))


def make_tiny_bert(folder: Path, seed: int = 0) -> Path:
    """Save a tiny randomly initialised BERT and a fast WordPiece tokenizer into folder."""
    import torch
    import transformers

    folder.mkdir(parents=True, exist_ok=True)
    vocab = _vocab()
    vocab_file = folder / "vocab.txt"
    vocab_file.write_text("\n".join(vocab) + "\n", encoding="utf-8")
    tokenizer = transformers.BertTokenizerFast(vocab_file=str(vocab_file))
    if len(tokenizer) < len(vocab):
        # transformers 5 takes the vocabulary as ``vocab=`` and ignores ``vocab_file``;
        # loading the folder that holds vocab.txt works on every version.
        tokenizer = transformers.BertTokenizerFast.from_pretrained(str(folder))
    assert len(tokenizer) == len(vocab)
    tokenizer.model_max_length = 128
    tokenizer.save_pretrained(str(folder))
    config = transformers.BertConfig(
        vocab_size=len(vocab),
        hidden_size=32,
        num_hidden_layers=2,
        num_attention_heads=2,
        intermediate_size=37,
        max_position_embeddings=128,
    )
    torch.manual_seed(seed)
    transformers.BertModel(config).eval().save_pretrained(str(folder))
    return folder


@pytest.fixture(scope="session")
def tiny_bert_dir(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A tiny random BERT (hidden 32, 2 layers) with its tokenizer, loadable offline."""
    return make_tiny_bert(tmp_path_factory.mktemp("tiny-bert"), seed=0)


@pytest.fixture(scope="session")
def other_bert_dir(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A second tiny BERT, same shape, different random weights (seed 1)."""
    return make_tiny_bert(tmp_path_factory.mktemp("other-bert"), seed=1)


@pytest.fixture(scope="session")
def tiny_encoder(tiny_bert_dir: Path):
    """The tiny BERT loaded once on the CPU (tests that read its stats load their own)."""
    from condsearch.model.encoders import load_encoder
    from condsearch.model.encoders.spec import EncoderSpec, Runtime

    return load_encoder(EncoderSpec(str(tiny_bert_dir), runtime=Runtime(device="cpu")))


class HashEncoder(Encoder):
    """A deterministic encoder: each (condition, sentence) maps to a sha256-seeded vector.

    It records every batch ``encode_batch`` receives, so tests can check de-duplication,
    length sorting and batching.
    """

    def __init__(self, dim: int = 16, model_id: str = "test/hash", revision: str = "1") -> None:
        super().__init__()
        self.dim = dim
        self.model_id = model_id
        self.revision = revision
        self.batches: list[list[Pair]] = []

    @staticmethod
    def vector(pair: Pair, dim: int = 16) -> np.ndarray:
        condition, sentence = pair
        text = condition + ("\x00<none>" if sentence is None else "\x01" + sentence)
        seed = int.from_bytes(hashlib.sha256(text.encode("utf-8")).digest()[:8], "little")
        return np.random.default_rng(seed).standard_normal(dim).astype(np.float32)

    def encode_batch(self, pairs: Sequence[Pair]) -> np.ndarray:
        self.batches.append(list(pairs))
        return np.stack([self.vector(p, self.dim) for p in pairs]).astype(np.float32)

    @property
    def seen(self) -> list[Pair]:
        """Every pair embedded so far, in order."""
        return [p for batch in self.batches for p in batch]


@pytest.fixture
def hash_encoder() -> HashEncoder:
    return HashEncoder()


WriteCorpus = Callable[..., Path]


@pytest.fixture
def write_corpus(tmp_path: Path) -> WriteCorpus:
    """Return ``write(columns: dict[str, list], name="corpus.parquet") -> Path``."""

    def write(columns: dict[str, list] | None = None, name: str = "corpus.parquet", **kw: list) -> Path:
        cols = dict(columns or {}, **kw)
        path = tmp_path / name
        pq.write_table(pa.table(cols), path)
        return path

    return write


SENTENCES = [
    "A girl in an orange dress serves the ball on a tennis court.",
    "A woman in a red dress walks her dog on the beach.",
    "Two men play soccer on a grass field.",
    "A boy in a blue shirt rides his bicycle down a quiet street.",
    "A man in a green jacket plays golf in the park.",
    "A girl in a yellow dress jumps into the swimming pool.",
    "Players in white uniforms play basketball in a busy gym.",
    "A woman in a pink hat runs on the track.",
]


@pytest.fixture
def corpus_file(write_corpus: WriteCorpus) -> Path:
    """A small corpus with string ids."""
    return write_corpus({"id": [f"s{i}" for i in range(len(SENTENCES))], "text": list(SENTENCES)})


@pytest.fixture(scope="session", autouse=True)
def _one_cpu_kind() -> Iterator[None]:
    """Pin the CPU kind for the whole session, its session-scoped fixtures included (set up before any test's
    monkeypatch): auto's dtype and backend follow the kind (condsearch.base.cpu_kind), one for every machine;
    a test's own monkeypatch.setenv of it is undone back to this."""
    before = os.environ.get("CONDSEARCH_CPU_KIND")
    os.environ["CONDSEARCH_CPU_KIND"] = "other"
    yield
    if before is None:
        os.environ.pop("CONDSEARCH_CPU_KIND", None)
    else:
        os.environ["CONDSEARCH_CPU_KIND"] = before


@pytest.fixture(autouse=True)
def _isolated_env(tmp_path_factory: pytest.TempPathFactory, monkeypatch: pytest.MonkeyPatch) -> None:
    """Keep every test off the network and out of ~/.cache and ./indexes."""
    monkeypatch.setenv("CONDSEARCH_CACHE_DIR", str(tmp_path_factory.mktemp("cache")))
    monkeypatch.setenv("CONDSEARCH_INDEX_DIR", str(tmp_path_factory.mktemp("indexes-env")))
    monkeypatch.setenv("HF_HUB_OFFLINE", "1")
    monkeypatch.setenv("TRANSFORMERS_OFFLINE", "1")


#: torch's intra-op threads in the tests (1 unless `make test-numerics` asks for others)
TORCH_THREADS_ENV = "CONDSEARCH_TEST_TORCH_THREADS"


def pytest_configure(config: pytest.Config) -> None:
    import torch

    # The stand-in models are tiny: waking a thread pool costs more than the work itself
    # (on a busy two-core machine, ~10 ms per matmul instead of ~0.03 ms). `make test-numerics`
    # asks for more, so that kernels split their sums otherwise and a fragile tolerance fails here.
    torch.set_num_threads(int(os.environ.get(TORCH_THREADS_ENV, "1")))


def router_csts_csv(path: Path) -> Path:
    """Write 12 C-STS rows over SENTENCES: each pair under a colour and a sport condition, labels opposed."""
    rows = []
    for i in range(6):
        s1, s2 = SENTENCES[i], SENTENCES[i + 1]
        rows.append({"sentence1": s1, "sentence2": s2, "condition": "the colour", "label": "5.0" if i % 2 else "2.0"})
        rows.append({"sentence1": s1, "sentence2": s2, "condition": "the sport", "label": "1.0" if i % 2 else "4.0"})
    with open(path, "w", newline="") as fh:
        writer = csv.DictWriter(fh, fieldnames=["sentence1", "sentence2", "condition", "label"])
        writer.writeheader()
        writer.writerows(rows)
    return path


def assert_same_ranking(
    a: tuple[np.ndarray, np.ndarray],
    b: tuple[np.ndarray, np.ndarray],
    tol: float | Callable[[object], float] = 1e-5,
) -> None:
    """Assert two top-k answers agree up to ties: each id's score within tolerance, the same ids past the cut.

    ``a`` and ``b`` are (scores, ids), both (n_queries, k). ``tol`` bounds how far one id's score may
    differ between them, or is a function of an id giving its own bound (:mod:`tests.tolerance`
    derives them from float32 rounding). Two builds of one index (another backend, other batches,
    another CPU) differ in the last bits of float32, so rows whose scores tie within tolerance may
    come back in either order, and one tied at the k-th score may be swapped for another.
    """
    (scores_a, ids_a), (scores_b, ids_b) = a, b
    assert np.shape(scores_a) == np.shape(scores_b) and np.shape(ids_a) == np.shape(ids_b)
    tol_of = tol if callable(tol) else (lambda _id: float(tol))  # type: ignore[operator]
    for q in range(len(scores_a)):
        got_a = {i: float(s) for i, s in zip(ids_a[q].tolist(), scores_a[q], strict=True)}
        got_b = {i: float(s) for i, s in zip(ids_b[q].tolist(), scores_b[q], strict=True)}
        for i in got_a.keys() & got_b.keys():
            assert abs(got_a[i] - got_b[i]) <= tol_of(i), (q, i, got_a[i], got_b[i], tol_of(i))
        # an id in one answer only must tie with the other answer's last score (at the cut)
        for mine, other in ((got_a, got_b), (got_b, got_a)):
            last = min(other, key=other.__getitem__)
            for i in mine.keys() - other.keys():
                assert mine[i] <= other[last] + tol_of(i), (q, i, mine[i], last, other[last])
