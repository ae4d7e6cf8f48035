"""The project on a GPU: every Triton kernel against its PyTorch reference, the tree-scan tile sweep, and the
zoo pairs' decoding speed on CUDA.

    python benchmarks/probes/gpu.py --json benchmarks/results/gpu_h100.json [--quick] [--no-e2e] [--no-sweep]
    python benchmarks/tools/tables.py benchmarks/results/gpu_h100.json     # the tables for BENCHMARKS.md

Kernels: `triton.testing.do_bench` (median ms over its repetitions) of the kernel and of the reference on the
same inputs, at the sizes of a real model (the tree scan and conv at Mamba-2 2.7B / 8B-like widths), each
checked equal first. End to end: the recorder (warm-up, methods interleaved per prompt, rounds, the spread),
every call ending in `torch.cuda.synchronize()`, greedy outputs compared with plain decoding; on the byte pair
the EAGLE chain also runs through the static-shape step (`multispec.targets.static_step`: CUDA graphs, with
and without `torch.compile`).
"""

from __future__ import annotations

import argparse
import json
import sys

import torch

from multispec import NGramDrafter, StoppingConfig, speculative_generate, zoo
from multispec.bench.recorder import Recorder, format_table, outputs_identical, repeat, results, sequences
from multispec.bench.text import classify, prompts
from multispec.drafters.eagle import EagleDrafter
from multispec.drafters.model import ModelDrafter
from multispec.image_ar.neighbourhood import neighbour_mass
from multispec.image_ar.continuous.trajectory_kernel import trajectory_log_ratio
from multispec.kernels import chain_verify_greedy, chain_verify_random, tree_verify_greedy, tree_verify_random
from multispec.ssm.kernels import ScanTiles, tree_conv1d_dispatch, tree_ssd_dispatch, tree_ssd_triton
from multispec.ssm.tree_scan import conv_sources
from multispec.ssm.mamba2 import Mamba2Target
from multispec.ssm.zoo_pair import DRAFT_WINDOW
from multispec.targets.static_step import capacity_for, static_pair
from multispec.tree import DraftTree, ancestor_mask_from_parents

CUDA = torch.device("cuda")


# ---- inputs -------------------------------------------------------------------------------------------------


def _gen(seed: int) -> torch.Generator:
    return torch.Generator(device=CUDA).manual_seed(seed)


def _random_parents(b: int, t: int, g: torch.Generator) -> torch.Tensor:
    """Random trees (every parent index below its child's), one per row, on the GPU."""
    idx = torch.arange(t, device=CUDA)
    parents = (torch.rand(b, t, device=CUDA, generator=g) * idx).long()
    parents[:, 0] = -1
    return parents


def chain_inputs(b, k, v, with_q, g):
    p = torch.softmax(torch.randn(b, k + 1, v, device=CUDA, generator=g) * 2.5, -1)
    q = torch.softmax(torch.randn(b, k, v, device=CUDA, generator=g) * 2.5, -1) if with_q else None
    drafts = torch.where(torch.rand(b, k, device=CUDA, generator=g) < 0.6, p[:, :k].argmax(-1),
                         torch.randint(0, v, (b, k), device=CUDA, generator=g))
    num = torch.full((b,), k, device=CUDA)
    u = torch.rand(b, k, device=CUDA, generator=g)
    noise = torch.empty(b, v, device=CUDA).exponential_(generator=g)
    greedy = torch.zeros(b, dtype=torch.bool, device=CUDA)
    return drafts, num, p, q, u, noise, greedy


def tree_inputs(b, n, v, with_q, g):
    parents = _random_parents(b, n, g)
    t = n + 1
    p = torch.softmax(torch.randn(b, t, v, device=CUDA, generator=g) * 2.5, -1)
    tree = DraftTree(torch.randint(0, v, (b, n), device=CUDA, generator=g), parents,
                     torch.ones(b, n, dtype=torch.bool, device=CUDA))
    argmax = p.argmax(-1)
    follow = torch.rand(b, n, device=CUDA, generator=g) < 0.5
    tree.tokens = torch.where(follow, argmax.gather(1, tree.full_parents()[:, 1:].clamp(min=0)), tree.tokens)
    fc, ns = tree.linked()
    tokens = torch.cat([torch.zeros(b, 1, dtype=torch.long, device=CUDA), tree.tokens], 1)
    q = torch.softmax(torch.randn(b, t, v, device=CUDA, generator=g) * 2.5, -1) if with_q else None
    u = torch.rand(b, t, device=CUDA, generator=g)
    noise = torch.empty(b, v, device=CUDA).exponential_(generator=g)
    greedy = torch.zeros(b, dtype=torch.bool, device=CUDA)
    return tokens, fc, ns, p, q, u, noise, greedy


def scan_inputs(b, t, heads, p, groups, n, g, chain=False):
    parents = (torch.arange(t, device=CUDA) - 1).expand(b, t) if chain else _random_parents(b, t, g)
    x = torch.randn(b, t, heads, p, device=CUDA, generator=g)
    dt = torch.nn.functional.softplus(torch.randn(b, t, heads, device=CUDA, generator=g))
    A = -torch.rand(heads, device=CUDA, generator=g) * 2 - 0.1
    B = torch.randn(b, t, groups, n, device=CUDA, generator=g)
    C = torch.randn(b, t, groups, n, device=CUDA, generator=g)
    D = torch.randn(heads, device=CUDA, generator=g)
    h0 = torch.randn(b, heads, p, n, device=CUDA, generator=g)
    return x, dt, A, B, C, D, ancestor_mask_from_parents(parents), h0


def conv_inputs(b, t, c, k, g):
    parents = _random_parents(b, t, g)
    return (torch.randn(b, t, c, device=CUDA, generator=g), torch.randn(b, c, k, device=CUDA, generator=g), parents,
            torch.randn(c, k, device=CUDA, generator=g), torch.randn(c, device=CUDA, generator=g))


# ---- kernels ------------------------------------------------------------------------------------------------


def _ms(fn) -> float:
    from triton.testing import do_bench

    return float(do_bench(fn, warmup=25, rep=100))


def _equal(a, b, tol: float | None) -> bool:
    a, b = (a,) if isinstance(a, torch.Tensor) else a, (b,) if isinstance(b, torch.Tensor) else b
    if tol is None:
        return all(torch.equal(x, y) for x, y in zip(a, b))
    return all(torch.allclose(x.float(), y.float(), rtol=tol, atol=tol * max(1.0, y.abs().max().item()))
               for x, y in zip(a, b))


def kernel_cases(quick: bool):
    """(kernel, size, triton call, reference call, tolerance or None for exact)."""
    g = _gen(0)
    cases = []

    def add(kernel, size, fn, inputs, tol=None, **kw):
        cases.append((kernel, size, lambda: fn(*inputs, backend="triton", **kw),
                      lambda: fn(*inputs, backend="torch", **kw), tol))

    c = chain_inputs(64, 8, 32_000, False, g)
    add("chain verify greedy", "B64 K8", chain_verify_greedy, (c[0], c[1], c[2].argmax(-1)))
    add("chain verify random", "B64 K8 V128k", chain_verify_random, chain_inputs(64, 8, 128_000, False, g))
    if not quick:
        add("chain verify random", "B64 K8 V262k, q", chain_verify_random, chain_inputs(64, 8, 262_144, True, g))
    t = tree_inputs(64, 64, 32_000, False, g)
    add("tree verify greedy", "B64 T64", tree_verify_greedy, (*t[:3], t[3].argmax(-1)))
    add("tree verify random", "B64 T64 V152k, q", tree_verify_random, tree_inputs(64 if not quick else 16, 64,
                                                                                  152_064, True, g))
    for size in [(16, 64, 24, 64, 1, 128), (16, 64, 48, 64, 1, 128), (16, 128, 48, 64, 8, 128),
                 (16, 16, 16, 32, 1, 32)]:
        b, tn, h, p, gr, n = size
        add("tree SSD scan", f"B{b} T{tn} H{h} P{p} G{gr} N{n}", tree_ssd_dispatch, scan_inputs(*size, g), tol=1e-5)
    for c_ in (1792, 3328):
        xbc, state, parents, w, bias = conv_inputs(16, 64, c_, 4, g)
        src = conv_sources(parents, 4)
        add("tree conv (sources given)", f"B16 T64 C{c_} K4", tree_conv1d_dispatch, (xbc, state, parents, w, bias),
            tol=1e-5, sources=src)
        # without precomputed sources: the reference walks the tree on the host side, the kernel in-kernel
        add("tree conv (walks parents)", f"B16 T64 C{c_} K4", tree_conv1d_dispatch, (xbc, state, parents, w, bias),
            tol=1e-5)
    for r, k in ((64, 1000), (4096, 50)):
        v = 16_384
        probs = torch.softmax(torch.randn(r, v, device=CUDA, generator=g) * 3, -1)
        table = (torch.arange(v, device=CUDA)[:, None] + torch.randint(1, v, (v, k), device=CUDA, generator=g)) % v
        add("LANTERN neighbourhood", f"R{r} V16k k{k}", neighbour_mass,
            (probs, torch.randint(0, v, (r,), device=CUDA, generator=g), table,
             torch.rand(r, device=CUDA, generator=g) * 0.2), tol=1e-5)
    x = [torch.randn(4096, 99, 16, device=CUDA, generator=g) for _ in range(3)]
    add("trajectory ratio", "N4096 S99 D16", trajectory_log_ratio,
        (*x, torch.rand(99, device=CUDA, generator=g) + 0.1), tol=1e-4)
    return cases


def time_kernels(quick: bool) -> list[dict]:
    rows = []
    for kernel, size, fast, ref, tol in kernel_cases(quick):
        equal = _equal(fast(), ref(), tol)
        tri, torch_ms = _ms(fast), _ms(ref)
        rows.append({"kernel": kernel, "size": size, "triton_ms": tri, "reference_ms": torch_ms,
                     "speedup": torch_ms / tri, "equal": equal})
        print(f"{kernel:28s} {size:24s} triton {tri:8.4f} ms  reference {torch_ms:8.4f} ms  "
              f"{torch_ms / tri:6.2f}x  equal={equal}", flush=True)
    return rows


SCAN_CONFIGS = [dict(block_t=bt, block_p=bp, block_n=bn, num_warps=w)
                for bt, bp, bn, w in [(16, 64, 64, 4), (32, 64, 64, 4), (32, 32, 64, 4), (32, 64, 32, 4),
                                      (32, 64, 128, 4), (64, 64, 64, 4), (64, 64, 64, 8), (32, 64, 64, 8),
                                      (16, 32, 64, 2), (64, 32, 32, 4)]]


def sweep_scan() -> list[dict]:
    """The chunk kernel's tiles at the realistic sizes (the defaults in `tree_ssd_triton` come from here)."""
    g = _gen(1)
    rows = []
    for size in [(16, 64, 24, 64, 1, 128), (16, 64, 48, 64, 1, 128), (16, 128, 48, 64, 8, 128)]:
        args = scan_inputs(*size, g)
        want = tree_ssd_dispatch(*args[:5], args[5], args[6], args[7], backend="torch")
        for cfg in SCAN_CONFIGS:
            try:
                got = tree_ssd_triton(*args, tiles=ScanTiles(**cfg))
                ok = _equal(got, want, 1e-5)
                ms = _ms(lambda: tree_ssd_triton(*args, tiles=ScanTiles(**cfg)))
            except Exception as err:  # a tile that does not fit (shared memory) is a row, not a crash
                ok, ms = f"{type(err).__name__}: {str(err)[:80]}", float("nan")
            rows.append({"size": "B{} T{} H{} P{} G{} N{}".format(*size), **cfg, "ms": ms, "equal": ok})
            print(f"scan sweep {rows[-1]}", flush=True)
    return rows


# ---- end to end ---------------------------------------------------------------------------------------------


def _synced(fn):
    def call(ids):
        out = fn(ids)
        torch.cuda.synchronize()
        return out
    return call


PAIRS = ("stdlib-bytes", "stdlib-bytes-large", "stdlib-mamba2")


def _cuda_pairs(names: tuple[str, ...] = PAIRS) -> dict:
    """name -> (target, {row: drafter}, tokenizer, target adapter or the model), for the pairs in `names`."""
    pairs = {}
    if "stdlib-bytes" in names:
        byte = zoo.load("stdlib-bytes")
        target = byte.target.to(CUDA)
        pairs["stdlib-bytes"] = (target, {"eagle": EagleDrafter(byte.drafter.head.to(CUDA), target)},
                                 byte.tokenizer, lambda m: m)
    if "stdlib-bytes-large" in names:  # the main job's pair: a 12-layer target, its chosen chain length
        large = zoo.load("stdlib-bytes-large")
        big = large.target.to(CUDA)
        pairs["stdlib-bytes-large"] = (big, {"eagle": EagleDrafter(large.drafter.head.to(CUDA), big),
                                             "draft_model": ModelDrafter(large.draft_model.to(CUDA))},
                                       large.tokenizer, lambda m: m)
    if "stdlib-mamba2" in names:
        try:
            ssm = zoo.load("stdlib-mamba2")
            ssm_draft = zoo.load("stdlib-mamba2-ssm-draft")
            llama = zoo.load("stdlib-bytes").target.to(CUDA)
            pairs["stdlib-mamba2"] = (ssm.targets.to(CUDA), {
                "llama_draft": ModelDrafter(llama, window=DRAFT_WINDOW),
                "ssm_draft": ModelDrafter(ssm_draft.drafter.lm.model.to(CUDA))}, ssm.tokenizer, Mamba2Target)
        except Exception as err:  # e.g. a transformers too old for the SSM path: say so, time the rest
            print(f"stdlib-mamba2 skipped: {type(err).__name__}: {err}", flush=True)
    return pairs


# the chain length of each pair's EAGLE rows: 4 for the byte pair (its earlier GPU runs), the length chosen on
# the validation split for the main job's pair (`draft_shape.json`)
CHAIN_K = {"stdlib-bytes": 4, "stdlib-bytes-large": 8}


def time_pairs(quick: bool, rounds: int, static: bool = True, compiled: bool = True,
               names: tuple[str, ...] = PAIRS) -> dict:
    tables = {}
    n = 64 if quick else 128
    for name, (model, drafters, tok, adapter) in _cuda_pairs(names).items():
        k = CHAIN_K.get(name, 4)
        inputs = [ids.to(CUDA) for _, ids in prompts(tok, quick=True)]

        def spec(drafter, tree):
            return _synced(lambda ids: speculative_generate(adapter(model), drafter, ids, max_new_tokens=n,
                                                            tree=tree, stopping=StoppingConfig.never()))

        methods = {"plain": _synced(lambda ids: model.generate(ids, attention_mask=torch.ones_like(ids),
                                                               max_new_tokens=n, do_sample=False,
                                                               eos_token_id=None, pad_token_id=0))}
        methods["ar_adapter"] = spec(NGramDrafter(), 0)
        if "draft_model" in drafters:  # transformers' assisted generation with the same draft model
            methods["hf_assisted"] = _synced(lambda ids: model.generate(
                ids, attention_mask=torch.ones_like(ids), max_new_tokens=n, do_sample=False, eos_token_id=None,
                pad_token_id=0, assistant_model=drafters["draft_model"].lm.model))
        methods["ngram_chain_k4"] = spec(NGramDrafter(), 4)
        for row, drafter in drafters.items():
            methods[f"{row}_chain_k{k}"] = spec(drafter, k)
        if "eagle" in drafters and static:
            # the same EAGLE chain through the static-shape step: CUDA graphs around the plain static function,
            # and (byte pair) around its torch.compile'd form (captured and compiled on the warm-up input)
            budget = 8 if k < 8 else 16
            capacity = capacity_for(max(ids.shape[1] for ids in inputs), n, budget)
            kinds = (("graphs", False), ("compiled_graphs", True))[: 2 if name == "stdlib-bytes" and compiled else 1]
            for label, comp in kinds:
                t_s, d_s = static_pair(model, drafters["eagle"], capacity=capacity, node_budget=budget, compile=comp,
                                       cuda_graphs=True)
                methods[f"eagle_chain_k{k}_static_{label}"] = _synced(
                    lambda ids, t_s=t_s, d_s=d_s: speculative_generate(t_s, d_s, ids, max_new_tokens=n, tree=k,
                                                                       stopping=StoppingConfig.never()))
            # control: the graph step with no drafts (one token a step), so the table shows how much of the
            # static rows' speedup is the graphs (plain `generate` runs eagerly) rather than speculation
            t_0, _ = static_pair(model, NGramDrafter(), capacity=capacity, node_budget=budget, cuda_graphs=True)
            methods["no_draft_static_graphs"] = _synced(
                lambda ids: speculative_generate(t_0, NGramDrafter(), ids, max_new_tokens=n, tree=0,
                                                 stopping=StoppingConfig.never()))
        compare = lambda ref, out, ids, m=model: classify(m, sequences(ref), sequences(out))  # noqa: E731
        against = [m for m in ("ar_adapter", "no_draft_static_graphs") if m in methods]
        tables[name] = Recorder(methods, "plain", compare=compare, also_against=against).run(
            repeat(inputs, rounds), desc=f"gpu {name}")
        print(format_table(f"{name} (CUDA, batch 1, greedy)", tables[name]), flush=True)
    return tables


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--json", help="write the results here")
    ap.add_argument("--quick", action="store_true", help="fewer and smaller cases")
    ap.add_argument("--no-e2e", action="store_true", help="kernels only")
    ap.add_argument("--no-sweep", action="store_true", help="skip the tree-scan tile sweep")
    ap.add_argument("--rounds", type=int, default=3)
    ap.add_argument("--no-static", action="store_true", help="skip the static-step rows (CUDA graphs, compile)")
    ap.add_argument("--no-compiled", action="store_true", help="skip the static step's torch.compile row")
    ap.add_argument("--no-kernels", action="store_true", help="end to end only")
    ap.add_argument("--pairs", default=",".join(PAIRS), help=f"comma-separated, of {', '.join(PAIRS)}")
    args = ap.parse_args(argv)
    if not torch.cuda.is_available():
        print("benchmarks/probes/gpu.py needs a CUDA GPU", file=sys.stderr)
        return 2
    names = tuple(p for p in args.pairs.split(",") if p)
    unknown = sorted(set(names) - set(PAIRS))
    if unknown:
        ap.error(f"--pairs: unknown {', '.join(unknown)} (expected some of {', '.join(PAIRS)})")
    out = {} if args.no_kernels else {"kernels": time_kernels(args.quick)}
    if not args.no_sweep:
        out["scan_sweep"] = sweep_scan()
    tables = {} if args.no_e2e else time_pairs(args.quick, args.rounds, static=not args.no_static,
                                                   compiled=not args.no_compiled, names=names)
    res = results("gpu", {"quick": args.quick, "rounds": args.rounds, "device": torch.cuda.get_device_name(0)},
                  tables, outputs_identical=outputs_identical(tables), **out)
    if args.json:
        with open(args.json, "w") as f:
            json.dump(res, f, indent=2)
    return 0


if __name__ == "__main__":
    sys.exit(main())
