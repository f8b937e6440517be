"""Options declared once: `kgc serve`'s flags are the fields of kgc.serve.ServeOptions and Limits, `kgc index`'s
the keys of every registered index type (kgc.cli.common.ModelFlags): the same names, defaults, help and bounds, and
the values reach the part that reads them in its own unit."""

from __future__ import annotations

import inspect

import pytest
import typer
from typer.testing import CliRunner

import kgc
from kgc.cli import app
from kgc.errors import KGCError


def _options(command: str) -> dict:
    """The command's options by parameter name (click's view of the typer command)."""
    return {p.name: p for p in typer.main.get_command(app).commands[command].params}


def test_kgc_serve_takes_every_field_of_its_models_with_their_defaults():
    from kgc.serve import Limits, ServeOptions

    options = _options("serve")
    fields = {**ServeOptions.model_fields, **Limits.model_fields}
    assert set(options) == {"run_dir", *fields}
    for name, field in fields.items():
        cli = (field.json_schema_extra or {}).get("cli", {})
        scale = cli.get("scale", 1)
        assert options[name].default == field.default / scale if scale != 1 else options[name].default == field.default
        assert options[name].opts == [cli.get("flag", "--" + name.replace("_", "-"))], name
        assert options[name].help == field.description, name
    assert options["max_body"].opts == ["--max-body-mb"] and options["max_body"].default == 8.0


def test_kgc_serve_hands_the_values_over_in_the_models_units(monkeypatch, tmp_path):
    seen = {}

    def fake_serve(run_dir, *, limits=None, echo=print, **options):
        seen.update(run_dir=run_dir, limits=limits, options=options)
        return 0

    monkeypatch.setattr(kgc.api, "serve", fake_serve)
    done = CliRunner().invoke(app, ["serve", str(tmp_path), "--port", "0", "--max-body-mb", "2", "--grace", "3",
                                    "--reply-budget-mb", "1.5", "--threads", "2"])
    assert done.exit_code == 0, done.output
    assert seen["limits"]["max_body"] == 2 << 20 and seen["limits"]["reply_budget"] == 3 << 19
    assert seen["limits"]["grace"] == 3.0 and seen["limits"]["per_client"] == 64  # the rest: the model's defaults
    assert seen["options"] == {"host": "127.0.0.1", "port": 0, "device": "auto", "max_batch": 64,
                               "max_wait_ms": 5.0, "threads": 2, "log_level": "info"}
    bad = CliRunner().invoke(app, ["serve", str(tmp_path), "--port", "70000"])
    assert bad.exit_code == 2 and "65535" in bad.output  # the field's bound, as typer checks it


def test_the_models_check_what_python_hands_kgc_serve():
    from kgc.errors import validated
    from kgc.serve import Limits

    assert Limits(max_connections=8, per_client=64).per_client == 8  # one client never takes every connection
    with pytest.raises(KGCError, match=r"unknown option 'max_bodies'; Limits takes max_body, "):
        validated(Limits, {"max_bodies": 1})
    with pytest.raises(KGCError, match=r"keep_alive: Input should be greater than or equal to 0.1 \(got 0\)"):
        validated(Limits, {"keep_alive": 0})
    with pytest.raises(KGCError, match=r"unknown option 'prot'"):
        kgc.api.serve("nowhere", prot=8000)


def test_kgc_index_takes_every_key_every_index_type_reads(monkeypatch, tmp_path):
    from kgc.registry import INDEX_TYPES

    options = _options("index")
    keys = {k for t in INDEX_TYPES.values() for k in t.Options.model_fields if k != "type"}
    assert keys and keys <= set(options)
    for key in keys:
        readers = [name for name, t in INDEX_TYPES.items() if key in t.Options.model_fields]
        assert options[key].default is None and options[key].help.startswith(", ".join(readers) + ": "), key
    assert options["hnsw_m"].opts == ["--hnsw-m"]

    asked = {}

    class Run:
        path = tmp_path

        def index(self, **kwargs):
            asked.update(kwargs)
            return {"action": "none", "why": "fresh", "meta": {}}

    monkeypatch.setattr(kgc, "load", lambda *a, **k: Run())
    done = CliRunner().invoke(app, ["index", str(tmp_path), "--type", "hnsw", "--ef-search", "128"])
    assert done.exit_code == 0, done.output
    assert asked["type"] == "hnsw" and asked["ef_search"] == 128
    assert {k: v for k, v in asked.items() if k in keys and k != "ef_search"} == dict.fromkeys(keys - {"ef_search"})
    refused = CliRunner().invoke(app, ["index", str(tmp_path), "--hnsw-m", "1"])
    assert refused.exit_code == 2 and "--hnsw-m" in refused.output  # below the field's ge=2


def test_a_field_the_command_has_already_is_refused_at_once():
    from pydantic import Field
    from pydantic.fields import FieldInfo

    from kgc.cli.common import ModelFlags

    def command(force: bool = False, params: dict | None = None) -> None:
        """A command with its own --force."""

    field: FieldInfo = Field(False, description="a plugin's force")
    with pytest.raises(KGCError, match="force are the command's own and a model's"):
        ModelFlags.of("params", {"force": field}, optional=True)(command)
    other: FieldInfo = Field(3, description="a plugin's own")
    made = ModelFlags.of("params", {"force": field, "bits": other}, optional=True, lenient=True)(command)
    assert list(inspect.signature(made).parameters) == ["force", "bits"]  # a plugin's clash: left out


def test_kgc_evaluate_takes_the_evaluation_options_and_hands_over_those_given(monkeypatch, tmp_path):
    from kgc.linkpred.evaluation.options import EvalOptions

    options = _options("evaluate")
    assert set(options) == {"run_dir", "split", "batch_size", "device", "progress", *EvalOptions.model_fields}
    for name, field in EvalOptions.model_fields.items():
        assert options[name].help == field.description, name
    asked = {}

    class Run:
        def evaluation(self, split, *, batch_size=None, progress=False, **kwargs):
            asked.update(split=split, batch_size=batch_size, **kwargs)
            return None

    monkeypatch.setattr(kgc, "load", lambda *a, **k: Run())
    monkeypatch.setattr(kgc.api, "report", lambda run, ev, split: [])
    done = CliRunner().invoke(app, ["evaluate", str(tmp_path), "--use-index", "--top-k", "5", "--no-rerank",
                                    "--split", "dev"])
    assert done.exit_code == 0, done.output
    assert asked == {"split": "dev", "batch_size": None, "use_index": True, "top_k": 5, "rerank": False}


@pytest.mark.parametrize("options, message", [
    ({"top_k": 5}, r"top_k \(--top-k\) goes with use_index"),
    ({"negatives": 50}, r"--negatives samples corrupted triples of an inference graph"),
    ({"inductive": True, "entities_from": "x"}, r"give it or --entities-from FOLDER, not both"),
    ({"inductive": True, "use_index": True}, r"use_index \(--use-index\) ranks against the run's own FAISS index"),
    ({"candidates": "all"}, r"candidates \(--candidates\) goes with entities_from"),
    ({"entities_from": "x", "rerank": True}, r"--rerank with --entities-from"),
    ({"candidates": "some", "inductive": True}, r"candidates: Input should be 'split' or 'all' \(got 'some'\)"),
    ({"top_k": 0, "use_index": True}, r"top_k: Input should be greater than or equal to 1 \(got 0\)"),
    ({"top_kk": 3}, r"unknown option 'top_kk'; EvalOptions takes rerank, entities_from, "),
])
def test_the_evaluation_options_are_checked_once_by_their_model(options, message):
    from kgc.linkpred.evaluation.options import EvalOptions

    with pytest.raises(KGCError, match=message):
        EvalOptions.of(options)
    assert EvalOptions.of({"inductive": True, "negatives": 50, "seed": 3}).negatives == 50


def test_a_benchmarks_defaults_are_its_functions_own_written_once():
    """A bench parameter's default written as SIGNATURE is the measuring function's own, read from its source
    without importing it: each equals inspect's reading of the imported function (comma-joined for a list flag),
    and one without a literal default in the signature is refused when the command is described."""
    import kgc.api
    from kgc.harness import SIGNATURE, BenchCommand, Param, signature_defaults

    read = 0
    for name, spec in kgc.api.bench_commands().items():
        defaults = {k: v.default for k, v in inspect.signature(spec.target.load()).parameters.items()
                    if v.default is not inspect.Parameter.empty}
        from_source = signature_defaults(spec.target)
        assert from_source == {k: v for k, v in defaults.items() if k in from_source}, name  # as inspect reads them
        for p in spec.params:
            assert p.default is not SIGNATURE, (name, p.name)
            if p.name in from_source:
                want = from_source[p.name]
                if p.kind in ("ints", "strs") and isinstance(want, (tuple, list)):
                    want = ",".join(map(str, want))
                read += p.default == want
    assert read >= 45  # most of them: kgc bench's defaults live in the functions
    source = "kgc.linkpred.bench.precision:bench_precision"
    assert signature_defaults(kgc.registry.lazy(source))["rounds"] == 2
    with pytest.raises(KGCError, match=r"--out's default is the signature's, but .* no literal default for out"):
        BenchCommand("x", source, "?", (Param("out", "path", SIGNATURE, ("--out",)),))
