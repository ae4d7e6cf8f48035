"""A procedural VQA generator: bar charts, line charts, shapes and small tables drawn at 64x64, each with
questions whose answers are exact (a colour, a count, a value, a sum) and questions asking for a
description or a step-by-step explanation (answers of tens of words). The zoo VLM is trained on it and the
shipped evaluation sets are drawn from it; everything follows from a seed.
"""

from __future__ import annotations

import random
from dataclasses import dataclass, field

from PIL import Image, ImageDraw, ImageFont

from .vqa_data import write_layouts

SIZE = 64
COLOURS = {"red": (220, 40, 40), "green": (40, 170, 60), "blue": (40, 80, 220), "yellow": (230, 200, 30),
           "purple": (150, 60, 190), "orange": (240, 130, 20)}
SHAPES = ("circle", "square", "triangle")
KINDS = ("bar", "line", "shapes", "table")


@dataclass(frozen=True)
class SceneItem:
    """One thing drawn in a slot of the image: a bar, a line point, a shape (slot = quadrant) or a table
    cell (slot = row-major cell). Absent attributes are None."""

    colour: str | None = None
    value: int | None = None  # bar or point value 1..9, table digit 0..9
    shape: str | None = None


@dataclass(frozen=True)
class Scene:
    """What an image shows, slot by slot (None = an empty slot): the labels of the vision tower's
    pretraining (`multispec.vision.tower`)."""

    kind: str
    slots: tuple[SceneItem | None, ...]


MAX_SLOTS = 6


@dataclass
class VQASample:
    image: Image.Image
    question: str
    answer: str  # the reference answer (what the zoo VLM is trained to say)
    kind: str  # bar | line | shapes | table
    style: str  # short | describe | explain
    answers: list[str] = field(default_factory=list)  # accepted short answers (for VQA accuracy)
    scene: Scene | None = None


def _canvas() -> tuple[Image.Image, ImageDraw.ImageDraw]:
    image = Image.new("RGB", (SIZE, SIZE), (255, 255, 255))
    return image, ImageDraw.Draw(image)


def _a(word: str) -> str:
    return "an" if word[0] in "aeiou" else "a"


def _join(words: list[str]) -> str:
    return words[0] if len(words) == 1 else ", ".join(words[:-1]) + " and " + words[-1]


QAs = list[tuple[str, str, list[str]]]  # (question, answer, accepted short answers)


def _scene(kind: str, items: dict[int, SceneItem]) -> Scene:
    return Scene(kind, tuple(items.get(i) for i in range(MAX_SLOTS)))


def _bar(rng: random.Random) -> tuple[Image.Image, QAs, Scene]:
    n = rng.randint(3, 5)
    names = rng.sample(list(COLOURS), n)
    values = rng.sample(range(1, 10), n)  # distinct: one tallest bar, so "which is tallest" has one answer
    image, draw = _canvas()
    draw.line([(4, 60), (60, 60)], fill=(0, 0, 0))
    width = 52 // n
    for i, (name, v) in enumerate(zip(names, values)):
        x = 6 + i * width
        draw.rectangle([x, 60 - 6 * v, x + width - 3, 59], fill=COLOURS[name])
    top = names[values.index(max(values))]
    pick = rng.randrange(n)
    listing = ", ".join(f"{c} {v}" for c, v in zip(names, values))
    steps = " ".join(f"Step {i + 1}: the {c} bar is {v}." for i, (c, v) in enumerate(zip(names, values)))
    qas = [("How many bars are there?", str(n), [str(n)]),
           ("Which bar is the tallest?", top, [top]),
           (f"What is the value of the {names[pick]} bar?", str(values[pick]), [str(values[pick])]),
           ("Describe the chart.", f"A bar chart with {n} bars: {listing}. The tallest bar is {top}.", [top]),
           ("Explain step by step which bar is the tallest.", f"{steps} So the tallest bar is {top}.", [top])]
    return image, qas, _scene("bar", {i: SceneItem(c, v) for i, (c, v) in enumerate(zip(names, values))})


def _line(rng: random.Random) -> tuple[Image.Image, QAs, Scene]:
    n = rng.randint(4, 6)
    values = [rng.randint(1, 8) for _ in range(n)]
    values[rng.randrange(n)] = 9 if rng.random() < 0.3 else max(values) + 1  # a single peak
    colour = rng.choice(list(COLOURS))
    image, draw = _canvas()
    draw.line([(4, 60), (60, 60)], fill=(0, 0, 0))
    step = 52 // (n - 1)
    points = [(6 + i * step, 60 - 6 * v) for i, v in enumerate(values)]
    draw.line(points, fill=COLOURS[colour], width=2)
    for x, y in points:
        draw.ellipse([x - 1, y - 1, x + 1, y + 1], fill=(0, 0, 0))
    peak = max(values)
    where = values.index(peak) + 1
    trend = "up" if values[-1] > values[-2] else "down" if values[-1] < values[-2] else "flat"
    listing = ", ".join(str(v) for v in values)
    qas = [("What colour is the line?", colour, [colour]),
           ("What is the highest value?", str(peak), [str(peak)]),
           ("Does the line go up or down at the end?", trend, [trend]),
           ("Describe the chart.", f"A {colour} line chart with {n} points: {listing}. It peaks at {peak} at "
            f"point {where}.", [str(peak)]),
           ("Explain step by step where the line peaks.", " ".join(
               f"Step {i + 1}: point {i + 1} is {v}." for i, v in enumerate(values)) +
            f" So the line peaks at point {where} with {peak}.", [str(where)])]
    return image, qas, _scene("line", {i: SceneItem(colour, v) for i, v in enumerate(values)})


def _shapes(rng: random.Random) -> tuple[Image.Image, QAs, Scene]:
    n = rng.randint(1, 4)
    cells = rng.sample(range(4), n)  # one shape per quadrant: no overlaps
    items = [(rng.choice(SHAPES), rng.choice(list(COLOURS))) for _ in range(n)]
    image, draw = _canvas()
    for cell, (shape, colour) in zip(cells, items):
        x0, y0 = 4 + (cell % 2) * 32 + rng.randint(0, 4), 4 + (cell // 2) * 32 + rng.randint(0, 4)
        s = rng.randint(18, 22)
        box = [x0, y0, x0 + s, y0 + s]
        fill = COLOURS[colour]
        if shape == "circle":
            draw.ellipse(box, fill=fill)
        elif shape == "square":
            draw.rectangle(box, fill=fill)
        else:
            draw.polygon([(x0 + s // 2, y0), (x0, y0 + s), (x0 + s, y0 + s)], fill=fill)
    kind = rng.choice(SHAPES)
    count = sum(s == kind for s, _ in items)
    shape, colour = rng.choice(items)
    plural = "shape" if n == 1 else "shapes"
    described = _join([f"{_a(c)} {c} {s}" for s, c in items])
    qas = [("How many shapes are there?", str(n), [str(n)]),
           (f"How many {kind}s are there?", str(count), [str(count)]),
           (f"What colour is the {shape}?", colour, [colour]),
           ("Describe the image.", f"There {'is' if n == 1 else 'are'} {n} {plural}: {described}.", [str(n)]),
           (f"Explain step by step how many {kind}s there are.", " ".join(
               f"Step {i + 1}: {_a(c)} {c} {s}{' counts' if s == kind else ' does not count'}."
               for i, (s, c) in enumerate(items)) + f" So there {'is' if count == 1 else 'are'} {count}.",
            [str(count)])]
    return image, qas, _scene("shapes", {cell: SceneItem(c, None, s) for cell, (s, c) in zip(cells, items)})


_FONT = None


def _font() -> ImageFont.ImageFont:
    global _FONT
    if _FONT is None:
        _FONT = ImageFont.load_default(size=14)
    return _FONT


def _table(rng: random.Random) -> tuple[Image.Image, QAs, Scene]:
    rows, cols = 2, rng.randint(2, 3)
    cells = [[rng.randint(0, 9) for _ in range(cols)] for _ in range(rows)]
    image, draw = _canvas()
    cw, ch = 60 // cols, 28
    for r in range(rows):
        for c in range(cols):
            box = [2 + c * cw, 4 + r * ch, 2 + (c + 1) * cw, 4 + (r + 1) * ch]
            draw.rectangle(box, outline=(0, 0, 0))
            draw.text((box[0] + cw // 2 - 4, box[1] + 6), str(cells[r][c]), fill=(0, 0, 0), font=_font())
    r = rng.randrange(rows)
    total = sum(cells[r])
    biggest = max(max(row) for row in cells)
    rows_text = " ".join(f"Row {i + 1}: {', '.join(map(str, row))}." for i, row in enumerate(cells))
    qas = [("How many columns does the table have?", str(cols), [str(cols)]),
           ("What is the largest number in the table?", str(biggest), [str(biggest)]),
           (f"What is the sum of row {r + 1}?", str(total), [str(total)]),
           ("Describe the table.", f"A table with {rows} rows and {cols} columns. {rows_text}", [str(cols)]),
           (f"Explain step by step the sum of row {r + 1}.",
            f"Step 1: row {r + 1} is {', '.join(map(str, cells[r]))}. Step 2: "
            f"{' + '.join(map(str, cells[r]))} = {total}. So the sum is {total}.", [str(total)])]
    return image, qas, _scene("table", {i * cols + j: SceneItem(value=v) for i, row in enumerate(cells)
                                        for j, v in enumerate(row)})


_MAKERS = {"bar": _bar, "line": _line, "shapes": _shapes, "table": _table}
_STYLES = ("short", "short", "short", "describe", "explain")  # the order of each maker's questions


def generate_vqa(count: int, seed: int = 0, kinds: tuple[str, ...] = KINDS,
                 long_fraction: float = 0.5) -> list[VQASample]:
    """`count` samples, one question per image; about `long_fraction` of them ask for a description or an
    explanation (long answers), the rest for a short exact answer."""
    if count < 0:
        raise ValueError(f"count: expected a non-negative int, got {count}")
    unknown = set(kinds) - set(KINDS)
    if unknown or not kinds:
        raise ValueError(f"kinds: expected a non-empty subset of {KINDS}, got {kinds}")
    rng = random.Random(seed)
    out = []
    for i in range(count):
        kind = kinds[i % len(kinds)]
        image, qas, scene = _MAKERS[kind](rng)
        long = rng.random() < long_fraction
        choices = [j for j, s in enumerate(_STYLES) if (s != "short") == long]
        j = rng.choice(choices)
        question, answer, answers = qas[j]
        out.append(VQASample(image, question, answer, kind, _STYLES[j], answers, scene))
    return out


EVAL_SEED = 77  # the shipped evaluation sets (training uses seeds from 1000 up, the benchmark 7)


def write_eval_sets(folder, count: int = 40, seed: int = EVAL_SEED) -> dict:
    """The shipped procedural evaluation set (short-answer questions) in every layout `multispec eval vqa`
    reads (VQAv2, TextVQA, DocVQA, ChartQA, JSONL), under `folder`."""
    samples = generate_vqa(count, seed=seed, long_fraction=0.0)
    return write_layouts(((s.image, s.question, s.answers) for s in samples), folder)
