"""`multispec train draft` on the main job's pair, from the command line as a user runs it.

    python benchmarks/studies/train_draft_cli.py --work DIR --json benchmarks/results/train_draft_cli.json

1. `multispec zoo export stdlib-bytes-large DIR/pair`: the target as a checkpoint folder with its tokenizer.
2. The zoo's own recipe through the command: the same text (600,000 characters of the stdlib training split,
   `corpus_text("train", 600_000, seed=1)`, plus 256 sequences the target writes itself), the same head shape,
   learning rate and budget (4 epochs of 16 x 256 tokens: 650 steps) as `multispec zoo train stdlib-bytes-large`
   gave the shipped head, once `--kind eagle` and once `--kind eagle3` (equal data and steps).
3. Text the zoo never trained on (the stdlib validation split's files up to 600,000 characters), `--kind eagle`
   for 300 steps, then `multispec generate --compare` on held-out (test-split) prompts: identical output, and
   its accepted length.
4. Every head's accepted length on the validation prompts of `bench text` (greedy, chains of 4 and 8), the
   shipped head's beside them.
Stages whose output exists are not run again.
"""

from __future__ import annotations

import argparse
import json
import subprocess
import sys
import time
from pathlib import Path

import torch

from multispec import StoppingConfig, speculative_generate, zoo
from multispec.bench.machine import machine_info
from multispec.bench.text import prompts
from multispec.drafters.formats import load_eagle
from multispec.training.draft import load_target
from multispec.zoo.data import corpus_text, read_source, stdlib_files

UNSEEN_STEPS = 300  # the unseen-text head: half the recipe's budget (its bar is an accepted length of 2.0)
RECIPE = ["--steps", "650", "--batch-size", "16", "--lr", "2e-3", "--warmup-steps", "20", "--seq-len", "256",
          "--intermediate-size", "704", "--heads", "4", "--kv-heads", "2", "--draft-vocab", "256", "--self-distill", "256",
          "--checkpoint-every", "100", "--threads", "2"]


def cli(*args: str) -> float:
    """Run `multispec ARGS` in a fresh process; its wall time."""
    t0 = time.time()
    subprocess.run([sys.executable, "-m", "multispec", *args], check=True)
    return round(time.time() - t0, 1)


def train(work: Path, name: str, data: Path, kind: str, extra: list[str], steps: int = 650) -> dict:
    out = work / name
    seconds = None
    recipe = [str(steps) if i and RECIPE[i - 1] == "--steps" else a for i, a in enumerate(RECIPE)]
    if not (out / "report.json").exists() or not json.loads((out / "report.json").read_text()).get("finished"):
        seconds = cli("train", "draft", "--target", str(work / "pair" / "target"), "--data", str(data), "--out",
                      str(out), "--kind", kind, *recipe, *extra)
    report = json.loads((out / "report.json").read_text())
    return {"kind": kind, "data": str(data.name), "wall_s": seconds or report.get("seconds"),
            "final_loss": report["final_loss"], "final_acc": report["final_acc"],
            "heldout_accepted_length": report.get("accepted_length"), "sequences": report["sequences"]}


@torch.no_grad()
def accepted(target, drafter, inputs: list[torch.Tensor], k: int, n: int = 128) -> float:
    committed = forwards = 0
    for ids in inputs:
        out = speculative_generate(target, drafter, ids, max_new_tokens=n, tree=k, stopping=StoppingConfig.never())
        committed += out.stats.committed
        forwards += len(out.stats.steps)
    return round(committed / forwards, 4)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--work", required=True, help="a folder for the exported pair, the data and the heads")
    ap.add_argument("--json", default=None)
    args = ap.parse_args()
    work = Path(args.work)
    work.mkdir(parents=True, exist_ok=True)
    torch.set_num_threads(2)
    if not (work / "pair" / "target" / "config.json").exists():
        cli("zoo", "export", "stdlib-bytes-large", str(work / "pair"))
    recipe, unseen = work / "recipe.txt", work / "validation"
    if not recipe.exists():
        recipe.write_text(corpus_text("train", max_chars=600_000, seed=1))
    if not unseen.exists():  # the validation split's files, up to the recipe's 600,000 characters
        unseen.mkdir()
        chars = 0
        for f in stdlib_files("validation"):
            if chars >= 600_000:
                break
            text = read_source(f)
            (unseen / f"{f.stem}.py.txt").write_text(text)
            chars += len(text)
    runs = {"eagle_recipe": train(work, "eagle_recipe", recipe, "eagle", ["--sliding-window", "128"]),
            "eagle3_recipe": train(work, "eagle3_recipe", recipe, "eagle3", []),
            "eagle_unseen": train(work, "eagle_unseen", unseen, "eagle", ["--sliding-window", "128"],
                                  steps=UNSEEN_STEPS)}
    target, tokenizer = load_target(work / "pair" / "target")
    inputs = [ids for _, ids in prompts(tokenizer, quick=False, split="validation")]
    heads = {"shipped": zoo.load("stdlib-bytes-large").drafter, **{n: load_eagle(work / n, target) for n in runs}}
    table = {name: {f"chain_k{k}": accepted(target, d, inputs, k) for k in (4, 8)} for name, d in heads.items()}
    heldout = work / "heldout_prompts.txt"
    heldout.write_text("\n".join(read_source(f)[:600].replace("\n", "\\n") for f in stdlib_files("heldout")[:3]))
    compare = work / "generate_compare.json"
    cli("generate", "--target", str(work / "pair" / "target"), "--draft", f"eagle:{work / 'eagle_unseen'}", "--prompts",
        str(heldout), "--max-new-tokens", "128", "--tree", "8", "--compare", "--no-stream", "--json", str(compare))
    result = {"machine": machine_info(), "runs": runs, "validation_accepted_length": table,
              "validation_prompts": len(inputs), "generate_compare": json.loads(compare.read_text())}
    print(json.dumps({k: v for k, v in result.items() if k != "machine"}, indent=2))
    if args.json:
        Path(args.json).write_text(json.dumps(result, indent=2) + "\n")


if __name__ == "__main__":
    main()
