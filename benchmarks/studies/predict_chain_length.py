"""Check `multispec.draft_length`'s prediction against measured speedups, across machines.

Prices a pair's stored step profiles with a verification-cost curve measured on some machine
(`benchmarks/probes/verify_cost.py --json`) and prints each chain length's predicted speedup over the engine with no
drafts beside the speedups a `multispec zoo tune` run measured on that machine (its JSON), where given.

    python benchmarks/studies/predict_chain_length.py --pair gemma3-270m-eagle \\
        --verify-cost benchmarks/results/verify_cost_gemma3-270m-eagle_xeon.json \\
        --measured benchmarks/results/draft_shape_gemma3-270m-eagle.json
"""

from __future__ import annotations

import argparse
import json

from multispec import zoo
from multispec.draft_length import StepProfile, VerifyCost, choose_chain_length


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--pair", default="gemma3-270m-eagle")
    ap.add_argument("--verify-cost", required=True, metavar="JSON", help="a verify_cost.py result")
    ap.add_argument("--measured", default=None, metavar="JSON", help="a multispec zoo tune result (--json)")
    ap.add_argument("--json", default=None, metavar="PATH")
    args = ap.parse_args()
    shape = json.loads((zoo.path(args.pair) / "draft_shape.json").read_text())
    if not shape.get("profiles"):
        raise SystemExit(f"--pair: {args.pair}'s draft_shape.json holds no step profiles")
    profiles = [StepProfile.from_json(p) for p in shape["profiles"]]
    curve = json.loads(open(args.verify_cost).read())
    ms = {int(r["nodes"]): float(r["verify_ms"]) for r in curve["verify"]}
    filled = []
    for m in sorted({w for p in profiles for w in p.widths} - set(ms)):  # widths the curve skipped
        lo, hi = max(w for w in ms if w < m), min(w for w in ms if w > m)
        ms[m] = ms[lo] + (ms[hi] - ms[lo]) * (m - lo) / (hi - lo)
        filled.append(m)
    cost = VerifyCost(ms)
    choice = choose_chain_length(profiles, cost)
    measured = json.loads(open(args.measured).read())["tables"] if args.measured else {}
    rows = []
    print(f"verification cost from {args.verify_cost} ({curve['machine']['cpu']})"
          + (f"; interpolated at {filled} nodes" if filled else ""))
    print(f"{'k':>3s} {'mode':>9s} {'predicted':>10s} {'measured':>9s}")
    for k, modes in choice.predicted.items():
        for mode, pred in modes.items():
            row = measured.get(mode, {}).get("methods", {}).get(f"chain_k{k}")
            got = row["speedup_vs_no_draft"] if row else None
            rows.append({"chain_k": k, "mode": mode, "predicted": round(pred, 3), "measured": got})
            print(f"{k:3d} {mode:>9s} {pred:10.2f} {'-' if got is None else f'{got:9.2f}':>9s}")
    print(f"predicted choice: k={choice.chain_k}")
    if args.json:
        with open(args.json, "w") as f:
            json.dump({"pair": args.pair, "verify_cost": args.verify_cost, "measured": args.measured,
                       "cpu": curve["machine"]["cpu"], "interpolated_widths": filled, "rows": rows,
                       "predicted_chain_k": choice.chain_k}, f, indent=2)


if __name__ == "__main__":
    main()
