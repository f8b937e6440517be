"""A synthetic knowledge graph of any size in the KG-BERT layout (``kgc data synth-graph``), for scale work.

Entities belong to classes (``city``, ``person``, ``river`` …, class sizes Zipf-like); each relation links one class
to another and is named after its verb and its tail class (``R0007  located in region``). Triples are drawn with
power laws: the relation from a permuted popularity ranking, the head and the tail each from a permuted ranking
within their class, so degrees are heavy-tailed (a few hubs, a small median), as in Wikidata5M. First every
entity gets one triple of its own (a relation that takes its class, the other end drawn by the power law), and so
does every relation: none is left out while there are at least as many triples as entities and relations.
Duplicates and self-loops are never written.

Names are two or three words of the built-in lists (``Amber Falcon Brook``), unique, with a number only beyond the
lists' 6.7 million combinations. A description names the entity's class and the relation of its own triple, with
the class at the other end, never that entity (so no answer leaks into a text)::

    E0001234    Quiet Heron Ford, a small city located in a region, known for its bridges
    E0004321    Amber Falcon Brook, an old region that a city is located in, first recorded in 1742

Dev and test are drawn from the shuffled triples, keeping only triples whose head, tail and relation stay in
some train triple (the transductive setting). ``meta.json`` records the parameters and the seed; the same
parameters and seed give the same bytes.

It is vectorised so that 5M entities and 20M triples take minutes in bounded memory: triples are int64 keys
``(h · R + r) · E + t`` deduplicated with ``np.unique``; triple lines are fixed-width bytes assembled in numpy and
written in 1M-row chunks; the folder is written beside ``out`` and renamed onto it when complete.
"""

from __future__ import annotations

import json
import os
import time
from dataclasses import dataclass
from pathlib import Path
from typing import IO

import numpy as np

from kgc.errors import KGCError
from kgc.fileio import atomic_dir, ensure_space, write_error

VERSION = 1  # bump when the same parameters and seed would give other bytes
TRIPLES_PER_ENTITY = 4.49  # Wikidata5M: 20,624,575 triples (train + valid + test) / 4,594,485 entities
MAX_RELATIONS = 822  # Wikidata5M's relations: the default at scale (entities // 100 below 82,200 entities)
HELD_OUT, HELD_OUT_FRACTION = 5000, 0.1  # dev and test triples each: Wikidata5M's ~5,000, at most 10 %
MIN_ENTITIES = 10
# p(rank k) ∝ k^-s over a permuted ranking; a tail exponent s gives degrees with a power-law tail of 1 + 1/s
RELATION_EXPONENT, HEAD_EXPONENT, TAIL_EXPONENT, CLASS_EXPONENT = 1.1, 0.7, 1.05, 1.0
CHUNK = 1 << 20  # rows per written chunk and per batch of draws
MAX_ROUNDS = 50  # rounds of draws that top up the distinct triples before the request is called impossible


def _words(text: str) -> tuple[str, ...]:
    return tuple(text.split())


FIRST = _words("""
Amber Ancient Arctic Ashen Autumn Azure Bitter Black Blazing Blue Bold Brave Brazen Bright Broad Broken Bronze Calm
Cedar Central Cheerful Chilly Civic Clear Clever Coastal Cobalt Cold Copper Coral Cosmic Crimson Crooked Crystal
Curious Daring Dark Dawn Deep Desert Distant Divine Double Dusky Dusty Eager Early Eastern Ebony Elder Electric
Emerald Empty Endless Eternal Evening Fading Fair Faithful Far Fast Fierce Fiery Final First Flying Foggy Forest
Forgotten Fragile Free Frozen Gentle Giant Gilded Glass Glowing Golden Grand Granite Gray Great Green Hidden High
Hollow Honest Humble Icy Idle Inner Iron Island Ivory Jade Jolly Kind Last Lazy Lesser Light Little Lively Lone
Lonely Long Lost Loud Lower Loyal Lucky Lunar Marble Meadow Merry Middle Mighty Misty Modern Morning Mossy Mountain
Muddy Narrow Native Neon Noble Northern Oaken Odd Old Olive Open Orange Outer Pale Patient Pearl Pine Plain Polar
Proud Purple Quick Quiet Radiant Rainy Rapid Rare Red Restless Rich Rocky Rolling Rosy Round Royal Ruby Rugged Rusty
Sacred Sandy Scarlet Secret Shadow Sharp Shining Silent Silver Simple Sleepy Slow Small Smoky Snowy Soft Solar
Southern Spring Square Stark Steady Steep Still Stone Stormy Strong Summer Sunny Swift Tall Tender Thin Tidal Tiny
Twin Upper Urban Velvet Vivid Wandering Warm Western White Wild Windy Winter Wise Wooden Young Zealous""")
SECOND = _words("""
Acorn Albatross Anchor Antelope Anvil Apple Arrow Aspen Badger Banner Barley Basil Beacon Bear Beaver Bee Beetle
Bell Birch Bison Blossom Boar Bramble Bridge Buffalo Bull Butterfly Cactus Camel Candle Canyon Cardinal Castle Cat
Cherry Chestnut Clover Cobra Comet Condor Cougar Crane Cricket Crow Crown Cypress Daisy Deer Dolphin Dove Dragon
Eagle Elk Elm Ember Falcon Feather Fern Finch Fir Flame Fox Frog Gazelle Gecko Glacier Goose Griffin Gull Hare Hawk
Hazel Heather Hedgehog Heron Hickory Hive Holly Hornet Horse Hyacinth Ibis Iris Ivy Jackal Jaguar Jasmine Juniper
Kestrel Kettle Kingfisher Kite Koala Lantern Lark Laurel Lemon Leopard Lily Lion Lizard Lotus Lynx Magnolia Magpie
Mallard Mantis Maple Marigold Marlin Marten Mink Mirror Mole Mongoose Moose Moth Mule Myrtle Narwhal Needle Nettle
Newt Nightingale Oak Ocelot Orca Orchid Oriole Osprey Otter Owl Ox Panda Panther Parrot Peach Pebble Pelican Penguin
Pepper Petrel Pheasant Pigeon Pike Plover Plum Poplar Poppy Puffin Quail Rabbit Raccoon Raven Reed Robin Rook Rose
Rowan Saffron Sage Salmon Seal Shark Skylark Sloth Sparrow Spruce Squirrel Stag Starling Stork Swallow Swan Sycamore
Tapir Thistle Thrush Tiger Toad Torch Trout Tulip Turtle Viper Violet Vulture Walnut Walrus Warbler Wasp Weasel
Whale Willow Wolf Wombat Wren Yak Yew Zebra""")
THIRD = _words("""
Abbey Acre Alley Arch Bank Barrow Basin Bay Beach Bend Bluff Bourne Brook Burrow Butte Cairn Canal Cape Cave Chapel
Cliff Close Coast Common Cove Creek Crest Croft Cross Crossing Dale Dam Dell Delta Den Dene Downs Drift Dune Edge
End Falls Fell Fen Ferry Field Fold Ford Forge Fort Gap Garden Gate Glade Glen Gorge Grange Grove Gulch Gully Hall
Hamlet Harbour Haven Heath Heights Hill Hold Holm Hook Hurst Inlet Isle Keep Key Knoll Lagoon Lake Landing Lane Lea
Ledge Loch Lodge Loop Manor Marsh Mead Mere Mesa Mill Mine Moor Mount Mouth Narrows Ness Nook Oasis Orchard Outpost
Park Pass Pasture Path Peak Pier Pines Place Plains Plateau Point Pond Pool Port Quarry Quay Rapids Reach Reef Ridge
Rise Rock Row Run Shoal Shore Slope Sound Spire Springs Spur Stead Steps Strand Stream Summit Tarn Terrace Thicket
Tor Tower Trail Vale Valley View Village Vista Wall Ward Water Way Weald Well Wharf Wick Wold Wood Yard""")
CLASSES = _words("""
person city river company album film band book country region village mountain lake island school university
museum team species plant song language ship painting building bridge festival journal disease protein gene
mineral planet star galaxy software game award event war party newspaper station airport road park church castle
dish instrument""")
VERBS = ("located in", "part of", "founded by", "owned by", "member of", "named after", "based in", "influenced by",
         "produced by", "written by", "directed by", "published by", "derived from", "connected to", "adjacent to",
         "followed by", "preceded by", "employed by", "married to", "allied with", "known for", "inspired by",
         "governed by", "operated by", "designed by", "built by", "led by", "funded by", "studied at", "born in",
         "buried in", "played by", "performed by", "composed by", "discovered by", "sponsored by", "hosted by",
         "made of", "native to", "used by")
ADJECTIVES = _words("""
small large old new famous remote busy quiet historic modern minor major local national regional northern southern
eastern western central coastal rural urban ancient early late popular obscure notable distant nearby rare common
tiny vast young grand humble bright""")
NOUNS = _words("""
gardens music history bridges festivals markets libraries architecture harbour forests lakes traditions scholars
archives collections mines vineyards craftsmen legends ruins towers murals fountains orchards meadows caves tunnels
parades recipes songs""")
YEARS = range(1100, 2021)  # "first recorded in YEAR"


def _a(word: str) -> str:
    return f"an {word}" if word[0] in "aeiou" else f"a {word}"


@dataclass
class Schema:
    """Classes and relations: ``order[starts[c] + k]`` is the entity of rank k in class c (``sizes[c]`` of them);
    relation r links class ``hc[r]`` to class ``tc[r]``; ``popular[k]`` is the relation of popularity rank k."""

    entities: int
    relations: int
    classes: list[str]
    sizes: np.ndarray
    starts: np.ndarray
    order: np.ndarray
    class_of: np.ndarray
    hc: np.ndarray
    tc: np.ndarray
    popular: np.ndarray
    texts: list[str]
    verbs: list[str]

    def pack(self, h: np.ndarray, r: np.ndarray, t: np.ndarray) -> np.ndarray:
        return (h.astype(np.int64) * self.relations + r) * self.entities + t

    def unpack(self, keys: np.ndarray) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
        return keys // (self.relations * self.entities), (keys // self.entities) % self.relations, keys % self.entities


def power_law(rng: np.random.Generator, n, s, size: int) -> np.ndarray:
    """``size`` ranks in ``[0, n)`` (``n`` a number or an array of ``size``) with p(rank k) ∝ (k + 1)^-s, s ≠ 1: the
    inverse CDF of the continuous power law on [1, n + 1), floored (one uniform per draw, no table of n)."""
    n = np.asarray(n, dtype=np.float64)
    a = 1.0 - np.asarray(s, dtype=np.float64)
    x = (1.0 + rng.random(size) * (np.power(n + 1.0, a) - 1.0)) ** (1.0 / a)
    return np.clip(x.astype(np.int64) - 1, 0, n.astype(np.int64) - 1)


def schema(rng: np.random.Generator, entities: int, relations: int) -> Schema:
    n_cls = min(len(CLASSES), relations, entities // 2)
    weights = 1.0 / np.arange(1, n_cls + 1) ** CLASS_EXPONENT
    share = (entities - 2 * n_cls) * weights / weights.sum()
    sizes = 2 + np.floor(share).astype(np.int64)  # at least 2 a class: a relation within one class has no self-loop
    sizes[np.argsort(share - np.floor(share))[::-1][:entities - int(sizes.sum())]] += 1
    starts = np.concatenate([[0], np.cumsum(sizes)[:-1]])
    classes = [CLASSES[i] for i in rng.permutation(len(CLASSES))[:n_cls]]
    order = rng.permutation(entities)
    class_of = np.empty(entities, dtype=np.int64)
    class_of[order] = np.repeat(np.arange(n_cls), sizes)
    p = sizes / entities
    tc = np.concatenate([rng.permutation(n_cls), rng.choice(n_cls, relations - n_cls, p=p)])  # every class a tail
    hc = rng.choice(n_cls, relations, p=p)
    popular = rng.permutation(relations)
    verb_order = [VERBS[i] for i in rng.permutation(len(VERBS))]
    first_verb = rng.integers(len(VERBS), size=n_cls)  # each tail class starts at its own verb
    used = np.zeros(n_cls, dtype=np.int64)
    texts, verbs = [], []
    for r in range(relations):  # (verb, tail class) distinct; a number only after every verb of that class
        k = int(used[tc[r]])
        used[tc[r]] += 1
        verbs.append(verb_order[(first_verb[tc[r]] + k) % len(VERBS)])
        texts.append(f"{verbs[-1]} {classes[tc[r]]}" + (f" {k // len(VERBS) + 1}" if k >= len(VERBS) else ""))
    return Schema(entities, relations, classes, sizes, starts, order, class_of, hc, tc, popular, texts, verbs)


def own_triples(rng: np.random.Generator, s: Schema) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """One triple per entity, then one per relation: ``(keys, relation, as_head)`` (the last two per entity). An
    entity is the head of a relation whose head class is its class (half of them, where there is one) or else the
    tail of one whose tail class is; the other end is drawn by the power law in its class."""
    e = np.arange(s.entities)
    c = s.class_of
    n_cls = len(s.classes)
    by_h, by_t = np.argsort(s.hc, kind="stable"), np.argsort(s.tc, kind="stable")
    count_h, count_t = np.bincount(s.hc, minlength=n_cls), np.bincount(s.tc, minlength=n_cls)
    start_h, start_t = np.cumsum(count_h) - count_h, np.cumsum(count_t) - count_t
    as_head = (count_h[c] > 0) & (rng.random(s.entities) < 0.5)
    u = rng.random(s.entities)
    pick_h = by_h[np.minimum(start_h[c] + (u * count_h[c]).astype(np.int64), s.relations - 1)]
    rel = np.where(as_head, pick_h, by_t[start_t[c] + (u * count_t[c]).astype(np.int64)])
    other = np.where(as_head, s.tc[rel], s.hc[rel])
    pos = power_law(rng, s.sizes[other], np.where(as_head, TAIL_EXPONENT, HEAD_EXPONENT), s.entities)
    loop = s.order[s.starts[other] + pos] == e
    pos[loop] = (pos[loop] + 1) % s.sizes[other][loop]  # the next entity of the class: never itself (sizes >= 2)
    partner = s.order[s.starts[other] + pos]
    keys = s.pack(np.where(as_head, e, partner), rel, np.where(as_head, partner, e))
    return np.concatenate([keys, with_ends(rng, s, np.arange(s.relations))]), rel, as_head  # + one per relation


def with_ends(rng: np.random.Generator, s: Schema, r: np.ndarray) -> np.ndarray:
    """Keys of triples of relations ``r``, head and tail drawn by the power laws in their classes (a tail that is
    the head moves to the next entity of its class: no self-loops)."""
    hc, tc = s.hc[r], s.tc[r]
    h = s.order[s.starts[hc] + power_law(rng, s.sizes[hc], HEAD_EXPONENT, len(r))]
    pos = power_law(rng, s.sizes[tc], TAIL_EXPONENT, len(r))
    loop = s.order[s.starts[tc] + pos] == h
    pos[loop] = (pos[loop] + 1) % s.sizes[tc][loop]
    return s.pack(h, r, s.order[s.starts[tc] + pos])


def draw(rng: np.random.Generator, s: Schema, size: int) -> np.ndarray:
    """``size`` triple keys by the power laws (they may repeat)."""
    return with_ends(rng, s, s.popular[power_law(rng, s.relations, RELATION_EXPONENT, size)])


def all_triples(rng: np.random.Generator, s: Schema, own: np.ndarray, total: int) -> np.ndarray:
    """``total`` distinct triple keys, shuffled: the entities' own triples, topped up by power-law draws."""
    own = np.unique(own)
    if total <= len(own):  # fewer triples than entities and relations: some of them stay without one
        return own[rng.permutation(len(own))[:total]]
    need, extra = total - len(own), np.empty(0, dtype=np.int64)
    want = int(need * 1.1) + 1000
    for _ in range(MAX_ROUNDS):
        batch = np.concatenate([draw(rng, s, min(CHUNK * 4, want - i)) for i in range(0, want, CHUNK * 4)])
        pos = np.minimum(np.searchsorted(own, batch), len(own) - 1)
        before = len(extra)
        extra = np.unique(np.concatenate([extra, batch[own[pos] != batch]]))
        if len(extra) >= need:
            break
        gained = len(extra) - before
        if gained == 0:
            break
        want = min(int((need - len(extra)) * want / gained * 1.2) + 1000, 2 * need + CHUNK)
    if len(extra) < need:
        raise KGCError(f"synth-graph: could not draw {total:,} distinct triples among {s.entities:,} entities and "
                       f"{s.relations:,} relations (the power laws keep repeating the likeliest triples; "
                       f"{len(own) + len(extra):,} found). Ask for fewer --triples, or more --entities or --relations.")
    rng.shuffle(extra)
    keys = np.concatenate([own, extra[:need]])
    rng.shuffle(keys)
    return keys


def hold_out(keys: np.ndarray, s: Schema, n_dev: int, n_test: int) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """``(train, dev, test)`` keys: dev and test taken in the keys' (shuffled) order, alternately, from the triples
    whose head, tail and relation each keep another triple in train."""
    degree = np.zeros(s.entities, dtype=np.int64)
    rel_count = np.zeros(s.relations, dtype=np.int64)
    for i in range(0, len(keys), CHUNK):
        h, r, t = s.unpack(keys[i:i + CHUNK])
        degree += np.bincount(h, minlength=s.entities) + np.bincount(t, minlength=s.entities)
        rel_count += np.bincount(r, minlength=s.relations)
    dev: list[int] = []
    test: list[int] = []
    for i in range(0, len(keys), 1 << 16):
        if len(dev) == n_dev and len(test) == n_test:
            break
        block = s.unpack(keys[i:i + (1 << 16)])
        for j, (h, r, t) in enumerate(zip(*(a.tolist() for a in block)), start=i):
            if degree[h] > 1 and degree[t] > 1 and rel_count[r] > 1:
                degree[h] -= 1
                degree[t] -= 1
                rel_count[r] -= 1
                (test if len(test) < n_test and (len(test) <= len(dev) or len(dev) == n_dev) else dev).append(j)
                if len(dev) == n_dev and len(test) == n_test:
                    break
    if len(dev) < n_dev or len(test) < n_test:
        raise KGCError(f"synth-graph: only {len(dev) + len(test):,} of {len(keys):,} triples can leave train with "
                       f"their entities and relation still in train; {n_dev + n_test:,} were asked for dev and test. "
                       "Ask for fewer --dev-triples/--test-triples, or more --triples.")
    held = np.zeros(len(keys), dtype=bool)
    held[dev + test] = True
    return keys[~held], keys[np.array(dev, dtype=np.int64)], keys[np.array(test, dtype=np.int64)]


def id_table(prefix: str, count: int, width: int) -> np.ndarray:
    """``(count, 1 + width)`` uint8: row i is ``prefix`` and i + 1 in ``width`` digits (``E0000001``)."""
    table = np.empty((count, 1 + width), dtype=np.uint8)
    table[:, 0] = ord(prefix)
    n = np.arange(1, count + 1, dtype=np.int64)
    for k in range(width):
        table[:, width - k] = 48 + (n // 10 ** k) % 10
    return table


def name_codes(rng: np.random.Generator, entities: int) -> tuple[np.ndarray, int]:
    """A distinct code per entity and the words a name has (2 while the two-word names are twice the entities)."""
    two, three = len(FIRST) * len(SECOND), len(FIRST) * len(SECOND) * len(THIRD)
    if entities <= two // 2:
        return rng.choice(two, entities, replace=False), 2
    return (rng.choice(three, entities, replace=False) if entities <= three else rng.permutation(entities)), 3


def names(codes: np.ndarray, words: int) -> list[str]:
    a, b, c = len(FIRST), len(SECOND), len(THIRD)
    i, j = (codes % a).tolist(), (codes // a % b).tolist()
    if words == 2:
        return [f"{FIRST[x]} {SECOND[y]}" for x, y in zip(i, j)]
    k, n = (codes // (a * b) % c).tolist(), (codes // (a * b * c)).tolist()
    return [f"{FIRST[x]} {SECOND[y]} {THIRD[z]}" + (f" {m + 1}" if m else "") for x, y, z, m in zip(i, j, k, n)]


def _write(path: Path, fh_writer) -> int:
    """Write ``path`` with ``fh_writer(fh)`` (binary), fsynced; a full or read-only disk is one KGCError."""
    try:
        with open(path, "wb") as fh:
            fh_writer(fh)
            fh.flush()
            os.fsync(fh.fileno())
    except OSError as exc:
        raise (write_error(path, exc) or exc) from None
    return path.stat().st_size


def _triple_lines(fh: IO[bytes], keys: np.ndarray, s: Schema, ent_ids: np.ndarray, rel_ids: np.ndarray) -> None:
    w, rw = ent_ids.shape[1], rel_ids.shape[1]
    for i in range(0, len(keys), CHUNK):
        h, r, t = s.unpack(keys[i:i + CHUNK])
        buf = np.empty((len(h), 2 * w + rw + 3), dtype=np.uint8)  # fixed-width lines: E…\tR…\tE…\n
        buf[:, :w], buf[:, w] = ent_ids[h], 9
        buf[:, w + 1:w + 1 + rw], buf[:, w + 1 + rw] = rel_ids[r], 9
        buf[:, w + 2 + rw:-1], buf[:, -1] = ent_ids[t], 10
        fh.write(buf.tobytes())


def _entity_lines(fh: IO[bytes], rng: np.random.Generator, s: Schema, rel: np.ndarray, as_head: np.ndarray,
                  width: int) -> None:
    codes, words = name_codes(rng, s.entities)
    adjective = rng.integers(len(ADJECTIVES), size=s.entities, dtype=np.int32)
    fillers = [""] * 2 + [f", known for its {n}" for n in NOUNS] + [f", first recorded in {y}" for y in YEARS]
    kind = rng.integers(3, size=s.entities)  # none, a noun, a year: a third each
    filler = np.where(kind == 0, 0, np.where(kind == 1, 2 + rng.integers(len(NOUNS), size=s.entities),
                                             2 + len(NOUNS) + rng.integers(len(YEARS), size=s.entities)))
    lead = [[f"{_a(adj)} {cls}" for cls in s.classes] for adj in ADJECTIVES]  # "a small city"
    phrase = [[f"that {_a(s.classes[s.hc[r]])} is {s.verbs[r]}" for r in range(s.relations)],  # as the tail
              [f"{s.verbs[r]} {_a(s.classes[s.tc[r]])}" for r in range(s.relations)]]  # as the head
    for i in range(0, s.entities, CHUNK):
        part = slice(i, i + CHUNK)
        rows = zip(range(i + 1, i + 1 + len(codes[part])), names(codes[part], words), adjective[part].tolist(),
                   s.class_of[part].tolist(), as_head[part].tolist(), rel[part].tolist(), filler[part].tolist())
        fh.write("".join(f"E{e:0{width}d}\t{name}, {lead[a][c]} {phrase[h][r]}{fillers[f]}\n"
                         for e, name, a, c, h, r, f in rows).encode("utf-8"))


def synth_graph(out: str | Path, *, entities: int, relations: int | None = None, triples: int | None = None,
                dev_triples: int = HELD_OUT, test_triples: int = HELD_OUT, dev_fraction: float = HELD_OUT_FRACTION,
                test_fraction: float = HELD_OUT_FRACTION, seed: int = 0, force: bool = False) -> dict:
    """Write the graph to the new folder ``out`` (``entity2text.txt`` as KG-BERT's ``id<TAB>name, description``,
    ``relation2text.txt``, ``train.tsv``, ``dev.tsv``, ``test.tsv``, ``meta.json``); returns ``folder``, ``entities``, ``relations``, ``triples`` (per
    split), ``seconds``, ``bytes``. ``relations``: default ``entities // 100`` within 10..822; ``triples``: all
    splits together, default 4.49 × ``entities``; dev and test each hold the smaller of ``*_triples`` and
    ``*_fraction`` of the triples. A non-empty ``out`` is refused unless ``force`` (it is replaced)."""
    started = time.perf_counter()
    out = Path(out)
    if entities < MIN_ENTITIES:
        raise KGCError(f"synth-graph: --entities {entities}: give at least {MIN_ENTITIES}")
    relations = relations if relations is not None else min(MAX_RELATIONS, max(10, entities // 100))
    triples = triples if triples is not None else round(TRIPLES_PER_ENTITY * entities)
    if relations < 1 or triples < 1 or min(dev_triples, test_triples) < 0:
        raise KGCError("synth-graph: --relations and --triples must be at least 1, --dev-triples and --test-triples "
                       "at least 0")
    if not (0 <= dev_fraction < 1 and 0 <= test_fraction < 1 and dev_fraction + test_fraction < 1):
        raise KGCError(f"synth-graph: --dev-fraction {dev_fraction} and --test-fraction {test_fraction}: each in "
                       "[0, 1), together below 1 (train needs triples)")
    if entities * entities * relations >= 2 ** 62:
        raise KGCError(f"synth-graph: {entities:,} entities × {entities:,} × {relations:,} relations do not fit the "
                       "int64 triple keys; ask for fewer entities or relations")
    n_dev, n_test = min(dev_triples, int(dev_fraction * triples)), min(test_triples, int(test_fraction * triples))
    if out.exists() and not force and (not out.is_dir() or any(out.iterdir())):
        raise KGCError(f"{out} exists and is not empty. Choose a new folder, or pass --force to replace it.")
    width, rel_width = max(7, len(str(entities))), max(4, len(str(relations)))
    ensure_space(out / "train.tsv", triples * (2 * width + rel_width + 6) + entities * 110, "the graph")

    rng = np.random.default_rng(seed)
    s = schema(rng, entities, relations)
    own, rel, as_head = own_triples(rng, s)
    train, dev, test = hold_out(all_triples(rng, s, own, triples), s, n_dev, n_test)
    del own
    ent_ids, rel_ids = id_table("E", entities, width), id_table("R", relations, rel_width)
    split_keys = {"train": train, "dev": dev, "test": test}
    meta = {"generator": "kgc data synth-graph", "version": VERSION, "seed": seed,
            "parameters": {"entities": entities, "relations": relations, "triples": triples,
                           "dev_triples": dev_triples, "test_triples": test_triples, "dev_fraction": dev_fraction,
                           "test_fraction": test_fraction},
            "triples": {k: len(v) for k, v in split_keys.items()},
            "classes": len(s.classes),
            "exponents": {"relation": RELATION_EXPONENT, "head": HEAD_EXPONENT, "tail": TAIL_EXPONENT,
                          "class_size": CLASS_EXPONENT}}
    size = 0
    with atomic_dir(out, replace=force) as tmp:
        size += _write(tmp / "entity2text.txt", lambda fh: _entity_lines(fh, rng, s, rel, as_head, width))
        size += _write(tmp / "relation2text.txt", lambda fh: fh.write("".join(
            f"R{r + 1:0{rel_width}d}\t{text}\n" for r, text in enumerate(s.texts)).encode("utf-8")))
        for split, keys in split_keys.items():
            size += _write(tmp / f"{split}.tsv", lambda fh, keys=keys: _triple_lines(fh, keys, s, ent_ids, rel_ids))
        size += _write(tmp / "meta.json", lambda fh: fh.write((json.dumps(meta, indent=2) + "\n").encode("utf-8")))
    return {"folder": str(out), "entities": entities, "relations": relations, "triples": meta["triples"],
            "seconds": round(time.perf_counter() - started, 2), "bytes": size}
