"""How many EAGLE-head forwards one target forward costs on this machine: the ratio the zoo's pairs are built to
(a target >= 10x its draft), measured two ways in interleaved rounds.

    python benchmarks/probes/cost_ratio.py [--pair stdlib-bytes-large] [--weights DIR] [--rounds 5] [--json PATH]

- `transformers`: one forward of the target for one token after the prompt (its own cache), against one forward of
  the head for one token (fc over the token's embedding and a feature, its decoder layer, its LM head);
- `engine`: what our loop pays, the target adapter's verification of one node, against the marginal cost of one
  more head forward in a drafted chain ((chain k=8 - chain k=1) / 7, the drafter's own `propose`).

Each figure is the median of `--calls` calls; the ratio is reported per round, with its median and [min-max].
"""

import argparse
import statistics
import time

import torch

from multispec import Chain, DraftTree, HFCausalLM, SamplingConfig, zoo
from multispec.bench.machine import describe, machine_info, save_results
from multispec.prompt import Prompt
from multispec.targets import as_target
from multispec.zoo.data import read_source, stdlib_files


def median_ms(fn, calls: int) -> float:
    times = []
    for _ in range(calls):
        t0 = time.perf_counter()
        fn()
        times.append(time.perf_counter() - t0)
    return statistics.median(times) * 1000


def hf_target_step(model, ids):
    """One cached forward of `model` for the prompt's last token; the cache is cropped back after each call."""
    with torch.no_grad():
        cache = model(ids[:, :-1], use_cache=True).past_key_values

    def step():
        with torch.no_grad():
            model(ids[:, -1:], past_key_values=cache, use_cache=True)
        cache.crop(-1)
    return step


def hf_head_step(pair, ids):
    """One cached forward of the EAGLE head (fc, decoder layer, LM head) for one token, as `transformers` runs it.
    The prefix is the head's window (a one-layer sliding-window head reads no further)."""
    head, target = pair.drafter.head, pair.target
    window = head.config.sliding_window or ids.shape[1]
    ids = ids[:, -min(window, ids.shape[1] - 1) - 1:]
    with torch.no_grad():
        feats = target(ids, output_hidden_states=True).hidden_states[-1]
        embeds = head.fuse(target.get_input_embeddings()(ids), feats)
        cache = head.decoder.model(inputs_embeds=embeds[:, :-1], use_cache=True).past_key_values
    if hasattr(cache, "layers"):  # a sliding-window layer must record its past to be cropped back
        for layer in cache.layers:
            if hasattr(layer, "activate_past_recording"):
                layer.activate_past_recording()
    token, feat = ids[:, -1:], feats[:, -1:]

    def step():
        with torch.no_grad():
            x = head.fuse(target.get_input_embeddings()(token), feat)
            hidden = head.decoder.model(inputs_embeds=x, past_key_values=cache, use_cache=True).last_hidden_state
            head.decoder.lm_head(hidden)
        cache.crop(-1)
    return step


def engine_steps(pair, ids):
    """Our loop's costs: the target adapter's verification of one node, and a drafted chain of k tokens."""
    target = as_target(pair.target)
    drafter = pair.drafter
    prompt = Prompt.build(ids)
    roots = target.prefill(prompt, drafter.feature_request).roots

    def verify():
        draft = DraftTree.chain(torch.zeros(1, 0, dtype=torch.long))
        tokens = torch.cat([roots[:, None], draft.tokens], 1)
        target.score(tokens, draft.full_parents(), draft.full_valid(), drafter.feature_request)
        target.discard()

    feats = HFCausalLM(pair.target).prefill(prompt, drafter.feature_request).features

    def chain(k):
        def run():
            drafter.start(prompt, feats)
            drafter.propose(ids[:, -1], Chain(k), SamplingConfig())
        return run
    return verify, chain(1), chain(8)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--pair", default="stdlib-bytes-large")
    ap.add_argument("--prompt-tokens", type=int, default=1200)
    ap.add_argument("--rounds", type=int, default=5)
    ap.add_argument("--calls", type=int, default=20)
    ap.add_argument("--threads", type=int, default=2)
    ap.add_argument("--weights", default=None, metavar="DIR", help="the pair's weights from DIR (default: shipped)")
    ap.add_argument("--json", default=None, metavar="PATH", help="also write the results as JSON")
    args = ap.parse_args()
    torch.set_num_threads(args.threads)
    pair = zoo.load(args.pair, weights=args.weights)
    if not hasattr(pair.drafter, "head"):
        raise SystemExit(f"--pair: {args.pair}'s drafter has no EAGLE head")
    text = read_source(stdlib_files("heldout")[0])
    ids = pair.tokenizer(text, return_tensors="pt")["input_ids"][:, : args.prompt_tokens]
    hf_target, hf_head = hf_target_step(pair.target, ids), hf_head_step(pair, ids)
    verify, chain1, chain8 = engine_steps(pair, ids)
    # chain timings include `start` (the head's prefill over its window), equal in both: the difference is 7 feeds
    for fn in (hf_target, hf_head, verify, chain1, chain8):  # warm-up
        for _ in range(3):
            fn()
    rounds = []
    for r in range(args.rounds):
        t, h = median_ms(hf_target, args.calls), median_ms(hf_head, args.calls)
        v, c1, c8 = median_ms(verify, args.calls), median_ms(chain1, args.calls), median_ms(chain8, args.calls)
        per_token = (c8 - c1) / 7
        rounds.append({"hf_target_ms": t, "hf_head_ms": h, "hf_ratio": t / h, "engine_verify_ms": v,
                       "engine_chain1_ms": c1, "engine_chain8_ms": c8, "engine_head_forward_ms": per_token,
                       "engine_ratio": v / per_token})
        print(f"round {r + 1}: transformers target {t:.2f} ms / head {h:.2f} ms = {t / h:.1f}x; engine verify "
              f"{v:.2f} ms / head forward {per_token:.2f} ms = {v / per_token:.1f}x")

    def summary(key):
        vals = [x[key] for x in rounds]
        return {"median": statistics.median(vals), "min": min(vals), "max": max(vals)}
    results = {"machine": machine_info(), "pair": args.pair, "prefix_tokens": ids.shape[1],
               "rounds": rounds, "summary": {k: summary(k) for k in rounds[0]}, "settings": vars(args)}
    print(f"machine: {describe(results['machine'])}")
    for key in ("hf_ratio", "engine_ratio"):
        s = results["summary"][key]
        print(f"{key}: {s['median']:.1f}x [{s['min']:.1f}-{s['max']:.1f}] over {args.rounds} rounds")
    save_results(results, args.json)


if __name__ == "__main__":
    main()
