"""How the write-ups spell numbers, lists and p values in prose ("twenty-two", "a, b and c", "−0.37",
"p = 0.053"), shared by the scripts that generate their sentences."""

from __future__ import annotations

import re

_WORDS = ("no one two three four five six seven eight nine ten eleven twelve thirteen fourteen fifteen sixteen "
          "seventeen eighteen nineteen").split()
_TENS = {20: "twenty", 30: "thirty", 40: "forty", 50: "fifty"}


def number(n: int, *, capital: bool = False) -> str:
    """0-59 in words ("twenty-two"), as the write-up spells counts."""
    if n < 0:  # (a negative index into _WORDS gave "nineteen" for -1)
        raise ValueError(f"no word for {n}")
    if n < 20:
        word = _WORDS[n]
    elif n < 60:
        word = _TENS[n // 10 * 10] + (f"-{_WORDS[n % 10]}" if n % 10 else "")
    else:
        raise ValueError(f"no word for {n}")
    return word[0].upper() + word[1:] if capital else word


_ORDINALS = ("first second third fourth fifth sixth seventh eighth ninth tenth eleventh twelfth thirteenth "
             "fourteenth fifteenth sixteenth seventeenth eighteenth nineteenth twentieth").split()


def ordinal(n: int) -> str:
    """1-20 as the write-up spells a rank ("sixth")."""
    if not 1 <= n <= len(_ORDINALS):
        raise ValueError(f"no ordinal word for {n}")
    return _ORDINALS[n - 1]


def listing(items: list[str]) -> str:
    """"a", "a and b", "a, b and c"."""
    if not items:  # an IndexError otherwise; prose about nothing needs its own sentence, which the caller knows
        raise ValueError("an empty list has no listing")
    return items[0] if len(items) == 1 else ", ".join(items[:-1]) + " and " + items[-1]


def listing_groups(groups: list[str]) -> str:
    """`listing` for phrases that may hold a list or an aside themselves: "seed 1 of CNNs and LightConv, and seeds 2
    and 3 of Bi_Direct and Rel_Pos"; "a; b; and c" for three or more; plain `listing` where no phrase but the last
    holds "and" or a comma."""
    if not any(" and " in g or "," in g for g in groups[:-1]):
        return listing(groups)
    return ", and ".join(groups) if len(groups) == 2 else "; ".join(groups[:-1]) + "; and " + groups[-1]


def possessive(name: str) -> str:
    """"Block's", "Rel_Pos's", "CNNs'" (a plural: an acronym's -s)."""
    return name + ("'" if name.endswith("s") and name[:-1].isupper() else "'s")


def seeds_phrase(seeds: tuple[int, ...]) -> str:
    """"seed 3", "seeds 2 and 3"."""
    return ("seed " if len(seeds) == 1 else "seeds ") + listing([str(s) for s in seeds])


def minus(text: str) -> str:
    """The write-up's typographic minus before digits: a sign ("-0.37", "(-0.37", "| -0.37"), not a hyphen after a
    letter or a digit ("seed-1", "updates 1,001-2,000", "2026-11-27"), which stays a hyphen."""
    return re.sub(r"(?<!\w)-(?=\d)", "−", text)


def how_many(n: int, *, capital: bool = False) -> str:
    """"none" (of the ...) or the number in words."""
    return number(n, capital=capital) if n else ("None" if capital else "none")


def p_prose(p: float, *, digits: int | None = None) -> str:
    """p as the write-up's prose gives it: 2 digits, 3 below 0.1 (or ``digits``), and sanlab's ``p_text`` where
    rounding would put it on a mark's threshold (0.04995 is not "0.05") or at zero."""
    from sanlab.evaluation.significance import p_text

    if not 0 <= p <= 1:  # (NaN too): a p value outside [0, 1] is a bug upstream, not a number to print
        raise ValueError(f"p = {p} is not a probability")

    text = f"{p:.{digits or (2 if p >= 0.0995 else 3)}f}"
    return p_text(p) if float(text) == 0 or any(p < th <= float(text) for th in (0.01, 0.05)) else text
