"""The contracts are written down and the code keeps to them: the session reads a target, a drafter and a rule
only through attributes their base classes declare (no `getattr` probing), every such attribute is documented
where it is declared, every rule takes the scoring pass's features the same way, and the settings arrive as
three objects (`SamplingConfig`, `StoppingConfig`, `EngineConfig`) rather than a keyword list."""

from __future__ import annotations

import ast
import inspect
import re
from pathlib import Path

import pytest
import torch

import multispec.image_ar  # noqa: F401 (its rule subclasses AcceptanceRule)
from multispec import (Drafter, EngineConfig, SamplingConfig, Session, StoppingConfig, Target, speculative_generate)
from multispec.config import MOVED
from multispec.rules import AcceptanceRule
from multispec.targets import base as target_base
from multispec.testing import make_perturbed_copy, make_target

ROOT = Path(__file__).resolve().parents[2]
SESSION = ROOT / "multispec" / "session.py"
# the token rules (the continuous rule's `target` is a node distribution, not a `Target`)
RULES = sorted(p for p in (ROOT / "multispec" / "rules").glob("*.py") if p.name != "continuous.py")


def _attributes_read(path: Path, owner: str) -> set[str]:
    """Names `X` read as `<owner>.X` (e.g. owner "self.target") anywhere in a module."""
    tree = ast.parse(path.read_text())
    return {node.attr for node in ast.walk(tree)
            if isinstance(node, ast.Attribute) and ast.unparse(node.value) == owner}


def _declared(cls: type, name: str) -> bool:
    return any(name in vars(k) or name in getattr(k, "__annotations__", {}) for k in cls.__mro__)


def test_the_session_probes_nothing():
    tree = ast.parse(SESSION.read_text())
    probes = [f"line {n.lineno}: {ast.unparse(n)[:80]}" for n in ast.walk(tree)
              if isinstance(n, ast.Call) and isinstance(n.func, ast.Name) and n.func.id in ("getattr", "hasattr")]
    assert not probes, "the session reads its parts through declared attributes only:\n" + "\n".join(probes)


@pytest.mark.parametrize("owner, cls", [("self.target", Target), ("self.drafter", Drafter),
                                        ("self.rule", AcceptanceRule)])
def test_what_the_session_reads_is_declared_and_documented(owner, cls):
    read = _attributes_read(SESSION, owner)
    assert len(read) >= 3, f"the walk found too little of {owner}: {read}"
    undeclared = sorted(n for n in read if not _declared(cls, n))
    assert not undeclared, f"{owner} attributes the session reads but {cls.__name__} does not declare: {undeclared}"
    docs = " ".join(filter(None, [inspect.getdoc(cls), inspect.getmodule(cls).__doc__]))
    undocumented = sorted(n for n in read if f"`{n}" not in docs and not (inspect.getdoc(getattr(cls, n, None))
                                                                          and callable(getattr(cls, n))))
    assert not undocumented, f"{cls.__name__} declares but does not document: {undocumented}"


def test_what_the_rules_read_of_a_target_is_declared():
    read = set().union(*(_attributes_read(path, "target") for path in RULES))
    assert "user_model" in read
    assert all(_declared(Target, n) for n in read), sorted(n for n in read if not _declared(Target, n))


def test_the_target_docstring_lists_its_attributes():
    doc = inspect.getdoc(Target)
    declared = [n for n in Target.__annotations__ if not n.startswith("_")]
    assert len(declared) >= 12, declared
    missing = [n for n in declared if not re.search(rf"`{n}[`(]", doc)]
    assert not missing, f"Target's docstring does not name: {missing}"


def test_every_rule_takes_the_features_of_the_scoring_pass():
    rules = set()
    todo = [AcceptanceRule]
    while todo:
        cls = todo.pop()
        rules.add(cls)
        todo += cls.__subclasses__()
    token_rules = [r for r in rules if r.__module__.startswith("multispec") and "accept" in vars(r)]
    assert len(token_rules) >= 4, token_rules  # Greedy, Exact, Judge, Relaxed at least
    for rule in token_rules:
        params = inspect.signature(rule.accept).parameters
        assert "features" in params and params["features"].default is None, rule.__name__


def test_speculative_generate_takes_settings_objects_not_keyword_lists():
    params = inspect.signature(speculative_generate).parameters
    model_inputs = {"input_ids", "attention_mask"}
    own = [n for n, p in params.items() if n not in model_inputs and p.kind is not p.VAR_KEYWORD]
    assert len(own) <= 10, own
    assert {"sampling", "stopping", "engine"} <= set(own)
    session = inspect.signature(Session).parameters
    assert {"sampling", "stopping", "engine"} <= set(session) and len(session) <= 10, list(session)


@pytest.mark.parametrize("name, home", sorted(MOVED.items()))
def test_a_keyword_that_moved_into_a_settings_object_names_its_new_home(name, home):
    target = make_target()
    with pytest.raises(TypeError, match=re.escape(f"{name}: give it in {home}")):
        speculative_generate(target, "ngram", torch.tensor([[5, 6, 7]]), max_new_tokens=2, **{name: 1})


def test_settings_objects_check_their_fields():
    assert StoppingConfig(eos_token_id=[2, 2, 3]).eos_token_id == (2, 3)
    assert StoppingConfig(eos_token_id=torch.tensor([4])).eos_token_id == (4,)
    assert StoppingConfig(stop=[5, [6, 7]]).stop == ((5,), (6, 7))
    assert StoppingConfig.never().eos_token_id == ()
    with pytest.raises(ValueError, match="stop: an empty stop sequence"):
        StoppingConfig(stop=[[]])
    with pytest.raises(TypeError, match="pad_token_id"):
        StoppingConfig(pad_token_id="0")
    with pytest.raises(TypeError, match="eos_token_id"):
        StoppingConfig(eos_token_id=True)
    with pytest.raises(ValueError, match="step: expected one of 'eager', 'static', 'compiled'"):
        EngineConfig(step="graphs")
    with pytest.raises(TypeError, match="progress"):
        EngineConfig(progress="yes")
    with pytest.raises(TypeError, match="sampling: expected a SamplingConfig, got dict"):
        speculative_generate(make_target(), "ngram", torch.tensor([[5, 6]]), sampling={"do_sample": True})
    with pytest.raises(TypeError, match="stopping: expected a StoppingConfig"):
        Session(make_target(), "ngram", stopping=[2])


def test_stop_sequences_end_a_row_like_an_eos():
    """`StoppingConfig.stop`: each row ends after the first stop sequence in its new tokens (kept, as an EOS
    is); a row without one runs to its budget. The reference is the target's own greedy decoding, cut."""
    target = make_target("llama", seed=4)
    draft = make_perturbed_copy(target, noise=0.05)
    ids = torch.tensor([[5, 17, 42, 9, 77], [8, 3, 50, 61, 2]])
    free = target.generate(ids, max_new_tokens=20, do_sample=False, eos_token_id=None, pad_token_id=0)[:, 5:]
    stop = free[0, 6:8].tolist()  # a two-token sequence row 0 writes at positions 6-7
    out = speculative_generate(target, draft, ids, max_new_tokens=20, tree=3,
                               stopping=StoppingConfig(eos_token_id=(), pad_token_id=0, stop=[stop]))
    for r in range(2):
        row = free[r].tolist()
        cut = next((i + len(stop) for i in range(len(row) - 1) if row[i: i + len(stop)] == stop), len(row))
        assert out.num_new_tokens[r] == cut, r
        assert out.sequences[r, 5: 5 + cut].tolist() == row[:cut]
    assert out.num_new_tokens[0] <= 8 and out.stats.mean_accepted_length > 1.2
