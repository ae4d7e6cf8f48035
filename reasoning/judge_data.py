"""Training data for judge verification, labelled automatically on problems with checkable answers.

Greedy speculative decoding of the base model with the small model as drafter; wherever the exact rule
rejects a draft token (the first divergence in a step), the divergent token is tried: the text up to it,
the token, then the base model's own greedy continuation to the end. The token is good (label 1) if that
answer checks out, bad (0) otherwise. Its feature is the base's hidden state at the token, the state the
judge reads during verification. Only divergent tokens are labelled: the judge is consulted only where
the exact rule rejects (it is OR-ed with it). Problems the base itself gets wrong are skipped: there a
good token and a bad one both end at a wrong answer, so every label would read "bad".
"""

from __future__ import annotations

import json
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

import torch
from tqdm.auto import tqdm

from multispec import Prompt, Session
from multispec.drafters import ModelDrafter
from multispec.judge import judge_inputs, train_judge_head
from multispec.targets import as_target
from multispec.targets.base import FeatureRequest

from .data import Problem, is_correct


@dataclass
class Divergence:
    prefix: list[int]  # the text before the draft token (prompt included)
    token: int  # the draft token the exact rule rejected
    target_token: int  # what the base chose instead


def divergences(base, small, prompt: list[int], k: int, max_new_tokens: int, eos: int
                ) -> tuple[list[Divergence], list[int]]:
    """Every first rejected draft token of a greedy speculative run (one per verification step), and the
    run's output (the base's own greedy text)."""
    found: list[Divergence] = []
    session = Session(base, ModelDrafter(small), tree=k, eos_token_id=eos, rollback=False)
    session.append(torch.tensor([prompt]))

    def record(draft, verdict, rows):
        acc = int(verdict.num_accepted[0])
        if acc < int(draft.valid[0].sum()):
            before = session.tokens[0] + verdict.tokens[0, :acc].tolist()
            found.append(Divergence(before, int(draft.tokens[0, acc]), int(verdict.tokens[0, acc])))

    out = session.generate(max_new_tokens, on_step=record)[0]
    return found, out


@torch.no_grad()
def judge_input_at(base, ids: list[int], context: bool = False) -> torch.Tensor:
    """What `Judge` reads for a draft token that ends `ids`: the base's final hidden state there [H], or with
    `context` the `judge_inputs` vector (also the state at the token before and the base's distribution
    there, its head applied to that state)."""
    padded = torch.tensor([ids + [0]])  # the prefill feeds all but the last token: pad one past it
    hidden = as_target(base).prefill(Prompt.build(padded), FeatureRequest(hidden=True)).features.hidden[0].float()
    if not context:
        return hidden[-1]
    logits = base.get_output_embeddings()(hidden[-2].to(base.dtype)).float()
    return judge_inputs(hidden[-1], hidden[-2], logits, torch.tensor(ids[-1]))


def label_divergences(base, small, problems: list[Problem], tokenizer, *, k: int = 4, max_new_tokens: int = 256,
                      check: Callable[[str, float], bool] = is_correct, context: bool = False,
                      progress: bool = True) -> dict:
    """Judge inputs [N, F] (`judge_input_at`), labels [N] and counts for the divergent draft tokens of
    `problems`."""
    eos = tokenizer.eos_token_id
    feats, labels, skipped = [], [], 0
    for problem in tqdm(problems, desc="labelling divergences", disable=not progress):
        prompt = tokenizer.encode(problem.prompt())
        found, own = divergences(base, small, prompt, k, max_new_tokens, eos)
        if not check(tokenizer.decode(own), problem.answer):
            skipped += 1
            continue
        for d in found:
            text = d.prefix + [d.token]
            if len(text) - len(prompt) >= max_new_tokens:
                continue
            session = Session(base, ModelDrafter(small), tree=k, eos_token_id=eos, rollback=False)
            session.append(torch.tensor([text]))
            rest = session.generate(max_new_tokens - (len(text) - len(prompt)))[0]
            good = check(tokenizer.decode(text[len(prompt):] + rest), problem.answer)
            feats.append(judge_input_at(base, text, context))
            labels.append(int(good))
    if not feats:
        raise ValueError(f"problems: no divergent draft tokens to label ({skipped} of {len(problems)} problems skipped "
                         "because the base's own answer is wrong; on the rest the draft agrees with the base)")
    return {"features": torch.stack(feats), "labels": torch.tensor(labels), "skipped_problems": skipped}


def train_zoo_judge(folder: str | Path, problems: int = 400, seed: int = 777, drafter: str = "small",
                    out: str = "judge", context: bool = False, width: int = 0) -> dict:
    """Label divergences of the base in `folder` with the drafter in `folder/drafter` on `problems`
    training-distribution problems and train its judge head (`context`, `width`: see `JudgeHead`) into
    `folder/out` (skipped when it exists)."""
    from .data import make_problems
    from .zoo_pair import CHECK_RATE, ByteTokenizer, load_model, test_split

    folder = Path(folder)
    config = folder / out / "judge_config.json"
    if config.exists():
        return json.loads(config.read_text())
    base, small = load_model(folder / "base"), load_model(folder / drafter)
    held_out = {p.question for p in test_split()}
    chosen = [p for p in make_problems(problems * 2, seed, CHECK_RATE) if p.question not in held_out][:problems]
    data = label_divergences(base, small, chosen, ByteTokenizer(), context=context)
    head, report = train_judge_head(data["features"], data["labels"], context=context, width=width)
    report |= {"problems": len(chosen), "labelled": len(data["labels"]), "skipped_problems": data["skipped_problems"]}
    head.save(folder / out, **report)
    return report
