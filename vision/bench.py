"""`multispec bench vision`: the zoo VLM (`vqa-llava`) on held-out procedural VQA questions, batch 1, greedy:
plain `generate`, `transformers`' assisted generation with the zoo's small Llava as assistant and its
prompt lookup (probed first: a refusal is reported, not fatal), the same small Llava as a draft model in
our loop, and the plain-EAGLE, ViSpec and SpecVLM drafters as chains and
dynamic trees. Every output is compared with plain decoding."""

from __future__ import annotations

from collections.abc import Sequence

import torch

from multispec import DynamicTree, zoo
from multispec.bench.machine import describe, machine_info, save_results

from .evaluate import CHAIN_K, TREE, VQAItem, chain_lengths, run_vqa, vqa_methods
from .vqa_synth import generate_vqa
from .zoo_pair import DRAFTERS, NAME, TEST_SEED, load_assistant, load_drafters
from .zoo_vlm import EOS, PAD


def bench_items(count: int, seed: int = TEST_SEED) -> list[VQAItem]:
    """Held-out questions (another seed than training): half short answers, half descriptions/explanations."""
    return [VQAItem(s.image, s.question, s.answers, s.style == "short") for s in generate_vqa(count, seed=seed)]


def run(quick: bool = False, json_path: str | None = None, max_new_tokens: int | None = None,
        threads: int | None = None, chain_k: int | Sequence[int] = CHAIN_K, tree: DynamicTree | None = None,
        weights: str | None = None, drafters: tuple[str, ...] = DRAFTERS) -> dict:
    if threads:
        torch.set_num_threads(threads)
    pair = zoo.load(NAME, weights)
    model, processor = pair.target, pair.tokenizer
    loaded = load_drafters(model, weights, drafters)
    n = max_new_tokens or 200
    tree = tree or TREE
    ks = chain_lengths(chain_k)
    items = bench_items(8 if quick else 32)
    methods = vqa_methods(model, loaded, n, EOS, PAD, chain_k=chain_k, tree=tree)
    # a small VLM of the same family: transformers' assisted generation, and the same draft model in our loop
    from multispec import speculative_generate
    from multispec.drafters import ModelDrafter

    assistant = load_assistant(weights)
    stop = dict(eos_token_id=EOS, pad_token_id=PAD)
    methods["hf_assisted_small_vlm"] = lambda inputs: model.generate(
        **inputs, assistant_model=assistant, max_new_tokens=n, do_sample=False, **stop)
    small_vlm = ModelDrafter(assistant)
    for k in ks:
        methods[f"small_vlm_chain_k{k}"] = lambda inputs, k=k: speculative_generate(
            model, small_vlm, max_new_tokens=n, tree=k, **stop, **inputs)
    refusal = None
    if "hf_prompt_lookup" in methods:
        from .evaluate import probe
        refusal = probe(methods["hf_prompt_lookup"], processor(items[0].image, items[0].question))
        if refusal is not None:
            del methods["hf_prompt_lookup"]
    res = run_vqa(items, processor, methods, EOS, desc="bench vision")
    rows = res["methods"]
    chain = rows.get(f"eagle_chain_k{ks[0]}", {}).get("per_step")
    results = {"machine": machine_info(), "pair": NAME, "target_class": type(model).__name__,
               "questions": len(items), "max_new_tokens": n, "threads": torch.get_num_threads(),
               "chain_k": list(ks), "dynamic_tree": [tree.depth, tree.topk, tree.total], "batch_size": 1,
               "greedy": rows, "outputs_identical": res["outputs_identical"],
               "vqa_accuracy": rows["plain"].get("vqa_accuracy"), "anls": rows["plain"].get("anls"),
               "transformers_assisted": "assistant_model: the zoo's small Llava (measured); prompt lookup: " +
                                        ("measured" if refusal is None else f"refused ({refusal})"),
               "mean_accepted_length_definition": "tokens committed per target forward, including the bonus token"}
    if chain:  # one target forward over k+1 tokens vs one draft forward (the draft's k forwards per step)
        results["target_forward_ms"] = chain["verify_ms"]
        results["draft_forward_ms"] = round(chain["draft_ms"] / ks[0], 3)
        results["target_to_draft_cost"] = round(chain["verify_ms"] / max(1e-9, chain["draft_ms"] / ks[0]), 2)
    _print(results)
    return save_results(results, json_path)


def _print(results: dict) -> None:
    print(f"pair {results['pair']} ({results['target_class']}): {results['questions']} questions, up to "
          f"{results['max_new_tokens']} new tokens, batch 1, {results['threads']} threads")
    print(f"machine: {describe(results['machine'])}")
    print(f"{'method':26s} {'tok/s':>8s} {'vs AR':>7s} {'acc. len':>8s} {'VQA acc':>8s} "
          f"{'draft/verify/commit/other ms per step':>38s}  mismatches")
    for name, r in results["greedy"].items():
        mal = "-" if r["mean_accepted_length"] is None else f"{r['mean_accepted_length']:.2f}"
        split = "/".join(f"{v:.2f}" for v in r["per_step"].values()) if "per_step" in r else "-"
        acc = r.get("vqa_accuracy")
        print(f"{name:26s} {r['tokens_per_s']:8.2f} {r['speedup_vs_ar']:6.2f}x {mal:>8s} "
              f"{'-' if acc is None else f'{acc:.3f}':>8s} {split:>38s}  {r['mismatches_vs_plain']}")
    if "target_to_draft_cost" in results:
        print(f"one target forward {results['target_forward_ms']:.2f} ms vs one draft forward "
              f"{results['draft_forward_ms']:.2f} ms ({results['target_to_draft_cost']:.1f}x)")
    print(f"transformers assisted generation: {results['transformers_assisted']}")
    print(f"outputs_identical={results['outputs_identical']} vqa_accuracy={results['vqa_accuracy']}")


def markdown(results: dict) -> str:
    """The greedy table of a `bench vision` results JSON, as in BENCHMARKS.md."""
    rows = ["| method | tok/s | vs plain | mean accepted length | draft / verify / commit ms per step | "
            "VQA acc. (short questions) | outputs vs plain |", "| --- | --- | --- | --- | --- | --- | --- |"]
    n = results["questions"]
    for name, r in results["greedy"].items():
        mal = "-" if r["mean_accepted_length"] is None else f"{r['mean_accepted_length']:.2f}"
        split = " / ".join(f"{r['per_step'][k]:.2f}" for k in ("draft_ms", "verify_ms", "commit_ms")) \
            if "per_step" in r else "-"
        same = "reference" if name == "plain" else (f"{n} identical" if not r["mismatches_vs_plain"]
                                                    else f"{r['mismatches_vs_plain']} of {n} differ")
        acc = r.get("vqa_accuracy")
        rows.append(f"| `{name}` | {r['tokens_per_s']:.2f} | {r['speedup_vs_ar']:.2f}x | {mal} | {split} | "
                    f"{'-' if acc is None else f'{acc:.3f}'} | {same} |")
    return "\n".join(rows)
