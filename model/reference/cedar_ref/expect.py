"""Whole-token answer checks: the `expect` of a task file (cedar eval, make_eval_tasks.py) and the
Python evaluator's answer_ok (train_eval.py) judge an answer the same way.

Owns: expect_of(value) -> {"regex": ...}, a pattern that reads the same in ECMAScript std::regex
(runtime/eval_tasks.cpp) and Python's re.
"""
import re
from typing import Dict

_ECMA_SPECIAL = set("^$\\.*+?()[]{}|")
_INT = re.compile(r"-?[0-9]+")
_DEC = re.compile(r"-?[0-9]+\.[0-9]+")
# Before a number: the start, or a character that is not a letter, digit, '.', ',' or '-', or a
# '.' or ',' that does not follow a digit ("= 1234", "(1234", "is: 1,234"; not "11234", "-1234",
# "0.1234", "5,1234", "x1234"). ECMAScript std::regex has no lookbehind, so this consumes one or
# two characters.
_NUM_BEFORE = r"(?:^|[^A-Za-z0-9.,-]|[^0-9][.,])"
# After a number (or any value ending in a digit): no letter or digit, and no '.' or ',' followed
# by a digit ("1234." and "1234, then" match; "12345", "1234k", "1234.5" and "1234,567" do not).
_NUM_AFTER = r"(?![A-Za-z0-9]|[.,][0-9])"
_ALNUM_BEFORE = r"(?:^|[^A-Za-z0-9])"
_ALNUM_AFTER = r"(?![A-Za-z0-9])"


def _escape(text: str) -> str:
    """`text` as an ECMAScript regex matching itself (only the syntax characters escaped, so the
    pattern reads the same in std::regex and Python's re)."""
    return "".join("\\" + c if c in _ECMA_SPECIAL else c for c in text)


def _grouped(digits: str) -> str:
    """'1234567' -> '1,234,567' (thousands separators; data.format_number never writes them)."""
    head = len(digits) % 3 or 3
    return ",".join([digits[:head]] + [digits[i:i + 3] for i in range(head, len(digits), 3)])


def expect_of(value: str) -> Dict[str, str]:
    """The task's `expect` for the graded answer's value: {"regex": ...} that finds `value` only as a
    whole token, never inside a longer one (a bare "1" would also be found in "1274").

    Numbers (data.format_number: integers exactly, no thousands separators; decimals rounded to 4
    places, trailing zeros dropped) must not touch a letter, another digit, a '-' or a decimal
    part: "= 1234", "1234." and "(1234)" match; "11234", "12345", "1234k", "-1234", "1234.5" and
    "HH-1234" do not (the generator never glues a value to a letter).
    An integer of four digits or more also matches written with thousands separators ("1,234",
    "1,234,567"; groups of three, all or none), as the same number. Negative values keep their sign
    ("-794" does not match "794"). Anything else (codes "HH-4035", names, pseudo-words, file names,
    "key = value" lines, dates) must not touch a letter or digit at an end that is a letter or
    digit ("vamna" does not match "vamnas", "HH-4035" not "HH-40351"); a trailing digit also
    refuses a decimal part after it. Case-sensitive, as before."""
    if _INT.fullmatch(value) or _DEC.fullmatch(value):
        sign = "-" if value.startswith("-") else ""
        int_part, dot, frac = value.lstrip("-").partition(".")
        forms = [int_part] if len(int_part) < 4 else [int_part, _grouped(int_part)]
        body = forms[0] if len(forms) == 1 else "(?:" + "|".join(forms) + ")"
        return {"regex": _NUM_BEFORE + _escape(sign) + body + (r"\." + frac if dot else "") + _NUM_AFTER}
    pattern = _escape(value)
    if value[:1].isascii() and value[:1].isalnum():
        pattern = _ALNUM_BEFORE + pattern
    if value[-1:].isascii() and value[-1:].isalnum():
        pattern += _NUM_AFTER if value[-1].isdigit() else _ALNUM_AFTER
    return {"regex": pattern}
