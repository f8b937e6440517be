"""The checks a member of a kgc family must pass, for kgc's own and for a plugin's alike (as PyKEEN ships its test
cases): a plugin package calls them in its own tests, and kgc's suite calls them on every built-in member.

    from kgc.testing import check_conditioner, check_tracker
    from kgc.linkpred.testing import check_index_type, check_structure_kind   # link prediction's families

    def test_my_conditioner():
        check_conditioner("gated", gate_scale=2.0)      # a name in kgc.registry.CONDITIONERS, and its options

Each builds what it needs small and random (a 3-layer BERT 32 wide, no download: the token ids are BERT's special
ones; a 12-entity graph written to a temporary folder), runs the member through the contract kgc relies on, and
raises AssertionError naming the member and what it broke. Nothing here imports pytest. The checks of link
prediction's own families (index types, structural model kinds) are :mod:`kgc.linkpred.testing`'s.

* :func:`check_conditioner`: unit vectors of the declared width; each row depends on its own (sentence, condition)
  pair alone, and another condition moves it; the three stages compose to ``forward``; it describes itself for
  ``kgc compare`` and states its export recipe (``kgc export``), JSON as it is.
* :func:`check_tracker`: logs rows, finishes and aborts without raising; a second run resumes on the same folder.
"""

from __future__ import annotations

from kgc.conditioning.testing import check_conditioner, fail, special_tokens, tiny_encoder
from kgc.training.testing import check_tracker

__all__ = ["check_conditioner", "check_tracker", "fail", "special_tokens", "tiny_encoder"]
