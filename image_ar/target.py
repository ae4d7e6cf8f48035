"""`ClassConditionalGPT` as a speculative target (and draft model): the core's lean Llama forward, with
the image model's conventions: prompts are class tokens from the larger input vocabulary, the output
vocabulary is the codebook, a fixed number of tokens and no end token, and the unconditional prompt for
classifier-free guidance is the null class (so `guidance_scale=` works as for Janus)."""

from __future__ import annotations

from multispec.prompt import Prompt
from multispec.targets.lean import LeanCausalLM

from .gpt import ClassConditionalGPT


class ImageGPTTarget(LeanCausalLM):
    stop_token_ids = ()  # a fixed number of image tokens, no end token

    def __init__(self, model: ClassConditionalGPT, name: str = "target"):
        if not isinstance(model, ClassConditionalGPT):
            raise TypeError(f"{name}: expected a ClassConditionalGPT, got {type(model).__name__}")
        super().__init__(model, name)
        self.prompt_vocab_size = int(model.config.vocab_size)
        self.num_image_tokens = int(model.config.num_image_tokens)

    def unconditional_prompt(self, prompt: Prompt) -> Prompt:
        return Prompt(self.model.unconditional_tokens(prompt.input_ids), prompt.attention_mask, dict(prompt.inputs))
