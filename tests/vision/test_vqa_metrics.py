"""VQA metrics (normalisation, VQA accuracy, ANLS, relaxed accuracy) against hand-worked values, and the
VQA layout readers / writers on small hand-written files."""

import json

import pytest
from PIL import Image

from multispec.vision.vqa_data import VQARecord, read_vqa, write_layouts
from multispec.vision.vqa_metrics import (
    VQAScores, anls, levenshtein, normalize_answer, relaxed_accuracy, score_predictions, vqa_accuracy,
)

# ---------------------------------------------------------------------------------------------------
# normalize_answer: the official vqaEval.py rules


@pytest.mark.parametrize("raw, expected", [
    ("Two dogs.", "2 dogs"),        # final '.' (no digit after it) dropped; "two" -> "2"; lower case
    ("dont", "don't"),              # contraction table
    ("Dont know", "don't know"),    # lower-cased before the table is looked up
    ("the cat", "cat"),             # articles a / an / the removed
    ("A man's hat", "man's hat"),   # the apostrophe is not punctuation
    ("an apple", "apple"),
    ("1,000", "1000"),              # digit-comma-digit: every mark deleted, not spaced
    ("red,blue", "red blue"),       # ',' touching no space becomes a space
    ("red, blue", "red blue"),      # ", " occurs: ',' deleted, then whitespace collapsed
    ("x-ray", "x ray"),             # '-' is punctuation too
    ("Yes!", "yes"),
    ("3.14", "3.14"),               # '.' followed by a digit kept
    ("5.", "5"),                    # ... but not one after a digit (the official regex's effective rule)
    ("e.g.", "eg"),                 # periods are deleted, never spaced
    ("none", "0"),
    ("ten", "10"),
    ("eleven", "eleven"),           # the number table stops at ten
    ("  Hello\tBIG\nworld  ", "hello big world"),
    ("1,000/2", "10002"),           # official quirk: a thousands comma anywhere deletes '/' too
    ("", ""),
])
def test_normalize_answer(raw, expected):
    assert normalize_answer(raw) == expected


# ---------------------------------------------------------------------------------------------------
# vqa_accuracy: mean over the n leave-one-out subsets of min(1, matches / 3)

def _ten(k: int) -> list[str]:
    return ["cat"] * k + ["dog"] * (10 - k)


@pytest.mark.parametrize("k, expected", [
    # With k of 10 answers matching: leaving out one of the k leaves k-1 matches, leaving out one of the
    # other 10-k leaves k; acc = [k * min(1, (k-1)/3) + (10-k) * min(1, k/3)] / 10.
    (0, 0.0),   # nothing matches
    (1, 0.3),   # [1*0   + 9*(1/3)] / 10 = 3/10
    (2, 0.6),   # [2*1/3 + 8*(2/3)] / 10 = (2/3 + 16/3) / 10 = 6/10
    (3, 0.9),   # [3*2/3 + 7*1]     / 10 = (2 + 7) / 10 (not 1.0: leave-one-out!)
    (4, 1.0),   # [4*1   + 6*1]     / 10
    (10, 1.0),
])
def test_vqa_accuracy_ten_annotators(k, expected):
    assert vqa_accuracy("cat", _ten(k)) == pytest.approx(expected)


def test_vqa_accuracy_normalises_both_sides():
    # "Two." and "2" normalise alike, "the dogs" and "dogs" too: 3 of 10 match -> 0.9
    assert vqa_accuracy("Two.", ["2"] * 3 + ["3"] * 7) == pytest.approx(0.9)
    assert vqa_accuracy("two", ["Two"] * 3 + ["three"] * 7) == pytest.approx(0.9)
    assert vqa_accuracy("dogs", ["the dogs"] * 4 + ["cats"] * 6) == pytest.approx(1.0)


def test_vqa_accuracy_fewer_answers():
    # one answer: exact match (after normalisation)
    assert vqa_accuracy("Red.", ["red"]) == 1.0
    assert vqa_accuracy("blue", ["red"]) == 0.0
    # three answers, two match: leaving out either "cat" leaves 1 match (1/3), leaving out "dog" leaves
    # 2 (2/3); (1/3 + 1/3 + 2/3) / 3 = 4/9
    assert vqa_accuracy("cat", ["cat", "cat", "dog"]) == pytest.approx(4 / 9)
    # two answers, both match: each subset holds one match -> 1/3
    assert vqa_accuracy("cat", ["cat", "cat"]) == pytest.approx(1 / 3)


def test_vqa_accuracy_needs_answers():
    with pytest.raises(ValueError):
        vqa_accuracy("cat", [])
    with pytest.raises(TypeError):
        vqa_accuracy("cat", "cat")


# ---------------------------------------------------------------------------------------------------
# ANLS

def test_levenshtein():
    assert levenshtein("kitten", "sitting") == 3   # k->s, e->i, +g
    assert levenshtein("flaw", "lawn") == 2        # -f, +n
    assert levenshtein("", "abc") == 3
    assert levenshtein("abc", "") == 3
    assert levenshtein("same", "same") == 0


def test_anls():
    assert anls("Hello ", ["hello"]) == 1.0                            # lower-cased and stripped: exact
    assert anls("abcdefghij", ["abcdefghiz"]) == pytest.approx(0.9)    # NL = 1/10
    assert anls("kitten", ["sitting"]) == pytest.approx(4 / 7)         # NL = 3/7 < 0.5 -> 1 - 3/7
    assert anls("abcd", ["abxy"]) == 0.0                               # NL = 2/4 = 0.5, not < 0.5 -> 0
    assert anls("abcd", ["wxyz"]) == 0.0                               # NL = 1
    assert anls("abcdefghij", ["zzzz", "abcdefghij"]) == 1.0           # best over the answers
    assert anls("Two", ["2"]) == 0.0                                   # no VQA normalisation: NL = 3/3
    assert anls("", [""]) == 1.0
    assert anls("", ["abc"]) == 0.0
    # a looser threshold keeps NL = 0.5: 1 - 0.5
    assert anls("abcd", ["abxy"], threshold=0.6) == pytest.approx(0.5)


# ---------------------------------------------------------------------------------------------------
# relaxed accuracy (ChartQA)

def test_relaxed_accuracy():
    assert relaxed_accuracy("10.4", ["10"]) == 1.0     # |10.4 - 10| / 10 = 0.04 <= 0.05
    assert relaxed_accuracy("9.6", ["10"]) == 1.0      # 0.04
    assert relaxed_accuracy("10.6", ["10"]) == 0.0     # 0.06 > 0.05
    assert relaxed_accuracy("10.6", ["10"], tolerance=0.1) == 1.0
    assert relaxed_accuracy("45%", ["0.45"]) == 1.0    # '%' divides by 100
    assert relaxed_accuracy("45%", ["45"]) == 0.0      # 0.45 vs 45
    assert relaxed_accuracy("1,000", ["1000"]) == 1.0  # thousands separator
    assert relaxed_accuracy("0", ["0"]) == 1.0
    assert relaxed_accuracy("0.01", ["0"]) == 0.0      # a zero reference needs exactly zero
    assert relaxed_accuracy("Red.", ["red"]) == 1.0    # text: equal after normalize_answer
    assert relaxed_accuracy("the blue one", ["blue"]) == 0.0
    assert relaxed_accuracy("nan", ["nan"]) == 1.0     # not numbers, but equal text
    assert relaxed_accuracy("12", ["blue", "12.5"]) == 1.0  # any answer: 0.5 / 12.5 = 0.04


def test_score_predictions():
    # q1: "cat" vs 10x"cat": vqa 1, anls 1, relaxed 1
    # q2: "10.4" vs ["10"]: vqa 0 (one answer, no exact match), anls: NL = 2/4 -> 0, relaxed 1
    scores = score_predictions(["cat", "10.4"], [["cat"] * 10, ["10"]])
    assert isinstance(scores, VQAScores)
    assert scores.count == 2
    assert scores.vqa_accuracy == pytest.approx(0.5)
    assert scores.anls == pytest.approx(0.5)
    assert scores.relaxed_accuracy == pytest.approx(1.0)
    with pytest.raises(ValueError, match="length"):
        score_predictions(["cat"], [])
    with pytest.raises(ValueError):
        score_predictions([], [])


# ---------------------------------------------------------------------------------------------------
# readers

def _write(path, obj):
    path.write_text(obj if isinstance(obj, str) else json.dumps(obj))
    return path


def _touch(path):
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_bytes(b"")
    return path


def _vqav2_questions(tmp_path, name="v2_OpenEnded_mscoco_val2014_questions.json"):
    return _write(tmp_path / name, {"data_subtype": "val2014", "questions": [
        {"image_id": 42, "question": "What color is the bus?", "question_id": 42000},
        {"image_id": 7, "question": "How many dogs?", "question_id": 7001}]})


def _vqav2_annotations(path):
    return _write(path, {"annotations": [
        {"question_id": 7001, "image_id": 7, "multiple_choice_answer": "2",
         "answers": [{"answer": "2", "answer_id": j} for j in range(1, 11)]},
        {"question_id": 42000, "image_id": 42, "multiple_choice_answer": "red",
         "answers": [{"answer": "red", "answer_id": 1}, {"answer": "maroon", "answer_id": 2}]}]})


def test_read_vqav2_official_names(tmp_path):
    q = _vqav2_questions(tmp_path)
    _vqav2_annotations(tmp_path / "v2_mscoco_val2014_annotations.json")  # found beside, task name dropped
    _touch(tmp_path / "val2014" / "COCO_val2014_000000000007.png")     # only a .png: found in val2014/
    recs = read_vqa(q)
    assert [r.question_id for r in recs] == ["42000", "7001"]
    assert recs[0].question == "What color is the bus?"
    assert recs[0].answers == ["red", "maroon"]
    assert recs[1].answers == ["2"] * 10
    # no file for image 42: the first candidate, .jpg beside the questions
    assert recs[0].image == str(tmp_path / "COCO_val2014_000000000042.jpg")
    assert recs[1].image == str(tmp_path / "val2014" / "COCO_val2014_000000000007.png")
    assert "questions[1]" in recs[1].where


def test_read_vqav2_annotations_by_name_and_explicit(tmp_path):
    q = _vqav2_questions(tmp_path, "my_questions.json")
    _vqav2_annotations(tmp_path / "my_annotations.json")
    images = tmp_path / "imgs"
    _touch(images / "COCO_val2014_000000000042.jpg")
    _touch(images / "COCO_val2014_000000000042.png")  # .jpg is tried first
    recs = read_vqa(q, images=images)
    assert recs[0].image == str(images / "COCO_val2014_000000000042.jpg")
    other = _vqav2_annotations(tmp_path / "elsewhere.json")
    assert read_vqa(q, annotations=other)[0].answers == ["red", "maroon"]


def test_read_vqav2_errors(tmp_path):
    q = _vqav2_questions(tmp_path)
    with pytest.raises(ValueError, match="annotations") as e:
        read_vqa(q)
    assert "v2_mscoco_val2014_annotations.json" in str(e.value)  # says where it looked
    assert [r.answers for r in read_vqa(q, require_answers=False)] == [[], []]
    ann = _write(tmp_path / "ann.json", {"annotations": [
        {"question_id": 42000, "answers": [{"answer": "red"}]}]})
    with pytest.raises(ValueError, match=r"questions\[1\].*7001 has no annotation"):
        read_vqa(q, annotations=ann)
    bad = _write(tmp_path / "bad_ann.json", {"annotations": [{"question_id": 42000, "answers": ["red"]}]})
    with pytest.raises(ValueError, match=r"bad_ann.json record 0.*answers\[0\]"):
        read_vqa(q, annotations=bad)
    with pytest.raises(ValueError, match="annotations file"):
        read_vqa(ann)


def test_read_textvqa(tmp_path):
    f = _write(tmp_path / "TextVQA_0.5.1_val.json", {"dataset_name": "textvqa", "data": [
        {"question_id": 34602, "question": "what is the brand?", "image_id": "0054c91397f2fe05",
         "answers": ["nokia"] * 9 + ["nokia phone"]},
        {"question_id": 34603, "question": "what time?", "image_id": "x", "image_path": "sub/x.png",
         "answers": ["5:41"]}]})
    images = tmp_path / "train_images"
    images.mkdir()
    recs = read_vqa(f, images=images)
    assert recs[0] == VQARecord("34602", "what is the brand?", ["nokia"] * 9 + ["nokia phone"],
                                str(images / "0054c91397f2fe05.jpg"), recs[0].where)
    assert recs[1].image == str(images / "sub" / "x.png")  # an explicit path wins over image_id
    assert "data[1]" in recs[1].where


def test_read_docvqa_and_infographicvqa(tmp_path):
    doc = _write(tmp_path / "val_v1.0.json", {"dataset_name": "docvqa", "data": [
        {"questionId": 52212, "question": "What is the date?", "image": "documents/xnbl0037_1.png",
         "docId": 1968, "answers": ["1/8/93", "01/08/93"]}]})
    rec, = read_vqa(doc)
    assert (rec.question_id, rec.answers) == ("52212", ["1/8/93", "01/08/93"])
    assert rec.image == str(tmp_path / "documents" / "xnbl0037_1.png")
    info = _write(tmp_path / "infographicVQA_val_v1.0.json", {"data": [
        {"questionId": 65718, "question": "What percentage?", "image_local_name": "37313.jpeg",
         "answers": ["10%", "10"]}]})
    (tmp_path / "infographics").mkdir()
    rec, = read_vqa(info, images=tmp_path / "infographics")
    assert rec.image == str(tmp_path / "infographics" / "37313.jpeg")
    assert rec.answers == ["10%", "10"]


def test_read_chartqa(tmp_path):
    f = _write(tmp_path / "test_human.json", [
        {"imgname": "41699051005347.png", "query": "What is the peak?", "label": "79"},
        {"imgname": "multi_col_1.png", "query": "Which year?", "label": 2019}])  # a number label
    _touch(tmp_path / "png" / "multi_col_1.png")
    recs = read_vqa(f)
    assert [(r.question_id, r.question, r.answers) for r in recs] == [
        ("0", "What is the peak?", ["79"]), ("1", "Which year?", ["2019"])]
    assert recs[0].image == str(tmp_path / "41699051005347.png")
    assert recs[1].image == str(tmp_path / "png" / "multi_col_1.png")  # the png/ folder is looked in


def test_read_jsonl(tmp_path):
    f = _write(tmp_path / "q.jsonl", "\n".join([
        json.dumps({"question_id": "a1", "question": "Q1?", "image": "i/1.png", "answers": ["x", "y"]}),
        "",  # blank lines hold no record
        json.dumps({"id": 5, "question": "Q2?", "image_path": "/abs/2.png", "answer": "z"}),
        json.dumps({"question": "Q3?", "image": "3.png", "answer": "w"}),
    ]) + "\n")
    recs = read_vqa(f)
    assert [(r.question_id, r.question, r.answers) for r in recs] == [
        ("a1", "Q1?", ["x", "y"]), ("5", "Q2?", ["z"]), ("2", "Q3?", ["w"])]
    assert recs[0].image == str(tmp_path / "i" / "1.png")
    assert recs[1].image == "/abs/2.png"  # absolute paths stay
    assert recs[2].where == f"{f} line 4"
    # the same objects as a JSON list, and as JSONL under a .json name
    listed = _write(tmp_path / "q_list.json", [json.loads(line) for line in f.read_text().split("\n") if line])
    assert [r.answers for r in read_vqa(listed)] == [["x", "y"], ["z"], ["w"]]
    renamed = _write(tmp_path / "q_lines.json", f.read_text())
    assert [r.answers for r in read_vqa(renamed)] == [["x", "y"], ["z"], ["w"]]


def test_read_jsonl_without_answers_or_image(tmp_path):
    f = _write(tmp_path / "q.jsonl", json.dumps({"question": "Q?"}) + "\n")
    with pytest.raises(ValueError, match="line 1: missing field 'answers'"):
        read_vqa(f)
    rec, = read_vqa(f, require_answers=False)
    assert rec.answers == [] and rec.image is None


# ---------------------------------------------------------------------------------------------------
# malformed files: ValueError naming the file, the line / record and the problem

def test_jsonl_bad_line(tmp_path):
    good = json.dumps({"question": "Q?", "image": "a.png", "answer": "a"})
    f = _write(tmp_path / "bad.jsonl", "\n".join([good, good, '{"question": "Q?", ']) + "\n")
    with pytest.raises(ValueError, match=r"bad.jsonl line 3: invalid JSON"):
        read_vqa(f)


def test_json_bad_syntax_names_line(tmp_path):
    f = _write(tmp_path / "bad.json", '{"data": [\n  {"question": "Q?"},\n  {"question": }\n]}')
    with pytest.raises(ValueError, match=r"bad.json line 3: invalid JSON"):
        read_vqa(f)


def test_json_record_missing_question(tmp_path):
    f = _write(tmp_path / "docs.json", {"data": [
        {"questionId": 1, "question": "Q?", "image": "a.png", "answers": ["a"]},
        {"questionId": 2, "image": "b.png", "answers": ["b"]}]})
    with pytest.raises(ValueError, match=r"docs.json record 1 \(data\[1\]\): missing field 'question'"):
        read_vqa(f)
    f = _write(tmp_path / "chart.json", [{"imgname": "a.png", "query": "Q?", "label": "1"},
                                         {"imgname": "b.png", "label": "2"}])
    with pytest.raises(ValueError, match=r"chart.json record 1: missing field 'query'"):
        read_vqa(f)


@pytest.mark.parametrize("answers", [[1, 2], "yes", [["a"]], None])
def test_answers_not_strings(tmp_path, answers):
    f = _write(tmp_path / "t.json", {"data": [
        {"question_id": 1, "question": "Q?", "image_id": "a", "answers": answers}]})
    with pytest.raises(ValueError, match=r"t.json record 0 \(data\[0\]\): answers .*not a list of strings"):
        read_vqa(f)
    g = _write(tmp_path / "t.jsonl", json.dumps({"question": "Q?", "image": "a.png", "answers": answers}))
    with pytest.raises(ValueError, match=r"t.jsonl line 1: answers .*not a list of strings"):
        read_vqa(g)


def test_other_malformed(tmp_path):
    with pytest.raises(ValueError, match="empty file"):
        read_vqa(_write(tmp_path / "empty.json", "  \n"))
    with pytest.raises(ValueError, match="empty file"):
        read_vqa(_write(tmp_path / "empty.jsonl", ""))
    with pytest.raises(ValueError, match="unknown layout"):
        read_vqa(_write(tmp_path / "odd.json", {"items": []}))
    with pytest.raises(ValueError, match="unknown layout"):
        read_vqa(_write(tmp_path / "odd_list.json", [{"prompt": "Q?"}]))
    with pytest.raises(ValueError, match="unknown layout"):
        read_vqa(_write(tmp_path / "num.json", "3"))
    with pytest.raises(ValueError, match=r"line 1: expected a JSON object"):
        read_vqa(_write(tmp_path / "arr.jsonl", "[1, 2]\n"))
    with pytest.raises(ValueError, match=r"line 1: field 'question' is not a string"):
        read_vqa(_write(tmp_path / "qnum.jsonl", json.dumps({"question": 3, "answer": "a"})))
    with pytest.raises(ValueError, match=r"line 1: answers \(.answers.\) is an empty list"):
        read_vqa(_write(tmp_path / "noans.jsonl", json.dumps({"question": "Q?", "answers": []})))
    with pytest.raises(FileNotFoundError):
        read_vqa(tmp_path / "missing.json")


# ---------------------------------------------------------------------------------------------------
# writing every layout and reading it back

def test_write_layouts_round_trip(tmp_path):
    colours = [(255, 0, 0), (0, 128, 0), (0, 0, 255)]
    samples = [(Image.new("RGB", (8, 6), c), f"Question {i}?", answers)
               for i, (c, answers) in enumerate(zip(colours, [["red"], ["green", "lime"], ["3"] * 12]))]
    paths = write_layouts(samples, tmp_path / "out")
    assert sorted(paths) == ["chartqa", "docvqa", "jsonl", "textvqa", "vqav2"]
    for layout, path in paths.items():
        recs = read_vqa(path)
        assert [r.question_id for r in recs] == ["0", "1", "2"], layout
        assert [r.question for r in recs] == [q for _, q, _ in samples], layout
        for rec, (image, _, answers) in zip(recs, samples):
            if layout == "vqav2":  # ten annotators, the given answers repeated in turn (12 kept as 12)
                expected = answers if len(answers) >= 10 else [answers[j % len(answers)] for j in range(10)]
            elif layout == "chartqa":  # one label
                expected = answers[:1]
            else:
                expected = answers
            assert rec.answers == expected, layout
            with Image.open(rec.image) as back:
                assert back.size == image.size and back.convert("RGB").getpixel((0, 0)) == image.getpixel((0, 0))
    assert paths["jsonl"].name == "questions.jsonl"
    assert read_vqa(paths["vqav2"])[1].image.endswith("val2014/COCO_val2014_000000000001.png")


def test_write_layouts_rejects_bad_samples(tmp_path):
    image = Image.new("RGB", (4, 4))
    with pytest.raises(ValueError, match=r"samples\[0\]: answers"):
        write_layouts([(image, "Q?", [])], tmp_path)
    with pytest.raises(ValueError, match=r"samples\[0\]: answers"):
        write_layouts([(image, "Q?", "yes")], tmp_path)
    with pytest.raises(ValueError, match="none given"):
        write_layouts([], tmp_path)
