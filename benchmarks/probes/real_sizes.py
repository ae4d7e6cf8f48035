"""Speculation at real model sizes, measured against its limit, with the acceptance set rather than trained.

    python benchmarks/probes/real_sizes.py --json benchmarks/results/real_sizes_h200.json        # on a GPU
    python benchmarks/probes/real_sizes.py --dry-run --json /tmp/real_sizes_dry.json            # CPU, tiny shapes

Random-weight models of real shapes in bf16 (Llama-3-8B; Qwen2.5-VL-7B's language model behind a 1,000-token
prefix standing in for the image's tokens; a Janus-Pro-7B-shape image GPT: its language model's shape with a
16,384-code head and 576 tokens an image; Mamba-2 2.7B; a hybrid of Bamba-9B's shape). Random weights make a
trained drafter meaningless, so the drafter is `ControlledDrafter`: the target's own greedy continuation, each
token right with probability `acceptance`. Per shape and batch size, in interleaved rounds: `transformers`'
`generate`, our step without drafts (a chain of 0), and speculation with chains of k and one static tree (a
`StaticTree.full` branching, each rank an independent guess) at each acceptance; the step is the fixed-shape
one (`step="static"`: CUDA graphs on CUDA; every class here has it), else eager (named in the row).
Efficiency = measured speedup over our step without drafts / its limit, the limit being accepted length x
one-token step time / the (k+1)-node verify time (drafting free), both verify times measured on the same
engine (a tree's priced with a chain of as many nodes).

`--dry-run`: the same code on the CPU at tiny shapes of the same classes (fp32, a few tokens), every
speculative output checked equal to `generate`; CI runs it (tests/bench/test_real_sizes.py). `--rehearse`: the
real widths, vocabularies and prompts in bf16 on the CPU with `--layers` layers (default 1) and `--new-tokens`
(default 8), to find what only the real shapes or bf16 break before a device's minutes are spent (outputs are
reported, not required equal: bf16 near-ties).
"""

from __future__ import annotations

import argparse
import gc
import json
import statistics
import sys
import time
from dataclasses import dataclass, field

import torch

from multispec import EngineConfig, NGramDrafter, Prompt, StaticTree, StoppingConfig, speculative_generate
from multispec.bench.machine import machine_info
from multispec.drafters.controlled import ControlledDrafter
from multispec.targets import as_target
from multispec.targets.static import static_engines


@dataclass(frozen=True)
class Shape:
    """A model shape: `kind` (llama, qwen2, mamba2, bamba), its config fields at the real size, the prompt's
    length (a prefix standing in for image tokens where the row says so) and the tokens generated."""

    name: str
    kind: str
    fields: dict = field(hash=False)
    prompt: int = 64
    new_tokens: int = 128
    note: str = ""


SHAPES = (
    Shape("llama3-8b", "llama", dict(hidden_size=4096, intermediate_size=14336, num_hidden_layers=32,
                                     num_attention_heads=32, num_key_value_heads=8, vocab_size=128256,
                                     rope_parameters=dict(rope_type="llama3", rope_theta=500000.0, factor=8.0,
                                                          low_freq_factor=1.0, high_freq_factor=4.0,
                                                          original_max_position_embeddings=8192))),
    Shape("qwen2.5-vl-7b-lm", "qwen2", dict(hidden_size=3584, intermediate_size=18944, num_hidden_layers=28,
                                            num_attention_heads=28, num_key_value_heads=4, vocab_size=152064),
          prompt=1064, note="the VLM's language model (Qwen2 shape) after a 1,000-token prefix for the image"),
    Shape("janus-pro-7b-gpt", "llama", dict(hidden_size=4096, intermediate_size=11008, num_hidden_layers=30,
                                            num_attention_heads=32, num_key_value_heads=32, vocab_size=16384),
          prompt=32, new_tokens=576, note="its language model's shape with a 16,384-code head, one 24x24 image"),
    Shape("mamba2-2.7b", "mamba2", dict(hidden_size=2560, num_hidden_layers=64, num_heads=80, head_dim=64,
                                        state_size=128, n_groups=1, vocab_size=50288)),
    Shape("bamba-9b", "bamba", dict(hidden_size=4096, intermediate_size=14336, num_hidden_layers=32,
                                    num_attention_heads=32, num_key_value_heads=8, attn_layer_indices=[9, 18, 27],
                                    mamba_n_heads=128, mamba_d_head=64, mamba_n_groups=1, mamba_d_state=128,
                                    vocab_size=128000)),
)

TINY = dict(llama=dict(hidden_size=64, intermediate_size=128, num_hidden_layers=2, num_attention_heads=4,
                       num_key_value_heads=2, vocab_size=256),
            qwen2=dict(hidden_size=64, intermediate_size=128, num_hidden_layers=2, num_attention_heads=4,
                       num_key_value_heads=2, vocab_size=256),
            mamba2=dict(hidden_size=64, num_hidden_layers=2, num_heads=8, head_dim=16, state_size=16, n_groups=2,
                        vocab_size=256, chunk_size=16),
            bamba=dict(hidden_size=64, intermediate_size=128, num_hidden_layers=4, num_attention_heads=4,
                       num_key_value_heads=2, attn_layer_indices=[1, 3], mamba_n_heads=8, mamba_d_head=16,
                       mamba_n_groups=2, mamba_d_state=16, mamba_chunk_size=16, vocab_size=256))


def build(shape: Shape, device: torch.device, dtype: torch.dtype, tiny: bool, layers: int | None = None
          ) -> torch.nn.Module:
    """A random-weight model of `shape` (of its tiny stand-in with `tiny`; with `layers`, its real widths cut to
    that many layers, a hybrid keeping its last one attention), built on `device` in `dtype`."""
    import transformers

    classes = dict(llama="Llama", qwen2="Qwen2", mamba2="Mamba2", bamba="Bamba")[shape.kind]
    fields = dict(shape.fields)
    if layers is not None:
        fields["num_hidden_layers"] = layers
        if "attn_layer_indices" in fields:
            fields["attn_layer_indices"] = [i for i in fields["attn_layer_indices"] if i < layers - 1] + [layers - 1]
    if tiny:
        fields = {k: v for k, v in fields.items() if k == "rope_parameters"} | TINY[shape.kind]
        if "rope_parameters" in fields:
            fields["rope_parameters"] = dict(fields["rope_parameters"], original_max_position_embeddings=32)
    config = getattr(transformers, f"{classes}Config")(**fields, tie_word_embeddings=False, bos_token_id=1,
                                                       eos_token_id=2, pad_token_id=0)
    if shape.kind in ("llama", "qwen2", "bamba"):
        config.max_position_embeddings = max(4096, shape.prompt + shape.new_tokens + 64)
    torch.manual_seed(0)
    default = torch.get_default_dtype()
    torch.set_default_dtype(dtype)  # initialised in `dtype` on `device`: 8B parameters never exist in fp32
    try:
        with torch.device(device):
            model = getattr(transformers, f"{classes}ForCausalLM")(config)
    finally:
        torch.set_default_dtype(default)
    with torch.no_grad():  # sharper logits than the init's, so greedy paths are not near-ties
        model.get_output_embeddings().weight.mul_(4.0)
    return model.eval()


def _synced(device: torch.device):
    if device.type == "cuda":
        torch.cuda.synchronize(device)


def timed(fn, device: torch.device) -> tuple[float, object]:
    _synced(device)
    t0 = time.perf_counter()
    out = fn()
    _synced(device)
    return time.perf_counter() - t0, out


@torch.no_grad()
def verify_times(model, step: str, ids: torch.Tensor, widths: list[int], reps: int) -> dict[int, float]:
    """Seconds one verification of n chain nodes costs on the engine `step` runs (median of `reps`), after the
    prompt: the numbers the limit is priced with."""
    if step == "eager":
        engine = as_target(model)
    else:
        engine, _ = static_engines(model, NGramDrafter(), step, ids.shape[1], 8, max(widths))
    device = ids.device
    out = {}
    for n in widths:
        engine.prefill(Prompt.build(ids, torch.ones_like(ids)))
        toks = ids[:, -n:].clone()
        parents = torch.arange(-1, n - 1, device=device).expand(ids.shape[0], -1)
        times = []
        for _ in range(reps + 2):  # the first scores capture or compile
            t, _ = timed(lambda: engine.score(toks, parents), device)
            engine.discard()
            times.append(t)
        out[n] = statistics.median(times[2:])
    return out


def fastest_step(model, prompt_len: int, n: int, k: int) -> str:
    """"static" where the class has a fixed-shape step, else "eager"."""
    try:
        static_engines(model, NGramDrafter(), "static", prompt_len, n, k)
        return "static"
    except ValueError:
        return "eager"


def methods_for(model, ids: torch.Tensor, n: int, step: str, chains: list[int], acceptances: list[float],
                device: torch.device, tree: list[int] | None = None) -> tuple[dict, torch.Tensor]:
    """The timed calls by name (generate, our step without drafts, each chain and the tree at each acceptance)
    and the reference output: our step's own greedy path without drafts, the continuation the drafter knows. In
    bf16 it can part from `generate`'s at a near-tie (other kernels, other rounding); speculation is lossless
    against the step it runs on, and a drafter that knew `generate`'s path would be wrong after the parting."""
    engine, never = EngineConfig(step=step), StoppingConfig.never()

    def plain():
        return model.generate(ids, attention_mask=torch.ones_like(ids), max_new_tokens=n, min_new_tokens=n,
                              do_sample=False, eos_token_id=None, pad_token_id=0)

    def no_draft():
        return speculative_generate(model, NGramDrafter(), ids, max_new_tokens=n, tree=0, stopping=never,
                                    engine=engine)

    _, reference = timed(no_draft, device)  # warm-up, and the continuation the drafter knows
    reference = reference.sequences
    continuation = reference[:, ids.shape[1]:].cpu()
    methods = {"generate": plain, "no_draft": no_draft}
    for k in chains:
        for p in acceptances:
            methods[f"chain_k{k}_p{p}"] = (lambda k=k, p=p: speculative_generate(
                model, ControlledDrafter(model, p, n, continuation=continuation), ids, max_new_tokens=n, tree=k,
                stopping=never, engine=engine))
    for p in acceptances if tree else ():
        methods[f"tree_{'x'.join(map(str, tree))}_p{p}"] = (lambda p=p: speculative_generate(
            model, ControlledDrafter(model, p, n, continuation=continuation), ids, max_new_tokens=n,
            tree=StaticTree.full(tree), stopping=never, engine=engine))
    return methods, reference


def tree_nodes(branching: list[int]) -> int:
    """Draft nodes of `StaticTree.full(branching)`."""
    total, level = 0, 1
    for width in branching:
        level *= width
        total += level
    return total


def rows_of(seconds: dict, outputs: dict, reference: torch.Tensor, verify: dict, tokens: int,
            tree: list[int] | None = None) -> list[dict]:
    """Per method: tok/s, ratios over `generate` and over our step without drafts (medians over rounds),
    whether its output equals the reference (our step's greedy path: `methods_for`); per chain also its
    accepted length, limit and efficiency."""
    no_draft, plain = statistics.median(seconds["no_draft"]), statistics.median(seconds["generate"])
    rows = []
    for name, ts in seconds.items():
        t = statistics.median(ts)
        out = outputs[name]
        sequences = out if isinstance(out, torch.Tensor) else out.sequences
        row = dict(method=name, tok_s=round(tokens / t, 2), seconds=[round(x, 4) for x in ts],
                   vs_generate=round(plain / t, 3), vs_no_draft=round(no_draft / t, 3),
                   identical=bool(torch.equal(sequences[:, : reference.shape[1]].cpu(), reference.cpu())))
        if name.startswith(("chain_", "tree_")):
            k = int(name.split("_")[1][1:]) if name.startswith("chain_") else tree_nodes(tree)
            accepted = out.stats.mean_accepted_length
            # the most a step can gain over one without drafts: its tokens at the cost of a (k+1)-node verify (no
            # cheaper than a 1-node one: a timing below that is noise), so never above the accepted length
            limit = accepted * verify[1] / max(verify[1], verify[k + 1])
            row.update(accepted_length=round(accepted, 3), limit=round(limit, 3),
                       efficiency=round(row["vs_no_draft"] / limit, 3))
        rows.append(row)
    return rows


@dataclass(frozen=True)
class Plan:
    """What every shape runs: chain rows of `chains` at each of `acceptances`, the static `tree` (branching per
    depth; None: no tree row), `rounds` interleaved timed rounds; `tiny`: the dry run's tiny widths; `layers` /
    `new_tokens`: cut every shape to that many (None: the shape's own)."""

    chains: list[int]
    acceptances: list[float]
    rounds: int
    tiny: bool
    tree: list[int] | None = None
    layers: int | None = None
    new_tokens: int | None = None


def run_shape(shape: Shape, batch: int, plan: Plan, device: torch.device, dtype: torch.dtype) -> dict:
    chains, acceptances, rounds, tiny, tree = plan.chains, plan.acceptances, plan.rounds, plan.tiny, plan.tree
    layers, new_tokens = plan.layers, plan.new_tokens
    model = build(shape, device, dtype, tiny, layers)
    prompt_len = 12 if tiny else shape.prompt
    n = 16 if tiny else new_tokens or shape.new_tokens
    vocab = model.get_output_embeddings().weight.shape[0]
    ids = torch.randint(3, vocab, (batch, prompt_len), generator=torch.Generator().manual_seed(1)).to(device)
    widest = max([*chains, tree_nodes(tree) if tree else 0])
    step = fastest_step(model, prompt_len, n, widest)
    methods, reference = methods_for(model, ids, n, step, chains, acceptances, device, tree)
    for fn in methods.values():  # warm-up: captures, compiles, allocations
        fn()
    seconds: dict[str, list[float]] = {m: [] for m in methods}
    outputs: dict[str, object] = {}
    for _ in range(rounds):  # interleaved: load drifts hit every method alike
        for name, fn in methods.items():
            t, outputs[name] = timed(fn, device)
            seconds[name].append(t)
    widths = [1] + [k + 1 for k in chains] + ([tree_nodes(tree) + 1] if tree else [])
    verify = verify_times(model, step, ids, sorted(set(widths)), reps=3 if tiny else 10)
    return dict(shape=shape.name, note=shape.note, batch=batch, step=step, prompt=prompt_len, new_tokens=n, layers=layers,
                verify_seconds={str(k): round(v, 6) for k, v in verify.items()},
                tree=tree, rows=rows_of(seconds, outputs, reference, verify, batch * n, tree))


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--json", help="write the results here")
    ap.add_argument("--dry-run", action="store_true", help="tiny shapes on the CPU, outputs checked")
    ap.add_argument("--shapes", default=",".join(s.name for s in SHAPES))
    ap.add_argument("--batches", default="1,8")
    ap.add_argument("--chains", default="2,4,8")
    ap.add_argument("--acceptances", default="0.6,0.8,0.9")
    ap.add_argument("--tree", default="2,2,1,1", help="the static tree's branching per depth ('' for none)")
    ap.add_argument("--rounds", type=int, default=3)
    ap.add_argument("--rehearse", action="store_true", help="real widths in bf16 on the CPU, few layers and tokens")
    ap.add_argument("--layers", type=int, default=None, help="cut every shape to this many layers (--rehearse: 1)")
    ap.add_argument("--new-tokens", type=int, default=None, help="tokens generated (--rehearse: 8)")
    args = ap.parse_args(argv)
    if args.rehearse and args.dry_run:
        ap.error("--rehearse: the real widths; --dry-run: tiny ones; choose one")
    if args.rehearse:
        args.layers, args.new_tokens = args.layers or 1, args.new_tokens or 8
    device = torch.device("cpu" if args.dry_run or args.rehearse else "cuda")
    if device.type == "cuda" and not torch.cuda.is_available():
        ap.error("no CUDA device: run with --dry-run or --rehearse on the CPU")
    dtype = torch.float32 if args.dry_run else torch.bfloat16
    names = args.shapes.split(",")
    unknown = [s for s in names if s not in {x.name for x in SHAPES}]
    if unknown:
        ap.error(f"--shapes: unknown {unknown}; known: {[s.name for s in SHAPES]}")
    plan = Plan([int(k) for k in args.chains.split(",")], [float(p) for p in args.acceptances.split(",")],
                args.rounds, args.dry_run, [int(w) for w in args.tree.split(",")] if args.tree else None, args.layers,
                args.new_tokens)
    results = []
    for shape in [s for s in SHAPES if s.name in names]:
        for batch in [int(b) for b in args.batches.split(",")]:
            try:
                result = run_shape(shape, batch, plan, device, dtype)
            except Exception as e:  # on a GPU, one shape's failure must not lose the others' figures
                if args.dry_run or args.rehearse:
                    raise
                print(f"{shape.name} B{batch}: {type(e).__name__}: {e}", file=sys.stderr, flush=True)
                results.append(dict(shape=shape.name, batch=batch, error=f"{type(e).__name__}: {e}"))
                continue
            results.append(result)
            gc.collect()  # the shape's model (and the engines kept on it) before the next one is built
            if device.type == "cuda":
                torch.cuda.empty_cache()
            for row in result["rows"]:
                extra = (f"  acc {row['accepted_length']:.2f}  limit {row['limit']:.2f}x  efficiency "
                         f"{row['efficiency']:.0%}" if "limit" in row else "")
                print(f"{shape.name:18s} B{batch} {result['step']:6s} {row['method']:16s} {row['tok_s']:9.1f} tok/s"
                      f"  {row['vs_generate']:5.2f}x generate  {row['vs_no_draft']:5.2f}x no-draft{extra}"
                      f"{'' if row['identical'] else '  (output differs)'}", flush=True)
            if args.dry_run:
                differ = [r["method"] for r in result["rows"] if not r["identical"]]
                if differ:
                    print(f"dry run: {shape.name} B{batch}: outputs differ from generate: {differ}", file=sys.stderr)
                    return 1
    if args.json:
        with open(args.json, "w") as f:
            json.dump(dict(machine=machine_info(), dry_run=args.dry_run, args=vars(args), results=results), f,
                      indent=1)
    return 0


if __name__ == "__main__":
    sys.exit(main())
