"""Conversations that keep their caches (`multispec.chat`): each turn's answer equals `generate` on the whole
conversation, and turn n+1 prefills only its own tokens (counted at the target's forward); a conversation the
session cannot extend (the rendering does not start with what it holds) starts over and says so.

Mutations caught (checked by hand): appending a turn without its rendered markers (the answer then differs from
`generate`'s), re-prefilling every turn (the count of prefilled positions)."""

import pytest
import torch
from transformers import AutoTokenizer

from multispec import NGramDrafter, SamplingConfig
from multispec.chat import Conversation, TurnFormat, render_ids
from multispec.drafters.model import ModelDrafter
from multispec.testing import make_perturbed_copy, make_target, save_checkpoint


@pytest.fixture(scope="module")
def chat_model(tmp_path_factory):
    folder = tmp_path_factory.mktemp("chat")
    model = make_target("llama", seed=5)
    save_checkpoint(folder, model)
    return model, AutoTokenizer.from_pretrained(folder)


class PositionCounter:
    """Counts the positions each target pass reads: a prefill's prompt, a scored tree's nodes (the adapter's own
    entry points, whichever engine runs the model)."""

    def __init__(self, target):
        self.calls: list[int] = []
        prefill, score = target.prefill, target.score

        def counted_prefill(prompt, *args, **kwargs):
            self.calls.append(int(prompt.input_ids.shape[1]))
            return prefill(prompt, *args, **kwargs)

        def counted_score(tokens, *args, **kwargs):
            self.calls.append(int(tokens.shape[1]))
            return score(tokens, *args, **kwargs)

        target.prefill, target.score = counted_prefill, counted_score


def _generate(model, ids, n):
    out = model.generate(torch.tensor([ids]), attention_mask=torch.ones(1, len(ids), dtype=torch.long),
                         max_new_tokens=n, do_sample=False, eos_token_id=2, pad_token_id=0)
    return out[0, len(ids):].tolist()


@pytest.mark.parametrize("drafter", ["model", "ngram"])
def test_each_turn_equals_generate_on_the_whole_conversation_and_prefills_only_itself(chat_model, drafter):
    model, tokenizer = chat_model
    draft = ModelDrafter(make_perturbed_copy(model, noise=0.02)) if drafter == "model" else NGramDrafter()
    chat = Conversation(model, draft, tokenizer, turn_format="plain", tree=4)
    messages = ["w10 w11 w12 w13 w10 w11", "w20 w21 w22 w20 w21 w22 w23", "w30 w31 w30 w31"]
    held, counter = 0, None
    for i, text in enumerate(messages):
        if counter is not None:
            counter.calls.clear()
        turn = chat.say(text, max_new_tokens=12)
        counter = counter or PositionCounter(chat.session.target)
        assert turn.tokens == _generate(model, turn.context, 12), i  # lossless on the whole conversation
        assert not turn.reprefilled
        if i == 0:
            assert turn.prefilled == len(turn.context)
        else:  # only the new turn's tokens (the old root and the rendered turn but its last), in one pass
            assert turn.prefilled == len(turn.context) - held
            assert counter.calls[0] == turn.prefilled, counter.calls[:3]
            # no pass reads the conversation again: every other one is a verification of at most 5 nodes
            assert max(counter.calls[1:]) <= 5 and len(turn.context) > 2 * turn.prefilled
        held = len(turn.context) + len(turn.tokens)
    if drafter == "model":
        assert turn.stats.mean_accepted_length > 1.5  # drafts accepted: speculation, not plain decoding


def test_a_rendering_that_does_not_extend_the_held_text_starts_over(chat_model):
    """A format that writes an answer back otherwise than it was generated (a template that trims, or re-tokenizes
    it otherwise, does): the held text is not the rendering's prefix, so the next turn reads the whole conversation
    anew (`reprefilled`) and still equals `generate` on it."""
    model, tokenizer = chat_model
    odd = TurnFormat("odd", "user: {content}\n", "assistant: w99 {content}\n", "assistant:", "\n", bos=False)
    chat = Conversation(model, NGramDrafter(), tokenizer, turn_format=odd, tree=3)
    first = chat.say("w40 w41 w42", max_new_tokens=6)
    assert not first.reprefilled and first.context == render_ids(
        [{"role": "user", "content": "w40 w41 w42"}], tokenizer, odd)
    second = chat.say("w50 w51", max_new_tokens=6)
    assert second.reprefilled and second.prefilled == len(second.context)
    assert second.tokens == _generate(model, second.context, 6)


def test_sampled_turns_come_from_the_callers_generator(chat_model):
    model, tokenizer = chat_model
    runs = []
    for _ in range(2):
        chat = Conversation(model, NGramDrafter(), tokenizer, turn_format="plain", tree=3,
                            sampling=SamplingConfig(do_sample=True), generator=torch.Generator().manual_seed(7))
        runs.append([chat.say(m, 8).tokens for m in ("w10 w11", "w12 w13")])
    assert runs[0] == runs[1]


def test_bad_input_is_refused_by_name(chat_model):
    model, tokenizer = chat_model
    with pytest.raises(ValueError, match="turn_format: expected one of gemma, plain"):
        Conversation(model, NGramDrafter(), tokenizer, turn_format="llama9")
    with pytest.raises(ValueError, match="text: expected the user's message"):
        Conversation(model, NGramDrafter(), tokenizer, turn_format="plain").say("", 4)
