"""An independent small `transformers` model of the same vocabulary as the draft source."""

from __future__ import annotations

import torch
from transformers import PreTrainedModel

from ..prompt import Prompt
from ..rules import Verdict
from ..sampling import SamplingConfig
from ..targets import FeedingEngine, Target, registered_feeding_engine, stateful_draft_engine
from ..targets.hf import HFCausalLM
from ..targets.lean import LeanCausalLM, lean_unsupported
from ..tree import DraftTree, TreeSpec, grow_tree
from .base import Drafter


class ModelDrafter(Drafter):
    """Drafts chains or trees with a small causal LM, keeping its own ragged KV cache.

    Each step feeds the committed tokens the draft model has not seen yet plus the root as one ragged
    chain, then grows the tree (`multispec.tree.grow_tree`) by feeding new nodes with tree masks. After
    verification the accepted nodes it already fed stay in its cache; the rest is dropped.
    """

    supports_skipped_steps = True  # a skipped step's root and accepted tokens are fed at the next draft

    def __init__(self, model: PreTrainedModel, engine: str = "auto", window: int | None = None):
        """`engine`: "hf" runs the model's own forward; "lean" a direct forward for Llama-family models
        (`multispec.targets.lean`: same numbers, a fraction of the per-call overhead, which is most of a
        small draft model's cost); "auto" takes "lean" where it applies. A stateful draft (a state-space or
        hybrid model) runs on the feeding engine its adapter package registered (`register_draft_engine`),
        so `engine` must stay "auto". `window` (lean engine only): the draft attends to about its last
        `window` committed tokens, so its cost stops growing with the context (see `LeanCausalLM`)."""
        if engine not in ("auto", "hf", "lean"):
            raise ValueError(f"engine: expected 'auto', 'hf' or 'lean', got {engine!r}")
        if isinstance(model, FeedingEngine):  # an engine built by the caller (e.g. a GuidedTarget draft)
            if engine != "auto" or window is not None:
                raise ValueError("engine/window: the model is already a feeding engine; leave them at their defaults")
            self.lm, self.engine = model, "given"
            self.who = f"draft_model ({type(getattr(model, 'model', model)).__name__})"
            self.vocab_size = self.lm.vocab_size
            self._skipped_roots = None
            return
        stateful = stateful_draft_engine(model)
        adapter = registered_feeding_engine(model) if stateful is None and engine == "auto" else None
        if stateful is not None:
            if engine != "auto" or window is not None:
                raise ValueError(f"engine/window: {type(model).__name__} keeps a recurrent state and is driven by "
                                 "the engine its adapter package registered; leave engine='auto' and window=None")
            self.lm, self.engine = stateful, "stateful"
        elif adapter is not None and window is None:  # e.g. a small VLM: its adapter prefills its images
            adapter.name = "draft_model"
            self.lm, self.engine = adapter, "adapter"
        else:
            lean = engine == "lean" or engine == "auto" and lean_unsupported(model) is None
            if window is not None and not lean:
                raise ValueError(f"window: needs the lean engine, which does not run this model "
                                 f"({lean_unsupported(model) or 'engine=hf'})")
            self.lm = (LeanCausalLM(model, name="draft_model", window=window) if lean
                       else HFCausalLM(model, name="draft_model"))
            self.engine = "lean" if lean else "hf"
        self.who = f"draft_model ({type(model).__name__})"
        self.vocab_size = self.lm.vocab_size
        self._skipped_roots: torch.Tensor | None = None

    def start(self, prompt: Prompt, features=None) -> None:
        # a draft model that takes the prompt's inputs (a VLM drafting for a VLM) sees them; others read tokens
        if prompt.inputs and isinstance(self.lm, Target) and set(prompt.inputs) <= set(self.lm.prefill_inputs):
            self.lm.prefill(prompt)
        else:
            self.lm.start(prompt.input_ids, prompt.attention_mask)
        b = prompt.batch_size
        self.unfed = torch.full((b, 0), -1, dtype=torch.long, device=self.lm.device)
        self._skipped_roots = None

    def skip(self, roots: torch.Tensor) -> None:
        self._skipped_roots = roots.to(self.lm.device)

    def propose(self, roots: torch.Tensor, spec: TreeSpec, sampling: SamplingConfig,
                generator: torch.Generator | None = None) -> DraftTree:
        lm, device = self.lm, self.lm.device
        roots = roots.to(device)
        b = roots.shape[0]
        # catch-up chain: [unfed..., root] per row, right-padded with invalid nodes
        counts = (self.unfed >= 0).sum(dim=1)
        width = int(counts.max()) + 1 if b else 1
        idx = torch.arange(width, device=device)[None, :]
        chain = torch.zeros(b, width, dtype=torch.long, device=device)
        if self.unfed.shape[1]:
            chain[:, : self.unfed.shape[1]] = self.unfed.clamp(min=0)
        chain.scatter_(1, counts[:, None], roots[:, None])
        valid = idx <= counts[:, None]
        parents = (idx - 1).expand(b, width).contiguous()
        logits = lm.feed(chain, parents, valid).logits
        root_logits = logits[torch.arange(b, device=device), counts]
        self._chain_valid, self._root_pending = valid, counts
        # feed id -> pending index (sized by the spec's bound: no host read of the ids)
        self._fed = torch.full((b, spec.feed_ids_bound), -1, dtype=torch.long, device=device)

        def feed(ids: torch.Tensor, tokens: torch.Tensor, parent_ids: torch.Tensor) -> torch.Tensor:
            parent_pending = torch.where(
                parent_ids >= 0, self._fed.gather(1, parent_ids.clamp(min=0)), self._root_pending[:, None])
            new = lm.num_pending + torch.arange(ids.shape[1], device=device).expand_as(ids)
            self._fed.scatter_(1, ids, new)
            return lm.feed(tokens, parent_pending).logits

        return grow_tree(spec, root_logits, feed, sampling, generator, who=self.who)

    def commit(self, draft: DraftTree, verdict: Verdict, features=None) -> None:
        device = self.lm.device
        b = verdict.num_accepted.shape[0]
        if self._skipped_roots is not None:
            # another drafter drafted this step: nothing was fed, so queue the step's root and accepted
            # tokens behind the ones still waiting, left-packed per row (the bonus is the next root)
            accepted = verdict.path[:, 1:].to(device) >= 0
            toks = torch.where(accepted, verdict.tokens[:, : accepted.shape[1]].to(device), -1)
            queue = torch.cat([self.unfed, self._skipped_roots[:, None], toks], dim=1)
            order = torch.sort((queue < 0).to(torch.int8), dim=1, stable=True).indices
            width = int((queue >= 0).sum(dim=1).max())
            self.unfed = queue.gather(1, order[:, :width])
            self._skipped_roots = None
            return
        # accepted draft nodes (full-tree path minus the root) -> feed ids -> pending indices
        accepted = verdict.path[:, 1:].to(device)
        node = (accepted - 1).clamp(min=0)
        fid = node if draft.feed_ids is None else draft.feed_ids.gather(1, node) if node.numel() else node
        if self._fed.shape[1] and fid.numel():
            pend = self._fed.gather(1, fid.clamp(max=self._fed.shape[1] - 1))
            pend = torch.where(fid < self._fed.shape[1], pend, -1)
        else:
            pend = torch.full_like(accepted, -1)
        pend = torch.where(accepted >= 0, pend, -1)
        fed = pend >= 0
        # fed accepted nodes form a prefix of the accepted path (children are only grown from fed nodes)
        chain_pending = torch.where(self._chain_valid, torch.arange(self._chain_valid.shape[1], device=device), -1)
        self.lm.commit(torch.cat([chain_pending, torch.where(fed, pend, -1)], dim=1))
        # the accepted drafts it never fed (at most the last one) are fed at the next step
        unfed_mask = (accepted >= 0) & ~fed
        toks = verdict.tokens[:, : accepted.shape[1]].to(device)
        n = unfed_mask.sum(dim=1)
        width = int(n.max()) if b else 0
        self.unfed = torch.full((b, width), -1, dtype=torch.long, device=device)
        if width:
            order = torch.sort((~unfed_mask).to(torch.int8), dim=1, stable=True).indices[:, :width]
            vals = toks.gather(1, order)
            keep = torch.arange(width, device=device)[None, :] < n[:, None]
            self.unfed = torch.where(keep, vals, -1)

    def select(self, rows: torch.Tensor) -> None:
        self.lm.select(rows)
        self.unfed = self.unfed[rows.to(self.lm.device)]
