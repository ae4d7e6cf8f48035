"""The image-generation targets (each also a draft model), with classifier-free guidance through the core's
`GuidedTarget`:

- `ImageGPTTarget`: the zoo's `ClassConditionalGPT` on the core's lean Llama forward, with the image model's
  conventions: prompts are class tokens from the larger input vocabulary, the output vocabulary is the
  codebook, a fixed number of tokens and no end token, and the unconditional prompt is the null class.
- `JanusImageTarget`: `transformers`' `JanusForConditionalGeneration` in image-generation mode. A text prompt
  (ending on the begin-of-image token) is prefilled with the text embeddings; every later token is an image
  token from the VQ codebook (`vq_config.num_embeddings` of them), embedded by
  `prepare_embeddings_for_image_generation` and scored by `model.model.generation_head`, not the text head.
  The first tree's root is the prompt's last (text) token, so it alone takes the text embedding. Image
  generation has a fixed length (`vision_config.num_image_tokens`) and no end token; `unconditional_prompt`
  builds the unconditional half as Janus's own `generate` does (every token except BOS and BOI replaced by
  the pad id).
"""

from __future__ import annotations

import json
from collections.abc import Sequence
from pathlib import Path
from typing import NamedTuple

import torch
from transformers import PreTrainedModel

from multispec.plugin import (FeatureRequest, Features, HFCausalLM, LeanCausalLM, NO_FEATURES, PrefillOutput, Prompt,
                              StaticFeed, StaticLeanCausalLM, TargetOutput)

from .gpt import ClassConditionalGPT


class ImageGPTTarget(LeanCausalLM):
    """The zoo's class-conditional GPT (see the module docstring)."""

    stop_token_ids = ()  # a fixed number of image tokens, no end token

    def __init__(self, model: ClassConditionalGPT, name: str = "target", window: int | None = None):
        if not isinstance(model, ClassConditionalGPT):
            raise TypeError(f"{name}: expected a ClassConditionalGPT, got {type(model).__name__}")
        super().__init__(model, name, window)
        self.prompt_vocab_size = int(model.config.vocab_size)
        self.num_image_tokens = int(model.config.num_image_tokens)

    def unconditional_prompt(self, prompt: Prompt) -> Prompt:
        return Prompt(self.model.unconditional_tokens(prompt.input_ids), prompt.attention_mask, dict(prompt.inputs))


class ImageLogits(NamedTuple):
    """What `JanusImageTarget.run_forward` returns in place of a model output (a named tuple: `torch.compile` traces it)."""

    logits: torch.Tensor


def restore_generation_kwargs(model: PreTrainedModel, folder: str | Path) -> None:
    """Put back the folder's `generation_kwargs` (Janus's `boi_token_id`), which transformers 5.24 drops when it
    loads a generation config; Janus's image mode and its unconditional prompts need it. `JanusImageTarget` does
    it for a model loaded from a folder."""
    path = Path(folder, "generation_config.json")
    if getattr(model.generation_config, "generation_kwargs", None) or not path.is_file():
        return
    saved = json.loads(path.read_text()).get("generation_kwargs")
    if saved:
        model.generation_config.generation_kwargs = saved


class JanusImageTarget(HFCausalLM):
    """Image-token generation with a Janus model (see the module docstring)."""

    provides = FeatureRequest(hidden=True)
    stop_token_ids = ()  # a fixed number of image tokens, no end token

    def __init__(self, model: PreTrainedModel, name: str = "target"):
        if not (isinstance(model, PreTrainedModel) and getattr(model.config, "model_type", None) == "janus"):
            raise TypeError(f"{name}: expected a transformers JanusForConditionalGeneration, got {type(model).__name__}")
        super().__init__(model, name)
        if Path(str(getattr(model, "name_or_path", "") or "")).is_dir():  # loaded from a folder: what 5.24 dropped
            restore_generation_kwargs(model, model.name_or_path)
        self.vocab_size = int(model.config.vq_config.num_embeddings)
        self.prompt_vocab_size = int(model.config.text_config.vocab_size)
        self.num_image_tokens = int(model.config.vision_config.num_image_tokens)
        self._text_roots = False

    @property
    def hidden_size(self) -> int:
        return int(self.model.config.text_config.hidden_size)

    def unconditional_prompt(self, prompt: Prompt) -> Prompt:
        """Janus's unconditional prompt: every token except BOS and BOI replaced by the pad id."""
        config = self.model.generation_config
        boi = (getattr(config, "generation_kwargs", None) or {}).get("boi_token_id")
        if boi is None or config.bos_token_id is None or config.pad_token_id is None:
            raise ValueError("guidance_scale: the model's generation_config needs bos_token_id, pad_token_id and "
                             "generation_kwargs['boi_token_id'] to build the unconditional prompt, as Janus's generate")
        ids = prompt.input_ids
        keep = (ids == config.bos_token_id) | (ids == boi)
        return Prompt(torch.where(keep, ids, config.pad_token_id), prompt.attention_mask, dict(prompt.inputs))

    def start(self, input_ids: torch.Tensor, attention_mask: torch.Tensor, *,
              inputs_embeds: torch.Tensor | None = None, request: FeatureRequest = NO_FEATURES) -> PrefillOutput:
        out = super().start(input_ids, attention_mask, inputs_embeds=inputs_embeds, request=request)
        self._text_roots = True  # the first root is the prompt's last (text) token
        return out

    def commit(self, path: torch.Tensor, counts: Sequence[int] | None = None) -> None:
        super().commit(path, counts)
        self._text_roots = False  # every later root is an image token

    def checkpoint(self) -> tuple:
        return super().checkpoint(), self._text_roots

    def rollback(self, state: tuple) -> None:
        super().rollback(state[0])
        self._text_roots = state[1]

    def run_forward(self, request: FeatureRequest, attention_mask, position_ids: torch.Tensor,
             cache_position: torch.Tensor | None = None, input_ids: torch.Tensor | None = None,
             inputs_embeds: torch.Tensor | None = None, logits_to_keep: int = 0):
        if inputs_embeds is None:  # the prompt: text embeddings
            inputs_embeds = self.model.get_input_embeddings()(input_ids)
        out = self.model.model.language_model(inputs_embeds=inputs_embeds, attention_mask=attention_mask,
                                              position_ids=position_ids, cache_position=cache_position,
                                              past_key_values=self.cache, use_cache=True)
        hidden = out.last_hidden_state
        features = Features(hidden) if request.hidden else None
        if logits_to_keep:
            hidden = hidden[:, -logits_to_keep:]
        return ImageLogits(self.model.model.generation_head(hidden)), features

    def score_forward(self, inputs: dict, masks, positions, cache_position, request, parents):
        with self._rotating():
            out, features = self.run_forward(request, attention_mask=masks, position_ids=positions,
                                      cache_position=cache_position,
                                      inputs_embeds=self.node_embeds(inputs["input_ids"]))
        return out.logits.float(), features

    def node_embeds(self, tokens: torch.Tensor) -> torch.Tensor:
        """The embeddings of fed nodes [B, M]: image tokens', but the first root's (the prompt's last token) is
        text."""
        embeds = self.model.prepare_embeddings_for_image_generation(tokens.clamp(max=self.vocab_size - 1))
        if self._text_roots and self.num_pending == 0:
            embeds = embeds.clone()
            embeds[:, 0] = self.model.get_input_embeddings()(tokens[:, 0]).to(embeds.dtype)
        return embeds


class StaticJanusFeed(StaticFeed):
    """Mixed in before `JanusImageTarget`: its feeds at fixed shapes (`multispec.targets.static_hf`). The nodes'
    embeddings (image tokens', the first root's text) are computed before the fixed-shape call, which then runs
    the language model and the generation head over them like any static feed."""

    @torch.no_grad()
    def feed(self, tokens: torch.Tensor, parents: torch.Tensor, valid: torch.Tensor | None = None, *,
             inputs_embeds: torch.Tensor | None = None, request: FeatureRequest = NO_FEATURES) -> TargetOutput:
        if inputs_embeds is None and tokens.shape[1]:
            inputs_embeds = self.node_embeds(tokens.to(self.device))
        return super().feed(tokens, parents, valid, inputs_embeds=inputs_embeds, request=request)


class StaticJanusImageTarget(StaticJanusFeed, JanusImageTarget):
    """`JanusImageTarget` at fixed shapes (`step="static"`)."""


class StaticImageGPTTarget(StaticLeanCausalLM, ImageGPTTarget):
    """`ImageGPTTarget` on the lean fixed-shape step (`step="static"`)."""


FIXED_SHAPE_CLASSES = {JanusImageTarget: StaticJanusImageTarget, ImageGPTTarget: StaticImageGPTTarget}
