"""A dataset the demo package adds to kgc's catalog (its ``kgc.datasets`` entry point names ``PETS``): a six-entity
KG-BERT folder shipped inside the package, fetched like any catalog entry (``kgc data fetch pets``: each file
downloaded — here from the package's own folder — and checked against its sha256)."""

from __future__ import annotations

from pathlib import Path

from kgc.data.catalog import CatalogEntry, Files

PETS = CatalogEntry(
    "pets", "Pets", "six pets and their parts (a plugin's dataset, KG-BERT layout)",
    Files((Path(__file__).resolve().parent / "pets").as_uri(), {
        "train.tsv": "065aefaa5b2759c1ce18e5c4cf8727e55f13aa0df4603c8aabec687324cb3a1b",
        "dev.tsv": "11e75e3b1c622634a5be6f600b35d380bebc35557165258553ff6137b6901eb8",
        "test.tsv": "92800ed3f00be95859aabb296d5cae1d252a954920b6a59702218bfd27af40a5",
        "entity2text.txt": "8df82e6787acf85ff19872ad4a201f96a009cb9b443055654bf9e7a4c4c816dd",
        "relation2text.txt": "7b7f9f4c945164888a5da0a12c95f3c3296c213b83bf5333836e1820341e89ea"}))
