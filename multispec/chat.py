"""Conversations that keep their caches: a chat with a target over one `Session`, turn after turn.

A user turn is rendered with the rest of the conversation (the tokenizer's chat template, or a named turn format
for a tokenizer without one: Gemma's GGUF-derived tokenizer has none), and only what the target has not read yet
is appended to the session: turn n+1 prefills its own tokens, not the conversation again. The text the session
holds must be the rendering's prefix for that (a template that trims or re-tokenizes an answer differently breaks
it); when it is not, the conversation prefills the whole rendering anew, so the output stays what `generate`
writes on the whole conversation, and the turn says so (`Turn.reprefilled`).

    chat = Conversation(target, drafter, tokenizer, turn_format="gemma", tree=4)
    first = chat.say("Name three rivers in Europe.", max_new_tokens=64)
    second = chat.say("Which of them is the longest?", max_new_tokens=64)
    second.text, second.prefilled        # the answer; the tokens this turn prefilled (its own)
"""

from __future__ import annotations

import time
from dataclasses import dataclass, field

import torch

from .config import EngineConfig, StoppingConfig
from .metrics import SpeculativeStats
from .sampling import SamplingConfig
from .session import Session
from .tree import TreeSpec


@dataclass(frozen=True)
class TurnFormat:
    """How a conversation is written for a tokenizer without a chat template: each message's text with `{content}`
    in it, the text that opens the model's turn, and the text that ends a turn (the stop)."""

    name: str
    user: str
    assistant: str
    generation_prompt: str
    end_of_turn: str
    bos: bool = True  # the tokenizer's BOS token first

    def render(self, messages: list[dict], add_generation_prompt: bool) -> str:
        text = ""
        for m in messages:
            if m["role"] not in ("user", "assistant"):
                raise ValueError(f"messages: the {self.name} turn format writes user and assistant turns, got "
                                 f"{m['role']!r}")
            text += (self.user if m["role"] == "user" else self.assistant).format(content=m["content"])
        return text + (self.generation_prompt if add_generation_prompt else "")


TURN_FORMATS = {
    # Gemma's own turn markers (the format its instruction-tuned checkpoints were trained on)
    "gemma": TurnFormat("gemma", "<start_of_turn>user\n{content}<end_of_turn>\n",
                        "<start_of_turn>model\n{content}<end_of_turn>\n", "<start_of_turn>model\n", "<end_of_turn>"),
    # plain role prefixes, for tokenizers with neither a template nor turn tokens (the tests' word tokenizers)
    "plain": TurnFormat("plain", "user: {content}\n", "assistant: {content}\n", "assistant:", "\n", bos=False),
}


def turn_format(tokenizer, name: str | TurnFormat | None = None) -> TurnFormat | None:
    """The turn format `name` (a `TurnFormat`, a name of `TURN_FORMATS`, or None: the tokenizer's chat template when
    it has one, else by its vocabulary: Gemma's markers when it knows them, else plain); ValueError naming an
    unknown one."""
    if isinstance(name, TurnFormat):
        return name
    if name is not None:
        if name not in TURN_FORMATS:
            raise ValueError(f"turn_format: expected one of {', '.join(TURN_FORMATS)}, got {name!r}")
        return TURN_FORMATS[name]
    if getattr(tokenizer, "chat_template", None):
        return None
    vocab = tokenizer.get_vocab() if hasattr(tokenizer, "get_vocab") else {}
    return TURN_FORMATS["gemma" if "<start_of_turn>" in vocab else "plain"]


def render_ids(messages: list[dict], tokenizer, fmt: TurnFormat | None) -> list[int]:
    """The token ids of `messages` with the model's turn opened after them (`fmt` None: the chat template)."""
    if fmt is None:
        text = tokenizer.apply_chat_template(messages, tokenize=False, add_generation_prompt=True)
        bos = False  # a chat template writes its own BOS
    else:
        text, bos = fmt.render(messages, add_generation_prompt=True), fmt.bos
    ids = tokenizer(text, add_special_tokens=False)["input_ids"]
    ids = list(ids[0] if ids and isinstance(ids[0], list) else ids)
    if bos and getattr(tokenizer, "bos_token_id", None) is not None and (not ids or ids[0] != tokenizer.bos_token_id):
        ids = [tokenizer.bos_token_id, *ids]
    return ids


def stop_ids(tokenizer, fmt: TurnFormat | None) -> list[int]:
    """The tokens that end the model's turn: its EOS, and the format's end-of-turn marker when it is one token."""
    out = [tokenizer.eos_token_id] if getattr(tokenizer, "eos_token_id", None) is not None else []
    marker = fmt.end_of_turn if fmt is not None else None
    if marker is None and hasattr(tokenizer, "get_vocab") and "<end_of_turn>" in tokenizer.get_vocab():
        marker = "<end_of_turn>"
    if marker:
        ids = tokenizer(marker, add_special_tokens=False)["input_ids"]
        ids = list(ids[0] if ids and isinstance(ids[0], list) else ids)
        if len(ids) == 1 and ids[0] not in out:
            out.append(ids[0])
    return out


@dataclass
class Turn:
    """One answer: its text and token ids (the stop included when the model wrote one), the conversation's ids the
    target read before it (`context`: what `generate` would take as its prompt), how many of them this turn
    prefilled (its own, unless `reprefilled`), and the generation's statistics."""

    text: str
    tokens: list[int]
    context: list[int]
    prefilled: int
    reprefilled: bool
    seconds: float
    stats: SpeculativeStats = field(repr=False)


class Conversation:
    """A chat over one `Session` that keeps the target's and the drafter's caches (see the module docstring). Batch 1;
    the session's settings as `speculative_generate`'s."""

    def __init__(self, target, drafter, tokenizer, *, turn_format: str | TurnFormat | None = None, tree: TreeSpec | int | None = None,
                 sampling: SamplingConfig | None = None, engine: EngineConfig | None = None,
                 generator: torch.Generator | None = None, system: str | None = None):
        self.target, self.drafter, self.tokenizer = target, drafter, tokenizer
        self.format = globals()["turn_format"](tokenizer, turn_format)
        self.options = dict(tree=tree, sampling=sampling, engine=engine, generator=generator)
        self.stop = stop_ids(tokenizer, self.format)
        self.messages: list[dict] = [] if system is None else [{"role": "system", "content": system}]
        self.session: Session | None = None

    def say(self, text: str, max_new_tokens: int) -> Turn:
        """The model's answer to `text`, after everything said before."""
        if not isinstance(text, str) or not text:
            raise ValueError("text: expected the user's message, a non-empty string")
        self.messages.append({"role": "user", "content": text})
        context = render_ids(self.messages, self.tokenizer, self.format)
        t0 = time.perf_counter()
        before = self.session.stats.prefill_s if self.session is not None else 0.0
        reprefilled, prefilled = self._read(context)
        prefill_s = self.session.stats.prefill_s - (0.0 if reprefilled or before == 0.0 else before)
        steps_before = len(self.session.stats.steps)
        new = self.session.generate(max_new_tokens)[0]
        seconds = time.perf_counter() - t0
        stats = SpeculativeStats(steps=self.session.stats.steps[steps_before:], prefill_s=prefill_s)
        answer = new[:-1] if new and new[-1] in self.stop else new
        reply = self.tokenizer.decode(answer, skip_special_tokens=True)
        self.messages.append({"role": "assistant", "content": reply})
        return Turn(reply, new, context, prefilled, reprefilled, seconds, stats)

    def _read(self, context: list[int]) -> tuple[bool, int]:
        """Give the session the conversation `context`: append what it has not read (a turn's own tokens), or start
        anew when what it holds is not the rendering's prefix. Returns (started anew, tokens prefilled)."""
        held = self.session.tokens[0] if self.session is not None else None
        if held is not None and len(context) > len(held) and context[: len(held)] == held:
            suffix = context[len(held):]
            self.session.append(torch.tensor([suffix], device=self.session.target.device))
            return False, len(suffix)
        self.session = Session(self.target, self.drafter, stopping=StoppingConfig(eos_token_id=tuple(self.stop) or None),
                               rollback=False, **self.options)
        self.session.append(torch.tensor([context]))
        return held is not None, len(context)


__all__ = ["Conversation", "TURN_FORMATS", "Turn", "TurnFormat", "render_ids", "stop_ids", "turn_format"]
