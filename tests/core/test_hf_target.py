"""HFCausalLM scores a whole draft tree in one forward exactly as decoding each node's path would."""

import pytest
import torch

from multispec.prompt import Prompt
from multispec.targets import FeatureRequest, HFCausalLM
from multispec.testing import make_target, ragged_prompts


LAYERS = (0, 1)  # the residual stream entering layers 0 and 1: transformers' hidden_states[0] and [1]
REQUEST = FeatureRequest(hidden=True, layers=LAYERS)


def _path_logits(model, prompt, path_tokens):
    with torch.no_grad():
        out = model(torch.cat([prompt, path_tokens])[None], output_hidden_states=True)
    return out.logits[0, -1], out.hidden_states[-1][0, -1], [out.hidden_states[i][0, -1] for i in LAYERS]


@pytest.mark.parametrize("kind", ["llama", "gemma3"])
def test_tree_forward_and_commit_match_sequential_decoding(kind):
    model = make_target(kind)
    ids, mask = ragged_prompts(3, seed=4)
    lm = HFCausalLM(model)
    prefilled = lm.prefill(Prompt(ids, mask), REQUEST)
    roots, prefill_hidden = prefilled.roots, prefilled.features.hidden
    prompts = [ids[r][mask[r].bool()] for r in range(3)]
    # prefill features are the final hidden states of the prompt tokens (all but the last)
    for r in range(3):
        n = len(prompts[r]) - 1
        with torch.no_grad():
            ref = model(prompts[r][None, :-1], output_hidden_states=True).hidden_states
        assert torch.allclose(prefill_hidden[r, -n:], ref[-1][0], atol=1e-5)
        for i in LAYERS:
            assert torch.allclose(prefilled.features.layers[i][r, -n:], ref[i][0], atol=1e-5), i
    # a tree per row: root(0) -> 1 -> 2 -> 3, root -> 4, 1 -> 5  (rows get different parents for node 5)
    g = torch.Generator().manual_seed(0)
    tokens = torch.cat([roots[:, None], torch.randint(3, 128, (3, 5), generator=g)], 1)
    parents = torch.tensor([[-1, 0, 1, 2, 0, 1], [-1, 0, 1, 2, 0, 4], [-1, 0, 1, 2, 0, 2]])
    scored = lm.score(tokens, parents, request=REQUEST)
    logits, hidden = scored.logits, scored.features.hidden
    for r in range(3):
        for node in range(6):
            path, j = [], node
            while j > 0:
                path.append(int(tokens[r, j]))
                j = int(parents[r, j])
            ref_logits, ref_hidden, ref_layers = _path_logits(model, prompts[r], torch.tensor(path[::-1], dtype=torch.long))
            assert torch.allclose(logits[r, node], ref_logits, atol=1e-4), (r, node)
            assert torch.allclose(hidden[r, node], ref_hidden, atol=1e-4), (r, node)
            for i, ref in zip(LAYERS, ref_layers):
                assert torch.allclose(scored.features.layers[i][r, node], ref, atol=1e-4), (r, node, i)
    # commit different paths per row (ragged), then decode one more token and compare
    lm.commit(torch.tensor([[0, 1, 2, 3], [0, 4, -1, -1], [0, -1, -1, -1]]))
    kept = [[1, 2, 3], [4], []]
    nxt = torch.randint(3, 128, (3, 1), generator=g)
    step = lm.feed(nxt, torch.full((3, 1), -1)).logits
    for r in range(3):
        history = torch.cat([prompts[r][:-1], tokens[r, [0] + kept[r]], nxt[r]])
        with torch.no_grad():
            ref = model(history[None]).logits[0, -1]
        assert torch.allclose(step[r, 0], ref, atol=1e-4), r
    # dropping a row keeps the others intact
    lm.commit(torch.zeros(3, 1, dtype=torch.long))
    lm.select(torch.tensor([2, 0]))
    again = lm.feed(torch.tensor([[7], [9]]), torch.full((2, 1), -1)).logits
    for i, r in enumerate([2, 0]):
        history = torch.cat([prompts[r][:-1], tokens[r, [0] + kept[r]], nxt[r], torch.tensor([[7], [9]][i])])
        with torch.no_grad():
            ref = model(history[None]).logits[0, -1]
        assert torch.allclose(again[i, 0], ref, atol=1e-4), r


def test_commit_rejects_bad_shapes():
    lm = HFCausalLM(make_target("llama"))
    lm.start(torch.tensor([[5, 6, 7]]), torch.ones(1, 3, dtype=torch.long))
    lm.feed(torch.tensor([[7, 8]]), torch.tensor([[-1, 0]])).logits
    with pytest.raises(ValueError, match="path"):
        lm.commit(torch.tensor([0, 1]))
    with pytest.raises(ValueError, match="parents"):
        lm.feed(torch.tensor([[1]]), torch.tensor([[5]])).logits


def test_feature_requests_are_checked():
    lm = HFCausalLM(make_target("llama"))
    with pytest.raises(ValueError, match=r"drafter: requested layer features \[9\]"):
        lm.prefill(Prompt(torch.tensor([[5, 6, 7]]), torch.ones(1, 3, dtype=torch.long)), FeatureRequest(layers=(9,)))
    with pytest.raises(ValueError, match="drafter: asks for image embeddings"):
        lm.check_request(FeatureRequest(image_embeds=True))
    with pytest.raises(TypeError, match="pixel_values: target \\(LlamaForCausalLM\\) does not take this input"):
        lm.check_prompt(Prompt.build(torch.tensor([[5, 6]]), pixel_values=torch.zeros(1, 3, 8, 8)))
    with pytest.raises(RuntimeError, match="score: commit or discard"):
        lm.prefill(Prompt(torch.tensor([[5, 6, 7]]), torch.ones(1, 3, dtype=torch.long)))
        lm.score(torch.tensor([[7]]), torch.tensor([[-1]]))
        lm.score(torch.tensor([[7]]), torch.tensor([[-1]]))
