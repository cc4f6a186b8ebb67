"""slices/rules.py against the table of cases the real kube-apiserver judged
(tests/judges/slice_cases.py): every write the server refuses as invalid, the plugin's
pre-send rules refuse too, so a bad slice names its device instead of failing a write."""

from __future__ import annotations

import pytest

from dra_plugin.slices.rules import SliceValidationError, validate_slice
from tests.judges.slice_cases import CASES, Case, Rejected

# Creates only: the update cases test immutable fields, which the publisher never changes.
REFUSED = [
    c
    for c in CASES
    if isinstance(c.outcome, Rejected) and c.outcome.status == 422 and c.base is None
]


@pytest.mark.parametrize("case", REFUSED, ids=[c.id for c in REFUSED])
def test_rules_refuse_what_the_server_refuses(case: Case) -> None:
    obj = {"metadata": {"generateName": "table-"}, "spec": case.spec}
    with pytest.raises(SliceValidationError):
        validate_slice(obj)


def test_the_table_has_refusals_for_rules_to_meet() -> None:
    assert len(REFUSED) >= 20
