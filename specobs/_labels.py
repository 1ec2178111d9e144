"""The one rule for label values: UTF-8 text, one line of printable characters, bounded in
length. ``configure()`` refuses a constant label that breaks it; the exporters make the values
that reach them fit. :mod:`specobs.catalog` gives these names to users.
"""

from __future__ import annotations

import re

__all__ = [
    "DEFAULT_MAX_LABEL_VALUE_LENGTH", "MAX_LABEL_VALUE_LENGTH", "exportable_label_value",
    "label_value_problem",
]

#: Longest label value specobs exports unless configured otherwise (``max_label_value_length``,
#: ``SPECOBS_MAX_LABEL_VALUE_LENGTH``), in characters: a constant label is repeated on every
#: series (about 250), so its length is multiplied by that in every scrape and export.
DEFAULT_MAX_LABEL_VALUE_LENGTH = 256
#: The most ``max_label_value_length`` may be set to.
MAX_LABEL_VALUE_LENGTH = 16384

# Characters no label value may hold: the C0 and C1 control characters (a carriage return in a
# quoted value makes Prometheus, promtool and prometheus_client reject the whole scrape; the text
# format escapes only line feed, backslash and double quote) and the line and paragraph
# separators, which line-splitting readers take as line ends.
_NOT_IN_LABEL_VALUES = re.compile("[\x00-\x1f\x7f-\x9f\u2028\u2029]")
# Those, and the lone surrogates that cannot be encoded as UTF-8.
_NOT_EXPORTABLE = re.compile("[\x00-\x1f\x7f-\x9f\u2028\u2029\ud800-\udfff]")


def label_value_problem(text: str, max_length: int = DEFAULT_MAX_LABEL_VALUE_LENGTH) -> str | None:
    """What keeps ``text`` from being a label value every consumer reads back (``None``: it can
    be one). The one rule for label values: UTF-8 text, one line of printable characters, at
    most ``max_length`` characters. ``configure()`` refuses a constant label that breaks it;
    values that reach the exporters otherwise are made to fit (:func:`exportable_label_value`)."""
    if len(text) > max_length:
        return (f"is {len(text)} characters long, more than max_label_value_length="
                f"{max_length} (SPECOBS_MAX_LABEL_VALUE_LENGTH)")
    bad = _NOT_IN_LABEL_VALUES.search(text)
    if bad is not None:
        return (f"holds a control character (U+{ord(bad.group()):04X} at character "
                f"{bad.start()}); label values must be one line of printable text")
    try:
        text.encode("utf-8")
    except UnicodeEncodeError as exc:
        # A lone surrogate: what os.environ makes of bytes that are not UTF-8.
        return f"is not valid UTF-8 text ({exc.reason} at character {exc.start})"
    return None


def exportable_label_value(text: str, max_length: int = DEFAULT_MAX_LABEL_VALUE_LENGTH) -> str:
    """``text`` made to keep :func:`label_value_problem`'s rule: each control character and lone
    surrogate replaced by U+FFFD, then cut to ``max_length`` characters."""
    return _NOT_EXPORTABLE.sub("\ufffd", text)[:max_length]
