"""The bad-input case type shared by the catalogue modules ``tests/_bad_inputs_*.py``.

Each module defines ``CASES``: a dict from the case id (the first column of the tables in
``docs/bad-inputs.md``) to a :class:`Case`. ``tests/test_bad_inputs.py`` checks that the
catalogue and the cases name the same ids, and runs every case.
"""
from __future__ import annotations

import dataclasses
from typing import Callable, Tuple, Type


@dataclasses.dataclass(frozen=True)
class Case:
  """A call that must be refused before anything runs.

  call: makes the bad call (no arguments); it must raise ``error``.
  error: the exception type (a subclass is accepted).
  names: substrings the message must contain: the public function the user called (as they
    call it, e.g. ``"jax_gmma.dot"``), the argument, and a word of the rule.

  """
  call: Callable[[], object]
  error: Type[BaseException] = ValueError
  names: Tuple[str, ...] = ()
