#!/usr/bin/env python3
"""CASE encode throughput (pairs/s, tokens/s) against the device's matrix-multiply bound.

Encodes N (sentence, condition) pairs from a C-STS CSV with ``Encoder.encode`` — the
path ``condsearch index`` takes — after a warm-up, and reports pairs/s and real (unpadded)
tokens/s, median of --repeats. The bound is measured in the same run: the device's dense
matrix-multiply rate in the encoder's dtype (a square product of --peak-size), divided by
the model's FLOPs per token (2 × non-embedding parameters, plus 4 × layers × attention
width × mean sequence length for the attention products). The fraction of that bound is what
the encoder reaches; padding, tokenisation, pooling and host copies are what it loses.

``--arch qwen3-0.6b`` builds a randomly initialised model of Qwen3-Embedding-0.6B's shape
(28 layers, hidden 1024) with a byte-level BPE tokenizer trained on the CSV's own text, so
the cost of a 0.6B decoder embedder can be measured where its weights cannot be fetched
(random weights run exactly as fast as trained ones).

    python -m benchmarks.systems.encode_throughput --csv $D/train.csv -n 20000 --device cuda --dtype bfloat16
    python -m benchmarks.systems.encode_throughput --csv $D/train.csv -n 4000 --arch qwen3-0.6b --device cuda

``--quantize int8`` measures instead, in one run and on the same pairs, CASE with the int8
encoder (onnxruntime dynamic int8, see condsearch.model.encoders.onnx.bert), CASE in float32 run by
torch (the same model loaded for inference), CASE in float32 run by onnxruntime (its checked
float32 export) and sentence-transformers' ``encode()`` of each pair's sentence and condition
joined by a space (one plain embedding per pair, about the same tokens). The four run in turn
within each repeat, so a change in the machine's load falls on all of them; the JSON gives their
median pairs/s, ``int8_speedup`` (int8 / float32 run by torch: the reference, named in
``int8_speedup_reference``), ``int8_vs_onnxruntime_float32`` and how close the int8 CASE vectors
are to float32's (cosine). CASE pays one more pass per distinct condition (the condition alone,
``f(c; I(∅))``), which sentence-transformers does not: with the conditions in turn (the
default, about 850 distinct among 1,000 dev pairs) that is most of a second pass, short ones;
``--one-condition`` puts every pair under one condition, as ``condsearch index`` does.
``share_of_peak`` gives each path's useful work (its unpadded tokens × the model's FLOPs per
token) as a share of the dense matrix-multiply rate measured on this CPU after the runs, at the
path's precision: the faster of torch's and onnxruntime's (``matmul_gops``; int8:
``torch._int_mm`` and ``MatMulInteger``; bfloat16: torch's alone).

    python -m benchmarks.systems.encode_throughput --csv $D/dev.csv -n 2000 --quantize int8
"""

from __future__ import annotations

import argparse
import os
import statistics
import sys
import tempfile
import time
from collections.abc import Sequence
from pathlib import Path

import torch

from benchmarks._lib.common import log, quiet_transformers, run_info, synthetic_csts, write_outputs  # noqa: E402
from condsearch.corpus.csts import read_csts  # noqa: E402
from condsearch.model.encoders import load_encoder  # noqa: E402
from condsearch.model.encoders.cpu import QUANTIZE_CHOICES, CpuConfig  # noqa: E402
from condsearch.model.encoders.spec import EncoderSpec, Runtime

#: Qwen3-Embedding-0.6B's published shape (its vocabulary is replaced by the BPE trained here)
QWEN3_06B = {
    "hidden_size": 1024,
    "intermediate_size": 3072,
    "num_hidden_layers": 28,
    "num_attention_heads": 16,
    "num_key_value_heads": 8,
    "head_dim": 128,
    "max_position_embeddings": 32768,
    "rope_theta": 1000000.0,
    "rms_norm_eps": 1e-6,
    "tie_word_embeddings": True,
}
TINY_QWEN3 = {**QWEN3_06B, "hidden_size": 64, "intermediate_size": 128, "num_hidden_layers": 2,
              "num_attention_heads": 4, "num_key_value_heads": 2, "head_dim": 16}  # fmt: skip


def build_random_qwen3(folder: Path, texts: Sequence[str], shape: dict[str, object], vocab_size: int) -> Path:
    """Save a randomly initialised Qwen3 model of the given shape with a BPE tokenizer trained on texts."""
    import transformers
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers, processors, trainers

    eos = "<|endoftext|>"
    tok = Tokenizer(models.BPE())
    tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    tok.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(
        vocab_size=vocab_size, special_tokens=[eos], initial_alphabet=pre_tokenizers.ByteLevel.alphabet()
    )
    tok.train_from_iterator(texts, trainer)
    # Qwen3-Embedding's tokenizer appends the end-of-text token that last-token pooling reads
    eos_id = tok.token_to_id(eos)
    tok.post_processor = processors.TemplateProcessing(single=f"$A {eos}", special_tokens=[(eos, eos_id)])
    wrapped = transformers.PreTrainedTokenizerFast(
        tokenizer_object=tok, eos_token=eos, pad_token=eos, model_max_length=8192
    )
    wrapped.save_pretrained(str(folder))
    torch.manual_seed(0)
    config = transformers.Qwen3Config(vocab_size=tok.get_vocab_size(), **shape)
    config.architectures = ["Qwen3ForCausalLM"]
    transformers.Qwen3Model(config).save_pretrained(str(folder))
    return folder


def draw_pairs(texts: Sequence[str], conditions: Sequence[str], one_condition: bool) -> list[tuple[str, str]]:
    """Return (condition, sentence) pairs: the conditions in turn, or the first for every text
    (``--one-condition``: what ``condsearch index`` does, one condition over a corpus)."""
    return [(conditions[0] if one_condition else conditions[i % len(conditions)], s) for i, s in enumerate(texts)]


def count_tokens(encoder: object, pairs: Sequence[tuple[str, str]]) -> int:
    """Return the real (unpadded) tokens the encoder feeds the model for pairs."""
    tokenize = getattr(encoder, "tokenize", None)
    if tokenize is not None:  # prompt encoders: one rendered, truncated row per pair
        return sum(len(row) for row in tokenize(pairs))
    tokenizer, limit = encoder.tokenizer, encoder.max_length  # type: ignore[attr-defined]
    enc = tokenizer([s for _, s in pairs], [c for c, _ in pairs], truncation=True, max_length=limit)
    return sum(len(ids) for ids in enc["input_ids"])


def model_flops_per_token(model: torch.nn.Module, mean_len: float) -> tuple[float, int]:
    """Return (FLOPs per token of one forward pass, non-embedding parameter count)."""
    config = model.config
    embed = sum(p.numel() for name, p in model.named_parameters() if "embed" in name)
    params = sum(p.numel() for p in model.parameters()) - embed
    width = getattr(config, "head_dim", None) or config.hidden_size // config.num_attention_heads
    attention = 4 * config.num_hidden_layers * width * config.num_attention_heads * mean_len
    return 2.0 * params + attention, params


def matmul_peak(device: torch.device, dtype: torch.dtype, size: int, repeats: int = 10) -> float:
    """Return the measured dense matrix-multiply rate in FLOP/s (median of repeats); int8: torch's
    int8 product with int32 sums (``torch._int_mm``), in operations per second."""
    if dtype == torch.int8:
        a = torch.randint(-128, 128, (size, size), device=device, dtype=dtype)
        b = torch.randint(-128, 128, (size, size), device=device, dtype=dtype)
        product = torch._int_mm
    else:
        a = torch.randn(size, size, device=device, dtype=dtype)
        b = torch.randn(size, size, device=device, dtype=dtype)
        product = torch.matmul
    times = []
    for i in range(repeats + 3):
        if device.type == "cuda":
            torch.cuda.synchronize(device)
        start = time.perf_counter()
        product(a, b)
        if device.type == "cuda":
            torch.cuda.synchronize(device)
        if i >= 3:
            times.append(time.perf_counter() - start)
    return 2.0 * size**3 / statistics.median(times)


def onnxruntime_matmul_peak(dtype: torch.dtype, size: int, threads: int, repeats: int = 10) -> float:
    """Return onnxruntime's measured dense matrix-multiply rate on the CPU (median of repeats), float32
    (MatMul) or int8 (MatMulInteger, uint8 × int8 with int32 sums), in operations per second."""
    import numpy as np
    import onnxruntime as ort
    from onnx import TensorProto, helper

    rng = np.random.default_rng(0)
    if dtype == torch.int8:
        kinds, op = (TensorProto.UINT8, TensorProto.INT8, TensorProto.INT32), "MatMulInteger"
        a = rng.integers(0, 256, (size, size), dtype=np.uint8)
        b = rng.integers(-128, 128, (size, size), dtype=np.int8)
    else:
        kinds, op = (TensorProto.FLOAT, TensorProto.FLOAT, TensorProto.FLOAT), "MatMul"
        a, b = (rng.standard_normal((size, size), dtype=np.float32) for _ in range(2))
    inputs = [helper.make_tensor_value_info(name, kinds[i], [size, size]) for i, name in enumerate("ab")]
    output = helper.make_tensor_value_info("y", kinds[2], None)
    graph = helper.make_graph([helper.make_node(op, ["a", "b"], ["y"])], "matmul", inputs, [output])
    options = ort.SessionOptions()
    options.intra_op_num_threads = threads
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 13)])
    session = ort.InferenceSession(model.SerializeToString(), options, providers=["CPUExecutionProvider"])
    times = []
    for i in range(repeats + 3):
        start = time.perf_counter()
        session.run(None, {"a": a, "b": b})
        if i >= 3:
            times.append(time.perf_counter() - start)
    return 2.0 * size**3 / statistics.median(times)


def measure(args: argparse.Namespace, texts: list[str], conditions: list[str]) -> dict[str, object]:
    with tempfile.TemporaryDirectory(prefix="throughput-") as tmp:
        model = args.model
        if args.arch is not None:
            shape = TINY_QWEN3 if args.smoke else QWEN3_06B
            model = str(build_random_qwen3(Path(tmp), texts + conditions, shape, 512 if args.smoke else 16000))
            log("throughput", f"built a random {args.arch} in {tmp}")
        encoder = load_encoder(
            EncoderSpec(
                model, profile="none", dtype=args.dtype, runtime=Runtime(device=args.device, threads=args.threads)
            )
        )
        net = encoder.model  # type: ignore[attr-defined]
        device = next(net.parameters()).device
        dtype = next(net.parameters()).dtype
        pairs = draw_pairs(texts, conditions, args.one_condition)
        n_tokens = count_tokens(encoder, pairs)
        flops_per_token, params = model_flops_per_token(net, n_tokens / len(pairs))
        warm = texts[: min(len(texts), 2 * args.batch_size)]
        encoder.encode(warm, "warm-up condition", batch_size=args.batch_size)
        seconds = []
        for r in range(args.repeats):
            # a new condition suffix per repeat so nothing is reused between repeats
            conds = [f"{c} ({r})" for c, _ in pairs]
            reps = [(c, s) for c, (_, s) in zip(conds, pairs, strict=True)]
            n_rep_tokens = count_tokens(encoder, reps)
            if device.type == "cuda":
                torch.cuda.synchronize(device)
            start = time.perf_counter()
            encoder.encode([s for _, s in reps], conds, batch_size=args.batch_size)
            if device.type == "cuda":
                torch.cuda.synchronize(device)
            seconds.append(time.perf_counter() - start)
            log("throughput", f"repeat {r + 1}: {len(pairs) / seconds[-1]:.0f} pairs/s")
        median = statistics.median(seconds)
        peak = matmul_peak(device, dtype, args.peak_size)
        tokens_per_s = n_rep_tokens / median
        bound = peak / flops_per_token
        return {
            "model": args.arch or encoder.model_id,
            "dtype": str(dtype).replace("torch.", ""),
            "device": str(device),
            "n_pairs": len(pairs),
            "batch_size": args.batch_size,
            "mean_tokens_per_pair": round(n_rep_tokens / len(pairs), 1),
            "non_embedding_params": params,
            "flops_per_token": flops_per_token,
            "seconds": [round(s, 3) for s in seconds],
            "pairs_per_s": round(len(pairs) / median, 1),
            "tokens_per_s": round(tokens_per_s, 1),
            "matmul_tflops": round(peak / 1e12, 2),
            "bound_tokens_per_s": round(bound, 1),
            "fraction_of_bound": round(tokens_per_s / bound, 4),
        }


#: the precision of each path of measure_int8, and the matmul that measures each precision's peak
PATH_PRECISION = {
    "int8": "int8",
    "float32": "float32",
    "onnxruntime_float32": "float32",
    "torch_bfloat16": "bfloat16",
    "sentence_transformers": "float32",
    "sentence_transformers_bfloat16": "bfloat16",
}
PEAK_DTYPES = {"float32": torch.float32, "bfloat16": torch.bfloat16, "int8": torch.int8}


def measure_int8(args: argparse.Namespace, texts: list[str], conditions: list[str]) -> dict[str, object]:
    """Return pairs/s of int8 CASE, float32 CASE (torch, onnxruntime), bfloat16 CASE (torch) and
    sentence-transformers' encode() in float32 and in bfloat16 (the peer at its best dtype on a CPU with
    bfloat16 products), interleaved within each repeat."""
    import numpy as np
    from sentence_transformers import SentenceTransformer

    from condsearch.base.model_sources import resolve_model
    from condsearch.model.encoders.bert import BertStyleEncoder
    from condsearch.model.encoders.onnx.bert import write_export
    from condsearch.model.encoders.onnx.export import pooled_cosines

    load_before = os.getloadavg()
    int8 = load_encoder(EncoderSpec(args.model, profile="none", quantize="int8", runtime=Runtime(threads=args.threads)))
    # float32 asked, not auto's dtype (bfloat16 on CPUs with bfloat16 products): the reference int8 is measured against
    runtime = Runtime(device="cpu", threads=args.threads)
    float32 = load_encoder(EncoderSpec(args.model, profile="none", dtype="float32", runtime=runtime))
    assert isinstance(float32, BertStyleEncoder)
    bf16 = load_encoder(EncoderSpec(args.model, profile="none", dtype="bfloat16", runtime=runtime))
    ort32, refused = write_export(
        float32, resolve_model(args.model), None, "float32", max_length=None, threads=torch.get_num_threads()
    )
    if ort32 is None:
        raise SystemExit(f"the float32 ONNX export was refused: {refused}")
    peer = SentenceTransformer(resolve_model(args.model).location, device="cpu")
    peer_bf16 = SentenceTransformer(resolve_model(args.model).location, device="cpu").to(torch.bfloat16)
    pairs = draw_pairs(texts, conditions, args.one_condition)
    n_tokens = count_tokens(float32, pairs)

    def case(encoder: object, r: int) -> object:
        conds = [f"{c} ({r})" for c, _ in pairs]  # a new suffix per repeat: nothing reused between repeats
        return encoder.encode([s for _, s in pairs], conds, batch_size=args.batch_size)  # type: ignore[attr-defined]

    runs = {
        "int8": lambda r: case(int8, r),
        "float32": lambda r: case(float32, r),
        "onnxruntime_float32": lambda r: case(ort32, r),
        "torch_bfloat16": lambda r: case(bf16, r),
        "sentence_transformers": lambda r: peer.encode(
            [f"{s} {c} ({r})" for c, s in pairs], batch_size=args.batch_size, convert_to_numpy=True
        ),
        "sentence_transformers_bfloat16": lambda r: peer_bf16.encode(
            [f"{s} {c} ({r})" for c, s in pairs], batch_size=args.batch_size, convert_to_numpy=True
        ),
    }
    warm = min(len(pairs), 2 * args.batch_size)
    int8.encode(texts[:warm], "warm-up condition", batch_size=args.batch_size)
    float32.encode(texts[:warm], "warm-up condition", batch_size=args.batch_size)
    ort32.encode(texts[:warm], "warm-up condition", batch_size=args.batch_size)
    bf16.encode(texts[:warm], "warm-up condition", batch_size=args.batch_size)
    peer.encode(texts[:warm], batch_size=args.batch_size)
    peer_bf16.encode(texts[:warm], batch_size=args.batch_size)
    seconds: dict[str, list[float]] = {name: [] for name in runs}
    outputs: dict[str, object] = {}
    for r in range(args.repeats):
        for name, run in runs.items():
            start = time.perf_counter()
            outputs[name] = run(r)
            seconds[name].append(time.perf_counter() - start)
        log("throughput", " ".join(f"{n}: {len(pairs) / t[-1]:.0f}" for n, t in seconds.items()) + " pairs/s")
    rate = {name: len(pairs) / statistics.median(t) for name, t in seconds.items()}
    cos = pooled_cosines(np.asarray(outputs["int8"]), np.asarray(outputs["float32"]))
    # each path's useful work (unpadded tokens × the model's FLOPs per token) against the faster of
    # torch's and onnxruntime's dense matrix multiply at the path's precision, measured after the runs
    # the tokens of repeat 0's texts (each condition with its " (0)" suffix) on both sides
    case_tokens = count_tokens(float32, [(f"{c} (0)", s) for c, s in pairs])
    peer_tokens = sum(len(ids) for ids in float32.tokenizer([f"{s} {c} (0)" for c, s in pairs])["input_ids"])
    cpu, threads = torch.device("cpu"), torch.get_num_threads()
    matmul = {f"torch_{name}": matmul_peak(cpu, dtype, args.peak_size) for name, dtype in PEAK_DTYPES.items()}
    for name in ("float32", "int8"):  # onnxruntime has no bfloat16 product on the CPU
        matmul[f"onnxruntime_{name}"] = onnxruntime_matmul_peak(PEAK_DTYPES[name], args.peak_size, threads)
    peak = {name: max(v for k, v in matmul.items() if k.endswith(f"_{name}")) for name in PEAK_DTYPES}
    share = {}
    for name, r in rate.items():
        tokens = peer_tokens if name.startswith("sentence_transformers") else case_tokens
        flops, _ = model_flops_per_token(float32.model, tokens / len(pairs))
        share[name] = round(r * tokens / len(pairs) * flops / peak[PATH_PRECISION[name]], 4)
    return {
        "model": int8.model_id,
        "quantize": "int8",
        "runtime": int8.describe()["quantize_runtime"],
        "device": "cpu",
        "threads": torch.get_num_threads(),
        "n_pairs": len(pairs),
        "batch_size": args.batch_size,
        "mean_tokens_per_pair": round(n_tokens / len(pairs), 1),
        "distinct_conditions": len({c for c, _ in pairs}),
        "seconds": {name: [round(x, 3) for x in t] for name, t in seconds.items()},
        "pairs_per_s": {name: round(v, 1) for name, v in rate.items()},
        "int8_speedup": round(rate["int8"] / rate["float32"], 3),
        "int8_speedup_reference": "float32: CASE run by torch (transformers), not its onnxruntime export",
        "int8_vs_onnxruntime_float32": round(rate["int8"] / rate["onnxruntime_float32"], 3),
        "int8_vs_sentence_transformers": round(rate["int8"] / rate["sentence_transformers"], 3),
        "float32_vs_sentence_transformers": round(rate["float32"] / rate["sentence_transformers"], 3),
        "case_cosine_int8_float32": {"median": round(float(np.median(cos)), 4), "min": round(float(cos.min()), 4)},
        "matmul_gops": {name: round(v / 1e9, 1) for name, v in matmul.items()},
        "share_of_peak": share,
        "share_of_peak_reference": f"the faster of torch's and onnxruntime's {args.peak_size}-square matmul at the "
        "path's precision (int8: torch._int_mm, MatMulInteger); useful work = unpadded tokens x FLOPs per token",
        "load_average_before": [round(x, 2) for x in load_before],
        "load_average_after": [round(x, 2) for x in os.getloadavg()],
    }


def int8_table(r: dict[str, object]) -> str:
    rate = r["pairs_per_s"]
    assert isinstance(rate, dict)
    return (
        f"{r['model']}, {r['n_pairs']} pairs ({r['mean_tokens_per_pair']} tokens/pair, "
        f"{r.get('distinct_conditions', '?')} distinct conditions), batch {r['batch_size']}, "
        f"{r['threads']} threads, load {r['load_average_before']}\n\n"
        "| encoder | pairs/s (median) | vs float32 (torch) | vs float32 (onnxruntime) | share of peak |\n"
        "|---|---:|---:|---:|---:|\n"
        + "".join(
            f"| {name} | {rate[name]:.3g} | {rate[name] / rate['float32']:.2f}× "
            f"| {rate[name] / rate['onnxruntime_float32']:.2f}× | {_share(r, name)} |\n"
            for name in rate
        )
    )


def _share(r: dict[str, object], name: str) -> str:
    share = r.get("share_of_peak")  # absent from results measured before it was recorded
    if not isinstance(share, dict) or name not in share:
        return "—"
    return f"{100 * share[name]:.0f}% of {PATH_PRECISION[name]}"


def table(r: dict[str, object]) -> str:
    return (
        "| model | dtype | device | pairs | tokens/pair | pairs/s | tokens/s | matmul TFLOP/s "
        "| bound tokens/s | of bound |\n"
        "|---|---|---|---:|---:|---:|---:|---:|---:|---:|\n"
        f"| {r['model']} | {r['dtype']} | {r['device']} | {r['n_pairs']} | {r['mean_tokens_per_pair']} "
        f"| {r['pairs_per_s']:.3g} | {r['tokens_per_s']:.0f} | {r['matmul_tflops']} | {r['bound_tokens_per_s']:.0f} "
        f"| {100 * float(r['fraction_of_bound']):.1f}% |\n"  # type: ignore[arg-type]
    )


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--csv", type=Path, default=None, help="C-STS CSV to draw sentences and conditions from")
    p.add_argument("-n", type=int, default=5000, help="pairs per repeat")
    p.add_argument("--model", default=None, help="model id or folder (default all-MiniLM-L6-v2)")
    p.add_argument("--arch", choices=["qwen3-0.6b"], default=None, help="a randomly initialised architecture")
    p.add_argument("--dtype", default="auto", choices=["auto", "float32", "float16", "bfloat16"])
    p.add_argument("--device", default=None)
    p.add_argument("--batch-size", type=int, default=128)
    p.add_argument("--repeats", type=int, default=3)
    p.add_argument("--peak-size", type=int, default=8192, help="side of the square matmul that measures the bound")
    p.add_argument(
        "--quantize",
        choices=QUANTIZE_CHOICES,
        default=CpuConfig.quantize,
        help="int8: int8 CASE beside float32 CASE (torch, onnxruntime) and sentence-transformers' encode() (CPU)",
    )
    p.add_argument(
        "--one-condition",
        action="store_true",
        help="every pair under the CSV's first condition (as `condsearch index` runs) instead of the conditions "
        "in turn: CASE's condition-only pass, f(c; I(empty)), is then paid once, not once a pair",
    )
    p.add_argument("--threads", type=int, default=CpuConfig.threads, help="intra-op threads [default: every core]")
    p.add_argument("--json-out", type=Path, default=None)
    p.add_argument("--md-out", type=Path, default=None)
    p.add_argument("--smoke", action="store_true", help="synthetic pairs, a tiny architecture, seconds")
    args = p.parse_args(argv)
    quiet_transformers()
    if args.smoke:
        data = synthetic_csts(64)
        args.n, args.repeats, args.peak_size, args.batch_size = 64, 1, 256, 16
    elif args.csv is None:
        p.error("--csv is required (or --smoke)")
    else:
        data = read_csts(args.csv)
    texts = list(dict.fromkeys(data.sentence1 + data.sentence2))[: args.n]
    conditions = list(dict.fromkeys(data.condition))
    if args.quantize == "int8":
        if args.arch is not None or args.device not in (None, "cpu") or args.dtype != "auto":
            p.error("--quantize int8 measures a BERT-style --model on the CPU; drop --arch, --device and --dtype")
        result = {**measure_int8(args, texts, conditions), **run_info("cpu")}
        write_outputs(result, int8_table(result), args.json_out, args.md_out)
        return 0
    result = {**measure(args, texts, conditions), **run_info(args.device)}
    write_outputs(result, table(result), args.json_out, args.md_out)
    return 0


if __name__ == "__main__":
    sys.exit(main())
