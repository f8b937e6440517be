"""SimKGC's bi-encoder: the condition enters at the token input, ``[CLS] head [SEP] relation [SEP]``.

Nothing can be cached below the condition (t = 0), so every (head, relation) pair runs the whole
encoder. Identical pairs inside a batch are encoded once.
"""

from __future__ import annotations

import torch

from kgc.conditioning.base import Conditioner, TokenLists, register


@register
class BiEncoder(Conditioner):
    name = "biencoder"
    enters_at = "input"
    encodes_conditions = False

    def encode_conditions(self, conditions: TokenLists) -> TokenLists:
        return conditions  # t = 0: the condition's state is its token ids

    def encode_sentences(self, sentences: TokenLists) -> TokenLists:
        return sentences  # t = 0: nothing is condition-free above the input

    def combine(self, sentence_state: TokenLists, condition_state: TokenLists,
                condition_index: torch.Tensor) -> torch.Tensor:
        pairs = [self.special.wrap_pair(s, condition_state[int(c)], self.max_tokens)
                 for s, c in zip(sentence_state, condition_index)]
        batch = {k: v.to(self.device) for k, v in self.special.pad(pairs).items()}
        return self.encoder.encode_unique(batch)  # (batch, dim)
