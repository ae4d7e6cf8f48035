"""The CPU LM-head layout (W @ x.T): same logits as F.linear, applied only where promised, restored after,
and greedy speculation through it still equals the model's own generate."""

import pytest
import torch
import torch.nn.functional as F

from multispec import NGramDrafter, speculative_generate
from multispec.targets.lm_head import MAX_ROWS, MIN_VOCAB, fast_head_applies, tall_linear, tall_lm_head
from multispec.testing import make_target


@pytest.mark.parametrize("shape", [(1, 40), (2, 40), (3, 40), (MAX_ROWS, 40), (MAX_ROWS + 1, 40), (2, 3, 40),
                                   (1, 1, 40), (0, 40)])
@pytest.mark.parametrize("bias", [False, True])
def test_tall_linear_equals_linear(shape, bias):
    g = torch.Generator().manual_seed(len(shape) * 10 + shape[0])
    w = torch.randn(3000, 40, generator=g)
    b = torch.randn(3000, generator=g) if bias else None
    x = torch.randn(*shape, generator=g)
    got, want = tall_linear(x, w, b), F.linear(x, w, b)
    assert got.shape == want.shape
    assert torch.allclose(got, want, atol=1e-4, rtol=1e-5)


def test_patch_applies_only_to_large_cpu_heads_and_is_undone(monkeypatch):
    big = make_target("llama", vocab=MIN_VOCAB, layers=1, hidden=32)
    small = make_target("llama", layers=1, hidden=32)
    assert fast_head_applies(big) and not fast_head_applies(small)
    monkeypatch.setenv("MULTISPEC_FAST_HEAD", "0")
    assert not fast_head_applies(big)
    monkeypatch.delenv("MULTISPEC_FAST_HEAD")
    head = big.get_output_embeddings()
    ids = torch.randint(3, 100, (2, 5))
    with torch.no_grad():
        want = big(ids).logits
        with tall_lm_head(big):
            assert "forward" in vars(head)
            got = big(ids).logits
    assert "forward" not in vars(head)  # Linear.forward is back
    assert torch.allclose(got, want, atol=1e-4, rtol=1e-5)
    with pytest.raises(RuntimeError), tall_lm_head(big):  # restored on errors too
        raise RuntimeError
    assert "forward" not in vars(head)


def test_greedy_speculation_with_the_tall_head_equals_generate():
    target = make_target("llama", vocab=MIN_VOCAB + 7, layers=2, seed=4)
    ids = torch.randint(3, 200, (1, 6), generator=torch.Generator().manual_seed(1))
    ids = torch.cat([ids, ids, ids[:, :3]], 1)  # repetition: lookup drafts get accepted
    assert fast_head_applies(target)
    out = speculative_generate(target, NGramDrafter(), ids, max_new_tokens=24, tree=4, eos_token_id=[],
                               pad_token_id=0)
    with torch.no_grad():
        want = target.generate(ids, attention_mask=torch.ones_like(ids), max_new_tokens=24, do_sample=False,
                               eos_token_id=None, pad_token_id=0)
    assert torch.equal(out.sequences, want)
