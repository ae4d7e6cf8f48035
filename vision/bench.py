"""`multispec bench vision`: a zoo VLM (`vqa-llava`, or `--pair vqa-words-llava`) on held-out procedural VQA
questions, batch 1, greedy: plain `generate`, `transformers`' assisted generation with the zoo's small Llava
as assistant and its prompt lookup (probed first: a refusal is reported, not fatal), the same small Llava as
a draft model in our loop, and the plain-EAGLE, ViSpec and SpecVLM drafters as chains and dynamic trees.
Every output is compared with plain decoding."""

from __future__ import annotations

import torch

from multispec import StoppingConfig, speculative_generate, zoo
from multispec.plugin import (BenchOptions, LEGEND, ModelDrafter, describe, format_table, results, save_results,
                              with_role)

from .evaluate import CHAIN_K, TREE, VQAItem, chain_lengths, gate_choices, probe, run_vqa, vqa_methods
from .vqa_synth import generate_vqa
from .zoo_pair import DRAFTERS, NAME, TEST_SEED, VALIDATION_SEED, load_assistant, load_drafters
from .zoo_words import NAME as WORDS_NAME

PAIRS = (NAME, WORDS_NAME)
SPLITS = {"test": TEST_SEED, "validation": VALIDATION_SEED}
ANSWER_KINDS = ("all", "short", "long")


def bench_items(count: int, seed: int = TEST_SEED, answers: str = "all") -> list[VQAItem]:
    """Held-out questions (another seed than training): half short answers, half descriptions/explanations;
    `answers="short"` / `"long"` keeps the first `count` of one kind (from a longer run of the same stream)."""
    if answers not in ANSWER_KINDS:
        raise ValueError(f"answers: expected one of {', '.join(ANSWER_KINDS)}, got {answers!r}")
    drawn = generate_vqa(count if answers == "all" else 4 * count, seed=seed)
    items = [VQAItem(s.image, s.question, s.answers, s.style == "short") for s in drawn]
    if answers != "all":
        items = [i for i in items if i.short == (answers == "short")][:count]
    return items


def run(options: BenchOptions = BenchOptions(), pair_name: str = NAME, drafters: tuple[str, ...] = DRAFTERS,
        answers: str = "all") -> dict:
    """`pair_name`: `vqa-llava` (bytes, 64 image tokens) or `vqa-words-llava` (words, 256 image tokens);
    `options.weights`: a retrained folder of that pair (default: the shipped one); `options.split`: the test
    questions (default), or the validation ones settings are chosen on; `answers`: every question, or only short
    answers / only descriptions and explanations (the image-prefill's share of a question's time differs between
    them). Defaults: chain lengths `CHAIN_K`, tree `TREE`, 200 new tokens, 4 rounds (2 with `quick`)."""
    quick, weights, split = options.quick, options.weights, options.split or "test"
    if pair_name not in PAIRS:
        raise ValueError(f"pair: expected one of {', '.join(PAIRS)}, got {pair_name!r}")
    if split not in SPLITS:
        raise ValueError(f"split: expected one of {', '.join(SPLITS)}, got {split!r}")
    options.apply_threads()
    pair = zoo.load(pair_name, weights)
    model, processor = pair.target, pair.tokenizer
    folder = weights or zoo.path(pair_name)
    loaded = load_drafters(model, folder, drafters)
    eos, pad = processor.eos_token_id, processor.pad_token_id
    n, tree, chain_k = options.max_new_tokens or 200, options.tree or TREE, options.chain_k or CHAIN_K
    ks = chain_lengths(chain_k)
    items = bench_items(8 if quick else 32, SPLITS[split], answers)
    rounds = options.rounds_or(4, quick_default=2)
    methods = vqa_methods(model, loaded, n, eos, pad, chain_k=chain_k, tree=tree)
    # a small VLM of the same family: transformers' assisted generation, and the same draft model in our loop
    assistant = load_assistant(folder)
    stop = dict(eos_token_id=eos, pad_token_id=pad)
    methods["hf_assisted_small_vlm"] = with_role("peer", lambda inputs: model.generate(
        **inputs, assistant_model=assistant, max_new_tokens=n, do_sample=False, **stop))
    small_vlm = ModelDrafter(assistant)
    for k in ks:
        methods[f"small_vlm_chain_k{k}"] = lambda inputs, k=k: speculative_generate(
            model, small_vlm, max_new_tokens=n, tree=k, stopping=StoppingConfig(**stop), **inputs)
    refusal = None
    if "hf_prompt_lookup" in methods:
        refusal = probe(methods["hf_prompt_lookup"], processor(items[0].image, items[0].question))
        if refusal is not None:
            del methods["hf_prompt_lookup"]
    res = run_vqa(items, processor, methods, eos, desc="bench vision", rounds=rounds)
    table = res["table"]
    rows = table["methods"]
    chain = rows.get(f"eagle_chain_k{ks[0]}", {}).get("per_step_ms")
    settings = {"pair": pair_name, "target_class": type(model).__name__, "questions": len(items), "split": split,
                "answers": answers, "quick": quick,
                "max_new_tokens": n, "threads": torch.get_num_threads(), "chain_k": list(ks),
                "dynamic_tree": [tree.depth, tree.topk, tree.total], "batch_size": 1, "rounds": rounds}
    summary = {"outputs_identical": res["outputs_identical"],
               "vqa_accuracy": rows["plain"].get("quality", {}).get("vqa_accuracy"),
               "anls": rows["plain"].get("quality", {}).get("anls"),
               "transformers_assisted": "assistant_model: the zoo's small Llava (measured); prompt lookup: " +
                                        ("measured" if refusal is None else f"refused ({refusal})"),
               "mean_accepted_length_definition": "tokens committed per target forward, including the bonus token"}
    if "specvlm" in loaded:  # which compressor the gate gave each question (never silently "no image")
        summary["specvlm_gate_choices"] = gate_choices(model, loaded["specvlm"],
                                                       [processor(i.image, i.question) for i in items])
    if chain:  # one target forward over k+1 tokens vs one draft forward (the draft's k forwards per step)
        summary["target_forward_ms"] = chain["verify"]
        summary["draft_forward_ms"] = round(chain["draft"] / ks[0], 3)
        summary["target_to_draft_cost"] = round(chain["verify"] / max(1e-9, chain["draft"] / ks[0]), 2)
    out = results("vision", settings, {"greedy": table}, **summary)
    _print(out)
    return save_results(out, options.json_path)


def _print(res: dict) -> None:
    s = res["settings"]
    print(f"pair {s['pair']} ({s['target_class']}): {s['questions']} questions, up to {s['max_new_tokens']} new "
          f"tokens, batch 1, {s['threads']} threads")
    print(f"machine: {describe(res['machine'])}")
    print(format_table("greedy", res["tables"]["greedy"], columns=[("vqa_accuracy", "VQA acc")]))
    if "target_to_draft_cost" in res:
        print(f"one target forward {res['target_forward_ms']:.2f} ms vs one draft forward "
              f"{res['draft_forward_ms']:.2f} ms ({res['target_to_draft_cost']:.1f}x)")
    if "specvlm_gate_choices" in res:
        print(f"SpecVLM gate, compressor per question: {gate_line(res['specvlm_gate_choices'])}")
    print(f"transformers assisted generation: {res['transformers_assisted']}")
    print(f"outputs_identical={res['outputs_identical']} vqa_accuracy={res['vqa_accuracy']}")
    print(LEGEND)


def markdown(res: dict) -> str:
    """The greedy table of a `bench vision` results JSON, as in BENCHMARKS.md."""
    table = res["tables"]["greedy"]
    rows = ["| method | tok/s | vs plain [spread] | mean accepted length | draft / verify / commit ms per step | "
            "VQA acc. (short questions) | outputs vs plain |", "| --- | --- | --- | --- | --- | --- | --- |"]
    for name, r in table["methods"].items():
        mal = "-" if r["mean_accepted_length"] is None else f"{r['mean_accepted_length']:.2f}"
        split = " / ".join(f"{r['per_step_ms'][k]:.2f}" for k in ("draft", "verify", "commit")) \
            if "per_step_ms" in r else "-"
        outputs = r.get("outputs", {})
        differ = sum(v for k, v in outputs.items() if k != "identical")
        same = "reference" if name == table["baseline"] else (
            f"{outputs.get('identical', 0)} identical" if not differ else f"{differ} of {sum(outputs.values())} differ")
        acc = r.get("quality", {}).get("vqa_accuracy")
        lo, hi = r["speedup_spread"]
        rows.append(f"| `{name}` | {r['tokens_per_s']:.2f} | {r['speedup']:.2f}x [{lo:.2f}-{hi:.2f}] | {mal} | {split} | "
                    f"{'-' if acc is None else f'{acc:.3f}'} | {same} |")
    if "specvlm_gate_choices" in res:
        rows.append(f"\nSpecVLM gate, compressor per question: {gate_line(res['specvlm_gate_choices'])}")
    return "\n".join(rows)


def gate_line(choices: dict[str, int]) -> str:
    return ", ".join(f"{name} {count}" for name, count in choices.items())
