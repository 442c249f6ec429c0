"""tools/device_bundle.py: the GPU lease's packed model keeps every used weight to float16 and nothing else."""

from __future__ import annotations

import zipfile
from pathlib import Path

import numpy as np
from safetensors.numpy import load_file

from tools import device_bundle as db


def test_texts_in_reads_every_field_of_csv_tsv_and_txt(tmp_path: Path) -> None:
    (tmp_path / "a.csv").write_text('s1,"s2, with a comma",cond\n', encoding="utf-8")
    (tmp_path / "b.tsv").write_text("h\trel\tt\n", encoding="utf-8")
    (tmp_path / "c.txt").write_text("id\tname, gloss\n", encoding="utf-8")
    (tmp_path / "d.json").write_text('{"skipped": "yes"}', encoding="utf-8")
    assert list(db.texts_in(tmp_path)) == ["s1", "s2, with a comma", "cond", "h", "rel", "t", "id", "name, gloss"]


def test_packed_weights_unpack_to_float16_rounding_with_unused_rows_zeroed(tiny_bert_dir: Path, tmp_path: Path) -> None:
    used = db.used_token_ids(tiny_bert_dir / "tokenizer.json", ["the red dress", "a blue hat"])
    original = load_file(str(tiny_bert_dir / db.WEIGHTS))
    table = next(k for k in original if k.endswith("word_embeddings.weight"))
    assert 0 < len(used) < original[table].shape[0]

    pkg = tmp_path / "stage" / db.MODEL_PACKAGE
    (pkg / "model").mkdir(parents=True)
    (pkg / "__init__.py").write_text("", encoding="utf-8")
    kept, rows = db.half_weights(tiny_bert_dir / db.WEIGHTS, used, tmp_path / "stage" / db.HALF)
    assert (kept, rows) == (len(used), original[table].shape[0])
    bundle = tmp_path / "bundle"
    bundle.mkdir()
    db._xz_tar(bundle / "model.tar.xz", {db.MODEL_PACKAGE: pkg, db.HALF: tmp_path / "stage" / db.HALF})
    (tmp_path / "wn").mkdir()
    (tmp_path / "wn" / "train.tsv").write_text("a\tb\tc\n", encoding="utf-8")
    db._xz_tar(bundle / "data.tar.xz", {"wn": tmp_path / "wn"})

    db.unpack(bundle, tmp_path / "site", tmp_path / "data")
    back = load_file(str(tmp_path / "site" / db.MODEL_PACKAGE / "model" / db.WEIGHTS))
    assert not (tmp_path / "site" / db.HALF).exists()
    assert (tmp_path / "data" / "wn" / "train.tsv").read_text(encoding="utf-8") == "a\tb\tc\n"
    assert set(back) == set(original)
    rows_used = np.zeros(rows, dtype=bool)
    rows_used[sorted(used)] = True
    for name, value in original.items():
        assert back[name].dtype == np.float32
        expect = value.astype(np.float16).astype(np.float32)
        if name == table:
            np.testing.assert_array_equal(back[name][rows_used], expect[rows_used])
            assert not back[name][~rows_used].any()
        else:
            np.testing.assert_array_equal(back[name], expect)


def test_wheels_unpack_onto_the_site(tmp_path: Path) -> None:
    wheels = []
    for name in ("alpha", "beta"):
        wheel = tmp_path / f"{name}-1.0-py3-none-any.whl"
        with zipfile.ZipFile(wheel, "w") as whl:
            whl.writestr(f"{name}/__init__.py", f"NAME = {name!r}\n")
            whl.writestr(f"{name}-1.0.dist-info/METADATA", f"Name: {name}\n")
        wheels.append(wheel)
    bundle = tmp_path / "bundle"
    bundle.mkdir()
    db.pack_wheels(bundle / "wheels.tar.xz", wheels)
    (tmp_path / "stage").mkdir()
    half = _tiny_half(tmp_path / "stage")
    db._xz_tar(bundle / "model.tar.xz", {db.MODEL_PACKAGE: tmp_path / "stage" / db.MODEL_PACKAGE, db.HALF: half})
    db.unpack(bundle, tmp_path / "site", tmp_path / "data")
    for name in ("alpha", "beta"):
        assert (tmp_path / "site" / name / "__init__.py").read_text() == f"NAME = {name!r}\n"
        assert (tmp_path / "site" / f"{name}-1.0.dist-info" / "METADATA").is_file()


def _tiny_half(stage: Path) -> Path:
    """A float16 weights file and the package folder unpack writes float32 weights into."""
    from safetensors.numpy import save_file

    (stage / db.MODEL_PACKAGE / "model").mkdir(parents=True)
    save_file({"w": np.ones((2, 2), dtype=np.float16)}, str(stage / db.HALF))
    return stage / db.HALF


def test_a_bundle_split_into_parts_joins_back_whole(tmp_path: Path) -> None:
    bundle = tmp_path / "bundle"
    bundle.mkdir()
    payload = {"model.tar.xz": np.random.default_rng(0).bytes(10_001), "data.tar.xz": b"data" * 333}
    for name, data in payload.items():
        (bundle / name).write_bytes(data)
    db.split_parts(bundle, 3)
    assert sorted(p.name for p in bundle.iterdir()) == ["part1", "part2", "part3"]
    db.join_parts(bundle)  # on the device, with every part carried
    for name, data in payload.items():
        assert (bundle / name).read_bytes() == data


def test_joining_with_a_part_missing_says_which_count(tmp_path: Path) -> None:
    import pytest

    bundle = tmp_path / "bundle"
    bundle.mkdir()
    (bundle / "data.tar.xz").write_bytes(b"x" * 100)
    db.split_parts(bundle, 2)
    (bundle / "part2" / "bundle.tar.2of2").unlink()
    with pytest.raises(SystemExit, match="1 of 2 parts"):
        db.join_parts(bundle)


def test_the_cublas_shim_defines_faiss_calls_under_cuda_12s_version(tmp_path: Path) -> None:
    import shutil
    import subprocess

    import pytest

    if shutil.which("gcc") is None or shutil.which("nm") is None:
        pytest.skip("needs gcc and nm")
    wheel = tmp_path / "nvidia_cuda_runtime_cu12-0-py3-none-any.whl"
    with zipfile.ZipFile(wheel, "w") as whl:
        whl.writestr("nvidia/cuda_runtime/lib/libcudart.so.12", b"not a real library")
    db.pack_cuda12_libs(tmp_path / "cuda12-libs.tar.xz", wheel)
    db.unpack(tmp_path, tmp_path / "site", tmp_path / "data")
    libs = tmp_path / "site" / db.CUDA12_LIBS
    assert sorted(p.name for p in libs.iterdir()) == ["libcublas.so.12", "libcublasLt.so.12", "libcudart.so.12"]
    symbols = subprocess.run(
        ["nm", "-D", "--defined-only", str(libs / "libcublas.so.12")], capture_output=True, text=True
    )
    for name in ("cublasCreate_v2", "cublasSgemmEx", "cublasGemmEx", "cublasGemmStridedBatchedEx"):
        assert f"{name}@@libcublas.so.12" in symbols.stdout
