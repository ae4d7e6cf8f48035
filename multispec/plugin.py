"""The one surface a modality plugs into: everything a modality package takes from the core, listed here by
what it is for. A modality imports from `multispec` (the user's API) and from
this module, nothing else of the core (tests/test_imports.py holds every modality to that); a new modality reads
this list, not the whole core.

How a modality registers (docs/plugins.md walks through one):
- target adapters and draft engines: `register_target_adapter(matches, adapter)`, `register_draft_engine`, called
  on import of the package named in pyproject's `multispec.adapters` entry-point group;
- fixed-shape engines (`step="static"`): `register_fixed_shape(EagerClass, StaticClass)`, one static class
  written out by name per adapter class;
- zoo pairs: `register_entry(ZooEntry(...))`;
- commands, `multispec generate` modes and `multispec train draft` trainers: `register_command`,
  `register_generate_mode`, `register_trainer`, called only from the `register` function named in the
  `multispec.commands` entry-point group, so importing a modality never loads the command line.

A subclass of `HFCausalLM` (or `LeanCausalLM`) overrides only the public hooks `HFCausalLM` documents as its
subclass contract (`prefill_extra_inputs`, `prefill_blocks`, `node_positions`, `score_forward`, `new_cache`, ...),
a fixed-shape class those of `StaticFeed`; nothing with a leading underscore (tests/test_plugin.py).

Each name is loaded on first use (PEP 562): importing a modality's registration functions loads the target
registry, not the benchmarks, the trainers or the command line.
"""

from __future__ import annotations

import importlib

# name -> "module:attribute"
REGISTRATION = {
    "register_target_adapter": "multispec.targets.registry:register_target_adapter",
    "register_draft_engine": "multispec.targets.registry:register_draft_engine",
    "register_fixed_shape": "multispec.targets.static:register_fixed_shape",
    "register_entry": "multispec.zoo:register_entry",
}
# what an adapter implements or extends (multispec.targets.base.Target is the contract)
TARGET_CONTRACT = {
    "Target": "multispec.targets.base:Target",
    "TargetOutput": "multispec.targets.base:TargetOutput",
    "PrefillOutput": "multispec.targets.base:PrefillOutput",
    "Features": "multispec.targets.base:Features",
    "FeatureRequest": "multispec.targets.base:FeatureRequest",
    "NO_FEATURES": "multispec.targets.base:NO_FEATURES",
    "FeedingEngine": "multispec.targets.base:FeedingEngine",
    "HFCausalLM": "multispec.targets.hf:HFCausalLM",
    "LeanCausalLM": "multispec.targets.lean:LeanCausalLM",
    "lean_unsupported": "multispec.targets.lean:lean_unsupported",
    "GuidedTarget": "multispec.targets.guidance:GuidedTarget",
    "as_target": "multispec.targets.resolve:as_target",
    "cache_layer_types": "multispec.targets.hf:cache_layer_types",
    "Prompt": "multispec.prompt:Prompt",
    "DraftTree": "multispec.tree:DraftTree",
    "ancestor_mask_from_parents": "multispec.tree:ancestor_mask_from_parents",
    "Requirement": "multispec.versions:Requirement",
    "require_version": "multispec.versions:require",
    "require": "multispec.host:require",
}
# the fixed-shape step's building blocks, for a static class of a modality's own
FIXED_SHAPE = {
    "StaticFeed": "multispec.targets.static_hf:StaticFeed",
    "ColumnCache": "multispec.targets.static_hf:ColumnCache",
    "StaticLeanCausalLM": "multispec.targets.static_step:StaticLeanCausalLM",
    "CapturedFeed": "multispec.targets.static_step:CapturedFeed",
    "capture_graph": "multispec.targets.static_step:capture_graph",
    "padded": "multispec.targets.static_step:padded",
    "static_feed_tables": "multispec.targets.static_step:static_feed_tables",
    "STEPS": "multispec.steps:STEPS",
}
DRAFTERS = {
    "EagleConfig": "multispec.drafters.eagle:EagleConfig",
    "EagleHead": "multispec.drafters.eagle:EagleHead",
    "EagleDrafter": "multispec.drafters.eagle:EagleDrafter",
    "EagleTrainConfig": "multispec.drafters.eagle_train:EagleTrainConfig",
    "EagleTrainer": "multispec.drafters.eagle_train:EagleTrainer",
    "ModelDrafter": "multispec.drafters.model:ModelDrafter",
    "NGramDrafter": "multispec.drafters.ngram:NGramDrafter",
    "cpu_tree": "multispec.drafters.recycling:cpu_tree",
    "dequantize_state": "multispec.int8:dequantize_state",
    "is_quantized": "multispec.int8:is_quantized",
}
# acceptance rules, generation loops and their statistics
VERIFICATION = {
    "AcceptanceRule": "multispec.rules.base:AcceptanceRule",
    "Verdict": "multispec.rules.base:Verdict",
    "check_logits": "multispec.rules.base:check_logits",
    "full_tree_tokens": "multispec.rules.base:full_tree_tokens",
    "walk_tree": "multispec.kernels.tree_walk:walk_tree",
    "TreeWalk": "multispec.kernels.tree_walk:TreeWalk",
    "ContinuousDraft": "multispec.rules.continuous:ContinuousDraft",
    "ContinuousVerdict": "multispec.rules.continuous:ContinuousVerdict",
    "DensityRatio": "multispec.rules.continuous:DensityRatio",
    "Judge": "multispec.rules.judge:Judge",
    "JudgeStats": "multispec.rules.judge:JudgeStats",
    "judge_inputs": "multispec.rules.judge:judge_inputs",
    "JudgeHead": "multispec.rules.judge_head:JudgeHead",
    "train_judge_head": "multispec.rules.judge_head:train_judge_head",
    "ContinuousOutput": "multispec.continuous:ContinuousOutput",
    "continuous_generate": "multispec.continuous:continuous_generate",
    "SpeculativeStats": "multispec.metrics:SpeculativeStats",
    "StepStats": "multispec.metrics:StepStats",
    "SpanScore": "multispec.session:SpanScore",
    "checked": "multispec.config:checked",
    "eos_ids": "multispec.config:eos_ids",
}
# randomness from the caller's generator, on its device; kernels' backend choice and argument checks
SAMPLING_AND_KERNELS = {
    "SamplingConfig": "multispec.sampling:SamplingConfig",
    "uniform": "multispec.sampling:uniform",
    "normal": "multispec.sampling:normal",
    "exponential": "multispec.sampling:exponential",
    "nan_safe_argmax": "multispec.sampling:nan_safe_argmax",
    "check_logits_finite": "multispec.sampling:check_logits_finite",
    "classifier_free_guidance": "multispec.sampling:classifier_free_guidance",
    "backend_for": "multispec.kernels.dispatch:backend_for",
    "check_tensor": "multispec.kernels.checks:check_tensor",
    "check_same_device": "multispec.kernels.checks:check_same_device",
    "argmax_ref": "multispec.kernels.common:argmax_ref",
    "sample_ref": "multispec.kernels.common:sample_ref",
}
# training drafters and the zoo's own models
TRAINING = {
    "TrainLoop": "multispec.training.loop:TrainLoop",
    "Losses": "multispec.training.loop:Losses",
    "item_generator": "multispec.training.loop:item_generator",
    "DraftKind": "multispec.training.kinds:DraftKind",
    "Shards": "multispec.shards:Shards",
    "current_shards": "multispec.shards:current",
    "Checkpoint": "multispec.zoo.training:Checkpoint",
    "train_steps": "multispec.zoo.training:train_steps",
    "adamw_cosine": "multispec.zoo.training:adamw_cosine",
}
ZOO = {
    "ZooEntry": "multispec.zoo:ZooEntry",
    "ZooPair": "multispec.zoo:ZooPair",
    "ByteTokenizer": "multispec.zoo.bytes_lm:ByteTokenizer",
    "TRAINED_CONTEXT": "multispec.zoo.bytes_lm:TRAINED_CONTEXT",
    "train_target": "multispec.zoo.bytes_lm:train_target",
    "ByteRecipe": "multispec.zoo.bytes_lm:ByteRecipe",
    "read_source": "multispec.zoo.data:read_source",
    "stdlib_files": "multispec.zoo.data:stdlib_files",
    "INT8_FILE": "multispec.zoo.int8:FILE",
    "load_int8": "multispec.zoo.int8:load_int8",
    "save_int8": "multispec.zoo.int8:save_int8",
    "VOCAB": "multispec.testing:VOCAB",
    "make_perturbed_copy": "multispec.testing:make_perturbed_copy",
}
# a modality's benchmarks record in the one results schema
BENCH = {
    "BenchOptions": "multispec.bench.options:BenchOptions",
    "Recorder": "multispec.bench.recorder:Recorder",
    "LEGEND": "multispec.bench.recorder:LEGEND",
    "format_table": "multispec.bench.recorder:format_table",
    "results": "multispec.bench.recorder:results",
    "with_role": "multispec.bench.recorder:with_role",
    "generated_tokens": "multispec.bench.recorder:generated_tokens",
    "outputs_identical": "multispec.bench.recorder:outputs_identical",
    "sequences": "multispec.bench.recorder:sequences",
    "partition": "multispec.bench.recorder:partition",
    "repeat": "multispec.bench.recorder:repeat",
    "describe": "multispec.bench.machine:describe",
    "machine_info": "multispec.bench.machine:machine_info",
    "save_results": "multispec.bench.machine:save_results",
    "Row": "multispec.bench.rows:Row",
    "leading": "multispec.bench.rows:leading",
    "method_table": "multispec.bench.rows:method_table",
    "bench_prompts": "multispec.bench.text:prompts",
    "classify": "multispec.bench.text:classify",
}
# for a modality's command modules only (its `cli.register` and what it loads)
COMMANDS = {
    "register_command": "multispec.cli:register_command",
    "register_generate_mode": "multispec.generate_args:register_generate_mode",
    "register_trainer": "multispec.training.cli:register_trainer",
    "parse_tree": "multispec.cli:parse_tree",
    "positive_int": "multispec.cli:positive_int",
    "add_speed_options": "multispec.cli:add_speed_options",
    "GenerateMode": "multispec.generate_cli:GenerateMode",
    "DEFAULT_MAX_NEW_TOKENS": "multispec.generate_cli:DEFAULT_MAX_NEW_TOKENS",
    "check_sampling": "multispec.generate_cli:check_sampling",
    "generate_one": "multispec.generate_cli:generate_one",
    "prompt_texts": "multispec.generate_cli:prompts",
    "tree_name": "multispec.generate_cli:tree_name",
    "tree_option": "multispec.generate_cli:tree_option",
    "write_json": "multispec.generate_cli:write_json",
    "comparison_line": "multispec.generate_cli:comparison_line",
    "comparison_record": "multispec.generate_cli:comparison_record",
    "timed_rounds": "multispec.generate_cli:timed_rounds",
    "TargetTrainer": "multispec.training.cli:TargetTrainer",
    "loop_config": "multispec.training.cli:loop_config",
    "loop_report": "multispec.training.cli:loop_report",
    "write_report": "multispec.training.cli:write_report",
}
GROUPS = {"registration": REGISTRATION, "target contract": TARGET_CONTRACT, "fixed shape": FIXED_SHAPE,
          "drafters": DRAFTERS, "verification": VERIFICATION, "sampling and kernels": SAMPLING_AND_KERNELS,
          "training": TRAINING, "zoo": ZOO, "bench": BENCH, "commands": COMMANDS}
SURFACE = {name: where for group in GROUPS.values() for name, where in group.items()}
__all__ = sorted(SURFACE)


def __getattr__(name: str):
    where = SURFACE.get(name)
    if where is None:
        raise AttributeError(f"multispec.plugin has no {name!r}: a modality uses the names listed in "
                             f"multispec.plugin.SURFACE (or multispec's own API); ask for a name to be added there "
                             f"rather than importing a core module directly")
    module, _, attribute = where.partition(":")
    value = getattr(importlib.import_module(module), attribute)
    globals()[name] = value  # once loaded, a plain attribute
    return value


def __dir__() -> list[str]:
    return sorted(set(globals()) | set(SURFACE))
