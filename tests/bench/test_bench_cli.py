"""The benchmark commands end to end on the shipped local pairs, shortened: JSON layout, every method's
output checked against plain decoding, ratios consistent with the reported speeds."""

import json

import pytest

from multispec.cli import main


def _check_table(table: dict, names: set[str]) -> None:
    assert names <= set(table)
    base = table["plain"]["tokens_per_s"]
    for r in table.values():
        assert r["tokens_per_s"] > 0
        assert r["speedup_vs_ar"] == pytest.approx(r["tokens_per_s"] / base, rel=1e-2)


def test_bench_text_on_the_byte_pair(tmp_path):
    path = tmp_path / "text.json"
    assert main(["bench", "text", "--pair", "stdlib-bytes", "--quick", "--max-new-tokens", "12",
                 "--json", str(path)]) == 0
    res = json.loads(path.read_text())
    assert res["outputs_identical"] is True
    _check_table(res["greedy"], {"plain", "hf_prompt_lookup", "ngram_chain", "ngram_chain_k4", "eagle_chain_k4",
                                  "eagle_dynamic_tree", "hybrid_chain_k4"})
    assert res["greedy"]["eagle_chain_k4"]["mean_accepted_length"] > 1.5  # the trained pair agrees


@pytest.mark.parametrize("pair", ["stdlib-mamba2", "stdlib-bamba"])
def test_bench_ssm_on_the_ssm_pairs(tmp_path, pair):
    path = tmp_path / "ssm.json"
    assert main(["bench", "ssm", "--pair", pair, "--quick", "--max-new-tokens", "12", "--json", str(path)]) == 0
    res = json.loads(path.read_text())
    assert res["outputs_identical"] is True
    names = {"plain", "chain_k4", "stree_static", "stree_dynamic", "ngram_chain_k5", "hybrid_chain_k4",
             "hybrid_stree_dynamic"}
    if pair == "stdlib-mamba2":
        names.add("chain_replay_k4")
    _check_table(res["greedy"], names)
    _check_table(res["sampling"], {"plain", "chain_k4", "stree_dynamic", "hybrid_stree_dynamic"})
    assert res["greedy"]["stree_dynamic"]["mean_accepted_length"] > 1.5


def test_bench_core_runs_every_method(tmp_path):
    path = tmp_path / "core.json"
    assert main(["bench", "core", "--quick", "--max-new-tokens", "6", "--json", str(path)]) == 0
    res = json.loads(path.read_text())
    assert res["outputs_identical"] is True
    methods = {r["method"] for r in res["rows"]}
    assert {"plain (generate)", "ours chain k=4", "ours token recycling tree", "ours suffix decoding tree"} <= methods
