"""HFCausalLM scores a whole draft tree in one forward exactly as decoding each node's path would."""

import pytest
import torch

from multispec.targets import HFCausalLM
from multispec.testing import make_target, ragged_prompts


def _path_logits(model, prompt, path_tokens):
    with torch.no_grad():
        out = model(torch.cat([prompt, path_tokens])[None], output_hidden_states=True)
    return out.logits[0, -1], out.hidden_states[-1][0, -1]


@pytest.mark.parametrize("kind", ["llama", "gemma3"])
def test_tree_forward_and_commit_match_sequential_decoding(kind):
    model = make_target(kind)
    ids, mask = ragged_prompts(3, seed=4)
    lm = HFCausalLM(model)
    roots, prefill_hidden = lm.start(ids, mask, output_hidden_states=True)
    prompts = [ids[r][mask[r].bool()] for r in range(3)]
    # prefill features are the final hidden states of the prompt tokens (all but the last)
    for r in range(3):
        n = len(prompts[r]) - 1
        with torch.no_grad():
            ref = model(prompts[r][None, :-1], output_hidden_states=True).hidden_states[-1][0]
        assert torch.allclose(prefill_hidden[r, -n:], ref, atol=1e-5)
    # a tree per row: root(0) -> 1 -> 2 -> 3, root -> 4, 1 -> 5  (rows get different parents for node 5)
    g = torch.Generator().manual_seed(0)
    tokens = torch.cat([roots[:, None], torch.randint(3, 128, (3, 5), generator=g)], 1)
    parents = torch.tensor([[-1, 0, 1, 2, 0, 1], [-1, 0, 1, 2, 0, 4], [-1, 0, 1, 2, 0, 2]])
    logits, hidden = lm.forward(tokens, parents, output_hidden_states=True)
    for r in range(3):
        for node in range(6):
            path, j = [], node
            while j > 0:
                path.append(int(tokens[r, j]))
                j = int(parents[r, j])
            ref_logits, ref_hidden = _path_logits(model, prompts[r], torch.tensor(path[::-1], dtype=torch.long))
            assert torch.allclose(logits[r, node], ref_logits, atol=1e-4), (r, node)
            assert torch.allclose(hidden[r, node], ref_hidden, atol=1e-4), (r, node)
    # commit different paths per row (ragged), then decode one more token and compare
    lm.commit(torch.tensor([[0, 1, 2, 3], [0, 4, -1, -1], [0, -1, -1, -1]]))
    kept = [[1, 2, 3], [4], []]
    nxt = torch.randint(3, 128, (3, 1), generator=g)
    step = lm.forward(nxt, torch.full((3, 1), -1))
    for r in range(3):
        history = torch.cat([prompts[r][:-1], tokens[r, [0] + kept[r]], nxt[r]])
        with torch.no_grad():
            ref = model(history[None]).logits[0, -1]
        assert torch.allclose(step[r, 0], ref, atol=1e-4), r
    # dropping a row keeps the others intact
    lm.commit(torch.zeros(3, 1, dtype=torch.long))
    lm.select(torch.tensor([2, 0]))
    again = lm.forward(torch.tensor([[7], [9]]), torch.full((2, 1), -1))
    for i, r in enumerate([2, 0]):
        history = torch.cat([prompts[r][:-1], tokens[r, [0] + kept[r]], nxt[r], torch.tensor([[7], [9]][i])])
        with torch.no_grad():
            ref = model(history[None]).logits[0, -1]
        assert torch.allclose(again[i, 0], ref, atol=1e-4), r


def test_commit_rejects_bad_shapes():
    lm = HFCausalLM(make_target("llama"))
    lm.start(torch.tensor([[5, 6, 7]]), torch.ones(1, 3, dtype=torch.long))
    lm.forward(torch.tensor([[7, 8]]), torch.tensor([[-1, 0]]))
    with pytest.raises(ValueError, match="path"):
        lm.commit(torch.tensor([0, 1]))
    with pytest.raises(ValueError, match="parents"):
        lm.forward(torch.tensor([[1]]), torch.tensor([[5]]))
