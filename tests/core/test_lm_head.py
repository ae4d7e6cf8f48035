"""The CPU LM-head layout (W @ x.T): same logits as F.linear, applied only where promised, restored after,
and greedy speculation through it still equals the model's own generate."""

import pytest
import torch
import torch.nn.functional as F

from multispec import StoppingConfig, speculative_generate
from multispec.targets import lm_head
from multispec.targets.lm_head import MAX_ROWS, MIN_VOCAB, fast_head_applies, tall_linear, tall_lm_head
from multispec.testing import make_perturbed_copy, make_target


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


def test_patch_applies_only_to_large_cpu_heads_when_asked_and_is_undone(monkeypatch):
    big = make_target("llama", vocab=MIN_VOCAB, layers=1, hidden=32)
    small = make_target("llama", layers=1, hidden=32)
    monkeypatch.delenv("MULTISPEC_FAST_HEAD", raising=False)
    assert not fast_head_applies(big)  # the default: the model's own F.linear
    monkeypatch.setenv("MULTISPEC_FAST_HEAD", "auto")
    assert fast_head_applies(big) and not fast_head_applies(small)
    monkeypatch.setenv("MULTISPEC_FAST_HEAD", "0")
    assert not fast_head_applies(big)
    monkeypatch.setenv("MULTISPEC_FAST_HEAD", "yes")
    with pytest.raises(ValueError, match="MULTISPEC_FAST_HEAD"):
        fast_head_applies(big)
    monkeypatch.setenv("MULTISPEC_FAST_HEAD", "1")  # always the tall layout, whatever this CPU measures
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


def _speculation_equals_generate_on_a_large_vocabulary(n: int = 24):
    target = make_target("llama", vocab=MIN_VOCAB + 7, layers=2, seed=4)
    ids = torch.randint(3, 200, (1, 6), generator=torch.Generator().manual_seed(1))
    out = speculative_generate(target, make_perturbed_copy(target), ids, max_new_tokens=n, tree=4,
                               stopping=StoppingConfig.never())
    with torch.no_grad():
        want = target.generate(ids, attention_mask=torch.ones_like(ids), max_new_tokens=n, do_sample=False,
                               eos_token_id=None, pad_token_id=0)
    assert torch.equal(out.sequences, want)
    assert out.stats.mean_accepted_length >= 2.0, out.stats  # multi-row heads really ran
    return target


def test_greedy_speculation_with_the_tall_head_equals_generate(monkeypatch):
    monkeypatch.setenv("MULTISPEC_FAST_HEAD", "1")
    assert fast_head_applies(_speculation_equals_generate_on_a_large_vocabulary())


def test_layout_is_chosen_by_measurement_once_per_row_count(monkeypatch):
    calls = []
    timings = {1: (10.0, 2.0), 2: (2.0, 10.0), 3: (10.0, 9.5)}  # (F.linear ms, tall ms): tall wins only for 1 row

    def fake_measure(weight, m):
        calls.append(m)
        return timings[m]

    monkeypatch.setattr(lm_head, "measure_layouts", fake_measure)
    monkeypatch.setattr(lm_head, "_TALL_WINS", {})
    w = torch.randn(4096, 8)
    assert [lm_head.tall_wins(w, m) for m in (1, 2, 3, 1, 2)] == [True, False, False, True, False]
    assert calls == [1, 2, 3]  # cached after the first measurement
    assert not lm_head.tall_wins(w, MAX_ROWS + 1) and not lm_head.tall_wins(w, 0)  # never measured
    x = torch.randn(2, 8)
    tall_rows = []
    monkeypatch.setattr(lm_head, "tall_linear", lambda x, w, b=None: tall_rows.append(x.shape[0]) or tall_linear(x, w, b))
    monkeypatch.setenv("MULTISPEC_FAST_HEAD", "auto")
    assert torch.allclose(lm_head.head_forward(x[:1], w), F.linear(x[:1], w), atol=1e-5)
    assert torch.allclose(lm_head.head_forward(x, w), F.linear(x, w), atol=1e-5)
    assert tall_rows == [1]  # the measured winner ran: tall for one row, F.linear for two


def test_real_measurement_returns_positive_times():
    linear_ms, tall_ms = lm_head.measure_layouts(torch.randn(2048, 16), 3)
    assert linear_ms > 0 and tall_ms > 0


def test_the_default_never_times_and_uses_the_model_own_head(monkeypatch):
    """Timing both layouts made which tokens win a near-tie depend on the process; by default nothing is
    timed and the head is the model's own `F.linear`."""
    monkeypatch.delenv("MULTISPEC_FAST_HEAD", raising=False)
    monkeypatch.setattr(lm_head, "measure_layouts", lambda *a: pytest.fail("the default must not time layouts"))
    monkeypatch.setattr(lm_head, "tall_linear", lambda *a: pytest.fail("the default must not change the layout"))
    assert not fast_head_applies(_speculation_equals_generate_on_a_large_vocabulary(16))
