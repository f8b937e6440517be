"""Near-miss spellings among millions of names in milliseconds: a character-bigram index in compact arrays.

``kgc predict --head Lisbn`` says "did you mean Lisbon"; comparing the query with every entity's id and name by
difflib is one pass over all of them (seconds at millions of entities). :class:`SpellingIndex` keeps, for each of
the 65,536 byte bigrams, the sorted ids of the spellings that contain it (CSR: ``indptr`` and ``owners``, 4 bytes
per distinct (bigram, spelling) pair), built with numpy in one vectorised pass. A query's candidates are the
spellings that share the most of its bigrams (the rarest bigrams first, the few that occur in a large share of all
spellings skipped when rarer ones exist); difflib then ranks only those, with the same cutoff. A spelling within
difflib ratio 0.8 of the query (one letter dropped, added or swapped in a 5-letter name) shares most of its
bigrams, so the name a typo came from is among the candidates. This is a departure from the full pass, on
purpose: a spelling that reaches the cutoff while sharing few bigrams with the query (possible among thousands of
near-identical names) can be left out of the five suggestions. ``tests/test_spelling.py`` checks, on generated
names alike by design, that every typo's own name is suggested and the best suggestion is the full pass's best.
"""

from __future__ import annotations

from typing import Sequence

import numpy as np

COMMON = 0.05  # a bigram in more than this share of all spellings is skipped when the query has rarer ones


def _encoded(texts: list[str]) -> tuple[np.ndarray, np.ndarray]:
    """(bytes of every text padded with a blank each side, concatenated; the text each byte belongs to)."""
    raw = [f" {t} ".encode("utf-8") for t in texts]
    lengths = np.fromiter(map(len, raw), dtype=np.int64, count=len(raw))
    return np.frombuffer(b"".join(raw), dtype=np.uint8), np.repeat(np.arange(len(raw), dtype=np.int64), lengths)


def bigrams(text: str) -> np.ndarray:
    """The distinct byte-bigram ids (0..65535) of ``text`` padded with a blank each side."""
    b = np.frombuffer(f" {text} ".encode("utf-8"), dtype=np.uint8).astype(np.int64)
    return np.unique(b[:-1] << 8 | b[1:])


class SpellingIndex:
    """Bigram → spellings, over ``texts`` (already lower-cased); :meth:`candidates` of a query."""

    def __init__(self, texts: list[str]) -> None:
        self.size = len(texts)
        buf, owner = _encoded(texts)
        same = owner[:-1] == owner[1:]  # a bigram never spans two texts
        keys = np.unique((buf[:-1].astype(np.int64) << 8 | buf[1:])[same] << 32 | owner[:-1][same])
        del buf, owner, same
        grams = keys >> 32
        self.owners = (keys & 0xFFFFFFFF).astype(np.int32)  # (pairs,) sorted by bigram, then spelling
        self.indptr = np.searchsorted(grams, np.arange(65537))  # (65537,): bigram g's spellings at [g], [g + 1]

    @property
    def nbytes(self) -> int:
        return int(self.owners.nbytes + self.indptr.nbytes)

    def candidates(self, query: str, limit: int = 2000) -> np.ndarray:
        """Ids of at most ``limit`` spellings sharing the most bigrams with ``query`` (lower-cased), best first."""
        grams = bigrams(query)
        sizes = self.indptr[grams + 1] - self.indptr[grams]
        grams, sizes = grams[sizes > 0], sizes[sizes > 0]
        if len(grams) == 0:
            return np.zeros(0, dtype=np.int64)
        rare = sizes <= max(1, int(COMMON * self.size))
        if rare.any():
            grams = grams[rare]
        hits = np.concatenate([self.owners[self.indptr[g]:self.indptr[g + 1]] for g in grams])
        ids, counts = np.unique(hits, return_counts=True)
        if len(ids) > limit:
            keep = np.argpartition(-counts, limit - 1)[:limit]
            ids, counts = ids[keep], counts[keep]
        return ids[np.lexsort((ids, -counts))].astype(np.int64)


BUCKETS = 64  # characters counted modulo this many buckets for :func:`ratio_bounds`


def _histograms(texts: Sequence[str]) -> tuple[np.ndarray, np.ndarray]:
    """(each text's character counts by code point modulo :data:`BUCKETS`, (n, BUCKETS) int32; each text's length)."""
    lengths = np.fromiter(map(len, texts), dtype=np.int64, count=len(texts))
    codes = np.frombuffer("".join(texts).encode("utf-32-le", "surrogatepass"), dtype=np.uint32) % BUCKETS
    owner = np.repeat(np.arange(len(texts), dtype=np.int64), lengths)
    hist = np.bincount(owner * BUCKETS + codes, minlength=len(texts) * BUCKETS)
    return hist.reshape(len(texts), BUCKETS).astype(np.int32), lengths


def ratio_bounds(query: str, texts: "Sequence[str] | tuple[np.ndarray, np.ndarray]") -> np.ndarray:
    """An upper bound of ``difflib.SequenceMatcher(None, text, query).ratio()`` for each text, in one array pass:
    difflib's own ``quick_ratio`` (2 × the characters the two share, counted with multiplicity, over their total
    length) with characters counted in :data:`BUCKETS` buckets, which can only count more shared characters. A text
    whose bound is below a cutoff cannot reach it, so difflib's exact ratio runs only on the others and its results
    are unchanged. ``texts``: strings, or what :func:`_histograms` made of them."""
    hist, lengths = _histograms(texts) if not isinstance(texts, tuple) else texts
    q, n = _histograms([query])
    total = lengths + n[0]
    shared = np.minimum(hist, q[0]).sum(axis=1)
    return np.where(total > 0, 2.0 * shared / np.maximum(total, 1), 1.0)


WORD_CUTOFF = 0.7  # a query word is taken for a typo of a vocabulary word this close (difflib ratio)
WORD_MATCHES = 5  # at most this many vocabulary words stand in for one query word
BRUTE_WORDS = 20_000  # above this many distinct words, a word's near matches come from a SpellingIndex of them
SIMILAR_KEPT = 100_000  # query words whose near matches are remembered (then forgotten all at once)


class NameIndex:
    """Near-miss candidates among millions of multi-word names, by word: ``word → the names holding it`` (CSR,
    4 bytes per (word, name) pair) and the distinct words themselves.

    A bigram index answers slowly where names are many and alike (millions of names built from a few thousand
    words: each bigram is in a large share of them). A typo changes one word of a name, so here each query word
    stands for itself and for the vocabulary words spelt close to it (difflib ratio ≥ :data:`WORD_CUTOFF`, among
    :data:`WORD_MATCHES`), and a candidate is a name that holds such a word for every query word but at most one.
    The names that can qualify all hold a match of one of the rarest query words, so the look-up reads the
    shortest postings first and checks the others by binary search. Names only, not ids: a typo in an opaque id
    (``Q1234567``) is not a spelling mistake this finds (:meth:`KnowledgeGraph.near_misses` says so)."""

    def __init__(self, names: list[str]) -> None:
        from array import array

        vocab: dict[str, int] = {}
        word_ids, counts = array("i"), array("i")
        for name in names:
            words = name.lower().split()
            counts.append(len(words))
            word_ids.extend([vocab.setdefault(w, len(vocab)) for w in words])
        owner = np.repeat(np.arange(len(names), dtype=np.int64), np.frombuffer(counts, dtype=np.int32))
        keys = np.frombuffer(word_ids, dtype=np.int32).astype(np.int64) * max(1, len(names)) + owner
        del owner, word_ids
        keys.sort()
        if len(keys):
            keys = keys[np.concatenate([[True], keys[1:] != keys[:-1]])]  # a name holding a word twice: once
        self.words = list(vocab)
        self.vocab = vocab
        self.names = (keys % max(1, len(names))).astype(np.int32)  # (pairs,) by word, then name
        self.indptr = np.searchsorted(keys // max(1, len(names)), np.arange(len(vocab) + 1))
        self._word_index = SpellingIndex(self.words) if len(self.words) > BRUTE_WORDS else None
        self._word_hist, self._similar = None, {}

    def arrays(self) -> dict[str, np.ndarray]:
        """The index as arrays (the distinct words as their UTF-8 bytes joined by newlines: a word never holds
        one), what :meth:`from_arrays` reads back: kept beside a cached graph (:func:`kgc.data.graph_cache.derived`),
        so a served graph of millions has its "did you mean" at once instead of after a pass over every name."""
        words = "\n".join(self.words).encode("utf-8", "surrogatepass")
        return {"names": self.names, "indptr": self.indptr, "words": np.frombuffer(words, dtype=np.uint8)}

    @classmethod
    def from_arrays(cls, arrays: dict[str, np.ndarray]) -> "NameIndex":
        """The index :meth:`arrays` wrote (memory-mapped arrays stay mapped)."""
        self = cls.__new__(cls)
        self.names, self.indptr = arrays["names"], arrays["indptr"]
        count = len(self.indptr) - 1
        self.words = bytes(arrays["words"]).decode("utf-8", "surrogatepass").split("\n") if count else []
        if len(self.words) != count:
            raise ValueError(f"a name index of {count} words holds {len(self.words)}")
        self.vocab = {w: i for i, w in enumerate(self.words)}
        self._word_index = SpellingIndex(self.words) if len(self.words) > BRUTE_WORDS else None
        self._word_hist, self._similar = None, {}
        return self

    @property
    def nbytes(self) -> int:
        return int(self.names.nbytes + self.indptr.nbytes)

    def similar_words(self, word: str) -> list[tuple[int, float]]:
        """The vocabulary words standing for query word ``word``, with their difflib ratios: itself (1.0) if known,
        and the closest spelt ones."""
        import difflib

        if word in self._similar:
            return self._similar[word]
        if self._word_index is None:  # every word, bounded in one array pass (the histograms made once)
            if self._word_hist is None:
                self._word_hist = _histograms(self.words)
            pool = np.flatnonzero(ratio_bounds(word, self._word_hist) >= WORD_CUTOFF).tolist()
        else:
            pool = self._word_index.candidates(word, limit=500).tolist()
        m = difflib.SequenceMatcher(autojunk=False)
        m.set_seq2(word)
        scored = []
        for j in pool:
            m.set_seq1(self.words[j])
            if m.real_quick_ratio() >= WORD_CUTOFF and m.quick_ratio() >= WORD_CUTOFF:
                r = m.ratio()
                if r >= WORD_CUTOFF:
                    scored.append((-r, self.words[j], j))
        out = [(j, -r) for r, _, j in sorted(scored)[:WORD_MATCHES]]
        if len(self._similar) >= SIMILAR_KEPT:  # the words asked most are a server's vocabulary's own: keep them
            self._similar.clear()
        self._similar[word] = out
        return out

    def _pieces(self, word: str, shortest: int = 3) -> list[int]:
        """Vocabulary words found in ``word`` left to right, the longest at each place (at least ``shortest``
        letters): the words a query ran together, or lost a blank between."""
        out, i = [], 0
        while i <= len(word) - shortest:
            j = next((j for j in range(len(word), i + shortest - 1, -1) if word[i:j] in self.vocab), None)
            if j is None:
                i += 1
            else:
                out.append(self.vocab[word[i:j]])
                i = j
        return out

    def _postings(self, words: list[tuple[int, float]]) -> tuple[np.ndarray, np.ndarray]:
        """(sorted names holding one of ``words``, the best ratio among the words each holds)."""
        if not words:
            return np.zeros(0, dtype=np.int32), np.zeros(0)
        names = [self.names[self.indptr[w]:self.indptr[w + 1]] for w, _ in words]
        if len(names) == 1:
            return names[0], np.full(len(names[0]), words[0][1])
        ids = np.concatenate(names)
        ratio = np.repeat([r for _, r in words], [len(p) for p in names])
        order = np.lexsort((-ratio, ids))
        ids, ratio = ids[order], ratio[order]
        first = np.concatenate([[True], ids[1:] != ids[:-1]])
        return ids[first], ratio[first]

    def candidates(self, query: str, limit: int = 200) -> np.ndarray:
        """Ids of at most ``limit`` names holding a match of every word of ``query`` but at most one, best first:
        by the sum over the query's words of the ratio of the word standing for it (1 for the word itself)."""
        matched = []
        for w in query.lower().split():
            similar = self.similar_words(w)
            if similar:
                matched.append(similar)
            else:  # two words run together ("stormyxcomet"): the known words inside it
                matched += [[(j, 1.0)] for j in self._pieces(w)] or [[]]
        if not matched:
            return np.zeros(0, dtype=np.int64)
        postings = [self._postings(m) for m in matched]
        need = max(1, len(matched) - 1)
        # every query word's names in one array, merged by a stable sort (timsort: the sorted runs merge in linear
        # time); a name's run in it is how many query words it matches, and the sum of their ratios its score
        ids = np.concatenate([p for p, _ in postings])
        if len(ids) == 0:
            return np.zeros(0, dtype=np.int64)
        ratio = np.concatenate([r for _, r in postings])
        order = np.argsort(ids, kind="stable")
        ids, ratio = ids[order], ratio[order]
        starts = np.flatnonzero(np.concatenate([[True], ids[1:] != ids[:-1]]))
        hits = np.diff(np.append(starts, len(ids)))
        keep = hits >= need
        pool, score = ids[starts][keep], np.add.reduceat(ratio, starts)[keep]
        best = np.lexsort((pool, -score))[:limit]
        return pool[best].astype(np.int64)


_MIX = np.random.default_rng(7).integers(1, 2 ** 63, 64, dtype=np.uint64) * 2 + 1
_STEP = 1 << 20  # strings hashed per pass


def text_hashes(texts: list[str], *, fold: bool = False) -> np.ndarray:
    """A stable 64-bit hash of each string (lower-cased when ``fold``), computed on the joined UTF-8 bytes a million
    strings at a time (no Python call per string): each byte times an odd constant of its position (modulo 64),
    summed (wrapping), the length mixed in. Collisions only cost a comparison: :class:`ExactNames` checks each hit."""
    out = []
    for start in range(0, len(texts), _STEP):
        joined = "\n".join(texts[start:start + _STEP])
        raw = (joined.lower() if fold else joined).encode("utf-8", "surrogatepass")  # a lone surrogate: found nowhere
        out.append(_segment_hashes(np.frombuffer(raw, np.uint8)))
    return np.concatenate(out) if out else np.zeros(0, dtype=np.uint64)


def _segment_hashes(data: np.ndarray) -> np.ndarray:
    """The hash of each newline-separated segment of ``data`` (bytes)."""
    ends = np.flatnonzero(data == 10)
    starts = np.concatenate([[0], ends + 1])
    lengths = np.concatenate([ends, [len(data)]]) - starts
    seg = np.repeat(np.arange(len(starts)), lengths + 1)[: len(data)]  # each byte's segment (a newline: the one it ends)
    pos = np.arange(len(data), dtype=np.int64)
    pos -= starts[seg]
    pos &= 63  # each byte weighted by its position's constant (cycling every 64 bytes; the length is mixed in)
    with np.errstate(over="ignore"):
        value = _MIX[pos]
        value *= data + np.uint64(1)
        value[ends] = 0
        sums = np.add.reduceat(value, np.minimum(starts, max(0, len(data) - 1))) if len(data) else \
            np.zeros(len(starts), dtype=np.uint64)
        sums[lengths == 0] = 0
        return sums + lengths.astype(np.uint64) * np.uint64(0x9E3779B97F4A7C15)


class ExactNames:
    """Entities by exact text — a name or a full text (``name: description``), as given or lower-cased — without a
    dict of millions of strings: a stable hash of each name and of its lower-cased form, sorted (16 bytes each),
    built with array operations (:func:`text_hashes`: seconds at millions of names). A full text is found by the
    name before one of its ``": "``, and every hit is checked against the texts themselves."""

    def __init__(self, names: list[str], full_texts: "Sequence[str] | None" = None) -> None:
        self.names, self.full_texts = names, full_texts
        keys = np.concatenate([text_hashes(names), text_hashes(names, fold=True)])
        self.order = np.argsort(keys)
        self.keys = keys[self.order]

    def _candidates(self, name: str, fold: bool) -> list[int]:
        key = text_hashes([name.lower() if fold else name])[0]
        lo, hi = np.searchsorted(self.keys, key, "left"), np.searchsorted(self.keys, key, "right")
        return (self.order[lo:hi] % max(1, len(self.names))).tolist()

    def find(self, query: str, *, fold: bool) -> list[int]:
        """Sorted entity ids whose name or full text equals ``query`` (both lower-cased when ``fold``)."""
        if "\n" in query:
            return []
        q = query.lower() if fold else query
        same = (lambda t: t.lower() == q) if fold else (lambda t: t == q)  # noqa: E731
        out = {i for i in self._candidates(query, fold) if same(self.names[i])}
        if self.full_texts is not None:
            cut = query.find(": ")
            while cut > 0:  # the name is what comes before one of the ": " (a name may hold one itself)
                out.update(i for i in self._candidates(query[:cut], fold) if same(self.full_texts[i]))
                cut = query.find(": ", cut + 1)
        return sorted(out)


class Prefixes:
    """Entities whose name or id starts with what was typed (case ignored), by binary search in the lower-cased
    names and ids sorted once — ``/entities`` of ``kgc serve`` at millions of entities, where a scan of every name
    per keystroke would take a second."""

    def __init__(self, names: list[str], ids: list[str]) -> None:
        import bisect

        self._bisect = bisect.bisect_left
        self.columns = []
        for texts in (names, ids):
            lowered = [t.lower() for t in texts]
            order = sorted(range(len(lowered)), key=lowered.__getitem__)
            self.columns.append(([lowered[i] for i in order], np.asarray(order, dtype=np.int64)))

    def find(self, prefix: str, limit: int) -> list[int]:
        """Up to ``limit`` entity ids whose name, then whose id, starts with ``prefix`` (lower-cased), each once,
        in the order of the sorted names and ids."""
        key, out = prefix.lower(), {}
        for texts, owner in self.columns:
            at = self._bisect(texts, key)
            while at < len(texts) and len(out) < limit and texts[at].startswith(key):
                out.setdefault(int(owner[at]), None)
                at += 1
        return list(out)
