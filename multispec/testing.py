"""Tiny randomly initialised `transformers` models of real classes, for tests, benchmarks and examples
(no download needed)."""

from __future__ import annotations

import collections
import copy
import inspect
import traceback

import torch
from torch.overrides import TorchFunctionMode
from transformers import (Gemma3ForCausalLM, Gemma3TextConfig, LlamaConfig, LlamaForCausalLM, MistralConfig,
                          MistralForCausalLM, Qwen2Config, Qwen2ForCausalLM)

from . import step_read
from .drafters.eagle import EagleConfig, EagleHead
from .targets.base import NO_FEATURES
from .zoo.data import read_source, stdlib_files

VOCAB = 128
KINDS = ("llama", "qwen2", "gemma3", "mistral")


def make_target(kind: str = "llama", seed: int = 0, vocab: int = VOCAB, layers: int = 3, hidden: int = 64,
                head_scale: float = 8.0, attn: str = "sdpa") -> torch.nn.Module:
    """A random causal LM; the LM head is scaled up so argmax ties (and flaky comparisons) are rare."""
    torch.manual_seed(seed)
    common = dict(vocab_size=vocab, hidden_size=hidden, intermediate_size=2 * hidden, num_hidden_layers=layers,
                  num_attention_heads=4, num_key_value_heads=2, max_position_embeddings=512,
                  tie_word_embeddings=False, bos_token_id=1, eos_token_id=2, pad_token_id=0)
    if kind == "llama":
        model = LlamaForCausalLM(LlamaConfig(**common))
    elif kind == "qwen2":
        model = Qwen2ForCausalLM(Qwen2Config(**common))
    elif kind == "mistral":  # a sliding window in every layer, shorter than the tests' contexts
        model = MistralForCausalLM(MistralConfig(**common, sliding_window=6))
    elif kind == "gemma3":
        # two sliding layers with a tiny window, so the sliding-window masks are exercised
        types = ["sliding_attention", "sliding_attention", "full_attention"][:layers]
        model = Gemma3ForCausalLM(Gemma3TextConfig(**common, head_dim=16, sliding_window=6, layer_types=types))
    else:
        raise ValueError(kind)
    with torch.no_grad():
        model.get_output_embeddings().weight.mul_(head_scale)
    model.config._attn_implementation = attn
    return model.eval()


# decoders beyond the four above, each exercising what its class adds (RoPE variants, q/k norms, experts,
# per-layer sliding windows, soft-capping, logit and residual scales, attention sinks): name -> (config class,
# model class, config fields); the classes are looked up in `transformers` by name
DECODERS = {
    "llama-rope-llama3": ("LlamaConfig", "LlamaForCausalLM", dict(rope_parameters=dict(
        rope_type="llama3", rope_theta=10000.0, factor=8.0, low_freq_factor=1.0, high_freq_factor=4.0,
        original_max_position_embeddings=32))),
    "llama-rope-yarn": ("LlamaConfig", "LlamaForCausalLM", dict(rope_parameters=dict(
        rope_type="yarn", rope_theta=10000.0, factor=4.0, original_max_position_embeddings=64))),
    "llama-rope-linear": ("LlamaConfig", "LlamaForCausalLM", dict(rope_parameters=dict(
        rope_type="linear", rope_theta=10000.0, factor=2.0))),
    # dynamic NTK past a 16-token original context: its frequencies grow during the tests' generations; queries and
    # keys scaled up (`qk_scale`) so that attention is sharp and the logits depend on the frequencies (at the default
    # scale, rotating every node of a verify with its deepest node's frequencies still matched `generate`)
    "llama-rope-dynamic": ("LlamaConfig", "LlamaForCausalLM", dict(max_position_embeddings=16, qk_scale=6.0,
                                                                   rope_parameters=dict(rope_type="dynamic",
                                                                                        rope_theta=10000.0,
                                                                                        factor=2.0))),
    "qwen3": ("Qwen3Config", "Qwen3ForCausalLM", dict(head_dim=16)),
    "qwen3-moe": ("Qwen3MoeConfig", "Qwen3MoeForCausalLM", dict(head_dim=16, num_experts=4, num_experts_per_tok=2,
                                                              moe_intermediate_size=32)),
    "gemma2": ("Gemma2Config", "Gemma2ForCausalLM", dict(head_dim=16, sliding_window=6)),
    "gemma3": ("Gemma3TextConfig", "Gemma3ForCausalLM", dict(head_dim=16, sliding_window=6, layer_types=[
        "sliding_attention", "full_attention"])),
    "olmo2": ("Olmo2Config", "Olmo2ForCausalLM", {}),
    "granite": ("GraniteConfig", "GraniteForCausalLM", dict(logits_scaling=2.0, residual_multiplier=0.5,
                                                           embedding_multiplier=2.0, attention_multiplier=0.2)),
    "mixtral": ("MixtralConfig", "MixtralForCausalLM", dict(num_local_experts=4, num_experts_per_tok=2,
                                                           sliding_window=6)),
    "phi3": ("Phi3Config", "Phi3ForCausalLM", {}),
    "cohere2": ("Cohere2Config", "Cohere2ForCausalLM", dict(sliding_window=6, layer_types=[
        "sliding_attention", "full_attention"])),
    "gpt-oss": ("GptOssConfig", "GptOssForCausalLM", dict(head_dim=16, num_local_experts=4, num_experts_per_tok=2,
                                                         sliding_window=6, layer_types=[
                                                             "sliding_attention", "full_attention"])),
}


def make_decoder(name: str, seed: int = 0, vocab: int = VOCAB, layers: int = 2, hidden: int = 64,
                 head_scale: float = 8.0) -> torch.nn.Module:
    """A tiny random decoder of `DECODERS[name]`'s class (its LM head scaled up, as `make_target`'s)."""
    import transformers

    if name not in DECODERS:
        raise ValueError(f"name: expected one of {', '.join(DECODERS)}, got {name!r}")
    config_class, model_class, fields = DECODERS[name]
    fields = dict(fields)
    qk_scale = fields.pop("qk_scale", 1.0)
    if "layer_types" in fields:
        fields["layer_types"] = (fields["layer_types"] * layers)[:layers]
    config = getattr(transformers, config_class)(**dict(
        dict(vocab_size=vocab, hidden_size=hidden, intermediate_size=2 * hidden, num_hidden_layers=layers,
             num_attention_heads=4, num_key_value_heads=2, max_position_embeddings=256, tie_word_embeddings=False,
             bos_token_id=1, eos_token_id=2, pad_token_id=0), **fields))
    torch.manual_seed(seed)
    model = getattr(transformers, model_class)(config)
    with torch.no_grad():
        model.get_output_embeddings().weight.mul_(head_scale)
        sharpen_attention(model, qk_scale)
    return model.eval()


@torch.no_grad()
def sharpen_attention(model: torch.nn.Module, scale: float) -> torch.nn.Module:
    """Scale every attention layer's query and key projections by `scale` (in place): attention scores grow by
    scale^2, so the output depends on the rotary positions as a trained model's does."""
    if scale != 1.0:
        for module in model.modules():
            for name in ("q_proj", "k_proj"):
                proj = getattr(module, name, None)
                if isinstance(proj, torch.nn.Linear):
                    proj.weight.mul_(scale)
    return model


def save_checkpoint(folder, model: torch.nn.Module) -> None:
    """`model` saved as a user's checkpoint folder, with a word-level tokenizer of its vocabulary (ids 0-2: pad,
    BOS, EOS; "w3", "w4", ... the rest), for the tests of commands that take `--target PATH`."""
    from tokenizers import Tokenizer, models, pre_tokenizers
    from transformers import PreTrainedTokenizerFast

    words = ["<pad>", "<s>", "</s>"] + [f"w{i}" for i in range(3, model.config.get_text_config().vocab_size)]
    tok = Tokenizer(models.WordLevel({w: i for i, w in enumerate(words)}, unk_token="w3"))
    tok.pre_tokenizer = pre_tokenizers.WhitespaceSplit()
    fast = PreTrainedTokenizerFast(tokenizer_object=tok, pad_token="<pad>", bos_token="<s>", eos_token="</s>")
    model.save_pretrained(folder)
    fast.save_pretrained(folder)


def make_eagle_head(d2t: torch.Tensor | None = None, hidden: int = 64, vocab: int = VOCAB,
                    draft_vocab: int = 96) -> EagleHead:
    """An untrained EAGLE head for `make_target`'s models, with a reduced draft vocabulary: `d2t` maps its
    ids to the target's (default: the first `draft_vocab` ids)."""
    config = EagleConfig(hidden_size=hidden, draft_vocab_size=draft_vocab, target_vocab_size=vocab,
                         intermediate_size=2 * hidden, num_attention_heads=4, num_key_value_heads=2)
    return EagleHead(config, torch.arange(draft_vocab) if d2t is None else d2t)


def make_layer_skip_draft(target: torch.nn.Module, layers: int = 1) -> torch.nn.Module:
    """A draft sharing the target's embeddings, first `layers` blocks and head (so it often agrees)."""
    config = copy.deepcopy(target.config)
    config.num_hidden_layers = layers
    if getattr(config, "layer_types", None) is not None:
        config.layer_types = config.layer_types[:layers]
    draft = type(target)(config)
    draft.load_state_dict(target.state_dict(), strict=False)
    draft.config._attn_implementation = target.config._attn_implementation
    return draft.eval()


def make_text_models() -> dict[str, torch.nn.Module]:
    """A tiny Llama and Gemma 3 target, each with a layer-skip draft, and an EAGLE head for them."""
    target, gemma = make_target("llama"), make_target("gemma3")
    return dict(target=target, draft=make_layer_skip_draft(target), gemma=gemma,
                gemma_draft=make_layer_skip_draft(gemma), head=make_eagle_head())


def make_perturbed_copy(model: torch.nn.Module, noise: float = 0.02, seed: int = 0) -> torch.nn.Module:
    """A copy of `model` with every weight moved by `noise` times its own standard deviation: a draft that
    agrees with the target most of the time but not always, so end-to-end tests accept *and* reject."""
    g = torch.Generator().manual_seed(seed)
    draft = copy.deepcopy(model)
    with torch.no_grad():
        for p in draft.parameters():
            if p.numel() > 1 and p.is_floating_point():
                p.add_(torch.randn(p.shape, generator=g).to(p) * noise * p.float().std().to(p.dtype))
    return draft.eval()


def ragged_prompts(batch: int, seed: int = 0, vocab: int = VOCAB, lengths=(7, 3, 5, 9, 4)):
    """Left-padded prompts of different lengths (pad id 0)."""
    g = torch.Generator().manual_seed(seed)
    lens = [lengths[i % len(lengths)] for i in range(batch)]
    width = max(lens)
    ids = torch.zeros(batch, width, dtype=torch.long)
    mask = torch.zeros(batch, width, dtype=torch.long)
    for r, n in enumerate(lens):
        ids[r, width - n:] = torch.randint(3, vocab, (n,), generator=g)
        mask[r, width - n:] = 1
    return ids, mask


def source_prompts(lengths: tuple[int, ...] = (330, 200, 260)) -> tuple[torch.Tensor, torch.Tensor]:
    """Byte-level prompts for the zoo's byte models: the first `lengths[i]` characters of held-out stdlib
    files (never trained on), left-padded with 0 to a common width. Returns (input_ids, attention_mask)."""
    files = stdlib_files("heldout")
    texts = [read_source(files[i % len(files)])[:n] for i, n in enumerate(lengths)]
    rows = [list(t.encode("utf-8")) for t in texts]
    width = max(len(r) for r in rows)
    ids = torch.zeros(len(rows), width, dtype=torch.long)
    mask = torch.zeros(len(rows), width, dtype=torch.long)
    for r, row in enumerate(rows):
        ids[r, width - len(row):] = torch.tensor(row)
        mask[r, width - len(row):] = 1
    return ids, mask


def greedy_rows_alone(model: torch.nn.Module, input_ids: torch.Tensor, attention_mask: torch.Tensor,
                      n: int) -> torch.Tensor:
    """[B, n]: each row's prompt (its padding removed) decoded greedily by the model's own `generate`, alone.
    The reference for batched speculation (an explicit all-ones mask: a prompt may contain the pad id)."""
    rows = []
    with torch.no_grad():
        for r in range(input_ids.shape[0]):
            prompt = input_ids[r, attention_mask[r].bool()][None]
            rows.append(model.generate(prompt, attention_mask=torch.ones_like(prompt), max_new_tokens=n,
                                       do_sample=False, pad_token_id=0, eos_token_id=None)[0, -n:])
    return torch.stack(rows)


def first_two_token_dists(model: torch.nn.Module, prompt: torch.Tensor, sampling) -> tuple[torch.Tensor, torch.Tensor]:
    """Exact distributions (float64) of the first sampled token after `prompt` [L] and, marginally, of the
    second, under the `SamplingConfig` transform: the reference for chi-square tests of samplers."""
    with torch.no_grad():
        p1 = sampling.probs(model(prompt[None]).logits[0, -1])
        support = p1.nonzero().flatten()
        seqs = torch.cat([prompt.expand(len(support), -1), support[:, None]], 1)
        p2_given = sampling.probs(model(seqs).logits[:, -1])
        p2 = (p1[support, None] * p2_given).sum(0)
    return p1.double(), p2.double()


def _pooled(counts: torch.Tensor, expected: torch.Tensor, min_expected: float) -> tuple[torch.Tensor, torch.Tensor]:
    """Bins expecting fewer than `min_expected` counts pooled into one; a pool that still expects fewer is
    merged with the smallest remaining bin. Nothing is dropped."""
    small = expected < min_expected
    if not small.any():
        return counts, expected
    obs, exp = counts[~small], expected[~small]
    pool_obs, pool_exp = counts[small].sum(), expected[small].sum()
    if pool_exp < min_expected and exp.numel():
        i = int(exp.argmin())
        pool_obs, pool_exp = pool_obs + obs[i], pool_exp + exp[i]
        keep = torch.ones(exp.numel(), dtype=torch.bool)
        keep[i] = False
        obs, exp = obs[keep], exp[keep]
    return torch.cat([obs, pool_obs[None]]), torch.cat([exp, pool_exp[None]])


def chi_square_pvalue(samples: torch.Tensor, probs: torch.Tensor, min_expected: float = 5.0) -> float:
    """Chi-square goodness of fit of integer `samples` (outcome ids) to the exact `probs` of every outcome.

    A sample on an outcome of probability 0 (or outside `probs`) returns 0.0: an impossible observation
    fails any threshold outright. Outcomes expecting fewer than `min_expected` counts are pooled (see
    `_pooled`); no observation is ever pooled away."""
    from scipy.stats import chisquare

    samples = samples.flatten().long().cpu()
    probs = probs.flatten().double().cpu()
    if samples.numel() == 0:
        raise ValueError("samples: empty")
    if (samples < 0).any() or (samples >= probs.numel()).any():
        return 0.0
    counts = torch.bincount(samples, minlength=probs.numel()).double()
    if (counts[probs <= 0] > 0).any():
        return 0.0
    possible = probs > 0
    expected = probs[possible] / probs[possible].sum() * samples.numel()  # float32 probs need not sum to 1
    obs, exp = _pooled(counts[possible], expected, min_expected)
    if obs.numel() < 2:
        return 1.0
    return float(chisquare(obs.numpy(), exp.numpy()).pvalue)


def detectable_deviation(n: int, p: float, bins: int, alpha: float = 1e-3, power: float = 0.9) -> float:
    """The smallest change of one outcome's probability `p` (the other outcomes rescaled to compensate)
    that `chi_square_pvalue` over `n` samples and `bins` possible outcomes detects at level `alpha` with
    probability `power` (non-central chi-square; noncentrality n * delta^2 / (p (1 - p)))."""
    from scipy.optimize import brentq
    from scipy.stats import chi2, ncx2

    dof = bins - 1
    critical = chi2.isf(alpha, dof)
    lam = brentq(lambda x: ncx2.sf(critical, dof, x) - power, 1e-9, 1e6)
    return (lam * p * (1 - p) / n) ** 0.5


def energy_distance_pvalue(a: torch.Tensor, b: torch.Tensor, permutations: int = 200, seed: int = 0) -> float:
    """Two-sample test of `a` [n, d] against `b` [m, d] (flattened beyond the first dimension): the energy
    distance 2 E|X - Y| - E|X - X'| - E|Y - Y'| with a permutation p-value ((1 + #permuted >= observed) /
    (1 + permutations)). The smallest p-value it can give is 1 / (1 + permutations)."""
    a, b = a.reshape(len(a), -1).double(), b.reshape(len(b), -1).double()
    n, m = len(a), len(b)
    pooled = torch.cat([a, b])
    dist = torch.cdist(pooled, pooled)
    g = torch.Generator().manual_seed(seed)
    labels = [torch.arange(n + m) < n] + [torch.randperm(n + m, generator=g) < n for _ in range(permutations)]
    ind = torch.stack(labels, 1).double()  # [n + m, 1 + permutations], 1 = first sample
    first, second = ind, 1 - ind
    dist_first = dist @ first
    cross = (second * dist_first).sum(0) / (n * m)
    within_a = (first * dist_first).sum(0) / (n * n)
    within_b = (second * (dist @ second)).sum(0) / (m * m)
    stat = 2 * cross - within_a - within_b
    return float((1 + (stat[1:] >= stat[0]).sum()) / (1 + permutations))


def compare_tree_feeds(reference, engine, ids: torch.Tensor, mask: torch.Tensor, request=None, tol: float = 1e-4,
                       counts: bool = False) -> None:
    """Feed both engines the same draft trees of 3 rows in calls (parents fed earlier and within a call, invalid
    nodes, a 5-node call), commit paths, twice, then drop a row and feed again; assert every valid node's logits
    (and the `request`ed features) agree within `tol`. `counts`: commit `engine` with the host counts."""
    request = NO_FEATURES if request is None else request
    assert torch.equal(reference.start(ids, mask).roots, engine.start(ids, mask).roots)
    g = torch.Generator().manual_seed(0)
    valid = torch.ones(3, 3, dtype=torch.bool)
    valid[-1, 2] = False
    calls = [(torch.tensor([[-1, 0, 0, 1, 3]] * 3), None), (torch.tensor([[1, 2, 6]] * 3), valid),
             (torch.tensor([[3, 6]] * 3), None)]

    def close(a, b, keep, what):
        assert (a[keep] - b[keep]).abs().max() < tol, what

    for _ in range(2):
        for par, ok in calls:
            toks = torch.randint(3, 128, par.shape, generator=g)
            x, y = reference.feed(toks, par, ok, request=request), engine.feed(toks, par, ok, request=request)
            keep = torch.ones_like(par, dtype=torch.bool) if ok is None else ok
            close(x.logits, y.logits, keep, "logits")
            if request.hidden:
                close(x.features.hidden, y.features.hidden, keep, "hidden")
            for i in request.layers:
                close(x.features.layers[i], y.features.layers[i], keep, f"layer {i}")
        path = torch.tensor([[0, 1, 3, 8], [0, 2, -1, -1], [0, 1, 5, 6]])
        reference.commit(path)
        engine.commit(path, counts=[4, 2, 4]) if counts else engine.commit(path)
    rows = torch.tensor([0, 2])
    reference.select(rows)
    engine.select(rows)
    toks = torch.randint(3, 128, (2, 2), generator=g)
    par = torch.tensor([[-1, 0]] * 2)
    close(reference.feed(toks, par).logits, engine.feed(toks, par).logits, slice(None), "logits after select")


# ---- counting host reads ------------------------------------------------------------------------------------
HOST_READS = {torch.Tensor.item, torch.Tensor.tolist, torch.Tensor.__bool__, torch.Tensor.__int__,
              torch.Tensor.__index__, torch.Tensor.__float__, torch.Tensor.numpy, torch.Tensor.nonzero, torch.nonzero}
HOST_BUILDS = {torch.tensor, torch.as_tensor}


class CountReads(TorchFunctionMode):
    """Counts host reads of device values (`int(t)`, `bool(t)`, `t.tolist()`, `t.item()`, `nonzero`, a tensor
    built from host data onto a device), by the project line ("file.py:LINE") that made them: on CUDA each one
    waits for the GPU, which a CPU test cannot see."""

    def __init__(self):
        super().__init__()
        self.where = collections.Counter()

    def __torch_function__(self, func, types, args=(), kwargs=None):
        kwargs = kwargs or {}
        if func in HOST_READS or (func in HOST_BUILDS and kwargs.get("device") is not None):
            frames = [f for f in traceback.extract_stack()[:-1] if "/multispec/" in f.filename]
            self.where[f"{frames[-1].filename.rsplit('/', 1)[-1]}:{frames[-1].lineno}" if frames else "?"] += 1
        return func(*args, **kwargs)

    @property
    def total(self) -> int:
        return sum(self.where.values())


def step_read_line() -> str:
    """Where the session's one read per step happens ("step_read.py:LINE"), as `CountReads` names it."""
    lines, start = inspect.getsourcelines(step_read.read_step)
    return f"step_read.py:{start + next(i for i, line in enumerate(lines) if '.tolist()' in line)}"


def assert_one_read_per_step(reads: CountReads, steps: int) -> None:
    """The speculative loop read the device once a step (`read_step`), plus at most one read besides: the last
    step's cut at the token budget builds the shortened path from the host's counts."""
    assert reads.where[step_read_line()] == steps, dict(reads.where)
    assert reads.total - steps <= 1, f"{reads.total} reads in {steps} steps: {dict(reads.where)}"
