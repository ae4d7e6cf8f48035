"""Reading VQA question sets in the layouts they are published in (VQAv2, TextVQA, DocVQA /
InfographicVQA, ChartQA, JSONL) into one record type, and writing a sample set out in each layout.

Every problem in a file is a `ValueError` naming the file, the JSONL line (1-based) or JSON record
(0-based index into its list) and what is wrong; no record is ever skipped.
"""

from __future__ import annotations

import json
from collections.abc import Iterable
from dataclasses import dataclass
from pathlib import Path
from typing import Any


@dataclass
class VQARecord:
    """One question as read from a file, whatever its layout."""
    question_id: str
    question: str
    answers: list[str]  # reference answers; [] only when read with require_answers=False
    image: str | None  # the image file path, resolved (None: a JSONL record without an image)
    where: str  # source file and line / record, for error messages


# --- field checks -----------------------------------------------------------------------------------

def _text(rec: dict, key: str, where: str) -> str:
    if key not in rec:
        raise ValueError(f"{where}: missing field {key!r} (fields: {sorted(rec)})")
    value = rec[key]
    if not isinstance(value, str):
        raise ValueError(f"{where}: field {key!r} is not a string: {value!r}")
    if not value.strip():
        raise ValueError(f"{where}: field {key!r} is empty")
    return value


def _question_id(value: Any, where: str, key: str) -> str:
    if isinstance(value, bool) or not isinstance(value, (int, str)):
        raise ValueError(f"{where}: field {key!r} is not an int or a string: {value!r}")
    return str(value)


def _string_list(value: Any, where: str, key: str, require: bool) -> list[str]:
    if not isinstance(value, list) or not all(isinstance(a, str) for a in value):
        raise ValueError(f"{where}: answers ({key!r}) not a list of strings: {value!r}")
    if require and not value:
        raise ValueError(f"{where}: answers ({key!r}) is an empty list")
    return value


def _missing_answers(where: str, fields: str, require: bool) -> list[str]:
    if require:
        raise ValueError(f"{where}: missing field {fields} (read with require_answers=False for "
                         f"questions without answers)")
    return []


def _record(rec: Any, where: str) -> dict:
    if not isinstance(rec, dict):
        raise ValueError(f"{where}: expected a JSON object, got {type(rec).__name__}")
    return rec


def _first_existing(candidates: list[Path]) -> str:
    # The first candidate that exists, else the first (so the caller's "not found" names the usual place).
    for path in candidates:
        if path.exists():
            return str(path)
    return str(candidates[0])


def _id_image(base: Path, stem: str, folders: tuple[str, ...] = ()) -> str:
    # Image names built from an id (VQAv2, TextVQA) carry no extension of their own: try .jpg (the
    # published images) then .png (what `write_layouts` writes), beside `base` then in `folders` under it.
    return _first_existing([root / f"{stem}{ext}" for root in (base, *(base / f for f in folders))
                            for ext in (".jpg", ".png")])


# --- layouts ----------------------------------------------------------------------------------------

def _annotations_candidates(questions: Path) -> list[Path]:
    # "X_questions.json" -> "X_annotations.json"; the published VQAv2 names also drop the task:
    # "v2_OpenEnded_mscoco_val2014_questions.json" -> "v2_mscoco_val2014_annotations.json".
    name = questions.name.replace("questions", "annotations")
    names = [name] + [name.replace(task, "") for task in ("OpenEnded_", "MultipleChoice_") if task in name]
    return [questions.with_name(n) for n in dict.fromkeys(names) if n != questions.name]


def _read_vqav2_answers(path: Path) -> dict[str, list[str]]:
    doc = _load_json(path)
    if not isinstance(doc, dict) or not isinstance(doc.get("annotations"), list):
        raise ValueError(f"{path}: not a VQAv2 annotations file (expected an object with an "
                         f"'annotations' list)")
    out: dict[str, list[str]] = {}
    for i, ann in enumerate(doc["annotations"]):
        where = f"{path} record {i} (annotations[{i}])"
        ann = _record(ann, where)
        if "question_id" not in ann:
            raise ValueError(f"{where}: missing field 'question_id'")
        if "answers" not in ann or not isinstance(ann["answers"], list):
            raise ValueError(f"{where}: answers ('answers') not a list of {{'answer': str}} objects")
        answers = []
        for j, entry in enumerate(ann["answers"]):
            if not isinstance(entry, dict) or not isinstance(entry.get("answer"), str):
                raise ValueError(f"{where}: answers[{j}] is not an object with a string 'answer': {entry!r}")
            answers.append(entry["answer"])
        if not answers:
            raise ValueError(f"{where}: answers ('answers') is an empty list")
        out[_question_id(ann["question_id"], where, "question_id")] = answers
    return out


def _read_vqav2(path: Path, doc: dict, base: Path, annotations: Path | None,
                require: bool) -> list[VQARecord]:
    if not isinstance(doc["questions"], list):
        raise ValueError(f"{path}: field 'questions' is not a list")
    if annotations is None:
        found = [p for p in _annotations_candidates(path) if p.exists()]
        if found:
            annotations = found[0]
        elif require:
            looked = ", ".join(str(p) for p in _annotations_candidates(path)) or "(no name to derive)"
            raise ValueError(f"{path}: VQAv2 questions need their annotations JSON for the answers; none "
                             f"found beside it (looked for {looked}); pass annotations=PATH (--annotations)")
    answers = _read_vqav2_answers(annotations) if annotations is not None else {}
    subtype = doc.get("data_subtype")
    records = []
    for i, q in enumerate(doc["questions"]):
        where = f"{path} record {i} (questions[{i}])"
        q = _record(q, where)
        question = _text(q, "question", where)
        if "question_id" not in q:
            raise ValueError(f"{where}: missing field 'question_id'")
        qid = _question_id(q["question_id"], where, "question_id")
        if "image" in q:
            image = str(base / _text(q, "image", where))
        else:
            image_id = q.get("image_id")
            if isinstance(image_id, str) and image_id.isdigit():
                image_id = int(image_id)
            if isinstance(image_id, bool) or not isinstance(image_id, int):
                raise ValueError(f"{where}: field 'image_id' missing or not an int: {image_id!r}")
            if not isinstance(subtype, str):
                raise ValueError(f"{path}: missing field 'data_subtype' (e.g. \"val2014\"), needed to name "
                                 f"the images COCO_<data_subtype>_<image_id>.jpg")
            image = _id_image(base, f"COCO_{subtype}_{image_id:012d}", (subtype,))
        if annotations is None:
            refs = []
        elif qid not in answers:
            raise ValueError(f"{where}: question_id {qid} has no annotation in {annotations}")
        else:
            refs = answers[qid]
        records.append(VQARecord(qid, question, refs, image, where))
    return records


def _read_data_list(path: Path, doc: dict, base: Path, require: bool) -> list[VQARecord]:
    # TextVQA ("question_id", "image_id") and DocVQA / InfographicVQA ("questionId", "image" /
    # "image_local_name") share the {"data": [...]} envelope; each record is read by the fields it has.
    if not isinstance(doc["data"], list):
        raise ValueError(f"{path}: field 'data' is not a list")
    records = []
    for i, rec in enumerate(doc["data"]):
        where = f"{path} record {i} (data[{i}])"
        rec = _record(rec, where)
        question = _text(rec, "question", where)
        key = next((k for k in ("questionId", "question_id") if k in rec), None)
        qid = str(i) if key is None else _question_id(rec[key], where, key)
        image_key = next((k for k in ("image_path", "image", "image_local_name") if k in rec), None)
        if image_key is not None:
            image = str(base / _text(rec, image_key, where))
        elif "image_id" in rec:
            image = _id_image(base, _question_id(rec["image_id"], where, "image_id"))
        else:
            raise ValueError(f"{where}: missing field 'image' (or 'image_path', 'image_local_name', 'image_id')")
        if "answers" in rec:
            refs = _string_list(rec["answers"], where, "answers", require)
        else:
            refs = _missing_answers(where, "'answers'", require)
        records.append(VQARecord(qid, question, refs, image, where))
    return records


def _chartqa_image(base: Path, name: str) -> str:
    # ChartQA ships its images in a "png" folder beside the JSON: look there too.
    return _first_existing([base / name, base / "png" / name])


def _read_chartqa(path: Path, items: list, base: Path, require: bool) -> list[VQARecord]:
    records = []
    for i, rec in enumerate(items):
        where = f"{path} record {i}"
        rec = _record(rec, where)
        question = _text(rec, "query", where)
        image = _chartqa_image(base, _text(rec, "imgname", where))
        if "label" not in rec:
            refs = _missing_answers(where, "'label'", require)
        else:
            label = rec["label"]
            # some ChartQA exports store numeric labels as JSON numbers
            if isinstance(label, (int, float)) and not isinstance(label, bool):
                label = str(label)
            if not isinstance(label, str):
                raise ValueError(f"{where}: answer ('label') is not a string: {label!r}")
            refs = [label]
        records.append(VQARecord(str(i), question, refs, image, where))
    return records


def _plain_record(rec: Any, index: int, where: str, base: Path, require: bool) -> VQARecord:
    # A JSONL line (or an item of a JSON list) with "question", "image"/"image_path" and
    # "answers"/"answer"; the question id is "question_id" or "id", else the 0-based record index.
    rec = _record(rec, where)
    question = _text(rec, "question", where)
    key = next((k for k in ("question_id", "id") if k in rec), None)
    qid = str(index) if key is None else _question_id(rec[key], where, key)
    image_key = next((k for k in ("image", "image_path") if k in rec), None)
    image = None if image_key is None else str(base / _text(rec, image_key, where))
    if "answers" in rec:
        refs = _string_list(rec["answers"], where, "answers", require)
    elif "answer" in rec:
        if not isinstance(rec["answer"], str):
            raise ValueError(f"{where}: answer ('answer') is not a string: {rec['answer']!r}")
        refs = [rec["answer"]]
    else:
        refs = _missing_answers(where, "'answers' (a list) or 'answer' (a string)", require)
    return VQARecord(qid, question, refs, image, where)


def _read_jsonl(path: Path, text: str, base: Path, require: bool) -> list[VQARecord]:
    records = []
    for lineno, line in enumerate(text.splitlines(), 1):
        if not line.strip():
            continue  # blank lines hold no record
        where = f"{path} line {lineno}"
        try:
            rec = json.loads(line)
        except json.JSONDecodeError as e:
            raise ValueError(f"{where}: invalid JSON ({e.msg} at column {e.colno})") from None
        records.append(_plain_record(rec, len(records), where, base, require))
    return records


def _load_json(path: Path) -> Any:
    text = path.read_text(encoding="utf-8-sig")
    if not text.strip():
        raise ValueError(f"{path}: empty file")
    try:
        return json.loads(text)
    except json.JSONDecodeError as e:
        raise ValueError(f"{path} line {e.lineno}: invalid JSON ({e.msg} at column {e.colno})") from None


def _looks_like_jsonl(text: str) -> bool:
    first = next((line for line in text.splitlines() if line.strip()), "")
    try:
        return isinstance(json.loads(first), dict)
    except json.JSONDecodeError:
        return False


def read_vqa(data: str | Path, images: str | Path | None = None, annotations: str | Path | None = None,
             require_answers: bool = True) -> list[VQARecord]:
    """The questions in `data`, in file order, whatever its layout:

    - VQAv2: {"questions": [{"question_id", "image_id", "question"}], "data_subtype", ...} with the answers
      from the annotations JSON (`annotations`, else beside `data`: "questions" -> "annotations" in the
      name, also without "OpenEnded_"); images COCO_<data_subtype>_<image_id:012d>.jpg, or .png;
    - TextVQA: {"data": [{"question_id", "question", "image_id", "answers"}]} -> <image_id>.jpg (or .png),
      or the record's "image" / "image_path";
    - DocVQA / InfographicVQA: {"data": [{"questionId", "question", "image" / "image_local_name", "answers"}]};
    - ChartQA: [{"imgname", "query", "label"}] -> answers [label], images beside the file or in png/;
    - JSONL (.jsonl, or a .json holding one object per line), or a JSON list of such objects:
      {"question", "image" / "image_path", "answers" (list) / "answer" (string), "question_id" / "id"}.

    Image paths are resolved against `images` when given, else against the folder of `data`; they are
    not required to exist. With `require_answers=False`, records without answers (test splits, training
    questions) read as answers=[] instead of raising.
    """
    path = Path(data)
    if not path.is_file():
        raise FileNotFoundError(f"data: {path} is not a file")
    if images is not None and not Path(images).is_dir():
        raise FileNotFoundError(f"images: {images} is not a folder")
    base = Path(images) if images is not None else path.parent
    ann = Path(annotations) if annotations is not None else None
    if ann is not None and not ann.is_file():
        raise FileNotFoundError(f"annotations: {ann} is not a file")

    text = path.read_text(encoding="utf-8-sig")
    if not text.strip():
        raise ValueError(f"{path}: empty file")
    if path.suffix.lower() in (".jsonl", ".ndjson"):
        return _read_jsonl(path, text, base, require_answers)
    try:
        doc = json.loads(text)
    except json.JSONDecodeError as e:
        # a JSONL file under a .json name: its first line parses on its own, the second is "extra data"
        if e.msg == "Extra data" and _looks_like_jsonl(text):
            return _read_jsonl(path, text, base, require_answers)
        raise ValueError(f"{path} line {e.lineno}: invalid JSON ({e.msg} at column {e.colno})") from None

    if isinstance(doc, dict):
        if "questions" in doc:
            return _read_vqav2(path, doc, base, ann, require_answers)
        if "data" in doc:
            return _read_data_list(path, doc, base, require_answers)
        if "annotations" in doc:
            raise ValueError(f"{path}: this is a VQAv2 annotations file; pass the questions JSON as data "
                             f"and this file as annotations (--annotations)")
        raise ValueError(f"{path}: unknown layout: a JSON object with fields {sorted(doc)[:10]}; expected "
                         f"'questions' (VQAv2) or 'data' (TextVQA / DocVQA / InfographicVQA)")
    if isinstance(doc, list):
        if not doc:
            return []
        first = doc[0]
        if isinstance(first, dict) and ("imgname" in first or "query" in first):
            return _read_chartqa(path, doc, base, require_answers)
        if isinstance(first, dict) and "question" in first:
            return [_plain_record(rec, i, f"{path} record {i}", base, require_answers) for i, rec in enumerate(doc)]
        shown = sorted(first) if isinstance(first, dict) else type(first).__name__
        raise ValueError(f"{path} record 0: unknown layout: {shown}; expected ChartQA records "
                         f"(imgname, query, label) or question records (question, image, answers)")
    raise ValueError(f"{path}: unknown layout: the JSON is a {type(doc).__name__}, not an object or a list")


# --- writing ----------------------------------------------------------------------------------------

def _save_png(image: Any, path: Path) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    image.save(path, format="PNG")


def _dump(obj: Any, path: Path) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(json.dumps(obj, indent=1) + "\n", encoding="utf-8")


def write_layouts(samples: Iterable[tuple[Any, str, list[str]]], folder: str | Path) -> dict[str, Path]:
    """Write (PIL image, question, answers) samples in each layout `read_vqa` reads, one subfolder each:
    vqav2/, textvqa/, docvqa/, chartqa/, jsonl/. Returns the data file of each layout, by layout name.

    Images are PNG everywhere: VQAv2's COCO_val2014_<id>.png under vqav2/val2014/ and TextVQA's <id>.png
    (the readers try .jpg, then .png). Question i gets question id i in every layout (image id i in VQAv2
    and TextVQA). VQAv2 stores ten annotator answers, the given ones repeated in turn when fewer; ChartQA
    keeps one label, the first answer.
    """
    rows = []
    for i, sample in enumerate(samples):
        image, question, answers = sample
        if not isinstance(question, str) or not question.strip():
            raise ValueError(f"samples[{i}]: the question is not a non-empty string: {question!r}")
        if isinstance(answers, str) or not answers or not all(isinstance(a, str) for a in answers):
            raise ValueError(f"samples[{i}]: answers not a non-empty list of strings: {answers!r}")
        rows.append((image, question, list(answers)))
    if not rows:
        raise ValueError("samples: none given (an empty JSONL file would not read back)")
    root = Path(folder)
    out: dict[str, Path] = {}

    subtype = "val2014"
    questions, annotations = [], []
    for i, (image, question, answers) in enumerate(rows):
        _save_png(image, root / "vqav2" / subtype / f"COCO_{subtype}_{i:012d}.png")
        questions.append({"image_id": i, "question": question, "question_id": i})
        ten = answers if len(answers) >= 10 else [answers[j % len(answers)] for j in range(10)]
        annotations.append({
            "question_id": i, "image_id": i, "question_type": "none of the above", "answer_type": "other",
            "multiple_choice_answer": max(ten, key=ten.count),  # the first most common
            "answers": [{"answer": a, "answer_confidence": "yes", "answer_id": j + 1} for j, a in enumerate(ten)],
        })
    out["vqav2"] = root / "vqav2" / f"v2_OpenEnded_mscoco_{subtype}_questions.json"
    _dump({"task_type": "Open-Ended", "data_type": "mscoco", "data_subtype": subtype, "questions": questions},
          out["vqav2"])
    _dump({"data_type": "mscoco", "data_subtype": subtype, "annotations": annotations},
          root / "vqav2" / f"v2_mscoco_{subtype}_annotations.json")

    data = []
    for i, (image, question, answers) in enumerate(rows):
        _save_png(image, root / "textvqa" / f"{i:06d}.png")
        data.append({"question_id": i, "question": question, "image_id": f"{i:06d}", "answers": answers})
    out["textvqa"] = root / "textvqa" / "TextVQA_0.5.1_val.json"
    _dump({"dataset_type": "val", "dataset_name": "textvqa", "dataset_version": "0.5.1", "data": data},
          out["textvqa"])

    data = []
    for i, (image, question, answers) in enumerate(rows):
        _save_png(image, root / "docvqa" / "documents" / f"doc{i:06d}.png")
        data.append({"questionId": i, "question": question, "image": f"documents/doc{i:06d}.png",
                     "docId": i, "answers": answers, "data_split": "val"})
    out["docvqa"] = root / "docvqa" / "val_v1.0.json"
    _dump({"dataset_name": "docvqa", "dataset_split": "val", "dataset_version": "1.0", "data": data},
          out["docvqa"])

    items = []
    for i, (image, question, answers) in enumerate(rows):
        _save_png(image, root / "chartqa" / "png" / f"{i}.png")
        items.append({"imgname": f"{i}.png", "query": question, "label": answers[0]})
    out["chartqa"] = root / "chartqa" / "test_human.json"
    _dump(items, out["chartqa"])

    lines = []
    for i, (image, question, answers) in enumerate(rows):
        _save_png(image, root / "jsonl" / "images" / f"{i:06d}.png")
        lines.append(json.dumps({"question_id": i, "question": question, "image": f"images/{i:06d}.png",
                                 "answers": answers}))
    out["jsonl"] = root / "jsonl" / "questions.jsonl"
    out["jsonl"].write_text("\n".join(lines) + "\n", encoding="utf-8")
    return out
