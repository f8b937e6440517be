"""A synthetic conditional-similarity set in the official C-STS layout, generated from a seed.

Each sentence describes a scene by six attributes — the kind of animal, how many, what they do, and the
colour and material of a piece of furniture, and where it happens — plus a free object word and one of
several word orders::

    Three brown dogs are sleeping next to a red wooden bench in the park.
    In the garden, one parrot is eating beside a glass stool painted blue.

A condition names one attribute ("The colour of the furniture.", in one of three phrasings) and the
label follows from the two sentences' values of that attribute, by construction:

* categorical attributes: the same value → 5, a value from the same group (red / orange, dog / cat,
  park / garden) → 3, another group → 1;
* the number: 5 − |difference| (at least 1), so 4 and 2 occur as well.

Every sentence pair appears twice, under a high and a low condition (labels hi > lo), as in C-STS.
Pairs are built so that a model blind to the condition can learn nothing: the (hi, lo) labels are drawn
independently of the sentences, and the number of attribute values the two sentences share is fixed per
pair independently of the labels, so plain sentence similarity carries no information about either
label (a test checks that it scores near-zero Spearman).
"""

from __future__ import annotations

import csv
import io
import random
from pathlib import Path

from kgc.fileio import atomic_dir, write_text

VERSION = 1  # bump when the generator changes: cached folders are keyed by it

# attribute → groups of values (a value's group gives the graded label 3)
GROUPS: dict[str, list[list[str]]] = {
    "animal": [["dog", "cat", "horse", "goat", "rabbit"], ["parrot", "duck", "owl", "pigeon", "swan"]],
    "action": [["sleeping", "resting", "lying down"], ["running", "jumping", "playing"], ["eating", "drinking"]],
    "colour": [["red", "orange", "yellow"], ["blue", "green", "purple"], ["black", "white", "grey", "brown"]],
    "material": [["wooden", "bamboo", "wicker"], ["metal", "steel", "iron"], ["plastic", "glass", "stone"]],
    "place": [["park", "garden", "forest", "meadow"], ["kitchen", "living room", "garage", "hallway"],
              ["beach", "harbour", "riverbank"]],
}
NUMBERS = ["one", "two", "three", "four", "five", "six"]
OBJECTS = ["bench", "table", "chair", "stool", "cabinet", "shelf"]
PLURAL = {"mouse": "mice", "goose": "geese"}
PLACE_PREP = {"beach": "on the", "harbour": "at the", "riverbank": "on the"}
CONDITIONS = {
    "animal": ["The kind of animal.", "The type of animals in the scene.", "Which animal is shown."],
    "number": ["The number of animals.", "How many animals there are.", "The count of animals."],
    "action": ["What the animals are doing.", "The activity of the animals.", "The animals' action."],
    "colour": ["The colour of the furniture.", "What colour the furniture is.", "The furniture's colour."],
    "material": ["The material of the furniture.", "What the furniture is made of.", "The furniture's material."],
    "place": ["The location.", "Where the scene takes place.", "The place where the animals are."],
}
ATTRIBUTES = list(CONDITIONS)  # animal, number, action, colour, material, place
FREE = ATTRIBUTES + ["object"]  # every slot whose value two sentences may share
TEMPLATES = [
    "{A_colour} {material} {object} stands {place_pp}, and {n} {animals} {be} {action} next to it.",
    "{N} {animals} {be} {action} next to {a_colour} {material} {object} {place_pp}.",
    "{Place_pp}, {n} {animals} {be} {action} beside {a_material} {object} painted {colour}.",
    "Next to {a_colour} {material} {object}, {n} {animals} {be} {action} {place_pp}.",
]
# the (hi, lo) label pairs a sentence pair is built for; each needs attributes that can realise them
LABEL_PAIRS = [(5, 1), (5, 3), (3, 1), (5, 2), (4, 1), (3, 2), (4, 3), (5, 4)]  # 4 and 2: the number only


def _group_of(attribute: str, value: str) -> int:
    return next(i for i, g in enumerate(GROUPS[attribute]) if value in g)


def label(attribute: str, a: str, b: str) -> int:
    """The similarity (1-5) of two values of one attribute."""
    if attribute == "number":
        return max(1, 5 - abs(NUMBERS.index(a) - NUMBERS.index(b)))
    if a == b:
        return 5
    return 3 if _group_of(attribute, a) == _group_of(attribute, b) else 1


def _values(attribute: str) -> list[str]:
    if attribute == "number":
        return NUMBERS
    if attribute == "object":
        return OBJECTS
    return [v for g in GROUPS[attribute] for v in g]


def _realisable(attribute: str, target: int) -> bool:
    return target in ({1, 2, 3, 4, 5} if attribute == "number" else {1, 3, 5})


def _value_with_label(rng: random.Random, attribute: str, a: str, target: int) -> str:
    """A value b with label(attribute, a, b) == target (a exists for every realisable target)."""
    choices = [b for b in _values(attribute) if label(attribute, a, b) == target]
    if not choices:  # e.g. number "three" has no value 4 steps away: pick another anchor
        raise LookupError
    return rng.choice(choices)


def _different(rng: random.Random, attribute: str, a: str) -> str:
    return rng.choice([b for b in _values(attribute) if b != a])


def _a(word: str) -> str:
    return ("an " if word[0] in "aeiou" else "a ") + word


def sentence(rng: random.Random, scene: dict[str, str]) -> str:
    n, animal, place = scene["number"], scene["animal"], scene["place"]
    prep = PLACE_PREP.get(place, "in the")
    slots = {"N": n.capitalize(), "n": n, "animals": animal if n == "one" else PLURAL.get(animal, animal + "s"),
             "be": "is" if n == "one" else "are", "action": scene["action"], "colour": scene["colour"],
             "material": scene["material"], "object": scene["object"], "a_colour": _a(scene["colour"]),
             "A_colour": _a(scene["colour"]).capitalize(), "a_material": _a(scene["material"]),
             "place_pp": f"{prep} {place}", "Place_pp": f"{prep.capitalize()} {place}"}
    return rng.choice(TEMPLATES).format(**slots)


def _pair(rng: random.Random) -> tuple[str, str, tuple[str, int], tuple[str, int]]:
    """Two sentences and their (high condition attribute, label), (low condition attribute, label)."""
    while True:
        hi, lo = rng.choice(LABEL_PAIRS)
        a_lo = rng.choice([a for a in ATTRIBUTES if _realisable(a, lo)])
        a_hi = rng.choice([a for a in ATTRIBUTES if a != a_lo and _realisable(a, hi)] or [None])
        if a_hi is None:  # 4 and 2 both need the number
            continue
        s1 = {a: rng.choice(_values(a)) for a in FREE}
        try:
            s2 = {a_hi: _value_with_label(rng, a_hi, s1[a_hi], hi), a_lo: _value_with_label(rng, a_lo, s1[a_lo], lo)}
        except LookupError:
            continue
        # the pair shares exactly `shared` slot values in all, whatever the labels: the labelled slots
        # contribute theirs (a label of 5 is a shared value), the free slots make up the rest
        shared = rng.choice([2, 3, 4])
        others = [a for a in FREE if a not in (a_hi, a_lo)]
        fixed = sum(s1[a] == s2[a] for a in (a_hi, a_lo))
        same = set(rng.sample(others, max(0, shared - fixed)))
        for a in others:
            s2[a] = s1[a] if a in same else _different(rng, a, s1[a])
        return sentence(rng, s1), sentence(rng, s2), (a_hi, hi), (a_lo, lo)


def generate_rows(pairs: int, seed: int) -> list[tuple[str, str, str, int]]:
    """``2 * pairs`` rows (sentence1, sentence2, condition, label); each pair's two rows are adjacent."""
    rng = random.Random(seed)
    rows = []
    for _ in range(pairs):
        s1, s2, (a_hi, hi), (a_lo, lo) = _pair(rng)
        two = [(s1, s2, rng.choice(CONDITIONS[a_hi]), hi), (s1, s2, rng.choice(CONDITIONS[a_lo]), lo)]
        rng.shuffle(two)
        rows.extend(two)
    return rows


def to_csv(rows: list[tuple[str, str, str, int]]) -> str:
    buf = io.StringIO()
    writer = csv.writer(buf, lineterminator="\n")
    writer.writerow(["sentence1", "sentence2", "condition", "label"])
    writer.writerows(rows)
    return buf.getvalue()


def write_synthetic(out: Path, *, seed: int = 0, train_pairs: int = 2000, validation_pairs: int = 300,
                    test_pairs: int = 500) -> Path:
    """Write ``csts_{train,validation,test}.csv`` into ``out`` (each file atomically). Splits use seeds
    derived from ``seed``, so the same arguments always give the same files."""
    out = Path(out)
    out.mkdir(parents=True, exist_ok=True)
    for i, (split, n) in enumerate((("train", train_pairs), ("validation", validation_pairs), ("test", test_pairs))):
        write_text(out / f"csts_{split}.csv", to_csv(generate_rows(n, seed * 1000 + i)))
    return out


def synthetic_folder(*, seed: int, train_pairs: int, validation_pairs: int, test_pairs: int,
                     home: Path | None = None) -> Path:
    """The generated set for these settings under ``$KGC_CACHE_HOME/synth-csts/``, made on first use.

    Written into a temporary folder and renamed into place, so a reader never sees half a set.
    """
    from kgc.encoding.cache import cache_home

    home = home or cache_home() / "synth-csts"
    folder = home / f"v{VERSION}-seed{seed}-{train_pairs}-{validation_pairs}-{test_pairs}"
    if (folder / "csts_test.csv").is_file():
        return folder
    try:
        with atomic_dir(folder) as tmp:
            write_synthetic(tmp, seed=seed, train_pairs=train_pairs, validation_pairs=validation_pairs,
                            test_pairs=test_pairs)
    except OSError:  # another process made it first (the rename onto its folder is refused)
        if not (folder / "csts_test.csv").is_file():
            raise
    return folder
