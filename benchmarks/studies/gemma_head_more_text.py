"""Does more training text fill the steps Gemma's prompt lookup misses? A `gemma3-270m-eagle` head trained on
`--text-multiple` times the shipped recipe's stdlib text (`multispec.zoo.gemma_recipe`, `--epochs` epochs), and
the tokens a step of its EAGLE chain and of the lookup-else-EAGLE hybrid (k = 7) on the validation prompts,
beside the shipped head's (greedy, so no timing: the same outputs, fewer or more steps). Training is skipped
when `--out` already holds a head (about 45 minutes on 2 CPU cores for 3x, 4 epochs).

    python benchmarks/studies/gemma_head_more_text.py --out DIR [--text-multiple 3] [--epochs 4] [--json PATH]
"""

from __future__ import annotations

import argparse
import json
import shutil
import tempfile
from dataclasses import replace
from pathlib import Path

import torch

from multispec import HybridDrafter, StoppingConfig, speculative_generate, zoo
from multispec.bench.machine import machine_info, save_results
from multispec.bench.text import prompts
from multispec.zoo.gemma import load_gemma
from multispec.zoo.gemma_recipe import RECIPE, TRAIN_CHARS
from multispec.zoo.train_eagle import HeadData, HeadShape, train_eagle

PAIR, K = "gemma3-270m-eagle", 7


def tokens_a_step(head_folder: Path | None) -> dict:
    """Mean accepted length per validation prompt of the EAGLE chain and the hybrid, with the pair's head
    replaced by the one in `head_folder` (None: the shipped head)."""
    folder = Path(tempfile.mkdtemp())
    shutil.copytree(zoo.path(PAIR), folder, dirs_exist_ok=True)
    if head_folder is not None:
        for name in ("eagle.safetensors", "eagle_config.json"):
            shutil.copy(head_folder / name, folder / name)
    pair = zoo.load(PAIR, folder)
    rows = {f"eagle_chain_k{K}": lambda: pair.drafter, f"hybrid_chain_k{K}": lambda: HybridDrafter(pair.drafter)}
    out = {}
    for name, make in rows.items():
        per_prompt = [speculative_generate(pair.target, make(), ids, max_new_tokens=128, tree=K,
                                           stopping=StoppingConfig.never()).stats.mean_accepted_length
                      for _, ids in prompts(pair.tokenizer, True, "validation")]
        out[name] = {"per_prompt": [round(x, 3) for x in per_prompt],
                     "mean": round(sum(per_prompt) / len(per_prompt), 3)}
    shutil.rmtree(folder)
    return out


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--out", required=True, help="the new head's folder (trained there unless it holds one)")
    parser.add_argument("--text-multiple", type=float, default=3.0)
    parser.add_argument("--epochs", type=int, default=4)
    parser.add_argument("--threads", type=int, default=2)
    parser.add_argument("--json", default=None)
    args = parser.parse_args()
    torch.set_num_threads(args.threads)
    out_dir = Path(args.out)
    if not (out_dir / "training_report.json").exists():
        target, tokenizer = load_gemma()
        train_eagle(target, lambda t: tokenizer(t, add_special_tokens=False).input_ids, out_dir,
                    shape=HeadShape(draft_vocab=8192, intermediate_size=1536, num_heads=8, kv_heads=2,
                                    sliding_window=128),
                    data=HeadData(train_chars=int(TRAIN_CHARS * args.text_multiple), vocab_chars=3_000_000),
                    train=replace(RECIPE, epochs=args.epochs), int8=True)
    report = json.loads((out_dir / "training_report.json").read_text())
    shipped = json.loads((zoo.path(PAIR) / "training_report.json").read_text())
    result = {"machine": machine_info(), "split": "validation", "chain_k": K,
              "shipped": {"train_tokens": shipped["train_tokens"], "epochs": shipped["epochs"],
                          "final_train_acc": round(shipped["history"][-1]["acc"], 4), **tokens_a_step(None)},
              "more_text": {"text_multiple": args.text_multiple, "train_tokens": report["train_tokens"],
                            "epochs": report["epochs"], "seconds": report["seconds"],
                            "final_train_acc": round(report["history"][-1]["acc"], 4), **tokens_a_step(out_dir)}}
    print(json.dumps({k: v for k, v in result.items() if k != "machine"}, indent=1))
    save_results(result, args.json)


if __name__ == "__main__":
    main()
