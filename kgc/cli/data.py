"""``kgc data``: find, check, fetch and derive datasets."""

from __future__ import annotations

import sys
from pathlib import Path
from typing import List, Optional

import typer

from kgc.cli.common import _echo, data_app
from kgc.errors import KGCError


@data_app.command("list")
def data_list() -> None:
    """Show which catalog datasets are found, and where."""
    from kgc import api

    rows = api.datasets()
    width = max(len(row["name"]) for row in rows)
    for row in rows:
        _echo(f"{row['name']:<{width}} {row['where']:<28} {row['folder']}")

@data_app.command("check")
def data_check(path: Optional[str] = typer.Argument(None, help="a dataset folder or catalog name (default: the "
                                                                "recipe's data)"),
               recipe: Optional[Path] = typer.Option(None, "--recipe", help="read the data with this recipe's "
                                                                            "settings (data.*, the backbone's tokenizer)"),
               set_: List[str] = typer.Option([], "--set",
                                              help="override a recipe key, e.g. --set data.long_text=true"),
               strict: bool = typer.Option(False, "--strict", help="leakage is an error: dev/test triples in train "
                                                                   "(exactly or reversed under an inverse relation), "
                                                                   "duplicates, self-loops")
               ) -> None:
    """Check a dataset as `kgc train` reads it, for its task (the recipe's; else the folder's: csts_train.csv is
    C-STS). Link prediction: counts, unseen entities and relations, empty or shared texts, texts cut at
    data.max_tokens, leakage (dev/test triples in train exactly or reversed under an inverse relation, duplicates,
    self-loops), the files found and the fallbacks taken; C-STS: rows, labels and sentence pairs per split, pairs
    not asked under two conditions, texts cut. Exit 2 on an error (--strict: on leakage too)."""
    from kgc import api

    if path is None and recipe is None:
        raise KGCError("give a dataset folder or name (`kgc data check data/examples/capitals`), or --recipe RECIPE")
    report = api.check_data(path, str(recipe) if recipe is not None else None, set_, strict=strict)
    for _level, line in report.lines():
        _echo(line)
    if report.errors:
        raise KGCError(f"{report.folder}: {len(report.errors)} error(s) above; " + (
            "--strict counts leakage as an error (`kgc train` warns of leakage and stops on the others)" if strict
            else "`kgc train` stops on them too"))

@data_app.command("fetch")
def data_fetch(name: str = typer.Argument(..., help="catalog name, e.g. wn18rr or csts"),
               dest: Optional[Path] = typer.Option(None, "--dest", help="data home (default $KGC_DATA_HOME or ./data)"),
               password: Optional[str] = typer.Option(None, "--password",
                                                      help="csts: the password its authors give on request"),
               source: Optional[str] = typer.Option(None, "--from", help="csts: a local csts.tar.enc; wikidata5m: "
                                                                         "a folder of its archives (no download)"),
               yes: bool = typer.Option(False, "--yes", "-y", help="agree to a large download (wikidata5m, "
                                                                  "~1.3 GB) without being asked")) -> None:
    """Download a dataset from its public home (sha256 checked; csts decrypted and its columns checked;
    wikidata5m converted to the KG-BERT layout)."""
    from kgc import api

    ask = (lambda question: typer.confirm(question, default=False)) if sys.stdin.isatty() else None
    _echo(f"fetched into {api.fetch_dataset(name, dest, password=password, source=source, yes=yes, ask=ask, echo=_echo)}")

@data_app.command("inductive-split")
def data_inductive_split(source: str = typer.Argument(..., help="catalog name or KG-BERT folder, e.g. wn18rr"),
                         out: Path = typer.Argument(..., help="new folder for the split"),
                         held_out: int = typer.Option(..., "--held-out", min=2, help="entities kept out of train"),
                         seed: int = typer.Option(0, "--seed")) -> None:
    """Hold entities out of training: test = triples among them (both ends unseen), train/dev = the rest."""
    from kgc import api

    summary = api.inductive_split(source, out, held_out=held_out, seed=seed)
    t = summary["triples"]
    _echo(f"held out {summary['held_out_entities']} entities: train {t['train']}, dev {t['dev']}, test {t['test']} "
          f"triples ({summary['dropped_triples']} dropped: one end held out, or a test triple of seen "
          f"entities) → {out}")
    _echo(f"train on it ({summary['recipe_key']}), then `kgc evaluate RUN --entities-from {out}`")

@data_app.command("synth-csts")
def data_synth_csts(out: Path = typer.Argument(..., help="folder for csts_{train,validation,test}.csv"),
                    seed: int = typer.Option(0, "--seed"),
                    train_pairs: int = typer.Option(2000, "--train-pairs", min=1),
                    validation_pairs: int = typer.Option(300, "--validation-pairs", min=1),
                    test_pairs: int = typer.Option(500, "--test-pairs", min=1)) -> None:
    """Generate the synthetic conditional-similarity set in the official C-STS layout (deterministic)."""
    from kgc import api

    api.synth_csts(out, seed=seed, train_pairs=train_pairs, validation_pairs=validation_pairs, test_pairs=test_pairs)
    _echo(f"wrote {2 * train_pairs} + {2 * validation_pairs} + {2 * test_pairs} rows to {out}/csts_*.csv")

@data_app.command("synth-routing")
def data_synth_routing(out: Path = typer.Argument(..., help="folder for the KG-BERT layout (data.path)"),
                       slots: int = typer.Option(3, "--slots", help="words per head = relations (2 to 4)"),
                       heads: int = typer.Option(96, "--heads", min=1),
                       seed: int = typer.Option(0, "--seed")) -> None:
    """Generate a graph where the relation decides which word of the head answers it (a router must route)."""
    from kgc import api

    counts = api.synth_routing(out, slots=slots, heads=heads, seed=seed)
    _echo(f"wrote {heads} heads × {slots} relations: train {counts['train']}, dev {counts['dev']}, test "
          f"{counts['test']} triples → {out}")
    _echo(f"train on it with data.path: {out} and data.neighbor_text: false (neighbours would name the answers)")

@data_app.command("synth-graph")
def data_synth_graph(out: Path = typer.Argument(..., help="new folder for the KG-BERT layout (data.path)"),
                     entities: int = typer.Option(..., "--entities", min=10, help="entities (unique names)"),
                     relations: Optional[int] = typer.Option(None, "--relations", min=1,
                                                             help="relations (default: entities / 100, at least 10, "
                                                                  "at most Wikidata5M's 822)"),
                     triples: Optional[int] = typer.Option(None, "--triples", min=1,
                                                           help="distinct triples, all splits (default: 4.49 × "
                                                                "entities, Wikidata5M's ratio)"),
                     dev_triples: int = typer.Option(5000, "--dev-triples", min=0, help="dev triples, at most"),
                     test_triples: int = typer.Option(5000, "--test-triples", min=0, help="test triples, at most"),
                     dev_fraction: float = typer.Option(0.1, "--dev-fraction", min=0.0, max=0.5,
                                                        help="dev holds at most this share of the triples"),
                     test_fraction: float = typer.Option(0.1, "--test-fraction", min=0.0, max=0.5,
                                                         help="test holds at most this share of the triples"),
                     seed: int = typer.Option(0, "--seed"),
                     force: bool = typer.Option(False, "--force", help="replace OUT when it is not empty")) -> None:
    """Generate a graph of any size: power-law degrees, names and descriptions from word lists, dev and test
    entities all seen in train (deterministic in the seed; written whole or not at all)."""
    from kgc import api
    from kgc.fileio import human_bytes

    s = api.synth_graph(out, entities=entities, relations=relations, triples=triples, dev_triples=dev_triples,
                        test_triples=test_triples, dev_fraction=dev_fraction, test_fraction=test_fraction, seed=seed,
                        force=force)
    t = s["triples"]
    _echo(f"wrote {s['entities']:,} entities, {s['relations']:,} relations, triples train {t['train']:,} / dev "
          f"{t['dev']:,} / test {t['test']:,} in {s['seconds']:.2f} s ({human_bytes(s['bytes'])}) → {out}")
