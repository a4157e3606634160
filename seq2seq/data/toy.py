"""Generated toy translation tasks with gold word alignments: no files, no download.

``ToyTranslation`` (the default demo) translates a small English-like language into an invented
"toy language" whose rules make attention do real work:

* word order is subject-object-verb: the verb moves to the end of its clause, after the object
  (which takes the object marker ``ka``) and after the clause's prepositional phrases, which move
  to just after the subject;
* noun phrases are mirrored: noun, then adjectives in reverse order, then numeral, then
  demonstrative or possessive ("these two big dogs" -> "kodan ri huho raho ko");
* prepositions become postpositions ("in the garden" -> "ruba nu"), and a prepositional phrase
  that modifies the subject comes before it;
* one word becomes two: a plural noun becomes noun + plural particle ``ri`` ("dogs" -> "kodan ri");
* two words become one: "does not" / "do not" becomes the negation ``mu`` before the verb;
* dropped words: the articles "the", "a", "an" have no translation;
* inserted words: the object marker ``ka`` translates no source word.

Alignment convention: ``Example.alignment`` holds (source position, target position) links,
0-based. A dropped source word and an inserted target word (only ``ka``) have no link; a plural
noun links to both its target words; "does"/"do" and "not" both link to ``mu``. Every other word
has exactly one link.

``Reverse``, ``Copy`` and ``Sort`` are the classic synthetic tasks over tokens ``w0``, ``w1``, ...

Every task is a deterministic function of its ``seed``: randomness comes only from
``random.Random`` instances seeded from it. ``test_long`` sources are all longer than any
``train``/``val``/``test`` source, and no source sentence appears in two splits.
"""

from __future__ import annotations

import random
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from functools import partial
from pathlib import Path
from typing import NamedTuple

from seq2seq.errors import ConfigError

SPLITS = ("train", "val", "test", "test_long")
# Held-out splits are drawn first, so their sentences do not change with train_size.
_GENERATION_ORDER = ("test_long", "test", "val", "train")
FILE_SUFFIXES = ("src", "tgt", "align")

Alignment = tuple[tuple[int, int], ...]


@dataclass(frozen=True)
class Example:
    """One sentence pair; ``alignment`` holds gold (src_index, tgt_index) links or is None."""

    src: str  # space-separated tokens
    tgt: str  # space-separated tokens
    alignment: Alignment | None


# --- The toy language's lexicon ---------------------------------------------------------------


class Noun(NamedTuple):
    """A source noun (both numbers) and its toy-language lemma."""

    singular: str
    plural: str
    target: str
    kind: str  # "animate", "object", "food" or "place": which verbs and prepositions take it


class Adjective(NamedTuple):
    """A source adjective and its toy-language word."""

    source: str
    target: str
    rank: int  # English order: opinion 0 < size 1 < age 2 < colour 3 ("a nice big old red ball")
    animate_only: bool  # "a hungry dog", but not "a hungry apple"


class Verb(NamedTuple):
    """A source verb (both present-tense forms) and its toy-language stem."""

    third_singular: str
    base: str
    target: str
    objects: tuple[str, ...]  # noun kinds it takes as object; empty: intransitive


class Preposition(NamedTuple):
    """A source preposition and the toy-language postposition."""

    source: str
    target: str
    objects: tuple[str, ...]  # noun kinds it takes


class Determiner(NamedTuple):
    """A source determiner and its toy-language word, which follows the noun phrase."""

    source: str
    target: str | None  # None: an article, which the toy language drops
    number: str  # "singular", "plural" or "both"


_ANIMATE, _OBJECT, _FOOD, _PLACE = _KINDS = ("animate", "object", "food", "place")

NOUNS: tuple[Noun, ...] = (
    Noun("dog", "dogs", "kodan", _ANIMATE),
    Noun("cat", "cats", "tula", _ANIMATE),
    Noun("bird", "birds", "mupu", _ANIMATE),
    Noun("horse", "horses", "mahe", _ANIMATE),
    Noun("fox", "foxes", "tunu", _ANIMATE),
    Noun("mouse", "mice", "bude", _ANIMATE),
    Noun("child", "children", "rurine", _ANIMATE),
    Noun("man", "men", "mabi", _ANIMATE),
    Noun("woman", "women", "gonuta", _ANIMATE),
    Noun("teacher", "teachers", "seron", _ANIMATE),
    Noun("farmer", "farmers", "bisibo", _ANIMATE),
    Noun("doctor", "doctors", "tirar", _ANIMATE),
    Noun("king", "kings", "dono", _ANIMATE),
    Noun("girl", "girls", "rikun", _ANIMATE),
    Noun("boy", "boys", "lekal", _ANIMATE),
    Noun("friend", "friends", "luno", _ANIMATE),
    Noun("book", "books", "pobe", _OBJECT),
    Noun("ball", "balls", "lusu", _OBJECT),
    Noun("letter", "letters", "gubaru", _OBJECT),
    Noun("box", "boxes", "todon", _OBJECT),
    Noun("key", "keys", "supa", _OBJECT),
    Noun("hat", "hats", "kisu", _OBJECT),
    Noun("cup", "cups", "roro", _OBJECT),
    Noun("bag", "bags", "gigi", _OBJECT),
    Noun("flower", "flowers", "hamu", _OBJECT),
    Noun("apple", "apples", "puna", _FOOD),
    Noun("cake", "cakes", "sebeve", _FOOD),
    Noun("egg", "eggs", "mehosa", _FOOD),
    Noun("pie", "pies", "rimuso", _FOOD),
    Noun("house", "houses", "sitete", _PLACE),
    Noun("garden", "gardens", "ruba", _PLACE),
    Noun("park", "parks", "vada", _PLACE),
    Noun("school", "schools", "verelis", _PLACE),
    Noun("city", "cities", "gagel", _PLACE),
    Noun("forest", "forests", "bove", _PLACE),
    Noun("kitchen", "kitchens", "vahe", _PLACE),
    Noun("village", "villages", "manenur", _PLACE),
    Noun("market", "markets", "lepi", _PLACE),
    Noun("field", "fields", "pove", _PLACE),
)

ADJECTIVES: tuple[Adjective, ...] = (
    Adjective("beautiful", "sanal", 0, False),
    Adjective("happy", "kohosor", 0, True),
    Adjective("sad", "sasu", 0, True),
    Adjective("quiet", "lihunu", 0, True),
    Adjective("hungry", "dilehu", 0, True),
    Adjective("tired", "tipela", 0, True),
    Adjective("clever", "titu", 0, True),
    Adjective("brave", "topi", 0, True),
    Adjective("kind", "nuka", 0, True),
    Adjective("angry", "tenar", 0, True),
    Adjective("lazy", "heno", 0, True),
    Adjective("big", "huho", 1, False),
    Adjective("small", "hame", 1, False),
    Adjective("tall", "veta", 1, True),
    Adjective("old", "hohava", 2, False),
    Adjective("young", "numon", 2, True),
    Adjective("red", "sade", 3, False),
    Adjective("black", "nave", 3, False),
    Adjective("white", "sene", 3, False),
    Adjective("green", "tore", 3, False),
)

VERBS: tuple[Verb, ...] = (
    Verb("sees", "see", "moto", (_ANIMATE, _OBJECT, _FOOD, _PLACE)),
    Verb("likes", "like", "lune", (_ANIMATE, _OBJECT, _FOOD, _PLACE)),
    Verb("finds", "find", "geli", (_ANIMATE, _OBJECT, _FOOD)),
    Verb("wants", "want", "padiles", (_OBJECT, _FOOD)),
    Verb("helps", "help", "dibegil", (_ANIMATE,)),
    Verb("follows", "follow", "rani", (_ANIMATE,)),
    Verb("carries", "carry", "himane", (_ANIMATE, _OBJECT, _FOOD)),
    Verb("takes", "take", "lari", (_OBJECT, _FOOD)),
    Verb("watches", "watch", "hati", (_ANIMATE,)),
    Verb("visits", "visit", "bala", (_ANIMATE, _PLACE)),
    Verb("meets", "meet", "tuhe", (_ANIMATE,)),
    Verb("calls", "call", "bovigol", (_ANIMATE,)),
    Verb("eats", "eat", "gudo", (_FOOD,)),
    Verb("paints", "paint", "kuvuba", (_OBJECT, _PLACE)),
    Verb("sleeps", "sleep", "getar", ()),
    Verb("runs", "run", "lohada", ()),
    Verb("sings", "sing", "ripo", ()),
    Verb("waits", "wait", "hututo", ()),
    Verb("works", "work", "betur", ()),
    Verb("plays", "play", "gibus", ()),
    Verb("laughs", "laugh", "nage", ()),
    Verb("walks", "walk", "hiro", ()),
    Verb("dances", "dance", "hena", ()),
)

PREPOSITIONS: tuple[Preposition, ...] = (
    Preposition("in", "nu", (_PLACE,)),
    Preposition("at", "ve", (_PLACE,)),
    Preposition("near", "sole", (_PLACE, _ANIMATE)),
    Preposition("behind", "kiha", (_PLACE, _ANIMATE)),
    Preposition("with", "vuma", (_ANIMATE, _OBJECT)),
    Preposition("without", "lumo", (_ANIMATE, _OBJECT)),
)

# "this"/"these" and "that"/"those" share a target word: number is the noun's plural particle.
DETERMINERS: tuple[Determiner, ...] = (
    Determiner("the", None, "both"),
    Determiner("a", None, "singular"),  # "an" before a vowel: same word, chosen by spelling
    Determiner("this", "ko", "singular"),
    Determiner("that", "ra", "singular"),
    Determiner("these", "ko", "plural"),
    Determiner("those", "ra", "plural"),
    Determiner("my", "naka", "both"),
    Determiner("your", "dagon", "both"),
    Determiner("his", "keba", "both"),
    Determiner("her", "nini", "both"),
    Determiner("our", "rudol", "both"),
    Determiner("every", "goru", "singular"),
)

NUMBERS: tuple[tuple[str, str], ...] = (
    ("two", "raho"),
    ("three", "mabar"),
    ("four", "kuduna"),
    ("five", "ropes"),
    ("six", "lige"),
    ("seven", "tipi"),
    ("eight", "tegagi"),
    ("nine", "luti"),
)

PLURAL = "ri"  # follows a plural noun; aligned to that noun
OBJECT_MARKER = "ka"  # follows the object noun phrase; inserted, aligned to nothing
NEGATION = "mu"  # "does not" / "do not"; comes right before the verb
CONJUNCTION = "se"  # "and" between clauses
PERIOD = "."
ARTICLES = ("the", "a", "an")

# Shortest train sentence: "dogs sleep ." Longest train/val/test source, and the longest test_long.
TRAIN_MAX_LEN = 20
LONG_MAX_LEN = 40


# --- Sentence generation ------------------------------------------------------------------------


@dataclass(frozen=True)
class _Shape:
    """How often each optional part of a sentence appears, and the source lengths kept."""

    clauses: tuple[float, float, float]  # weights of 1, 2 and 3 conjoined clauses
    transitive: float
    negated: float
    subject_modifier: float  # a prepositional phrase after the subject: "the dog in the park"
    adjuncts: tuple[float, float, float]  # weights of 0, 1 and 2 prepositional phrases per clause
    adjectives: tuple[float, float, float, float]  # weights of 0..3 adjectives per noun phrase
    plural: float
    numeral: float  # chance of a numeral in a plural noun phrase
    min_len: int
    max_len: int


_SHORT = _Shape(
    clauses=(0.8, 0.2, 0.0),
    transitive=0.6,
    negated=0.25,
    subject_modifier=0.15,
    adjuncts=(0.6, 0.3, 0.1),
    adjectives=(0.55, 0.3, 0.12, 0.03),
    plural=0.4,
    numeral=0.3,
    min_len=1,
    max_len=TRAIN_MAX_LEN,
)
# The same constructions, just more of them: test_long measures length generalisation.
_LONG = _Shape(
    clauses=(0.0, 0.6, 0.4),
    transitive=0.7,
    negated=0.3,
    subject_modifier=0.3,
    adjuncts=(0.3, 0.45, 0.25),
    adjectives=(0.35, 0.4, 0.2, 0.05),
    plural=0.4,
    numeral=0.3,
    min_len=TRAIN_MAX_LEN + 1,
    max_len=LONG_MAX_LEN,
)

# A target word and the source positions it translates: () for an inserted word, two positions
# for a word that translates two ("does not" -> "mu").
_TargetWord = tuple[str, tuple[int, ...]]


class _Source:
    """The source tokens of the sentence being generated."""

    def __init__(self) -> None:
        self.tokens: list[str] = []

    def add(self, token: str) -> int:
        """Append ``token``; return its position (what target words link to)."""
        self.tokens.append(token)
        return len(self.tokens) - 1


def _pick(rng: random.Random, weights: Sequence[float]) -> int:
    """An index drawn with probability proportional to ``weights``."""
    r = rng.random() * sum(weights)
    for index, weight in enumerate(weights):
        r -= weight
        if r < 0:
            return index
    # Rounding can leave r >= 0 at the end: fall back to the last index that can be drawn.
    return max(i for i, w in enumerate(weights) if w > 0)


# Lookup tables, built once from the lexicon above (generation draws from them ~10^5 times).
_NOUNS_BY_KIND = {kind: tuple(n for n in NOUNS if n.kind == kind) for kind in _KINDS}
_VERBS_BY_TRANSITIVITY = {t: tuple(v for v in VERBS if bool(v.objects) == t) for t in (False, True)}
_ADJECTIVES_BY_ANIMACY = {
    animate: tuple(a for a in ADJECTIVES if animate or not a.animate_only)
    for animate in (False, True)
}
# Bare plurals (None) are allowed: "dogs sleep ."
_DETERMINERS_BY_PLURALITY: dict[bool, tuple[Determiner | None, ...]] = {
    False: tuple(d for d in DETERMINERS if d.number in ("singular", "both")),
    True: (*(d for d in DETERMINERS if d.number in ("plural", "both")), None),
}
# Articles are the most common determiners, as in English; the others share the rest.
_DETERMINER_WEIGHTS = {
    plural: tuple(4.0 if d is not None and d.target is None else 1.0 for d in determiners)
    for plural, determiners in _DETERMINERS_BY_PLURALITY.items()
}


def _noun_phrase(
    rng: random.Random, source: _Source, kinds: Sequence[str], shape: _Shape
) -> tuple[list[_TargetWord], bool]:
    """Emit a noun phrase; return its translation (mirrored) and whether it is plural."""
    # Kind first, then noun, so that the 16 animate nouns do not crowd out the 4 foods.
    noun = rng.choice(_NOUNS_BY_KIND[rng.choice(kinds)])
    plural = rng.random() < shape.plural
    determiners = _DETERMINERS_BY_PLURALITY[plural]
    determiner = determiners[_pick(rng, _DETERMINER_WEIGHTS[plural])]
    numeral = rng.choice(NUMBERS) if plural and rng.random() < shape.numeral else None

    eligible = _ADJECTIVES_BY_ANIMACY[noun.kind == _ANIMATE]
    adjectives: list[Adjective] = []
    for _ in range(_pick(rng, shape.adjectives)):
        # One adjective per rank keeps phrases plausible ("big small dog" is not).
        used = {a.rank for a in adjectives}
        adjectives.append(rng.choice([a for a in eligible if a.rank not in used]))
    adjectives.sort(key=lambda a: a.rank)

    # Source order: determiner, numeral, adjectives, noun.
    noun_form = noun.plural if plural else noun.singular
    det_position = num_position = -1
    if determiner is not None:
        after = numeral[0] if numeral else adjectives[0].source if adjectives else noun_form
        vowel = determiner.source == "a" and after[0] in "aeiou"
        det_position = source.add("an" if vowel else determiner.source)
    if numeral:
        num_position = source.add(numeral[0])
    adj_positions = [source.add(a.source) for a in adjectives]
    noun_position = source.add(noun_form)

    # Target order: the mirror image, with the plural particle after the noun, articles dropped.
    target: list[_TargetWord] = [(noun.target, (noun_position,))]
    if plural:
        target.append((PLURAL, (noun_position,)))
    for adjective, position in reversed(list(zip(adjectives, adj_positions, strict=True))):
        target.append((adjective.target, (position,)))
    if numeral:
        target.append((numeral[1], (num_position,)))
    if determiner is not None and determiner.target is not None:
        target.append((determiner.target, (det_position,)))
    return target, plural


def _prepositional_phrase(rng: random.Random, source: _Source, shape: _Shape) -> list[_TargetWord]:
    """Emit a prepositional phrase; return its translation (a postpositional phrase)."""
    preposition = rng.choice(PREPOSITIONS)
    position = source.add(preposition.source)
    noun_phrase, _ = _noun_phrase(rng, source, preposition.objects, shape)
    return [*noun_phrase, (preposition.target, (position,))]


def _clause(rng: random.Random, source: _Source, shape: _Shape) -> list[_TargetWord]:
    """Emit one clause (subject-verb-object); return its translation (subject-object-verb)."""
    subject, plural = _noun_phrase(rng, source, (_ANIMATE,), shape)
    if rng.random() < shape.subject_modifier:
        subject = _prepositional_phrase(rng, source, shape) + subject
    transitive = rng.random() < shape.transitive
    verb = rng.choice(_VERBS_BY_TRANSITIVITY[transitive])
    negation: list[_TargetWord] = []
    if rng.random() < shape.negated:
        auxiliary = source.add("do" if plural else "does")
        negation.append((NEGATION, (auxiliary, source.add("not"))))
        verb_position = source.add(verb.base)
    else:
        verb_position = source.add(verb.base if plural else verb.third_singular)
    obj: list[_TargetWord] = []
    if transitive:
        obj, _ = _noun_phrase(rng, source, verb.objects, shape)
        obj.append((OBJECT_MARKER, ()))
    # Only clauses take prepositional phrases after the verb (objects never do), so the source
    # has no attachment ambiguity and the translation is a function of the source.
    adjuncts: list[_TargetWord] = []
    for _ in range(_pick(rng, shape.adjuncts)):
        adjuncts += _prepositional_phrase(rng, source, shape)
    return [*subject, *adjuncts, *obj, *negation, (verb.target, (verb_position,))]


def _toy_example(rng: random.Random, shape: _Shape) -> Example | None:
    """One sentence pair, or None if its source length is outside the shape's range."""
    source = _Source()
    target: list[_TargetWord] = []
    for index in range(1 + _pick(rng, shape.clauses)):
        if index:
            target.append((CONJUNCTION, (source.add("and"),)))
        target += _clause(rng, source, shape)
    target.append((PERIOD, (source.add(PERIOD),)))
    if not shape.min_len <= len(source.tokens) <= shape.max_len:
        return None
    links = sorted((s, t) for t, (_, positions) in enumerate(target) for s in positions)
    return Example(" ".join(source.tokens), " ".join(w for w, _ in target), tuple(links))


# --- Splits -------------------------------------------------------------------------------------


def _check_sizes(sizes: dict[str, int]) -> None:
    for split, size in sizes.items():
        if size < 0:
            raise ConfigError(f"{split}_size must be >= 0, got {size}.")


def _split_rngs(seed: int) -> dict[str, random.Random]:
    """One generator per split, all derived from ``seed``."""
    master = random.Random(seed)
    return {split: random.Random(master.getrandbits(64)) for split in SPLITS}


def _sample_unique(
    draw: Callable[[random.Random], Example | None],
    rng: random.Random,
    size: int,
    seen: set[str],
    what: str,
) -> list[Example]:
    """``size`` examples whose sources are not in ``seen`` (which they are added to)."""
    examples: list[Example] = []
    # Generous: rejection by length or duplicates costs a few draws per example at most, unless
    # the space of sentences is (nearly) exhausted.
    budget = 100 * size + 10_000
    while len(examples) < size:
        if budget == 0:
            raise ConfigError(
                f"could not generate {size} distinct {what} sentences (found {len(examples)}) "
                "that are not already in another split: the task cannot produce that many "
                "unique sentences. Ask for fewer, or widen the task (lengths, vocabulary)."
            )
        budget -= 1
        example = draw(rng)
        if example is not None and example.src not in seen:
            seen.add(example.src)
            examples.append(example)
    return examples


@dataclass(frozen=True)
class ToyTranslation:
    """English-like source -> toy-language target, with gold alignments (see module docstring)."""

    seed: int = 1
    train_size: int = 20000
    val_size: int = 1000
    test_size: int = 1000
    test_long_size: int = 1000

    def __post_init__(self) -> None:
        _check_sizes(self._sizes())

    def _sizes(self) -> dict[str, int]:
        return {
            "train": self.train_size,
            "val": self.val_size,
            "test": self.test_size,
            "test_long": self.test_long_size,
        }

    def splits(self) -> dict[str, list[Example]]:
        """The four splits, keyed (in order) by ``SPLITS``."""
        sizes = self._sizes()
        rngs = _split_rngs(self.seed)
        seen: set[str] = set()
        generated: dict[str, list[Example]] = {}
        for split in _GENERATION_ORDER:
            shape = _LONG if split == "test_long" else _SHORT
            draw = partial(_toy_example, shape=shape)
            generated[split] = _sample_unique(
                draw, rngs[split], sizes[split], seen, f"ToyTranslation {split}"
            )
        return {split: generated[split] for split in SPLITS}


# --- The classic tasks --------------------------------------------------------------------------


@dataclass(frozen=True)
class _SymbolTask:
    """Random sequences of tokens ``w0 .. w{vocab_size-1}``, transduced by ``_transduce``."""

    seed: int = 1
    train_size: int = 20000
    val_size: int = 1000
    test_size: int = 1000
    test_long_size: int = 1000
    vocab_size: int = 50
    min_len: int = 5
    max_len: int = 25  # train, val and test
    long_min_len: int = 26  # test_long: strictly longer than max_len
    long_max_len: int = 40

    def __post_init__(self) -> None:
        _check_sizes(self._sizes())
        if self.vocab_size < 1:
            raise ConfigError(f"vocab_size must be >= 1, got {self.vocab_size}.")
        if not 1 <= self.min_len <= self.max_len:
            raise ConfigError(
                f"need 1 <= min_len <= max_len, got min_len={self.min_len}, max_len={self.max_len}."
            )
        if not self.max_len < self.long_min_len <= self.long_max_len:
            raise ConfigError(
                "test_long must be strictly longer than the other splits: need max_len < "
                f"long_min_len <= long_max_len, got max_len={self.max_len}, "
                f"long_min_len={self.long_min_len}, long_max_len={self.long_max_len}."
            )

    def _sizes(self) -> dict[str, int]:
        return {
            "train": self.train_size,
            "val": self.val_size,
            "test": self.test_size,
            "test_long": self.test_long_size,
        }

    def _transduce(self, symbols: list[int]) -> tuple[list[int], Alignment]:
        """The target symbols and the (src, tgt) links of a source sequence."""
        raise NotImplementedError

    def _example(self, rng: random.Random, min_len: int, max_len: int) -> Example:
        symbols = [rng.randrange(self.vocab_size) for _ in range(rng.randint(min_len, max_len))]
        target, alignment = self._transduce(symbols)
        return Example(
            " ".join(f"w{s}" for s in symbols),
            " ".join(f"w{s}" for s in target),
            tuple(sorted(alignment)),
        )

    def splits(self) -> dict[str, list[Example]]:
        """The four splits, keyed (in order) by ``SPLITS``."""
        sizes = self._sizes()
        short = sum(sizes[split] for split in ("train", "val", "test"))
        for wanted, low, high, what in (
            (short, self.min_len, self.max_len, "train+val+test"),
            (sizes["test_long"], self.long_min_len, self.long_max_len, "test_long"),
        ):
            available = sum(self.vocab_size**n for n in range(low, high + 1))
            if wanted > available:
                raise ConfigError(
                    f"{type(self).__name__}: {what} needs {wanted} distinct sequences but only "
                    f"{available} exist with vocab_size={self.vocab_size} and lengths "
                    f"{low}..{high}."
                )
        rngs = _split_rngs(self.seed)
        seen: set[str] = set()
        generated: dict[str, list[Example]] = {}
        for split in _GENERATION_ORDER:
            low, high = (
                (self.long_min_len, self.long_max_len)
                if split == "test_long"
                else (self.min_len, self.max_len)
            )
            draw = partial(self._example, min_len=low, max_len=high)
            generated[split] = _sample_unique(
                draw, rngs[split], sizes[split], seen, f"{type(self).__name__} {split}"
            )
        return {split: generated[split] for split in SPLITS}


@dataclass(frozen=True)
class Reverse(_SymbolTask):
    """Target = the source reversed; source position i links to target position n-1-i."""

    def _transduce(self, symbols: list[int]) -> tuple[list[int], Alignment]:
        n = len(symbols)
        return symbols[::-1], tuple((i, n - 1 - i) for i in range(n))


@dataclass(frozen=True)
class Copy(_SymbolTask):
    """Target = the source; source position i links to target position i."""

    def _transduce(self, symbols: list[int]) -> tuple[list[int], Alignment]:
        return list(symbols), tuple((i, i) for i in range(len(symbols)))


@dataclass(frozen=True)
class Sort(_SymbolTask):
    """Target = the source sorted by token index (w2 < w10), stably; links follow each token."""

    def _transduce(self, symbols: list[int]) -> tuple[list[int], Alignment]:
        order = sorted(range(len(symbols)), key=lambda i: (symbols[i], i))
        return [symbols[i] for i in order], tuple((i, j) for j, i in enumerate(order))


# --- Files --------------------------------------------------------------------------------------


def format_pharaoh(alignment: Alignment | None) -> str:
    """Pharaoh format, ``"i-j i-j ..."`` sorted; empty for no links or no gold alignment."""
    return " ".join(f"{i}-{j}" for i, j in sorted(alignment or ()))


def parse_pharaoh(line: str) -> Alignment:
    """The links of a Pharaoh-format line (inverse of ``format_pharaoh``)."""
    links: list[tuple[int, int]] = []
    for link in line.split():
        src, sep, tgt = link.partition("-")
        if not sep or not src.isdigit() or not tgt.isdigit():
            raise ValueError(f"not a Pharaoh link (want 'i-j'): {link!r} in {line!r}")
        links.append((int(src), int(tgt)))
    return tuple(sorted(links))


def write_splits(splits: dict[str, list[Example]], out_dir: Path) -> None:
    """Write ``{split}.src``, ``{split}.tgt`` and ``{split}.align`` for each split to ``out_dir``.

    UTF-8, one example per line, ``\\n`` line ends; alignments in Pharaoh format (empty line when
    an example has no gold alignment).
    """
    out_dir = Path(out_dir)
    out_dir.mkdir(parents=True, exist_ok=True)
    for split, examples in splits.items():
        columns = {
            "src": [ex.src for ex in examples],
            "tgt": [ex.tgt for ex in examples],
            "align": [format_pharaoh(ex.alignment) for ex in examples],
        }
        for suffix in FILE_SUFFIXES:
            text = "".join(line + "\n" for line in columns[suffix])
            (out_dir / f"{split}.{suffix}").write_text(text, encoding="utf-8", newline="\n")
