"""The C-STS model: one sentence tower g(s | c) (the conditioner), similarity = cos(g(s1 | c), g(s2 | c)).

Both sentences of a row pass through the same conditioned encoder (the C-STS bi-/tri-encoder setting),
so every registered conditioner serves as it is. Texts are tokenised once per run (:class:`Texts`).
"""

from __future__ import annotations

from pathlib import Path
from typing import Sequence

import torch

from kgc.conditioning.base import build_conditioner
from kgc.csts.data import CSTSData
from kgc.data.texts import SpecialTokens, tokenizer_hash
from kgc.encoding.backbone import TextEncoder, load_tokenizer
from kgc.recipe import Recipe
from kgc.training.setup import TaskModel, build_encoders, conditioner_options


class Texts:
    """Token ids (no special tokens) of every distinct sentence and condition, tokenised once."""

    def __init__(self, data: CSTSData, tokenizer) -> None:
        tok = lambda texts: tokenizer(list(texts), add_special_tokens=False)["input_ids"]  # noqa: E731
        self.sentences = tok(data.sentences)
        self.conditions = tok(data.conditions)


class SimilarityModel(TaskModel):
    def __init__(self, encoder: TextEncoder, special: SpecialTokens, *, max_tokens: int, conditioner: str,
                 tokenizer_hash: str, **options) -> None:
        super().__init__()
        self.encoder = encoder
        self.special, self.max_tokens, self._tokenizer_hash = special, max_tokens, tokenizer_hash
        self.conditioner = build_conditioner(conditioner, encoder=encoder, special=special, max_tokens=max_tokens,
                                             **options)

    @property
    def encoders(self) -> list[TextEncoder]:
        return [self.encoder]

    @property
    def tokenizer_hash(self) -> str:
        return self._tokenizer_hash

    def similarity(self, s1: Sequence[Sequence[int]], s2: Sequence[Sequence[int]],
                   conditions: Sequence[Sequence[int]]) -> torch.Tensor:
        """(batch,) cos(g(s1 | c), g(s2 | c)) for token-id lists; both sentences in one conditioner call."""
        emb = self.conditioner(list(s1) + list(s2), list(conditions) * 2).float()  # (2 batch, dim)
        b = len(s1)
        return (emb[:b] * emb[b:]).sum(-1)


def build_model(recipe: Recipe, backbone_folder: Path, *, pretrained: bool = True):
    """(model, tokenizer). ``pretrained=False`` builds the architecture only (weights come next)."""
    tokenizer = load_tokenizer(backbone_folder)
    encoder, _ = build_encoders(recipe, backbone_folder, pretrained=pretrained, shared=True)
    model = SimilarityModel(encoder, SpecialTokens.from_tokenizer(tokenizer), max_tokens=recipe.data.max_tokens,
                            conditioner=recipe.model.conditioner, tokenizer_hash=tokenizer_hash(tokenizer),
                            **conditioner_options(recipe))
    return model, tokenizer
