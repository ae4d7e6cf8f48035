"""Step traces of a speculative run: what was drafted, which path the target accepted, what was emitted.

    rec = StepRecorder()
    out = speculative_generate(target, drafter, ids, engine=EngineConfig(on_step=rec))
    rec.steps[0][0].nodes, rec.steps[0][0].accepted   # row 0's tree and accepted path in the first step
    html = render_steps_html(rec.steps, decode=lambda t: tokenizer.decode([t]))

The demos render these; tests use them to check that the accepted path is a root-to-node chain of the
drafted tree and that the emitted tokens are the output's.
"""

from __future__ import annotations

import html as _html
from collections.abc import Callable
from dataclasses import dataclass

from .rules import Verdict
from .tree import DraftTree


@dataclass
class DraftNode:
    token: int
    parent: int  # index into the row's nodes, -1 = the step's root (the last committed token)


@dataclass
class RowStep:
    """One row's view of one step: its valid draft nodes, the accepted node indices (root excluded, in
    path order) and the emitted tokens (accepted drafts + the correction or bonus token)."""

    nodes: list[DraftNode]
    accepted: list[int]
    emitted: list[int]


class StepRecorder:
    """`on_step` callback for `speculative_generate`: `steps[i][row]` is row `row`'s `RowStep` at step i
    (rows that had finished are absent from that step's dict)."""

    def __init__(self) -> None:
        self.steps: list[dict[int, RowStep]] = []

    def __call__(self, draft: DraftTree, verdict: Verdict, rows: list[int]) -> None:
        tokens, parents, valid = draft.tokens.tolist(), draft.parents.tolist(), draft.valid.tolist()
        path, emitted, counts = verdict.path.tolist(), verdict.tokens.tolist(), verdict.num_accepted.tolist()
        step: dict[int, RowStep] = {}
        for i, row in enumerate(rows):
            # keep only valid nodes, renumbered; full-tree node j (j >= 1) is draft node j - 1
            keep = [j for j, ok in enumerate(valid[i]) if ok]
            new_index = {j: k for k, j in enumerate(keep)}
            nodes = [DraftNode(tokens[i][j], new_index.get(parents[i][j], -1)) for j in keep]
            accepted = [new_index[n - 1] for n in path[i][1:counts[i] + 1]]
            step[row] = RowStep(nodes, accepted, emitted[i][:counts[i] + 1])
        self.steps.append(step)

    def row(self, row: int = 0) -> list[RowStep]:
        return [s[row] for s in self.steps if row in s]


def render_steps_html(steps: list[RowStep], decode: Callable[[int], str], max_steps: int = 64) -> str:
    """One line per step: the drafted tree as nested branches, accepted nodes green, rejected red, then
    the correction/bonus token in blue. Pass `StepRecorder.row(r)`."""
    lines = []
    for i, st in enumerate(steps[:max_steps]):
        children: dict[int, list[int]] = {}
        for k, node in enumerate(st.nodes):
            children.setdefault(node.parent, []).append(k)
        accepted = set(st.accepted)

        def branch(k: int) -> str:
            cls = "acc" if k in accepted else "rej"
            text = f'<span class="{cls}">{_esc(decode(st.nodes[k].token))}</span>'
            kids = children.get(k, [])
            if not kids:
                return text
            if len(kids) == 1:
                return text + branch(kids[0])
            return text + "{" + " | ".join(branch(c) for c in kids) + "}"

        roots = children.get(-1, [])
        tree = " | ".join(branch(k) for k in roots) if roots else "<i>no draft</i>"
        bonus = _esc(decode(st.emitted[-1])) if st.emitted else ""
        lines.append(f'<div class="step"><b>{i + 1}</b> [{len(st.accepted)}/{len(st.nodes)}] {tree} '
                     f'&rarr; <span class="bonus">{bonus}</span></div>')
    if len(steps) > max_steps:
        lines.append(f"<div>... {len(steps) - max_steps} more steps</div>")
    style = ("<style>.acc{background:#c8f7c5}.rej{background:#f7c5c5;text-decoration:line-through}"
             ".bonus{background:#c5dcf7}.step{font-family:monospace;white-space:pre-wrap;margin:2px 0}</style>")
    return style + "\n".join(lines)


def _esc(text: str) -> str:
    return _html.escape(text.replace("\n", "\u21b5").replace(" ", "\u00b7"))  # visible whitespace
