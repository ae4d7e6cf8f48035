"""The vision commands of the `multispec` CLI: `bench vision`, `eval vqa`, and `train draft` for a VLM target."""

from __future__ import annotations

import argparse
import json
import math
from pathlib import Path

import torch

from multispec import StoppingConfig, speculative_generate, zoo
from multispec.plugin import (BenchOptions, LEGEND, TargetTrainer, TrainLoop, current_shards, format_table, loop_config,
                              loop_report, parse_tree, positive_int, register_command, register_generate_mode,
                              register_trainer, write_report)

from . import generate_mode
from .bench import ANSWER_KINDS, PAIRS, SPLITS, run
from .compress import BRANCHES, COMPRESSORS
from .distill import DistillConfig, VisionDistiller
from .drafters import VisionDraftConfig, VisionEagleDrafter, VisionEagleHead
from .evaluate import VQAItem, run_vqa, vqa_methods
from .processing import AnswerExample, HFVQAProcessor, answer_examples, collate_examples
from .targets import vision_adapter_for
from .vqa_data import read_vqa
from .zoo_pair import NAME, head_for, load_drafters
from .zoo_words import NAME as WORDS_NAME
from .zoo_vlm import EOS, IMAGE, PAD, VQAProcessor, load_vlm

SHIPPED = Path(__file__).parent / "data" / "vqa_synth"


def _image(record):
    """A record's image as RGB; a file that is not an image names the record and the file."""
    from PIL import Image

    try:
        return Image.open(record.image).convert("RGB")
    except OSError as err:  # PIL's UnidentifiedImageError included
        raise ValueError(f"{record.where}: {record.image} is not an image ({err})") from None


def _lengths(text: str) -> tuple[int, ...]:
    try:
        ks = tuple(int(k) for k in text.split(","))
    except ValueError:
        raise argparse.ArgumentTypeError(f"expected comma-separated chain lengths such as 4,8, got {text!r}")
    if any(k < 1 for k in ks):
        raise argparse.ArgumentTypeError(f"chain lengths must be positive, got {text!r}")
    return ks


def _load_target(path: str | None):
    """(model, processor, eos id, pad id): the zoo VLM by default, else a Llava / Qwen2-VL checkpoint folder
    with its processor (a checkpoint in the zoo's byte format needs none)."""
    if path is None:
        return load_vlm(zoo.path(NAME) / "target"), VQAProcessor(), EOS, PAD
    from transformers import AutoConfig, AutoModelForImageTextToText

    if not Path(path, "config.json").exists():
        raise FileNotFoundError(f"--target: no config.json in {path}")
    config = AutoConfig.from_pretrained(path)
    model = AutoModelForImageTextToText.from_pretrained(path).eval()
    text = config.get_text_config()
    if text.vocab_size == VQAProcessor.vocab_size and getattr(config, "image_token_id", None) == IMAGE:
        return model, VQAProcessor(), EOS, PAD  # the zoo's format
    processor = HFVQAProcessor.from_pretrained(path)
    eos = model.generation_config.eos_token_id
    eos = eos[0] if isinstance(eos, list) else eos
    pad = model.generation_config.pad_token_id
    return model, processor, eos, pad if pad is not None else (eos if eos is not None else 0)


def _add_bench(p: argparse.ArgumentParser) -> None:
    p.add_argument("--quick", action="store_true", help="8 questions instead of 32")
    p.add_argument("--rounds", type=positive_int, default=None,
                   help="the questions split into N rounds, a speedup per round (default 4; --quick 2)")
    p.add_argument("--max-new-tokens", type=positive_int, default=None, help="default 200")
    p.add_argument("--threads", type=int, default=None, help="torch CPU threads")
    p.add_argument("--chain-k", type=_lengths, default=None, metavar="K[,K...]",
                   help="chain lengths, one row each (default 8)")
    p.add_argument("--tree", default=None, type=parse_tree, metavar="D/K/N", help="dynamic tree (default 8/2/16)")
    p.add_argument("--pair", default=NAME, choices=list(PAIRS),
                   help=f"the zoo VLM pair (default {NAME}; {WORDS_NAME}: word tokens, 256 image tokens)")
    p.add_argument("--weights", default=None, help="a retrained folder of the pair (default: the shipped one)")
    p.add_argument("--split", choices=list(SPLITS), default="test",
                   help="questions: the test split (default) or the validation split (where settings are chosen)")
    p.add_argument("--answers", choices=list(ANSWER_KINDS), default="all",
                   help="every question (default), or only short answers / only descriptions and explanations")
    p.add_argument("--json", default=None, metavar="PATH")


def _bench(args: argparse.Namespace) -> int:
    run(BenchOptions.from_args(args), args.pair, answers=args.answers)
    return 0


def _add_eval(p: argparse.ArgumentParser) -> None:
    p.add_argument("--data", default=None,
                   help="questions: VQAv2 questions JSON, TextVQA / DocVQA / InfographicVQA JSON, ChartQA JSON "
                        f"or JSONL (default: the shipped procedural set, {SHIPPED / 'jsonl'})")
    p.add_argument("--images", default=None, help="image folder (default: beside the data file)")
    p.add_argument("--annotations", default=None, help="VQAv2 annotations JSON (default: found beside --data)")
    p.add_argument("--target", default=None, help="a Llava / Qwen2-VL checkpoint folder (default: the zoo VLM)")
    p.add_argument("--draft", action="append", default=None, metavar="PATH",
                   help="a trained drafter folder (repeatable; default: the zoo's three for the zoo VLM)")
    p.add_argument("--limit", type=positive_int, default=None, help="first N questions only")
    p.add_argument("--max-new-tokens", type=positive_int, default=32)
    p.add_argument("--no-speculation", action="store_true", help="plain decoding only (accuracy)")
    p.add_argument("--json", default=None, metavar="PATH")


def _eval(args: argparse.Namespace) -> int:
    data = args.data or str(SHIPPED / "jsonl" / "questions.jsonl")
    records = read_vqa(data, images=args.images, annotations=args.annotations)
    if args.limit is not None:
        records = records[:args.limit]
    if not records:
        raise ValueError(f"--data: {data} holds no questions")
    items = []
    for rec in records:
        if rec.image is None or not Path(rec.image).exists():
            raise FileNotFoundError(f"{rec.where}: image {rec.image} not found (pass --images DIR)")
        items.append(VQAItem(_image(rec), rec.question, rec.answers, True))
    model, processor, eos, pad = _load_target(args.target)
    drafters = {}
    if not args.no_speculation:
        if args.draft:
            for path in args.draft:
                head = VisionEagleHead.load(path)
                drafters[f"{Path(path).name}"] = VisionEagleDrafter(head, model)
        elif args.target is None:
            drafters = load_drafters(model)
    methods = vqa_methods(model, drafters, args.max_new_tokens, eos, pad, prompt_lookup=False)
    shards = current_shards()  # under accelerate launch / torchrun: this process answers its share of the questions
    res = run_vqa(items, processor, methods, eos, desc="eval vqa", shards=shards)
    if not shards.main:  # rank 0 reports
        return 0
    print(f"{len(items)} questions from {data}")
    print(format_table("method", res["table"], columns=[("vqa_accuracy", "VQA acc"), ("anls", "ANLS"),
                                                        ("relaxed_accuracy", "relaxed")]))
    print(f"outputs_identical={res['outputs_identical']}")
    print(LEGEND)
    if args.json:
        Path(args.json).write_text(json.dumps({"data": data, "questions": len(items)} | res, indent=2))
    return 0


# `multispec train draft`'s options for a VLM target (dest -> flag): refused for other targets
TRAIN_OPTIONS = {"images": "--images", "annotations": "--annotations", "num_queries": "--num-queries",
                 "no_global": "--no-global", "ratio": "--ratio", "branches": "--branches", "offline": "--offline",
                 "max_new_tokens": "--max-new-tokens", "limit": "--limit"}


def _add_train(p) -> None:
    p.add_argument("--images", default=None, help="--data's image folder (any layout `eval vqa` reads)")
    p.add_argument("--annotations", default=None)
    p.add_argument("--num-queries", type=int, default=None, help="vispec: q-1 image tokens + 1 global vector (2)")
    p.add_argument("--no-global", action="store_true", default=None, help="vispec without the global image vector")
    p.add_argument("--ratio", type=square_ratio, default=None,
                   help="specvlm: compression of prune / pool / conv, a square (default 4: 2 x 2 windows)")
    p.add_argument("--branches", type=branch_list, default=None, metavar="A,B,...",
                   help=f"specvlm: the gate's choices among {','.join(BRANCHES)} (default: the four that keep the "
                        "image; 'text' drops it, an ablation)")
    p.add_argument("--offline", action="store_true", default=None,
                   help="CE to the data's tokens, not the teacher's distribution")
    p.add_argument("--max-new-tokens", type=positive_int, default=None,
                   help="length of the target's training answers (default 200)")
    p.add_argument("--limit", type=positive_int, default=None, help="first N questions only")


def square_ratio(text: str) -> int:
    """argparse type of --ratio: a square >= 1 (SpecVLM's 2-D windows have side sqrt(ratio))."""
    try:
        value = int(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"expected a square integer (1, 4, 9, ...), got {text!r}") from None
    if value < 1 or math.isqrt(value) ** 2 != value:
        raise argparse.ArgumentTypeError(f"expected a square integer (1, 4, 9, ...), got {value}")
    return value


def branch_list(text: str) -> tuple[str, ...]:
    """argparse type of --branches: a comma-separated subset of the SpecVLM compressor branches."""
    names = tuple(n.strip() for n in text.split(",") if n.strip())
    unknown = [n for n in names if n not in BRANCHES]
    if not names or unknown or len(set(names)) != len(names):
        raise argparse.ArgumentTypeError(f"expected distinct names among {','.join(BRANCHES)}, got {text!r}")
    return names


def _train(args: argparse.Namespace) -> int:
    """`multispec train draft` for a VLM: the target answers the questions (its answers are the training text),
    a drafter of `--kind` is distilled online on the shared training loop (data parallel under `accelerate
    launch`, gradient accumulation, bf16 autocast on a GPU, resumable); the accepted length on held-out
    questions, before and after, goes to report.json beside it."""
    # training needs questions and images only: the answers are the target's own
    records = read_vqa(args.data, images=args.images, annotations=args.annotations, require_answers=False)[:args.limit]
    for r in records:  # every image readable before any model loads
        if r.image is None or not Path(r.image).exists():
            raise FileNotFoundError(f"{r.where}: image {r.image} not found (pass --images DIR)")
    pairs = [(_image(r), r.question) for r in records]
    # every twentieth question (at least one, unless there is only one) measures the accepted length
    held_at = set(range(19, len(pairs), 20)) or ({len(pairs) - 1} if len(pairs) > 1 else set())
    held = [p for i, p in enumerate(pairs) if i in held_at] or pairs
    train = [p for i, p in enumerate(pairs) if i not in held_at]
    shards = current_shards()
    model, processor, eos, pad = _load_target(args.target)
    device = args.device or (str(shards.device) if shards.world > 1 else None)
    if device is not None:
        model.to(device)
    image_token = getattr(model.config, "image_token_id", None)
    if image_token is None:
        raise ValueError(f"--target: {type(model).__name__} has no image_token_id in its config")
    n = args.max_new_tokens or 200
    examples = _answers(model, processor, train, n, eos, pad, shards)
    vision = VisionDraftConfig(mode=args.kind, image_token_id=int(image_token), num_queries=args.num_queries or 2,
                               global_vector=not args.no_global, ratio=args.ratio or 4,
                               branches=args.branches or COMPRESSORS)
    torch.manual_seed(args.seed)  # the untrained head (and so the run) follows --seed
    head = head_for(model, vision).to(model.device)
    untrained = _accepted(model, head, processor, held, n, eos, pad) if shards.main else None
    config = DistillConfig(steps=args.steps, batch_size=args.batch_size, lr=args.lr, online=not args.offline)
    answer_type = getattr(vision_adapter_for(model), "appended_token_type", 0)  # PaliGemma's suffix: 1
    distiller = VisionDistiller(model, head, config)
    losses = distiller.loop_losses(examples, lambda b: collate_examples(b, pad, answer_type), args.seed)
    trainer = TrainLoop(head, losses, len(examples), loop_config(args, grad_clip=config.grad_clip), args.out, shards,
                        desc=f"train {args.kind}")
    history = trainer.run()
    report = loop_report(args, trainer, history, questions=len(train), heldout_questions=len(held),
                         untrained_accepted_length=untrained)
    if shards.main:
        if trainer.finished:
            head.save(args.out)
            report["accepted_length"] = _accepted(model, head, processor, held, n, eos, pad)
        write_report(args.out, report)
    return 0


def _answers(model, processor, pairs, n: int, eos, pad, shards) -> list[AnswerExample]:
    """The target's own answers to `pairs` (on the host), each process answering every `world`-th question
    and all of them gathering every answer back in the questions' order."""
    device = model.device
    mine = answer_examples(model, _on(processor, device), shards.take(pairs), n, eos, pad, progress=shards.main)
    mine = [AnswerExample({k: v.cpu() for k, v in e.inputs.items()}, e.answer.cpu()) for e in mine]
    gathered = shards.gather(mine)
    return [gathered[i % shards.world][i // shards.world] for i in range(len(pairs))]


def _on(processor, device):
    """`processor` whose tensors land on `device` (the target's)."""
    def process(image, question):
        return {k: v.to(device) if isinstance(v, torch.Tensor) else v for k, v in processor(image, question).items()}

    return process


def _accepted(model, head, processor, pairs, n: int, eos, pad) -> float:
    """Tokens committed per target forward, greedy, chains of 4, over the (image, question) pairs."""
    committed = forwards = 0
    drafter = VisionEagleDrafter(head.eval(), model)
    process = _on(processor, model.device)
    for image, question in pairs:
        out = speculative_generate(model, drafter, max_new_tokens=n, tree=4,
                                   stopping=StoppingConfig(eos_token_id=eos, pad_token_id=pad),
                                   **process(image, question))
        committed += out.stats.committed
        forwards += len(out.stats.steps)
    return round(committed / max(1, forwards), 4)


def _is_vlm(config) -> bool:
    # Janus has a vision tower too, but `train draft` serves it as an image generator (multispec.image_ar)
    return getattr(config, "vision_config", None) is not None and getattr(config, "model_type", None) != "janus"


def register() -> None:
    register_generate_mode(generate_mode.MODE)
    register_command("bench", "vision", "VLM drafters (EAGLE, ViSpec, SpecVLM) on the zoo VLM", _add_bench, _bench)
    register_command("eval", "vqa", "VQA accuracy / ANLS and speed per method", _add_eval, _eval)
    register_trainer(TargetTrainer("vision-language", _is_vlm, ("vispec", "specvlm", "eagle"), TRAIN_OPTIONS,
                                   _add_train, _train))
