"""The reasoning zoo pair, `arith-reasoning`: byte-level Llamas trained here on synthetic arithmetic with
step-by-step solutions (`multispec.reasoning.data`).

- `base/`: the base model (12 layers, deep and narrow), trained on the problems and symbolic drills, then
  continued by practice stages with drills in every phrasing and in the worded ones (`BASE_STAGES`);
- `small/`: the small model (2 layers), much less accurate on the arithmetic;
- `small-reflective/`: the small model continued on traces that open a step with "Wait, " where it tends to err
  (`REFLECTIVE`): Speculative Thinking's small writer, whose cues hand those steps to the base;
- `experts/*`: further small models (other sizes and seeds): Speculative Verdict's draft experts;
The models are stored in int8 (`multispec.zoo.int8`: half of fp16, for the zoo's 100 MB) and load as fp32
`LlamaForCausalLM`s.
- `judge/`: a judge head on the base's hidden states, trained on automatically labelled draft tokens of `small`;
- `styled/`: a drafter with another phrasing habit (`STYLED`: never "a + b = r"), whose right steps the base
  would not write token for token, the case judge verification is for; `judge-styled/` its judge (linear on the
  base's hidden state, the paper's head).
The held-out test split is `test.jsonl` (problems whose questions the training data never contains).

`multispec zoo train arith-reasoning` reproduces it (fixed seeds; each stage resumes when its folder is
complete).
"""

from __future__ import annotations

import json
import math
import random
import re
import shutil
from dataclasses import dataclass, field, replace
from pathlib import Path

import torch
from transformers import LlamaConfig, LlamaForCausalLM

from multispec import zoo
from multispec.plugin import ByteTokenizer as BaseByteTokenizer
from multispec.plugin import (Checkpoint, INT8_FILE, Judge, JudgeHead, ModelDrafter, ZooEntry, ZooPair, load_int8,
                              save_int8, train_judge_head, train_steps)

from .data import Problem, make_drill, make_problem, make_problems, read_problems, training_text, write_problems
from .judge_data import label_divergences
from .task_data import drill_scoring_row, scoring_row, verdict_row

NAME = "arith-reasoning"
EOS = 3  # byte 0x03 ends a solution (the byte tokenizer has no special tokens)
PAD = 0
MAX_LEN = 512
SEED = 0
TEST_SEED = 12345
TEST_SIZE = 300
CHECK_RATE = 0.25
DRILL_RATE = 0.35  # training rows that are arithmetic practice ("a op b = r" lines), not problems
DRILL_HEADER = "Practice:\n"


def llama_config(hidden: int, layers: int, heads: int, kv_heads: int, intermediate: int) -> LlamaConfig:
    return LlamaConfig(vocab_size=256, hidden_size=hidden, intermediate_size=intermediate, num_hidden_layers=layers,
                       num_attention_heads=heads, num_key_value_heads=kv_heads, max_position_embeddings=MAX_LEN,
                       tie_word_embeddings=False, bos_token_id=None, eos_token_id=EOS, pad_token_id=PAD)


@dataclass(frozen=True)
class Recipe:
    """One model of the pair: its architecture and training budget."""

    hidden: int
    layers: int
    heads: int
    kv_heads: int
    intermediate: int
    steps: int
    batch_size: int
    lr: float
    seed: int = SEED
    style: str = "mixed"  # the solutions' phrasing habit (`multispec.reasoning.data.phrase`)
    drill: str = "symbols"  # the practice rows' phrasing (`multispec.reasoning.data.make_drill`)
    reflect: tuple[float, ...] = ()  # reflective cues per operation (`multispec.reasoning.data.make_problem`)
    # (scoring, verdict): the shares of rows that teach the step-level methods' prompts (`task_data`), after the
    # drills' share; empty: none (and the stream of earlier releases)
    tasks: tuple[float, ...] = ()
    # the share of batches made of scoring rows only: a score is one learnt token against a problem's ~60, so in
    # mixed batches its gradient is drowned; a batch of scores alone weighs them as much as a batch of problems
    score_batches: float = 0.0
    verdict_wrong: float = 0.5  # the rate at which each expert's solution in a verdict row holds a wrong step
    checks: float = CHECK_RATE  # the rate at which a solution's step is followed by a check step
    score_form: str = "step"  # scoring rows: "step" (`task_data.scoring_row`) or "drill" (`drill_scoring_row`)

    def config(self):
        return llama_config(self.hidden, self.layers, self.heads, self.kv_heads, self.intermediate)


BASE = Recipe(hidden=128, layers=12, heads=4, kv_heads=2, intermediate=384, steps=3500, batch_size=16, lr=2e-3)
# Then the base practises the arithmetic in every phrasing a step may take (`BASE` drilled "a op b = r" only, so
# its steps written "a minus b is r" were wrong more often than its symbolic ones; judge decoding, which lets the
# drafter pick the phrasing, paid for that in accuracy). `BASE_WORDS` then continues this stage (`BASE_STAGES`).
BASE_PRACTICE = replace(BASE, steps=1800, lr=5e-4, seed=1, drill="mixed")
# The worded phrasings stayed the weak ones after that stage, so two last stages drill them alone (the problems
# still hold every phrasing): judge decoding with the styled drafter loses accuracy to the base's arithmetic in
# the drafter's phrasings (BENCHMARKS.md, Judge decoding with the styled drafter).
BASE_WORDS = replace(BASE, steps=1800, lr=3e-4, seed=2, drill="words")
BASE_WORDS_AGAIN = replace(BASE_WORDS, seed=4)
# (folder, recipe, description): each stage continues the previous one; the last one's folder is the shipped base.
BASE_STAGES = (("base-pretrain", BASE, "base"), ("base-practice", BASE_PRACTICE, "base, practice in every phrasing"),
               ("base-words", BASE_WORDS, "base, practice in words"),
               ("base", BASE_WORDS_AGAIN, "base, practice in words (2)"))
# Tried, not shipped (benchmarks/studies/reasoning_teach_prompts.py; BENCHMARKS.md, Teaching the base the methods'
# prompts): stages continuing the shipped base that teach it the step-level methods' prompts (`task_data`):
# scoring a step 0-9 (SpecReason's scorer) and the right solution after two experts' (Speculative Verdict's
# verdict). `TEACH_TASKS`: of all rows 35% drills, 20% scoring, 12% verdicts, 33% problems; then `TEACH_SCORES`:
# half the batches scoring rows alone (in mixed batches a score's one token is drowned by a problem's ~60), more
# verdict rows with more wrong experts. Neither taught the base to score: right and wrong steps got the same
# scores.
TEACH_TASKS = replace(BASE, steps=1200, lr=3e-4, seed=6, drill="mixed", tasks=(0.2 / 0.65, 0.12 / 0.65))
TEACH_SCORES = replace(TEACH_TASKS, steps=600, seed=7, score_batches=0.5, tasks=(0.2 / 0.65, 0.25 / 0.65),
                       verdict_wrong=0.7)
# A probe from the shipped base: scoring rows alone at a higher rate. Its score is the label prior whatever the step.
TEACH_SCORES_ONLY = replace(TEACH_SCORES, steps=400, lr=1e-3, score_batches=1.0, seed=8)
# A probe of whether the base can learn to score at all: the comparison made local ("a op b = r", then the score).
TEACH_DRILL_SCORES = replace(TEACH_SCORES_ONLY, steps=2000, score_form="drill")
TEACH_DRILL_SCORES_LONG = replace(TEACH_DRILL_SCORES, steps=8000)  # the same, four times as long
# Two layers at least: a one-layer model cannot copy the question's numbers into its steps (no induction).
SMALL = Recipe(hidden=128, layers=2, heads=4, kv_heads=2, intermediate=384, steps=6000, batch_size=16, lr=3e-3)
# A drafter with another writing habit (never "a + b = r"): its steps differ from the base's choice while
# being right, the case judge verification is for. `STYLED` (shipped) has the 2-layer expert's size, what the
# zoo's budget leaves room for; `STYLED_WIDE`, the small model's size, was the drafter of the earlier runs of
# benchmarks/studies/reasoning_styled_drafter.py.
STYLED = Recipe(hidden=64, layers=2, heads=2, kv_heads=1, intermediate=192, steps=3000, batch_size=16, lr=4e-3,
                seed=3, style="words")
# The checking writer: "words" phrasing, and a check step after every operation ("Let me check: 60 / 5 = 12. Yes.").
# The words drafter's divergences are phrasings the base itself writes a quarter of the time or more, so a
# probability floor of 0.2 passes them all and a judge adds nothing over it (BENCHMARKS.md, Judge decoding with
# the styled drafter). The base opens a check step a quarter of the time, with one of three leads: it gives each
# lead ~0.08, under that floor, and a check is always right text, the case judge decoding is for. (Two spaces
# between words, tried first, are under 0.01 and break the base's arithmetic after them: BENCHMARKS.md.)
STYLED_CHECKING = replace(STYLED, checks=1.0)
STYLED_SPACED = replace(STYLED, style="spaced")
# The checking writer whose steps also open in lowercase: a second habit under every floor (the base gives a
# lowercase opening < 0.002), harmless to the base's arithmetic after it (measured on 26 validation problems: the
# base's own continuation after a lowercase verb stays right on 25)
STYLED_CHECKING_LOWER = replace(STYLED, checks=1.0, style="lower")
# The paper's setting: a drafter about as accurate as the small model (it is the small model, continued 1,500
# steps) whose right text differs from the base's in ways no floor sees: "words" phrasing, lowercase openings and no
# period after a result (`casual`); most of its divergences are then harmless, as a strong drafter's are.
STYLED_CASUAL = replace(SMALL, steps=1500, lr=1e-3, seed=3, style="casual")
# tried (benchmarks/studies/reasoning_judge_floors.py --train-styled); a variant's drafter starts from the pair's model
# named in `STYLED_INIT`, else from scratch
STYLED_VARIANTS = {"checking": STYLED_CHECKING, "spaced": STYLED_SPACED, "checking-lower": STYLED_CHECKING_LOWER,
                   "casual": STYLED_CASUAL}
STYLED_INIT = {"casual": "small"}
STYLED_WIDE = Recipe(hidden=128, layers=2, heads=4, kv_heads=2, intermediate=384, steps=3000, batch_size=16, lr=3e-3,
                     seed=3, style="words")
# Speculative Thinking's small writer: the small model continued on traces that say "Wait, " where it tends to
# err. Measured on 120 validation problems (greedy; 27 wrong): the first step whose result departs from the
# reference's is the first operation's in 5, the second's in 4, a later one's in 17. So the cue opens the first
# operation's step rarely, the second's often, every later one's almost always (most problems have a second
# operation: the large model takes over on most of them, as the method needs).
REFLECTIVE = replace(SMALL, steps=1500, lr=1e-3, seed=5, reflect=(0.05, 0.6, 0.9))
REFLECTIVE_FOLDER = "small-reflective"
STYLED_JUDGE = "judge-styled"  # the styled drafter's judge head (its folder in the pair): linear, the paper's
STYLED_JUDGE_PROBLEMS = 200
JUDGE_PROBLEMS = 400  # the small model's judge (the shipped one's)
EXPERTS = {  # Speculative Verdict's draft experts besides `small`
    "expert-1layer": Recipe(hidden=64, layers=1, heads=2, kv_heads=1, intermediate=192, steps=10000, batch_size=16,
                            lr=4e-3),
    "expert-2layer": Recipe(hidden=64, layers=2, heads=2, kv_heads=1, intermediate=192, steps=3000, batch_size=16,
                            lr=4e-3, seed=1),
}


class ByteTokenizer(BaseByteTokenizer):
    """The zoo's byte tokenizer, with the EOS byte that ends a solution (dropped when decoding)."""

    eos_token_id = EOS
    pad_token_id = PAD

    def decode(self, ids) -> str:
        ids = ids.tolist() if hasattr(ids, "tolist") else ids
        return super().decode([i for i in ids if int(i) not in (EOS, PAD)])


@dataclass
class ReasoningPair(ZooPair):
    """`target` the base model, `drafter` the small model (as a token-level drafter), plus the small model
    itself, the experts (name -> model, `small` first), the judge head, the styled drafter with its judge head
    and the test split."""

    small: object = None
    experts: dict = field(default_factory=dict)
    judge: object = None
    styled: object = None
    styled_judge: object = None
    reflective: object = None  # Speculative Thinking's small writer (`REFLECTIVE`), None in earlier releases
    test: list = field(default_factory=list)
    folder: Path | None = None



def test_split() -> list[Problem]:
    """The held-out problems (fixed seed; their questions never occur in the training stream)."""
    return make_problems(TEST_SIZE, TEST_SEED, CHECK_RATE)


VALIDATION_SEED = 4242
JUDGE_SEED = 777  # the judges' labelling problems (`train_zoo_judge`, `multispec train judge`)


def validation_split(n: int = TEST_SIZE) -> list[Problem]:
    """`n` problems for choosing settings (thresholds, floors, stages, drafters): fixed seed, none in the test
    split or among the judges' labelling problems."""
    excluded = {p.question for p in test_split()} | {p.question for p in make_problems(800, JUDGE_SEED, CHECK_RATE)}
    out: list[Problem] = []
    size = 2 * n
    while len(out) < n:
        out = [p for p in make_problems(size, VALIDATION_SEED, CHECK_RATE) if p.question not in excluded][:n]
        size *= 2
    return out


class Batches:
    """The endless training stream of a recipe: problems outside the test split, and (a `DRILL_RATE` share of
    rows) arithmetic practice; prompt tokens and padding are masked out of the loss. Its state is a
    `random.Random` state, saved with checkpoints."""

    def __init__(self, recipe: Recipe, held_out: set[str]):
        self.recipe, self.held_out = recipe, held_out
        self.rng = random.Random(recipe.seed + 100)
        self.tok = ByteTokenizer()

    def __next__(self) -> dict:
        rows, learn = [], []  # token ids; which of them the loss reads
        if self.recipe.score_batches and self.rng.random() < self.recipe.score_batches:
            while len(rows) < self.recipe.batch_size:
                p = make_problem(self.rng, CHECK_RATE, self.recipe.style)
                if p.question not in self.held_out:
                    text, at = self._scoring_row(p)
                    rows.append(self.tok.encode(text))
                    learn.append([i == at for i in range(len(text))])
            return self._collate(rows, learn, max(len(r) for r in rows))
        while len(rows) < self.recipe.batch_size:
            if self.rng.random() < DRILL_RATE:  # the loss reads the results ("= r", "is r", ": r") and the EOS
                text = DRILL_HEADER + make_drill(self.rng, style=self.recipe.drill) + "\n" + chr(EOS)
                read = [False] * len(text)
                for m in re.finditer(r"(?:= |is |: )(\d+\n)", text):
                    read[m.start(1): m.end(1)] = [True] * (m.end(1) - m.start(1))
                read[-1] = True
                rows.append(self.tok.encode(text))
                learn.append(read)
                continue
            task = self._task()
            checks = 0.0 if task == "verdict" else self.recipe.checks
            p = make_problem(self.rng, checks, self.recipe.style, self.recipe.reflect)
            if p.question in self.held_out:
                continue
            if task is not None:  # the loss reads the score digit, or the verdict's solution
                if task == "score":
                    text, start = self._scoring_row(p)
                else:
                    text, start = verdict_row(p, self.rng, chr(EOS), wrong_rate=self.recipe.verdict_wrong)
                ids = self.tok.encode(text)[:MAX_LEN]
                rows.append(ids)
                learn.append([i == start if task == "score" else i >= start for i in range(len(ids))])
                continue
            ids = self.tok.encode(training_text(p, chr(EOS)))[:MAX_LEN]
            n = len(self.tok.encode(p.prompt()))
            rows.append(ids)
            learn.append([i >= n for i in range(len(ids))])
        width = max(len(r) for r in rows)
        return self._collate(rows, learn, width)

    def _scoring_row(self, problem: Problem) -> tuple[str, int]:
        """A scoring row of the recipe's `score_form` (a drill-form row does not read `problem`)."""
        if self.recipe.score_form == "drill":
            return drill_scoring_row(self.rng)
        if self.recipe.score_form != "step":
            raise ValueError(f"score_form: expected 'step' or 'drill', got {self.recipe.score_form!r}")
        return scoring_row(problem, self.rng, chr(EOS))

    def _task(self) -> str | None:
        """"score", "verdict" or None (a problem), drawn at the recipe's `tasks` rates among the rows that are
        not drills (no draw without tasks: the stream stays that of earlier releases)."""
        if not self.recipe.tasks:
            return None
        u, (score, verdict) = self.rng.random(), self.recipe.tasks
        return "score" if u < score else "verdict" if u < score + verdict else None

    @staticmethod
    def _collate(rows: list[list[int]], learn: list[list[bool]], width: int) -> dict:
        ids = torch.full((len(rows), width), PAD, dtype=torch.long)
        labels = torch.full((len(rows), width), -100, dtype=torch.long)
        mask = torch.zeros(len(rows), width, dtype=torch.long)
        for i, (r, read) in enumerate(zip(rows, learn)):
            ids[i, : len(r)] = torch.tensor(r)
            labels[i, : len(r)] = torch.where(torch.tensor(read), torch.tensor(r), -100)
            mask[i, : len(r)] = 1
        return {"input_ids": ids, "attention_mask": mask, "labels": labels}


def train_model(recipe: Recipe, out: Path, desc: str, checkpoint_every: int = 200, init: Path | None = None) -> dict:
    """Train one model of the recipe into `out` (skipped when `out` already holds it), from scratch or, with
    `init`, continuing the model stored there (a fine-tuning stage). A run that was cut off resumes from its
    last checkpoint (`out/resume.pt`: weights, optimiser, schedule, data stream)."""
    report_file = out / "training_report.json"
    if report_file.exists():
        return json.loads(report_file.read_text())
    out.mkdir(parents=True, exist_ok=True)
    torch.manual_seed(recipe.seed)
    model = LlamaForCausalLM(recipe.config()) if init is None else load_model(init)
    shape = ("vocab_size", "hidden_size", "intermediate_size", "num_hidden_layers", "num_attention_heads",
             "num_key_value_heads")
    if init is not None and any(getattr(model.config, k) != getattr(recipe.config(), k) for k in shape):
        raise ValueError(f"init: the model in {init} is not the architecture of recipe {desc!r}")
    stream = Batches(recipe, {p.question for p in test_split()})
    decay = [p for p in model.parameters() if p.dim() >= 2]
    rest = [p for p in model.parameters() if p.dim() < 2]
    opt = torch.optim.AdamW([{"params": decay, "weight_decay": 0.05}, {"params": rest, "weight_decay": 0.0}],
                            lr=recipe.lr, betas=(0.9, 0.95))
    warmup = max(1, recipe.steps // 20)
    cosine = lambda s: 0.1 + 0.45 * (1 + math.cos(math.pi * min(1.0, s / recipe.steps)))  # noqa: E731 (to 0.1 lr)
    sched = torch.optim.lr_scheduler.LambdaLR(opt, lambda s: min(1.0, (s + 1) / warmup) * cosine(s))
    run = Checkpoint(out / "resume.pt", recipe.__dict__, model, opt, sched, every=checkpoint_every,
                     total=recipe.steps, state=stream.rng.getstate, load_state=stream.rng.setstate)
    model.train()
    losses = train_steps(model, lambda _: next(stream), recipe.steps, (opt, sched), desc, checkpoint=run)
    model.eval()
    save_int8(model, out)  # shipped in int8 (the zoo's budget); loaded back in fp32
    report = {"recipe": recipe.__dict__, "params": sum(p.numel() for p in model.parameters()),
              "final_loss": sum(losses[-50:]) / len(losses[-50:]), "seconds": round(run.seconds())}
    if init is not None and (init / "training_report.json").exists():
        report["continues"] = json.loads((init / "training_report.json").read_text())
    report_file.write_text(json.dumps(report, indent=2))
    run.finish()
    return json.loads(report_file.read_text())  # as a finished stage reads back (tuples as lists)


def load_model(folder: Path):
    """A model of the pair: int8 storage (`multispec.zoo.int8`), or a `save_pretrained` folder."""
    if not (folder / "config.json").exists():
        raise FileNotFoundError(f"{folder}: no trained weights; run `multispec zoo train {NAME}`")
    if (folder / INT8_FILE).exists():
        return load_int8(LlamaForCausalLM, folder)
    return LlamaForCausalLM.from_pretrained(folder, dtype=torch.float32).eval()


def load_pair(folder: str | Path | None = None) -> ReasoningPair:
    """The shipped pair (or a retrained one in `folder`)."""
    folder = Path(folder) if folder is not None else zoo.path(NAME)
    base, small = load_model(folder / "base"), load_model(folder / "small")
    experts = {"small": small}
    for name in EXPERTS:
        if (folder / "experts" / name / "config.json").exists():
            experts[name] = load_model(folder / "experts" / name)
    heads = {name: JudgeHead.load(folder / name) if (folder / name / "judge_config.json").exists() else None
             for name in ("judge", STYLED_JUDGE)}
    styled = load_model(folder / "styled") if (folder / "styled" / "config.json").exists() else None
    reflective = folder / REFLECTIVE_FOLDER
    reflective = load_model(reflective) if (reflective / "config.json").exists() else None
    test = read_problems(folder / "test.jsonl") if (folder / "test.jsonl").exists() else test_split()
    return ReasoningPair(base, ModelDrafter(small), ByteTokenizer(), NAME, small=small, experts=experts,
                         judge=heads["judge"], styled=styled, styled_judge=heads[STYLED_JUDGE], reflective=reflective,
                         test=test, folder=folder)


@dataclass(frozen=True)
class OnPolicy:
    """One DAgger round: the runs labelled are judge decoding with the judge in folder `judge` (under the pair's
    folder) at `threshold` and floor `floor`, instead of plain decoding."""

    judge: str
    threshold: float = 0.9
    floor: float = 0.0


def train_zoo_judge(folder: str | Path, problems: int = 400, seed: int = 777, drafter: str = "small",
                    out: str = "judge", head: tuple[bool, int] = (False, 0), on_policy: OnPolicy | None = None,
                    also: dict[str, tuple[bool, int]] | None = None) -> dict:
    """Label divergences of the base in `folder` with the drafter in `folder/drafter` on `problems`
    training-distribution problems and train its judge head (`head`: (context, width), see `JudgeHead`) into
    `folder/out` (skipped when it exists). `on_policy`: label judge decoding's runs instead (`OnPolicy`).
    `also`: further heads trained on the same labels, folder -> (context, width) (the labelling runs once);
    their reports go under "also"."""
    folder = Path(folder)
    context, width = head
    config = folder / out / "judge_config.json"
    if config.exists():
        return json.loads(config.read_text())
    base, small = load_model(folder / "base"), load_model(folder / drafter)
    held_out = {p.question for p in test_split()}
    chosen = [p for p in make_problems(problems * 2, seed, CHECK_RATE) if p.question not in held_out][:problems]
    rule = None
    if on_policy is not None:
        rule = Judge(JudgeHead.load(folder / on_policy.judge), on_policy.threshold, on_policy.floor)
    heads = {out: (context, width)} | (also or {})
    labelled_with_context = any(c for c, _ in heads.values())
    data = label_divergences(base, small, chosen, ByteTokenizer(), context=labelled_with_context, rule=rule)
    hidden = base.get_output_embeddings().weight.shape[1]
    common = {"problems": len(chosen), "labelled": len(data["labels"]), "skipped_problems": data["skipped_problems"],
              "skipped_prefixes": data["skipped_prefixes"], "drafter": drafter,
              "by_target_prob": by_target_prob(data["labels"], data["target_probs"])}
    if on_policy is not None:
        common |= {"on_policy": on_policy.judge, "on_policy_threshold": on_policy.threshold,
                   "on_policy_floor": on_policy.floor}
    reports = {}
    for name, (ctx, wide) in heads.items():
        # a context vector opens with the state at the token: the linear head's whole input
        features = data["features"] if ctx or not labelled_with_context else data["features"][:, :hidden]
        head, report = train_judge_head(features, data["labels"], context=ctx, width=wide)
        reports[name] = report | common
        head.save(folder / name, target=base, **reports[name])
    return reports[out] | ({"also": {n: reports[n] for n in also}} if also else {})


PROB_BINS = (0.0, 0.01, 0.05, 0.1, 0.2, 0.3, 0.5, 1.0)


def by_target_prob(labels: torch.Tensor, probs: torch.Tensor) -> dict:
    """Good and bad labelled tokens per bin of the base's own probability of them: where a `min_target_prob` floor
    can tell them apart, and what is left for a judge (good tokens under the floor, bad ones above it)."""
    out = {}
    for lo, hi in zip(PROB_BINS[:-1], PROB_BINS[1:]):
        inside = (probs >= lo) & ((probs < hi) if hi < 1 else (probs <= hi))
        out[f"[{lo}, {hi}{']' if hi == 1 else ')'}"] = {"good": int((labels[inside] == 1).sum()),
                                                       "bad": int((labels[inside] == 0).sum())}
    return out


def train_pair(folder: str | Path, quick: bool = False) -> dict:
    """Every stage of the pair into `folder`: base (pretraining, then its practice stages), small, experts, test
    split, styled drafter, the two judges. `quick`: a smoke run (tiny budgets) for tests."""
    folder = Path(folder)
    folder.mkdir(parents=True, exist_ok=True)
    shrink = (lambda r: replace(r, steps=8, batch_size=4)) if quick else (lambda r: r)
    report = {}
    previous = None
    if not (folder / "base" / "training_report.json").exists():
        for name, recipe, desc in BASE_STAGES[:-1]:
            report[name.replace("-", "_")] = train_model(shrink(recipe), folder / name, desc, init=previous)
            previous = folder / name
    name, recipe, desc = BASE_STAGES[-1]
    report["base"] = train_model(shrink(recipe), folder / name, desc, init=previous)
    for name, _, _ in BASE_STAGES[:-1]:  # not shipped: the last stage continues them
        shutil.rmtree(folder / name, ignore_errors=True)
    report["small"] = train_model(shrink(SMALL), folder / "small", "small")
    report["small_reflective"] = train_model(shrink(REFLECTIVE), folder / REFLECTIVE_FOLDER, "small, reflective",
                                             init=folder / "small")
    for name, recipe in EXPERTS.items():
        report[name] = train_model(shrink(recipe), folder / "experts" / name, name)
    if not (folder / "test.jsonl").exists():
        write_problems(test_split(), folder / "test.jsonl")
    report["styled"] = train_model(shrink(STYLED), folder / "styled", "styled")
    report["judge"] = train_zoo_judge(folder, problems=8 if quick else JUDGE_PROBLEMS)
    report[STYLED_JUDGE] = train_zoo_judge(folder, problems=8 if quick else STYLED_JUDGE_PROBLEMS, drafter="styled",
                                           out=STYLED_JUDGE)
    return report


def zoo_entry() -> ZooEntry:
    return ZooEntry(NAME, "byte-level Llamas on synthetic step-by-step arithmetic: a 12-layer base, a 2-layer small "
                    "model, two more small experts and a judge head (multispec.reasoning)", None,
                    lambda folder: load_pair(folder), lambda folder: train_pair(folder))
