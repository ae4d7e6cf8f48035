"""`multispec bench reasoning`: every reasoning method on the `arith-reasoning` pair, timed through the one
benchmark recorder (see `evaluate`), with the machine and settings stored beside the figures (`speedup` with
its spread, `accuracy`, `latency_s` per method, the `split`). The validation split is the default: every
choice is made there; the test split (`split="test"`) is for a configuration already chosen, run once."""

from __future__ import annotations

from multispec.plugin import BenchOptions, describe, results, save_results

from .evaluate import METHODS, Models, Settings, evaluate_table, markdown
from .spec_thinking import SpeculativeThinkingConfig, Triggers
from .zoo_pair import load_pair, validation_split


DRAFTERS = ("small", "styled")


SPLITS = ("validation", "test")


def zoo_models(weights: str | None = None, drafter: str = "small") -> tuple[Models, list]:
    """The pair's models and its test split. `drafter`: the token-level rows' draft model and judge head,
    "small" (the small model, which writes like the base) or "styled" (the drafter with another phrasing
    habit and its own judge, where judge verification has room to lengthen the accepted runs)."""
    if drafter not in DRAFTERS:
        raise ValueError(f"drafter: expected one of {', '.join(DRAFTERS)}, got {drafter!r}")
    pair = load_pair(weights)
    models = Models(pair.target, pair.small, pair.tokenizer, pair.experts, pair.judge, thinker=pair.reflective)
    if drafter == "styled":
        if pair.styled is None:
            raise ValueError(f"drafter: the pair in {pair.folder} has no styled drafter")
        models.token_drafter, models.judge = pair.styled, pair.styled_judge
    return models, pair.test


def zoo_thinking(budget: int):
    """Speculative Thinking's knobs for the zoo's short solutions (~60 bytes, where the reference's are for
    thousands of tokens): the reference's keywords, a look-ahead long enough to hold a step's opening ("Wait,
    ..."), the large model writing the reflective step up to its delimiter, 30 more tokens after a verify word.
    The pair's reflective small model (`zoo_pair.REFLECTIVE`) says "Wait" where it tends to err; earlier
    releases added "answer" to the positive words instead, which fired at every final line and never at a
    reflective one."""
    return SpeculativeThinkingConfig(triggers=Triggers(), lookahead_tokens=12, takeover_tokens=None, verify_tokens=30,
                                     token_budget=budget)


# The paper-form rows the zoo's base cannot run: it was not taught SpecReason's 0-9 scoring prompt nor the
# verdict prompt (teaching it failed: benchmarks/studies/reasoning_teach_prompts.py); its rows are the likelihood ones,
# named as what they are
NOT_ON_ZOO = ("specreason", "verdict")
# `judge_floor_matched` comes along with `judge` when a control floor is set (Settings.control_min_prob)
ZOO_METHODS = tuple(m for m in METHODS if m not in NOT_ON_ZOO and m != "judge_floor_matched")


def check_zoo_methods(methods) -> None:
    """Refuse, naming the argument, the rows the zoo's base cannot run (`NOT_ON_ZOO`)."""
    bad = [m for m in methods if m in NOT_ON_ZOO]
    if bad:
        raise ValueError(f"methods: {bad[0]!r} needs a base that follows its prompt, which the zoo pair's base does "
                         f"not (BENCHMARKS.md, Teaching the base the methods' prompts); on the zoo pair use "
                         f"{bad[0]}_likelihood, or give your own instruction-tuned models (eval reasoning --base)")


def zoo_settings(settings: Settings) -> Settings:
    """`settings` with Speculative Thinking's knobs for the zoo pair's short solutions (`zoo_thinking`)."""
    if settings.thinking is None:
        settings.thinking = zoo_thinking(settings.max_new_tokens)
    return settings


def settings_record(settings: Settings) -> dict:
    """The settings a results JSON stores beside the figures."""
    s = settings
    return {"threshold": s.threshold, "scorer": repr(s.scorer), "score_prompt": s.score_prompt,
            "likelihood_threshold": s.likelihood_threshold, "verdict_compact": s.verdict_compact, "k": s.k,
            "judge_threshold": s.judge_threshold, "judge_min_prob": s.judge_min_prob,
            "control_min_prob": s.control_min_prob, "verdict_k": s.verdict_k, "max_new_tokens": s.max_new_tokens,
            "thinking": repr(s.thinking)}


def run(options: BenchOptions = BenchOptions(), problems: int | None = None, methods=ZOO_METHODS,
        settings: Settings | None = None, drafter: str = "small") -> dict:
    """`bench reasoning` on `arith-reasoning` (`options.weights`: a retrained folder of it): `problems` of
    `options.split` (default validation; 30 with `quick`, else the whole split), 3 rounds."""
    quick, split, rounds = options.quick, options.split or "validation", options.rounds_or(3)
    if split not in SPLITS:
        raise ValueError(f"split: expected one of {', '.join(SPLITS)}, got {split!r}")
    options.apply_threads()
    check_zoo_methods(methods)
    models, test = zoo_models(options.weights, drafter)
    n = problems or (30 if quick else len(test))
    chosen = test[:n] if split == "test" else validation_split(n)
    settings = zoo_settings(settings or Settings())
    table = evaluate_table(models, chosen, methods, settings, rounds=rounds)
    for row in table["methods"].values():
        row["split"] = split
    record = {"problems": n, "split": split, "quick": quick, "drafter": drafter, "rounds": rounds} | \
        settings_record(settings)
    out = results("reasoning", record, {"greedy": table}, pair="arith-reasoning")
    print(f"reasoning on arith-reasoning ({describe(out['machine'])}), {n} problems of the {split} split")
    print(markdown(table))
    return save_results(out, options.json_path)
