"""kgc.testing and kgc.linkpred.testing: every built-in member passes the checks a plugin's runs (the plugin demo's
members pass them too: tests/test_plugins.py), and a member that breaks the contract fails with its name and what it
broke."""

from __future__ import annotations

import importlib.util

import pytest
import torch

from kgc.linkpred.testing import check_index_type, check_structure_kind
from kgc.registry import CONDITIONERS, INDEX_TYPES, TRACKERS
from kgc.testing import check_conditioner, check_tracker
from tests.test_conditioners import CASES

MIN_RECALL = {"ivfpq": 0.6}  # recall@10 of its compressed vectors (10× re-scored) on the kit's 2,000 × 32


@pytest.mark.parametrize("case", sorted(CASES))
def test_every_built_in_conditioner_passes_the_kit(case):
    name, options = CASES[case]
    check_conditioner(name, **options)


@pytest.mark.parametrize("name", sorted(INDEX_TYPES))
def test_every_built_in_index_type_passes_the_kit(name):
    check_index_type(name, min_recall=MIN_RECALL.get(name, 0.9))


@pytest.mark.parametrize("model, options", [("rules", {}), ("DistMult", {"epochs": 2, "dim": 8, "batch_size": 16})])
def test_every_built_in_structure_kind_passes_the_kit(model, options):
    check_structure_kind(model, **options)


NEEDS = {"csv": "csv", "mlflow": "mlflow", "tensorboard": "tensorboard", "wandb": "wandb"}  # the package each writes with


@pytest.mark.parametrize("name", sorted(n for n in TRACKERS if importlib.util.find_spec(NEEDS.get(n, n)) is not None))
def test_every_installed_tracker_passes_the_kit(name, tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)  # a tracker that writes beside the run (mlflow's store) writes here
    monkeypatch.setenv("WANDB_MODE", "offline")
    check_tracker(name)


def test_a_conditioner_that_breaks_the_contract_fails_by_name(monkeypatch):
    """One that ignores its condition, and one whose rows are not unit vectors: each an AssertionError naming it."""
    cls = CONDITIONERS["hadamard"]
    real = cls.combine

    def blind(self, sentence_state, condition_state, condition_index):  # the condition's state replaced by ones
        return real(self, sentence_state, torch.ones_like(condition_state), condition_index)

    monkeypatch.setattr(cls, "combine", blind)
    monkeypatch.setattr(cls, "forward", lambda self, s, c: blind(self, self.encode_sentences(s),
                                                                 self.encode_conditions(c), torch.arange(len(s))))
    with pytest.raises(AssertionError, match="conditioner 'hadamard': the same sentence under another condition"):
        check_conditioner("hadamard")
    monkeypatch.setattr(cls, "forward", lambda self, s, c: 2 * real(self, self.encode_sentences(s),
                                                                    self.encode_conditions(c), torch.arange(len(s))))
    with pytest.raises(AssertionError, match="conditioner 'hadamard': rows are not unit vectors"):
        check_conditioner("hadamard")
    with pytest.raises(AssertionError, match="conditioner 'nope': not registered"):
        check_conditioner("nope")


def test_an_index_type_that_loses_its_build_key_or_its_recall_fails_by_name(monkeypatch):
    kind = INDEX_TYPES["hnsw"]
    real = type(kind).resolve
    monkeypatch.setattr(type(kind), "resolve", lambda self, config, n, dim: {
        k: v for k, v in real(self, config, n, dim).items() if k != "hnsw_m"})
    with pytest.raises(AssertionError, match=r"index type 'hnsw': resolve\(\) leaves out its build key\(s\) \['hnsw_m'\]"):
        check_index_type("hnsw")
    monkeypatch.undo()
    with pytest.raises(AssertionError, match=r"index type 'ivfpq': recall@10 0\.\d+ against exact search, below 0.99"):
        check_index_type("ivfpq", rescore=1, min_recall=0.99)  # compressed scores, no exact re-scoring
