"""The drafters `multispec train draft` trains for a text decoder, one class per `--kind`:

- `eagle`: an EAGLE-1/2 head (`multispec.drafters.EagleHead`) over the target's final hidden state: SmoothL1
  to the next feature plus cross-entropy to the target's next-token law, and one step on its own prediction;
- `eagle3`: an EAGLE-3 head (`multispec.drafters.eagle3.Eagle3Head`) over three fused layers, trained on its own
  predictions for `ttt_steps` steps (losses weighted 0.8^j, positions whose target token lies outside the draft
  vocabulary left out), saved in the layout vLLM and SGLang serve;
- `draft-model`: a small model of the target's own class, its first `draft_layers` layers copied from the
  target, distilled on the target's next-token law.

Each kind gives the module to train, its `losses(items, step)` for the `TrainLoop`, `save(folder)`, and
`drafter()` (the trained drafter, for the accepted length measured after training). Modality packages add
kinds for their models with `register_kind`.
"""

from __future__ import annotations

import copy
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field

import torch
from tqdm.auto import tqdm
from transformers import PreTrainedModel

from ..drafters import Drafter, ModelDrafter
from ..drafters.eagle import EagleConfig, EagleDrafter, EagleHead
from ..drafters.eagle3 import Eagle3Config, Eagle3Drafter, Eagle3Head, default_aux_layers
from ..drafters.eagle_train import EagleTrainConfig, EagleTrainer
from ..targets.base import FeatureRequest
from ..targets.hf import output_vocab_size
from ..targets.resolve import as_target
from .features import Teacher, capture, top_tokens
from .loop import item_generator

CACHE_BYTES = 4 << 30  # target features up to this size are computed once and kept (fp16); else every step


@dataclass
class KindOptions:
    """The shape of the drafter to train (None: taken from the target, as EAGLE's recipe mirrors one of its
    layers) and the knobs of its losses."""

    draft_vocab: int | None = None  # the draft vocabulary's size (the most frequent training tokens)
    intermediate_size: int | None = None
    heads: int | None = None
    kv_heads: int | None = None
    sliding_window: int | None = None  # eagle: the head attends to this many positions
    ttt_steps: int = 7  # eagle3: steps of training on its own predictions
    aux_layers: tuple[int, ...] | None = None  # eagle3: the fused target layers (default 2, L // 2, L - 3)
    draft_layers: int | None = None  # draft-model: layers of the student (default a quarter of the target's)
    feature_noise: float = 0.05  # eagle: std of the noise on input features, relative to their rms
    layout: str = "eagle3"  # eagle3: the layout written ("eagle3": vLLM / SGLang's reference; "speculators")
    verifier: str | None = None  # eagle3, speculators layout: the target's name or path the config names
    seed: int = 0
    extra: dict = field(default_factory=dict)


def _text_config(target: PreTrainedModel):
    return target.config.get_text_config(decoder=True)


def _layer_shape(target: PreTrainedModel, options: KindOptions) -> dict:
    """The draft layer's width, heads and MLP: the options', else one of the target's attention layers' (a
    state-space target has none: heads of 64 channels and an MLP twice the width)."""
    text = _text_config(target)
    heads = options.heads or getattr(text, "num_attention_heads", None) or max(1, text.hidden_size // 64)
    return dict(intermediate_size=options.intermediate_size or getattr(text, "intermediate_size", None)
                or 2 * text.hidden_size, num_attention_heads=heads,
                num_key_value_heads=options.kv_heads or getattr(text, "num_key_value_heads", None) or heads,
                rope_theta=_rope_theta(text))


def _check_provides(target: PreTrainedModel, request: FeatureRequest, kind: str) -> None:
    """The drafter reads these features at run time: the target's adapter must return them."""
    adapter = as_target(target)
    if (request.layers and not adapter.provides.layers) or (request.hidden and not adapter.provides.hidden):
        raise ValueError(f"--kind: {kind} reads the target's {'layers' if request.layers else 'hidden state'}, "
                         f"which its adapter ({type(adapter).__name__}) does not return")


def _device(target: PreTrainedModel) -> torch.device:
    return next(target.parameters()).device


class DraftKind:
    """Interface (see the module docstring)."""

    name = ""
    module: torch.nn.Module

    def losses(self, items: Sequence[int], step: int) -> dict:
        raise NotImplementedError

    def save(self, folder) -> None:
        raise NotImplementedError

    def drafter(self) -> Drafter:
        raise NotImplementedError

    def describe(self) -> dict:
        return {}


def _stored(t: torch.Tensor) -> torch.Tensor:
    """A feature tensor in 16 bits: float16 (finer) where its values fit, bfloat16 where they would overflow
    (Gemma's residual stream runs into the hundreds of thousands)."""
    return t.to(torch.float16 if bool(t.abs().max() < 6e4) else torch.bfloat16)


class _FeatureKind(DraftKind):
    """What the feature-level kinds share: the training sequences and the target's features of them, computed
    once when they fit in `CACHE_BYTES`, else each step."""

    def __init__(self, target: PreTrainedModel, sequences: list[list[int]], request: FeatureRequest,
                 options: KindOptions, teacher: Teacher | None = None):
        """`teacher`: when given, whether each position's top token lies in its draft vocabulary is stored beside
        the features (`in_vocab`), so the full head runs once per token, not once per step."""
        self.target, self.options, self.request, self.teacher = target.eval(), options, request, teacher
        for p in target.parameters():
            p.requires_grad_(False)
        self.ids = torch.tensor(sequences, dtype=torch.long)
        self.vocab_size = output_vocab_size(target)
        width = _text_config(target).hidden_size * (int(request.hidden) + len(request.layers))
        self.cached = None
        if self.ids.numel() * width * 2 <= CACHE_BYTES:
            starts = tqdm(range(0, len(self.ids), 16), desc="target features", unit="batch", leave=False)
            self.cached = [self._features(self.ids[i: i + 16]) for i in starts]

    def _features(self, ids: torch.Tensor):
        f = capture(self.target, ids, self.request)
        in_vocab = None if self.teacher is None else self.teacher.in_vocab(f.hidden)
        return (None if f.hidden is None else _stored(f.hidden), {i: _stored(t) for i, t in f.layers.items()},
                in_vocab)

    def features(self, items: Sequence[int]):
        """(hidden [B, S, H] or None, {layer: [B, S, H]}, in_vocab [B, S] or None) of the sequences `items`, float32
        on the target's device (the target runs, and the stored 16-bit features are read, outside any autocast:
        the features are the ones the drafter reads when drafting)."""
        device = _device(self.target)
        with torch.autocast(device.type, enabled=False):
            return self._features_at(items, device)

    def _features_at(self, items: Sequence[int], device: torch.device):
        to = lambda t: None if t is None else t.to(device, torch.float32)  # noqa: E731
        if self.cached is None:
            hidden, layers, in_vocab = self._features(self.ids[list(items)].to(device))
            return to(hidden), {k: to(v) for k, v in layers.items()}, in_vocab
        parts = [(self.cached[i // 16], i % 16) for i in items]
        stack = lambda ts: torch.stack([t.to(device, torch.float32) for t in ts])  # noqa: E731 (mixed 16-bit kinds)
        hidden = None if parts[0][0][0] is None else stack([c[0][j] for c, j in parts])
        layers = {k: stack([c[1][k][j] for c, j in parts]) for k in parts[0][0][1]}
        in_vocab = None if parts[0][0][2] is None else torch.stack([c[2][j] for c, j in parts]).to(device)
        return hidden, layers, in_vocab


class EagleKind(_FeatureKind):
    name = "eagle"

    def __init__(self, target: PreTrainedModel, sequences: list[list[int]], options: KindOptions):
        _check_provides(target, FeatureRequest(hidden=True), self.name)
        super().__init__(target, sequences, FeatureRequest(hidden=True), options)
        text = _text_config(target)
        d2t = top_tokens(sequences, options.draft_vocab or self.vocab_size, self.vocab_size)
        config = EagleConfig(hidden_size=text.hidden_size, draft_vocab_size=len(d2t), target_vocab_size=self.vocab_size,
                             sliding_window=options.sliding_window, **_layer_shape(target, options))
        torch.manual_seed(options.seed)
        self.module = self.head = EagleHead(config, d2t).to(_device(target))
        self.trainer = EagleTrainer(target, self.head, EagleTrainConfig(feature_noise=options.feature_noise))

    def losses(self, items: Sequence[int], step: int) -> dict:
        ids = self.ids[list(items)].to(_device(self.target))
        hidden, _, _ = self.features(items)
        s, h = ids.shape[1] - 1, hidden.shape[-1]
        noise = torch.stack([torch.randn(s, h, generator=item_generator(self.options.seed, step, i)) for i in items])
        parts = self.trainer.losses(ids, hidden, noise=noise)
        return {"total": parts["total"], "acc": parts["acc"], "tokens": ids.numel()}

    def save(self, folder) -> None:
        self.head.save(folder)

    def drafter(self) -> Drafter:
        return EagleDrafter(self.head.eval(), self.target)

    def describe(self) -> dict:
        return {"draft_vocab": self.head.config.draft_vocab_size, "layout": "multispec EagleHead (eagle_config.json)"}


class Eagle3Kind(_FeatureKind):
    name = "eagle3"

    def __init__(self, target: PreTrainedModel, sequences: list[list[int]], options: KindOptions):
        text = _text_config(target)
        aux = tuple(options.aux_layers or default_aux_layers(text.num_hidden_layers))
        _check_provides(target, FeatureRequest(layers=aux), self.name)
        vocab = output_vocab_size(target)
        d2t = top_tokens(sequences, options.draft_vocab or vocab, vocab)
        super().__init__(target, sequences, FeatureRequest(hidden=True, layers=aux), options, Teacher(target, d2t))
        config = Eagle3Config(hidden_size=text.hidden_size, target_hidden_size=text.hidden_size,
                              draft_vocab_size=len(d2t), target_vocab_size=self.vocab_size, aux_layers=aux,
                              rms_norm_eps=getattr(text, "rms_norm_eps", 1e-6), **_layer_shape(target, options))
        torch.manual_seed(options.seed)
        self.module = self.head = Eagle3Head(config, d2t).to(_device(target))
        self.embed = target.get_input_embeddings()

    def losses(self, items: Sequence[int], step: int) -> dict:
        ids = self.ids[list(items)].to(_device(self.target))
        hidden, layers, in_vocab = self.features(items)
        want = self.teacher.draft_logits(hidden)
        g = self.head.fuse_target(layers)[:, :-1]
        embeds = self.embed(ids[:, 1:]).detach().to(g.dtype)
        total, acc = 0.0, None
        for j, logits in enumerate(self.head.unrolled(embeds, g, self.options.ttt_steps)):
            n = logits.shape[1]
            p = torch.softmax(want[:, j + 1: j + 1 + n], -1)
            mask = in_vocab[:, j + 1: j + 1 + n].float()
            ce = -(p * torch.log_softmax(logits.float(), -1)).sum(-1)
            total = total + 0.8 ** j * (ce * mask).sum() / mask.sum().clamp(min=1)
            if j == 0:
                hit = (logits.argmax(-1) == p.argmax(-1)).float()
                acc = ((hit * mask).sum() / mask.sum().clamp(min=1)).detach()
        return {"total": total, "acc": acc, "tokens": ids.numel()}

    def save(self, folder) -> None:
        self.head.save(folder, layout=self.options.layout, target=self.target, verifier=self.options.verifier)

    def drafter(self) -> Drafter:
        return Eagle3Drafter(self.head.eval(), self.target)

    def describe(self) -> dict:
        return {"draft_vocab": self.head.eagle.draft_vocab_size, "aux_layers": list(self.head.eagle.aux_layers),
                "ttt_steps": self.options.ttt_steps,
                "layout": ("EAGLE-3, speculators' layout (Eagle3Speculator: config.json, model.safetensors)"
                           if self.options.layout == "speculators" else
                           "EAGLE-3, the reference layout vLLM and SGLang serve (config.json, model.safetensors)")}


class DraftModelKind(DraftKind):
    name = "draft-model"

    def __init__(self, target: PreTrainedModel, sequences: list[list[int]], options: KindOptions):
        self.target, self.options = target.eval(), options
        for p in target.parameters():
            p.requires_grad_(False)
        self.ids = torch.tensor(sequences, dtype=torch.long)
        self.module = self.student = layer_skip_student(target, options.draft_layers)
        vocab = output_vocab_size(target)
        self.teacher = Teacher(target, torch.arange(vocab))

    def losses(self, items: Sequence[int], step: int) -> dict:
        ids = self.ids[list(items)].to(_device(self.target))
        want, _ = self.teacher(capture(self.target, ids, FeatureRequest(hidden=True)).hidden)
        logits = self.student(input_ids=ids).logits.float()
        p = torch.softmax(want, -1)
        loss = -(p * torch.log_softmax(logits, -1)).sum(-1).mean()
        acc = (logits.argmax(-1) == want.argmax(-1)).float().mean().detach()
        return {"total": loss, "acc": acc, "tokens": ids.numel()}

    def save(self, folder) -> None:
        self.student.save_pretrained(folder)

    def drafter(self) -> Drafter:
        return ModelDrafter(self.student.eval())

    def describe(self) -> dict:
        return {"draft_layers": _text_config(self.student).num_hidden_layers,
                "layout": "a transformers checkpoint of the target's class"}


def layer_skip_student(target: PreTrainedModel, layers: int | None) -> PreTrainedModel:
    """A model of the target's class with its first `layers` decoder layers (default a quarter, at least 1),
    embeddings, final norm and head copied from the target: a draft model to distil."""
    text = _text_config(target)
    n = layers or max(1, text.num_hidden_layers // 4)
    if not 1 <= n <= text.num_hidden_layers:
        raise ValueError(f"--draft-layers: expected 1..{text.num_hidden_layers}, got {n}")
    config = copy.deepcopy(target.config)
    sub = config.get_text_config(decoder=True)
    sub.num_hidden_layers = n
    if isinstance(getattr(sub, "layer_types", None), list) and "layer_types" in vars(sub):  # not a derived property
        sub.layer_types = sub.layer_types[:n]
    student = type(target)(config).to(_device(target), next(target.parameters()).dtype)
    student.load_state_dict({k: v for k, v in target.state_dict().items() if k in student.state_dict()}, strict=False)
    for p in student.parameters():
        p.requires_grad_(True)
    return student.train()


def _rope_theta(text) -> float:
    params = getattr(text, "rope_parameters", None) or {}
    return float(params.get("rope_theta", getattr(text, "rope_theta", 10000.0)))


KINDS: dict[str, Callable[[PreTrainedModel, list[list[int]], KindOptions], DraftKind]] = {
    "eagle": EagleKind, "eagle3": Eagle3Kind, "draft-model": DraftModelKind}


def register_kind(name: str, factory: Callable[[PreTrainedModel, list[list[int]], KindOptions], DraftKind]) -> None:
    """A modality package's drafter kind for `multispec train draft --kind NAME`."""
    KINDS[name] = factory


__all__ = ["CACHE_BYTES", "DraftKind", "DraftModelKind", "Eagle3Kind", "EagleKind", "KINDS", "KindOptions",
           "layer_skip_student", "register_kind"]
