"""The bad-input catalogue (docs/bad-inputs.md) and the cases that enforce it (CPU).

Every row of the catalogue's tables has a case in one of the ``tests/_bad_inputs_*.py`` modules,
and every case a row; each case is refused with the documented error type and a message that
names the function, the argument and the rule.
"""
import glob
import importlib
import os
import re

import pytest

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
DOC = os.path.join(ROOT, "docs", "bad-inputs.md")
ROW = re.compile(r"^\|\s*`([a-z0-9][a-z0-9_.-]*)`\s*\|")


def _catalogue_ids():
  with open(DOC, encoding="utf-8") as f:
    ids = [m.group(1) for line in f if (m := ROW.match(line))]
  return ids


def _cases():
  cases = {}
  here = os.path.dirname(os.path.abspath(__file__))
  for path in sorted(glob.glob(os.path.join(here, "_bad_inputs_*.py"))):
    mod = importlib.import_module(os.path.splitext(os.path.basename(path))[0])
    for key, case in mod.CASES.items():
      assert key not in cases, f"case id {key!r} defined twice"
      cases[key] = case
  return cases


CASES = _cases()


def test_catalogue_and_cases_agree():
  ids = _catalogue_ids()
  dup = sorted({i for i in ids if ids.count(i) > 1})
  assert not dup, f"ids listed twice in docs/bad-inputs.md: {dup}"
  missing = sorted(set(ids) - set(CASES))
  extra = sorted(set(CASES) - set(ids))
  assert not missing, f"catalogue rows without a case: {missing}"
  assert not extra, f"cases without a catalogue row: {extra}"


@pytest.mark.parametrize("case_id", sorted(CASES))
def test_bad_input_is_refused(case_id):
  case = CASES[case_id]
  with pytest.raises(case.error) as info:
    case.call()
  msg = str(info.value)
  for name in case.names:
    assert name in msg, f"{case_id}: message does not name {name!r}: {msg}"
