"""VQA answer scoring: the VQAv2 answer normalisation and 10-annotator accuracy, DocVQA's ANLS and
ChartQA's relaxed accuracy, per question and as means over a set.

`normalize_answer` reproduces what the official VQAv2 evaluation (GT-Vision-Lab/VQA, `vqaEval.py`) does to
a predicted answer, quirks included (see its docstring); the scores here apply it to the predictions and,
unlike the official script (which trusts the dataset's pre-normalised ground truth), to the references too.
"""

from __future__ import annotations

import math
import re
from collections.abc import Sequence
from dataclasses import dataclass

# Contractions written without their apostrophe, as annotators and models type them, mapped to the
# spelling used by the VQA answers. Only lower-case keys: the official table also has "Im", "Ive",
# "Id've" and "I'dve", which can never fire there because the text is lower-cased first.
CONTRACTIONS: dict[str, str] = {
    "aint": "ain't", "arent": "aren't", "cant": "can't", "couldve": "could've", "couldnt": "couldn't",
    "couldn'tve": "couldn't've", "couldnt've": "couldn't've", "didnt": "didn't", "doesnt": "doesn't",
    "dont": "don't", "hadnt": "hadn't", "hadnt've": "hadn't've", "hadn'tve": "hadn't've", "hasnt": "hasn't",
    "havent": "haven't", "hed": "he'd", "hed've": "he'd've", "he'dve": "he'd've", "hes": "he's",
    "howd": "how'd", "howll": "how'll", "hows": "how's", "isnt": "isn't", "itd": "it'd", "itd've": "it'd've",
    "it'dve": "it'd've", "itll": "it'll", "maam": "ma'am", "mightnt": "mightn't", "mightnt've": "mightn't've",
    "mightn'tve": "mightn't've", "mightve": "might've", "mustnt": "mustn't", "mustve": "must've",
    "neednt": "needn't", "notve": "not've", "oclock": "o'clock", "oughtnt": "oughtn't",
    "ow's'at": "'ow's'at", "'ows'at": "'ow's'at", "'ow'sat": "'ow's'at", "shant": "shan't",
    "shed've": "she'd've", "she'dve": "she'd've", "shouldve": "should've", "shouldnt": "shouldn't",
    "shouldnt've": "shouldn't've", "shouldn'tve": "shouldn't've",
    # the official table maps this one backwards; kept so scores agree with it
    "somebody'd": "somebodyd",
    "somebodyd've": "somebody'd've", "somebody'dve": "somebody'd've", "somebodyll": "somebody'll",
    "somebodys": "somebody's", "someoned": "someone'd", "someoned've": "someone'd've",
    "someone'dve": "someone'd've", "someonell": "someone'll", "someones": "someone's",
    "somethingd": "something'd", "somethingd've": "something'd've", "something'dve": "something'd've",
    "somethingll": "something'll", "thats": "that's", "thered": "there'd", "thered've": "there'd've",
    "there'dve": "there'd've", "therere": "there're", "theres": "there's", "theyd": "they'd",
    "theyd've": "they'd've", "they'dve": "they'd've", "theyll": "they'll", "theyre": "they're",
    "theyve": "they've", "twas": "'twas", "wasnt": "wasn't", "wed've": "we'd've", "we'dve": "we'd've",
    "weve": "we've", "werent": "weren't", "whatll": "what'll", "whatre": "what're", "whats": "what's",
    "whatve": "what've", "whens": "when's", "whered": "where'd", "wheres": "where's", "whereve": "where've",
    "whod": "who'd", "whod've": "who'd've", "who'dve": "who'd've", "wholl": "who'll", "whos": "who's",
    "whove": "who've", "whyll": "why'll", "whyre": "why're", "whys": "why's", "wont": "won't",
    "wouldve": "would've", "wouldnt": "wouldn't", "wouldnt've": "wouldn't've", "wouldn'tve": "wouldn't've",
    "yall": "y'all", "yall'll": "y'all'll", "y'allll": "y'all'll", "yall'd've": "y'all'd've",
    "y'alld've": "y'all'd've", "y'all'dve": "y'all'd've", "youd": "you'd", "youd've": "you'd've",
    "you'dve": "you'd've", "youll": "you'll", "youre": "you're", "youve": "you've",
}

NUMBER_WORDS: dict[str, str] = {
    "none": "0", "zero": "0", "one": "1", "two": "2", "three": "3", "four": "4", "five": "5", "six": "6",
    "seven": "7", "eight": "8", "nine": "9", "ten": "10",
}
ARTICLES = frozenset({"a", "an", "the"})

# Removed or turned into a space (see _strip_punctuation). Not in the list, so kept: the apostrophe (the
# contractions need it), ':', '#', '$', '%', '&', '*', '|', '~' and '.', which has its own rule.
PUNCTUATION = (";", "/", "[", "]", '"', "{", "}", "(", ")", "=", "+", "\\", "_", "-", ">", "<", "@", "`",
               ",", "?", "!")
_DIGIT_COMMA_DIGIT = re.compile(r"\d,\d")
# The official pattern is "(?!<=\d)(\.)(?!\d)": its first group is a look-*ahead* for the text "<=digit",
# which never matches at a '.', so in effect every period not followed by a digit is dropped ("5." -> "5",
# "3.14" kept), not only periods away from digits as intended. This reproduces the effective rule.
_PERIOD = re.compile(r"\.(?!\d)")


def _strip_punctuation(text: str) -> str:
    # Each mark is deleted when it touches a space somewhere in the text ("red, blue" -> "red blue") and
    # becomes a space otherwise ("red,blue" -> "red blue"); a digit-comma-digit anywhere ("1,000") makes
    # every mark deleted. The tests look at the original text, not the partly processed one.
    thousands = _DIGIT_COMMA_DIGIT.search(text) is not None
    out = text
    for mark in PUNCTUATION:
        if thousands or mark + " " in text or " " + mark in text:
            out = out.replace(mark, "")
        else:
            out = out.replace(mark, " ")
    return _PERIOD.sub("", out)


def normalize_answer(text: str) -> str:
    """The VQAv2 normalisation of an answer: punctuation (see `PUNCTUATION`; periods dropped unless a
    digit follows; "1,000" -> "1000"), lower case, number words to digits ("two" -> "2", "none" -> "0"),
    articles removed, apostrophe-less contractions restored ("dont" -> "don't"), whitespace collapsed."""
    text = text.replace("\n", " ").replace("\t", " ").strip()
    words = []
    for word in _strip_punctuation(text).lower().split():
        word = NUMBER_WORDS.get(word, word)
        if word not in ARTICLES:
            words.append(CONTRACTIONS.get(word, word))
    return " ".join(words)


def _require_answers(answers: Sequence[str]) -> None:
    if isinstance(answers, str):  # a bare string would be scored character by character
        raise TypeError(f"answers: expected a list of strings, got the string {answers!r}")
    if not answers:
        raise ValueError("answers: expected at least one reference answer, got none")


def vqa_accuracy(prediction: str, answers: Sequence[str]) -> float:
    """VQAv2 accuracy of one prediction, in [0, 1], on normalised strings.

    For each of the n leave-one-out subsets of the reference answers the prediction scores
    min(1, matches in the subset / 3); the result is the mean over the n subsets. With the usual ten
    answers, k agreeing annotators give 0.3, 0.6, 0.9 and 1.0 for k = 1, 2, 3, 4+. Fewer than ten answers
    get the same average over the answers given (so two matching answers out of two give only 1/3); a
    single answer is scored by exact match, since leaving it out would leave nothing to match.
    """
    _require_answers(answers)
    pred = normalize_answer(prediction)
    refs = [normalize_answer(a) for a in answers]
    if len(refs) == 1:
        return float(pred == refs[0])
    hits = [ref == pred for ref in refs]
    matches = sum(hits)
    # Leaving out answer i leaves matches - hits[i] matching answers among the other n - 1.
    return sum(min(1.0, (matches - hit) / 3) for hit in hits) / len(refs)


def levenshtein(a: str, b: str) -> int:
    """Edit distance (insertions, deletions and substitutions, each costing 1) between two strings."""
    if len(a) < len(b):
        a, b = b, a
    previous = list(range(len(b) + 1))  # distances from a[:0] to each prefix of b
    for i, ca in enumerate(a, 1):
        current = [i]
        for j, cb in enumerate(b, 1):
            current.append(min(previous[j] + 1, current[j - 1] + 1, previous[j - 1] + (ca != cb)))
        previous = current
    return previous[-1]


def anls(prediction: str, answers: Sequence[str], threshold: float = 0.5) -> float:
    """ANLS of one prediction (DocVQA / InfographicVQA), in [0, 1]: the best over the reference answers of
    1 - NL when NL < threshold else 0, where NL = levenshtein / max(length) on lower-cased, stripped
    strings (no VQA normalisation). Two empty strings count as identical."""
    _require_answers(answers)
    pred = prediction.strip().lower()
    best = 0.0
    for answer in answers:
        ref = answer.strip().lower()
        longest = max(len(ref), len(pred))
        nl = levenshtein(ref, pred) / longest if longest else 0.0
        if nl < threshold:
            best = max(best, 1.0 - nl)
    return best


_THOUSANDS = re.compile(r"[+-]?\d{1,3}(,\d{3})+(\.\d*)?")


def _to_number(text: str) -> float | None:
    # As ChartQA's scoring does, a trailing '%' divides by 100 (so "45%" equals "0.45", not "45"). We also
    # read thousands separators ("1,000") and refuse "nan" / "inf", which float() would accept.
    text = text.strip()
    scale = 1.0
    if text.endswith("%"):
        text, scale = text[:-1].strip(), 0.01
    if _THOUSANDS.fullmatch(text):
        text = text.replace(",", "")
    try:
        value = float(text)
    except ValueError:
        return None
    return value * scale if math.isfinite(value) else None


def relaxed_accuracy(prediction: str, answers: Sequence[str], tolerance: float = 0.05) -> float:
    """ChartQA's relaxed accuracy of one prediction, 1.0 or 0.0: correct if, for some reference answer,
    both parse as numbers and |pred - ref| <= tolerance * |ref| (a reference of 0 needs exactly 0), or
    otherwise the two are equal after `normalize_answer`."""
    _require_answers(answers)
    pred_value = _to_number(prediction)
    pred_text = normalize_answer(prediction)
    for answer in answers:
        ref_value = _to_number(answer)
        if pred_value is not None and ref_value is not None:
            if abs(pred_value - ref_value) <= tolerance * abs(ref_value):
                return 1.0
        elif pred_text == normalize_answer(answer):
            return 1.0
    return 0.0


@dataclass
class VQAScores:
    """Means over a set of questions, each a fraction in [0, 1]."""
    vqa_accuracy: float
    anls: float
    relaxed_accuracy: float
    count: int  # questions scored


def score_predictions(predictions: Sequence[str], answers: Sequence[Sequence[str]]) -> VQAScores:
    """Mean VQA accuracy, ANLS and relaxed accuracy of `predictions[i]` against `answers[i]`."""
    if len(predictions) != len(answers):
        raise ValueError(f"predictions and answers differ in length: {len(predictions)} != {len(answers)}")
    if not predictions:
        raise ValueError("no predictions to score")
    n = len(predictions)
    return VQAScores(
        vqa_accuracy=sum(vqa_accuracy(p, a) for p, a in zip(predictions, answers)) / n,
        anls=sum(anls(p, a) for p, a in zip(predictions, answers)) / n,
        relaxed_accuracy=sum(relaxed_accuracy(p, a) for p, a in zip(predictions, answers)) / n,
        count=n,
    )
