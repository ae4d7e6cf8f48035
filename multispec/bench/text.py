"""Text speed benchmark on a zoo pair (`multispec bench text`).

Same prompts for every method: held-out CPython stdlib files (never trained on) and natural-language
prompts. Greedy: plain decoding, `transformers` prompt lookup (and assisted generation with the pair's small
draft model, where it has one), our n-gram drafter, the draft model as a chain, our EAGLE drafter
as a chain and as a dynamic tree, the hybrid (prompt lookup when it matches, EAGLE otherwise), Token
Recycling and SuffixDecoding; each output is compared with plain greedy, and a differing token is classified
as a floating-point near-tie when the target's top-2 logit gap there is below 1e-4. Sampling (temperature
0.8): speed and acceptance only (correctness is the core's chi-square tests). Timed through the recorder
(`multispec.bench.recorder`): warm-up on the same prompts, methods interleaved in repeated rounds.
"""

from __future__ import annotations


import torch

from .. import (Chain, DynamicTree, HybridDrafter, ModelDrafter, NGramDrafter, SuffixDecodingDrafter,
                 TokenRecyclingDrafter, speculative_generate)
from .. import zoo
from ..zoo.data import _shuffled, read_source, stdlib_files
from ..targets.lean import lean_unsupported
from ..targets.lm_head import fast_head_applies, tall_lm_head
from ..drafters.recycling import cpu_tree, tree_to_text
from ..draft_length import calibrate, describe_choice
from .machine import describe, save_results
from .recorder import (LEGEND, Fresh, Recorder, format_table, outputs_identical, repeat, results,
                       sequences)

NATURAL = [
    "The history of the printing press begins in the fifteenth century, when",
    "To make a good cup of tea, first",
    "Photosynthesis is the process by which plants",
    "Dear committee members, I am writing to",
]
NATURAL_VALIDATION = [  # where settings are chosen; NATURAL is the test split's
    "The river had flooded twice that spring, and the villagers",
    "A good recipe for bread needs only four ingredients:",
]
NEAR_TIE = 1e-4


PROMPT_CHARS = 1200


def prompt_files(split: str, count: int) -> list:
    """`count` stdlib files of `split` to prompt with: the held-out (test) files in order, or validation files
    long enough for a full prompt, in a fixed pseudo-random order."""
    if split == "heldout":
        return stdlib_files("heldout")[:count]
    files = [f for f in _shuffled(stdlib_files(split), seed=2) if len(read_source(f)) >= 2 * PROMPT_CHARS]
    return files[:count]


def prompts(tokenizer, quick: bool, split: str = "heldout") -> list[tuple[str, torch.Tensor]]:
    """Code prompts (the first 1200 characters of stdlib files of `split`) and natural-language ones."""
    if split not in ("heldout", "validation"):
        raise ValueError(f"split: expected 'heldout' (test) or 'validation', got {split!r}")
    out = [(f"stdlib:{f.name}", read_source(f)[:PROMPT_CHARS]) for f in prompt_files(split, 2 if quick else 6)]
    natural = NATURAL if split == "heldout" else NATURAL_VALIDATION
    tag = "natural" if split == "heldout" else "natural-validation"
    out += [(f"{tag}:{i}", t) for i, t in enumerate(natural[: 1 if quick else 4])]
    return [(name, tokenizer(text, return_tensors="pt")["input_ids"]) for name, text in out]


@torch.no_grad()
def classify(target, reference: torch.Tensor, other: torch.Tensor) -> str:
    """'identical', 'near-tie' (first difference at a target top-2 gap < 1e-4) or 'mismatch'."""
    if torch.equal(reference, other):
        return "identical"
    n = min(reference.shape[1], other.shape[1])
    diff = (reference[0, :n] != other[0, :n]).nonzero()
    if len(diff) == 0:
        return "mismatch"  # one is a prefix of the other: lengths differ
    pos = int(diff[0])
    logits = target(reference[:, :pos]).logits[0, -1].float()
    top2 = torch.topk(logits, 2).values
    return "near-tie" if float(top2[0] - top2[1]) < NEAR_TIE else "mismatch"


def _with_fast_head(model, fn):
    with tall_lm_head(model):
        return fn()


def _corpus(tokenizer, chars: int) -> list[list[int]]:
    """The stdlib training split (never the held-out prompts) as token documents, for SuffixDecoding."""
    docs, total = [], 0
    for path in stdlib_files("train"):
        text = read_source(path)
        docs.append(tokenizer(text)["input_ids"])
        total += len(text)
        if total >= chars:
            break
    return [d if isinstance(d, list) else list(d) for d in docs]


def run(pair_name: str = "stdlib-bytes-large", quick: bool = False, json_path: str | None = None,
        max_new_tokens: int | None = None, temperature: float = 0.8, threads: int | None = None,
        chain_k: int | str | None = None, tree: DynamicTree | None = None, corpus_chars: int = 1_000_000,
        rounds: int = 3, compile: bool = False, split: str = "heldout", only: tuple[str, ...] | None = None) -> dict:
    """`chain_k` / `tree`: the draft shape of the chain and tree rows (default: for a pair with step profiles
    "auto", the chain length predicted best on this machine from them and the verification cost measured
    here, with the padding that cost favours (`multispec.draft_length`); else the pair's, chosen on the
    validation split, else 4 and 4/4/15). `compile`: also the EAGLE rows with `step="compiled"` (the static
    step under `torch.compile`), for pairs whose target the lean engine runs. `split`: the prompts' split,
    'heldout' (test: the reported figures) or 'validation'. `only`: the rows to run (plain decoding and the
    peers always run); a name no table has raises before anything is timed."""
    if threads:
        torch.set_num_threads(threads)
    pair = zoo.load(pair_name)
    target, eagle, tok = pair.target, pair.drafter, pair.tokenizer
    if compile and lean_unsupported(target) is not None:
        raise ValueError(f"--compile: the compiled step runs Llama-family targets; {pair_name}'s target "
                         f"cannot ({lean_unsupported(target)})")
    ps = prompts(tok, quick, split)
    n = max_new_tokens or 128  # --quick: fewer prompts, not fewer tokens (short runs measure the prefill)
    choice = None
    if chain_k == "auto" or (chain_k is None and pair.step_profiles):
        if not pair.step_profiles:
            raise ValueError(f"--chain-k auto: {pair_name} has no step profiles (benchmarks/choose_draft_shape.py "
                             "--write-profile records them)")
        prefix = sum(ids.shape[1] for _, ids in ps) // len(ps) + n // 2  # a mid-generation context
        choice = calibrate(target, pair.step_profiles, prefix_tokens=prefix, request=eagle.feature_request)
        print(describe_choice(choice))
        chain_k = choice.chain_k
    chain_k = chain_k or pair.chain_k or 4
    # 16 verified nodes: on CPUs Gemma's LM-head GEMM costs about the same for 16 rows as for 8
    tree = tree or pair.tree or DynamicTree(depth=4, topk=4, total=15)
    recycling_tree = pair.recycling_tree or cpu_tree()  # the pair's, chosen on validation, else the CPU default
    no_eos = dict(eos_token_id=[], pad_token_id=0)
    hf_no_eos = dict(eos_token_id=None, pad_token_id=0)
    # The training-free drafters keep what they learn across the prompts of a round (Token Recycling's hot
    # start, SuffixDecoding's earlier outputs), as they would across a user's requests, and start over at
    # every round (`Fresh`). Each row has its own instance: one that saw another row's output for the same
    # prompt would draft it back verbatim.
    corpus = _corpus(tok, corpus_chars) if corpus_chars else None

    def suffix():
        return SuffixDecodingDrafter(corpus=corpus)

    # with a calibrated length, the row whose steps the calibration profiled (the pair's profiled drafter, EAGLE
    # or n-gram, chained at that length) pads its steps as the measured cost found cheaper, and so does the suffix
    # chain of that length (its steps verify the same widths, 1 to k+1 nodes). Other rows are not
    # padded: their widths were never profiled, and a width's single cost reading is noisy (padding Token
    # Recycling's 2-node steps to 5 cost it 1.19x -> 1.04x on validation,
    # benchmarks/results/padding_control_recycling_stdlib-bytes-large.json)
    pads = {"pad_widths": choice.pad_widths} if choice and choice.pad_widths else {}
    profiled = pair.profiled_drafter or "eagle"
    padded_rows = [f"{profiled}_chain_k{chain_k}", f"suffix_chain_k{chain_k}", f"hybrid_ngram_suffix_k{chain_k}"] \
        if pads else []

    def ours(drafter, spec, padded=False, **kw):
        """`drafter`: a drafter instance, or a factory called for every prompt (a drafter whose state is
        one prompt's); `padded`: a profiled row, padded as calibrated."""
        extra = pads if padded and kw.get("step", "eager") == "eager" else {}
        return lambda ids: speculative_generate(target, drafter() if callable(drafter) else drafter, ids,
                                                max_new_tokens=n, tree=spec, **no_eos, **extra, **kw)

    def fresh(make_drafter, spec, **kw):
        """A drafter that learns across the prompts of a round, and starts over at the next round."""
        return Fresh(lambda: ours(make_drafter(), spec, **kw))

    # control: our engine with no drafts (an empty chain each step), so the table shows how much of a
    # speedup is the engine (the lean forward, one host read a step) rather than speculation
    no_draft = ours(NGramDrafter, 0)
    greedy = {
        "plain": lambda ids: target.generate(ids, max_new_tokens=n, do_sample=False, **hf_no_eos),
        "no_draft": no_draft,
        "hf_prompt_lookup": lambda ids: target.generate(ids, max_new_tokens=n, do_sample=False,
                                                        prompt_lookup_num_tokens=5, **hf_no_eos),
    }
    draft = pair.draft_model  # a small model of the same tokenizer, where the pair has one
    if draft is not None:
        greedy["hf_assisted"] = lambda ids: target.generate(ids, max_new_tokens=n, do_sample=False,
                                                            assistant_model=draft, **hf_no_eos)
    if fast_head_applies(target):
        # control: the model's own decoding through the LM-head layout MULTISPEC_FAST_HEAD opted into (our
        # adapter uses it too), so the table shows how much of a speedup is that layout alone
        greedy["plain_fast_head"] = lambda ids: _with_fast_head(target, lambda: target.generate(
            ids, max_new_tokens=n, do_sample=False, **hf_no_eos))
    greedy |= {
        # the same lookup as transformers' row (5 tokens), then at the chain length of the other rows
        "ngram_chain": ours(NGramDrafter, 5),
        f"ngram_chain_k{chain_k}": ours(NGramDrafter, chain_k, padded=profiled == "ngram"),
        **({f"draft_chain_k{chain_k}": ours(ModelDrafter(draft), chain_k)} if draft is not None else {}),
        f"eagle_chain_k{chain_k}": ours(eagle, chain_k, padded=profiled == "eagle"),
        "eagle_chain_adaptive": ours(eagle, Chain(2 * chain_k, min_prob=0.3)),
        "eagle_dynamic_tree": ours(eagle, tree),
        f"hybrid_chain_k{chain_k}": ours(lambda: HybridDrafter(eagle), chain_k),
        "hybrid_dynamic_tree": ours(lambda: HybridDrafter(eagle), tree),
        "recycling_tree": fresh(TokenRecyclingDrafter, recycling_tree),
        "suffix_chain": fresh(suffix, 16),
        # the calibrated length: a chain of the profiled row's widths (1 to k+1 nodes), so the same padding fits
        f"suffix_chain_k{chain_k}": fresh(suffix, chain_k, padded=bool(pads)),
        "suffix_tree": fresh(suffix, DynamicTree(depth=4, topk=4, total=16)),
        f"hybrid_suffix_eagle_k{chain_k}": fresh(lambda: HybridDrafter(eagle, lookup=suffix(), lookup_k=8), chain_k),
        # prompt lookup first (the row's own latest match), the corpus's most frequent continuation where it finds
        # nothing: the suffix chain alone prefers corpus continuations where the row's own text was right
        f"hybrid_ngram_suffix_k{chain_k}": fresh(lambda: HybridDrafter(suffix(), lookup_k=chain_k), chain_k,
                                                 padded=bool(pads)),
    }
    if compile:
        greedy[f"eagle_chain_k{chain_k}_compiled"] = ours(eagle, chain_k, step="compiled")
        greedy["eagle_dynamic_tree_compiled"] = ours(eagle, tree, step="compiled")
    if only is not None:
        greedy = keep_rows(greedy, only, ["plain", *peers_of(greedy)], "greedy")
    inputs = [ids for _, ids in ps]
    # warm up on the longest prompt: the compiled step's buffers are sized there, so no timed call rebuilds
    # them; with compiled rows on every prompt (each padded width compiles once, when a step first needs it)
    warmup = sorted(inputs, key=lambda ids: -ids.shape[1]) if compile else [max(inputs, key=lambda ids: ids.shape[1])]
    compare = lambda ref, out, ids: classify(target, sequences(ref), sequences(out))  # noqa: E731
    peers = peers_of(greedy)
    tables = {"greedy": Recorder(greedy, "plain", compare=compare, also_against=peers)
              .run(repeat(inputs, rounds), warmup=warmup, desc="greedy")}

    g = torch.Generator().manual_seed(0)
    sample = dict(do_sample=True, temperature=temperature, generator=g)
    sampling = {
        "plain": lambda ids: target.generate(ids, max_new_tokens=n, do_sample=True, temperature=temperature,
                                             top_k=0, **hf_no_eos),
        "no_draft": ours(NGramDrafter, 0, **sample),
        **({f"draft_chain_k{chain_k}": ours(ModelDrafter(draft), chain_k, **sample)} if draft is not None else {}),
        f"eagle_chain_k{chain_k}": ours(eagle, chain_k, padded=profiled == "eagle", **sample),
        "eagle_dynamic_tree": ours(eagle, tree, **sample),
        f"hybrid_chain_k{chain_k}": ours(lambda: HybridDrafter(eagle), chain_k, **sample),
        "suffix_tree": fresh(suffix, DynamicTree(depth=4, topk=4, total=16), **sample),
    }
    if compile:
        sampling[f"eagle_chain_k{chain_k}_compiled"] = ours(eagle, chain_k, step="compiled", **sample)
    if only is not None:
        sampling = keep_rows(sampling, only, ["plain", "no_draft"], "sampling")
    torch.manual_seed(0)
    tables["sampling"] = Recorder(sampling, "plain", also_against=["no_draft"]).run(
        repeat(inputs, rounds), warmup=warmup, desc="sampling")
    settings = {"pair": pair_name, "quick": quick, "max_new_tokens": n, "temperature": temperature,
                "prompts": [p for p, _ in ps], "threads": torch.get_num_threads(), "chain_k": chain_k,
                "dynamic_tree": [tree.depth, tree.topk, tree.total],
                "recycling_tree": tree_to_text(recycling_tree), "corpus_chars": corpus_chars, "rounds": rounds,
                "compile": compile, "split": split, "methods": list(only) if only else "all",
                "chain_k_by": "calibrated here" if choice else "given or the pair's stored choice"}
    if choice is not None:
        settings["chain_k_calibration"] = {"verify_ms": {str(m): round(v, 2) for m, v in choice.cost.ms.items()},
                                           "pad_widths": {str(m): w for m, w in choice.pad_widths.items()},
                                           "padded_rows": padded_rows,
                                           "predicted_speedup_vs_no_draft": {str(k): v for k, v in
                                                                             choice.predicted.items()}}
    out = results("text", settings, tables, outputs_identical=outputs_identical(tables))
    _print(out)
    return save_results(out, json_path)


def peers_of(greedy: dict) -> list[str]:
    """The greedy table's other baselines, where it has them: our engine without drafts, transformers'."""
    return [p for p in ("no_draft", "hf_prompt_lookup", "hf_assisted") if p in greedy]


def keep_rows(methods: dict, only: tuple[str, ...], always: list[str], table: str) -> dict:
    """`methods` restricted to `only` (and `always`, the baseline and peers); unknown names fail in the greedy
    table (which holds every row name) with the rows there are."""
    if table == "greedy":
        unknown = [n for n in only if n not in methods]
        if unknown:
            raise ValueError(f"--methods: no row {', '.join(unknown)}; rows: {', '.join(methods)}")
    return {name: fn for name, fn in methods.items() if name in only or name in always}


def _print(res: dict) -> None:
    s = res["settings"]
    print(f"pair {s['pair']}: {len(s['prompts'])} prompts x {s['max_new_tokens']} new tokens, {s['threads']} threads")
    print(f"machine: {describe(res['machine'])}")
    print(format_table("greedy", res["tables"]["greedy"]))
    print(format_table(f"sampling T={s['temperature']}", res["tables"]["sampling"]))
    print(f"outputs_identical={res['outputs_identical']} (greedy rows against plain decoding; a near-tie is a "
          f"first difference where the target's top-2 logit gap is below {NEAR_TIE})")
    print(LEGEND)
