"""EAGLE-style feature-level drafter.

The draft is one decoder layer that reads, at each position, the target's final hidden state f_t fused
with the embedding of the next token x_{t+1} (`fc(cat(emb(x_{t+1}), f_t))`, EAGLE-1/2) and predicts
f_{t+1} and the token after. The target's embeddings are used frozen (not stored with the head), and
the head speaks a reduced vocabulary (EAGLE-3's trick) mapped to target ids by `d2t`: a full
262k-row head would cost the draft about as much as the target's own head.

Runtime: the drafter keeps its own ragged KV cache (an `HFCausalLM` over the one-layer decoder fed with
`inputs_embeds`). Tree nodes are fed with the draft's *predicted* features; after verification only
entries built from the target's *true* features are kept, and the accepted tokens are re-fed next step
with their true features, as EAGLE does.
"""

from __future__ import annotations

import json
from dataclasses import asdict, dataclass
from pathlib import Path

import torch
from safetensors.torch import load_file, save_file
from torch import nn
from transformers import LlamaConfig, LlamaForCausalLM, PreTrainedModel, Qwen2Config, Qwen2ForCausalLM

from ..int8 import dequantize_state, is_quantized, quantize_state
from ..prompt import Prompt
from ..rules import Verdict
from ..sampling import SamplingConfig
from ..targets.base import FeatureRequest, Features
from ..targets.hf import HFCausalLM, check_causal_lm, output_vocab_size
from ..targets.lean import LeanCausalLM, lean_unsupported
from ..tree import DraftTree, TreeSpec, grow_tree
from .base import Drafter


@dataclass
class EagleConfig:
    hidden_size: int  # the target's hidden size
    draft_vocab_size: int
    target_vocab_size: int
    intermediate_size: int = 2048
    num_attention_heads: int = 8
    num_key_value_heads: int = 2
    rope_theta: float = 10000.0
    max_position_embeddings: int = 32768
    rms_norm_eps: float = 1e-6
    # attend only to the last `sliding_window` positions: keeps every relative distance the head sees at
    # inference inside what training showed it (RoPE does not extrapolate); None = full attention
    sliding_window: int | None = None
    # the EAGLE-1/2 reference code's layer (`formats.load_reference_eagle`): Llama attention without biases, no
    # norm before it and no final norm (the target's own LM head, copied into `lm_head`, reads the layer's
    # output); `fc_bias` as the checkpoint has it
    reference_layout: bool = False
    fc_bias: bool = True


def check_d2t(d2t: object, draft_vocab_size: int, target_vocab_size: int) -> torch.Tensor:
    """`d2t` (draft index -> target token id) as int64, or a ValueError naming what is wrong with it: a draft
    distribution is scattered into the target vocabulary through it, so a repeated id would lose
    probability mass (the verification would then be biased) and an id outside the vocabulary would index
    past it."""
    if not isinstance(d2t, torch.Tensor) or d2t.dtype.is_floating_point or d2t.dtype == torch.bool:
        raise ValueError(f"d2t: expected an integer tensor, got {getattr(d2t, 'dtype', type(d2t).__name__)}")
    if d2t.shape != (draft_vocab_size,):
        raise ValueError(f"d2t: expected shape ({draft_vocab_size},) (one target id per draft token), "
                         f"got {tuple(d2t.shape)}")
    d2t = d2t.long()
    outside = (d2t < 0) | (d2t >= target_vocab_size)
    if outside.any():
        raise ValueError(f"d2t: ids must lie in the target vocabulary [0, {target_vocab_size}); "
                         f"got {d2t[outside][:5].tolist()} at draft indices {outside.nonzero().flatten()[:5].tolist()}")
    values, counts = torch.unique(d2t, return_counts=True)
    if (counts > 1).any():
        raise ValueError(f"d2t: every target id may appear once; repeated: {values[counts > 1][:5].tolist()}")
    return d2t


def _decoder(config: EagleConfig) -> Qwen2ForCausalLM:
    """The head's layer: Qwen2-style (biased q/k/v), optionally sliding-window, with its own norms."""
    window = config.sliding_window
    return Qwen2ForCausalLM(Qwen2Config(
        vocab_size=config.draft_vocab_size, hidden_size=config.hidden_size, intermediate_size=config.intermediate_size,
        num_hidden_layers=1, num_attention_heads=config.num_attention_heads,
        num_key_value_heads=config.num_key_value_heads, rope_theta=config.rope_theta,
        max_position_embeddings=config.max_position_embeddings, rms_norm_eps=config.rms_norm_eps,
        tie_word_embeddings=False, use_sliding_window=window is not None, sliding_window=window,
        max_window_layers=0, layer_types=["sliding_attention" if window else "full_attention"]))


def _reference_decoder(config: EagleConfig) -> LlamaForCausalLM:
    """The EAGLE-1/2 reference layer (see `EagleConfig.reference_layout`)."""
    decoder = LlamaForCausalLM(LlamaConfig(
        vocab_size=config.draft_vocab_size, hidden_size=config.hidden_size, intermediate_size=config.intermediate_size,
        num_hidden_layers=1, num_attention_heads=config.num_attention_heads,
        num_key_value_heads=config.num_key_value_heads, rope_theta=config.rope_theta,
        max_position_embeddings=config.max_position_embeddings, rms_norm_eps=config.rms_norm_eps,
        tie_word_embeddings=False, attention_bias=False))
    decoder.model.layers[0].input_layernorm = nn.Identity()
    decoder.model.norm = nn.Identity()
    return decoder


class EagleHead(nn.Module):
    """fc + one decoder layer (Qwen2-style, optionally sliding-window) + a reduced-vocabulary head."""

    def __init__(self, config: EagleConfig, d2t: torch.Tensor | None = None):
        super().__init__()
        self.config = config
        h = config.hidden_size
        self.fc = nn.Linear(2 * h, h, bias=config.fc_bias)
        self.decoder = _reference_decoder(config) if config.reference_layout else _decoder(config)
        self.decoder.model.embed_tokens = nn.Embedding(1, h)  # inputs come as embeddings; keep no table
        if d2t is None:
            d2t = torch.arange(config.draft_vocab_size)
        self.register_buffer("d2t", check_d2t(d2t, config.draft_vocab_size, config.target_vocab_size).clone())

    def fuse(self, token_embeds: torch.Tensor, features: torch.Tensor) -> torch.Tensor:
        """Decoder inputs from next-token embeddings and the preceding positions' features."""
        return self.fc(torch.cat([token_embeds.to(self.fc.weight.dtype), features.to(self.fc.weight.dtype)], -1))

    def forward(self, inputs_embeds: torch.Tensor, **kwargs):
        """Teacher-forced pass (training): returns (draft logits [B, S, Vd], predicted features [B, S, H])."""
        out = self.decoder.model(inputs_embeds=inputs_embeds, **kwargs)
        hidden = out.last_hidden_state
        return self.decoder.lm_head(hidden), hidden

    # ---- persistence ------------------------------------------------------------------------------------
    def save(self, folder: str | Path, dtype: torch.dtype = torch.float16, int8: bool = False) -> None:
        """Weights in `dtype`, or with `int8` each matrix in int8 with per-row scales (`multispec.int8`: half
        the bytes of fp16; `load` dequantizes, and the dequantized head is the one every figure is measured on)."""
        folder = Path(folder)
        folder.mkdir(parents=True, exist_ok=True)
        state = self.state_dict()
        if int8:
            tensors = quantize_state(state)
        else:
            tensors = {k: (v.to(dtype) if v.is_floating_point() else v).contiguous() for k, v in state.items()}
        save_file(tensors, str(folder / "eagle.safetensors"))
        (folder / "eagle_config.json").write_text(json.dumps(asdict(self.config), indent=2))

    @staticmethod
    def load(folder: str | Path, dtype: torch.dtype = torch.float32) -> "EagleHead":
        folder = Path(folder)
        if not (folder / "eagle_config.json").exists():
            raise FileNotFoundError(f"folder: no eagle_config.json in {folder}")
        config = EagleConfig(**json.loads((folder / "eagle_config.json").read_text()))
        tensors = load_file(str(folder / "eagle.safetensors"))
        if is_quantized(tensors):
            tensors = dequantize_state(tensors)
        head = EagleHead(config, tensors["d2t"])
        head.load_state_dict({k: (v.to(dtype) if v.is_floating_point() else v) for k, v in tensors.items()})
        return head.to(dtype).eval()


# what the drafter reads of its own head at every fed node: the output feature, which the next depth reads
HEAD_OUTPUT = FeatureRequest(hidden=True)


class EagleDrafter(Drafter):
    """Drafts chains or trees with an `EagleHead` over a target's features."""

    feature_request = FeatureRequest(hidden=True)  # EAGLE-1/2: the target's final hidden state
    supports_skipped_steps = True  # `commit` after a step it did not draft queues the committed tokens

    def __init__(self, head: EagleHead, target: PreTrainedModel):
        check_causal_lm(target, "target", allow_stateful=True)  # only its embeddings and head are read
        self.head = head.eval()
        self.embed = target.get_input_embeddings()
        self.vocab_size = self.target_vocab_size(target)
        if head.config.target_vocab_size != self.vocab_size:
            raise ValueError(f"head: trained for a vocabulary of {head.config.target_vocab_size}, the target has "
                             f"{self.vocab_size}")
        if head.config.hidden_size != self.embed.weight.shape[1]:
            raise ValueError(f"head: hidden size {head.config.hidden_size} does not match the target's "
                             f"{self.embed.weight.shape[1]}")
        # the one-layer decoder through the lean forward (its per-call overhead is most of a draft step).
        # With a sliding window, a one-layer head's keys and values at a position depend on that position's
        # input alone, and no query reaches back further than the window: the lean engine's window (prefill
        # and read only the last `window` positions) then computes the same attention, with positions shifted
        # by a constant that RoPE does not see.
        window = head.config.sliding_window if head.decoder.config.num_hidden_layers == 1 else None
        lean = lean_unsupported(head.decoder) is None and not head.config.reference_layout  # lean: its own norms
        self.lm = (LeanCausalLM(head.decoder, name="eagle_head", window=window) if lean
                   else HFCausalLM(head.decoder, name="eagle_head"))
        self.device = self.lm.device
        self.hidden_size = head.config.hidden_size

    @staticmethod
    def target_vocab_size(target: PreTrainedModel) -> int:
        """The vocabulary the target's generated tokens come from (its output head's; a subclass's target may
        generate with another head, e.g. Janus's image head)."""
        return output_vocab_size(target)

    @torch.no_grad()
    def draft_embeds(self, tokens: torch.Tensor, features: torch.Tensor) -> torch.Tensor:
        """The head's input at each entry: the token's embedding fused with the feature before it."""
        return self.head.fuse(self.embed(tokens.to(self.embed.weight.device)).to(self.device), features.to(self.device))

    @torch.no_grad()
    def _target_features(self, features: Features | None, when: str) -> torch.Tensor:
        """The feature the head reads where the target computed one [B, N, H]: its final hidden state."""
        if features is None or features.hidden is None:
            raise ValueError(f"features: the EAGLE drafter needs the target's hidden states {when}")
        return features.hidden

    @torch.no_grad()
    def start(self, prompt: Prompt, features: Features | None = None) -> None:
        features = self._target_features(features, "at the prefill")
        input_ids, attention_mask = prompt.input_ids, prompt.attention_mask
        b, length = input_ids.shape
        # draft entry j pairs token x_{j+1} with the target feature f_j; the root x_{L-1} pairs with f_{L-2}
        feats = torch.zeros(b, length - 1, features.shape[-1], device=self.device, dtype=features.dtype)
        feats[:, : features.shape[1]] = features.to(self.device)
        feats = feats * attention_mask[:, :-1, None].to(feats)  # zero features at padding
        if length > 1:
            tokens, mask = input_ids[:, 1:], attention_mask[:, 1:]
            window = getattr(self.lm, "window", None)
            if window is not None and tokens.shape[1] > window + 1:  # the rest is never read (see __init__)
                tokens, mask, feats = tokens[:, -window - 1:], mask[:, -window - 1:], feats[:, -window - 1:]
            self.lm.start(tokens, mask, inputs_embeds=self.draft_embeds(tokens, feats))
            self._pending_features = feats[:, -1:]  # the root's (possibly zero) feature
        else:  # a one-token prompt: nothing to pair yet; the root gets a zero feature
            self.lm.start(input_ids[:, :0].new_zeros(b, 1), attention_mask.new_zeros(b, 1) + 1)
            self._pending_features = torch.zeros(b, 1, self.hidden_size, device=self.device)
        self._pending_tokens = input_ids[:, -1:].to(self.device)
        self._pending_counts = [1] * b  # real entries of `_pending_tokens` per row, on the host (None: unknown)
        self._proposed = False

    @torch.no_grad()
    def propose(self, roots: torch.Tensor, spec: TreeSpec, sampling: SamplingConfig,
                generator: torch.Generator | None = None) -> DraftTree:
        lm, device = self.lm, self.device
        b = roots.shape[0]
        tokens, feats = self._pending_tokens, self._pending_features  # [B, U], [B, U, H]; -1 = padding
        counts = (tokens >= 0).sum(dim=1)
        width = tokens.shape[1]
        idx = torch.arange(width, device=device)[None, :]
        valid = idx < counts[:, None]
        safe = tokens.clamp(min=0)
        out = lm.feed(safe, (idx - 1).expand(b, width).contiguous(), valid, inputs_embeds=self.draft_embeds(safe, feats),
                      request=HEAD_OUTPUT)
        logits, hidden = out.logits, out.features.hidden
        rows = torch.arange(b, device=device)
        last = counts - 1
        self._chain_valid = valid
        node_hidden = [hidden]  # predicted features by pending index
        root_pending = last
        # pending index of each fed node id (sized by the spec's bound: no host read of the ids)
        fed = torch.full((b, spec.feed_ids_bound), -1, dtype=torch.long, device=device)

        def feed(ids: torch.Tensor, toks: torch.Tensor, parent_ids: torch.Tensor) -> torch.Tensor:
            parent_pending = torch.where(parent_ids >= 0, fed.gather(1, parent_ids.clamp(min=0)), root_pending[:, None])
            all_hidden = torch.cat(node_hidden, dim=1)
            parent_feat = all_hidden.gather(1, parent_pending[..., None].expand(-1, -1, all_hidden.shape[-1]))
            new = lm.num_pending + torch.arange(ids.shape[1], device=device).expand_as(ids)
            fed.scatter_(1, ids, new)
            out = lm.feed(toks, parent_pending, inputs_embeds=self.draft_embeds(toks, parent_feat),
                          request=HEAD_OUTPUT)
            node_hidden.append(out.features.hidden)
            return out.logits

        tree = grow_tree(spec, logits[rows, last], feed, sampling, generator, vocab_map=self.head.d2t,
                         vocab_size=self.vocab_size, who="drafter (EagleHead)")
        self._proposed = True
        return tree

    @torch.no_grad()
    def commit(self, draft: DraftTree, verdict: Verdict, features: Features | None = None) -> None:
        features = self._target_features(features, "at every tree node")
        device = self.device
        path = verdict.path.to(device)
        keep = path >= 0
        feats = features.to(device).gather(1, path.clamp(min=0)[..., None].expand(-1, -1, features.shape[-1]))
        feats = feats * keep[..., None]
        tokens = torch.where(keep, verdict.tokens.to(device), -1)
        if not self._proposed:
            # another drafter drafted this step (e.g. prompt lookup in a HybridDrafter): nothing was fed,
            # so queue the step's tokens behind the ones still waiting, left-packed per row
            tokens = torch.cat([self._pending_tokens, tokens], dim=1)
            feats = torch.cat([self._pending_features, feats], dim=1)
            order = torch.sort((tokens < 0).to(torch.int8), dim=1, stable=True).indices
            width = int((tokens >= 0).sum(dim=1).max())
            order = order[:, :width]
            self._pending_tokens = tokens.gather(1, order)
            self._pending_features = feats.gather(1, order[..., None].expand(-1, -1, feats.shape[-1]))
            self._pending_counts = (None if self._pending_counts is None or verdict.host_counts is None
                                    else [a + c for a, c in zip(self._pending_counts, verdict.host_counts)])
            return
        width = self._chain_valid.shape[1]
        # keep the catch-up entries (built from true features); drop every tree node (predicted features)
        self.lm.commit(torch.where(self._chain_valid, torch.arange(width, device=device), -1),
                       counts=self._pending_counts)
        # next step re-feeds the accepted tokens and the new root, each with the true feature before it
        self._pending_features, self._pending_tokens = feats, tokens
        self._pending_counts = None if verdict.host_counts is None else list(verdict.host_counts)
        self._proposed = False

    def select(self, rows: torch.Tensor) -> None:
        self.lm.select(rows)
        if self._pending_counts is not None:
            self._pending_counts = [self._pending_counts[i] for i in rows.tolist()]
        rows = rows.to(self.device)
        self._pending_tokens, self._pending_features = self._pending_tokens[rows], self._pending_features[rows]
