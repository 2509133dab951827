"""How strong a production key must be, and why a weak one is refused.

A key is refused when an attacker would guess it early, by either of two
estimates, so the error can say what makes it guessable:

- **zxcvbn** (Dropbox's estimator, the maintained Python port): the number
  of guesses an attacker trying dictionary words, common passwords, keyboard
  patterns, sequences (``0123``, ``abcd``), repeats (``changeme-changeme``),
  dates and leet substitutions would need. At least :data:`MIN_GUESSES_LOG10`
  (10^20, about 66 bits) passes. zxcvbn counts an unrecognised run of
  characters as 10 guesses per character whatever the alphabet, so a random
  key needs about 20 characters; ``openssl rand -hex 32`` (64 characters)
  scores about 10^63.
- **Shannon entropy of the characters** (:func:`key_bits`): length times the
  entropy of the key's character frequencies. zxcvbn misses a long key over a
  tiny alphabet (``0110100110...``); this does not: at least
  :data:`MIN_KEY_BITS`.

Words an attacker knows about this deployment (``vidrec``, the role names)
count as dictionary words: ``vidrec-production-api-key`` is refused. A
refusal names the patterns found, never a piece of the key. Only
the first :data:`CHECKED_CHARS` characters are estimated (zxcvbn's time
grows with length; a key that strong in its first 128 characters is strong).
"""

from __future__ import annotations

import math
from collections import Counter

from zxcvbn import zxcvbn

MIN_LENGTH = 20
"""Shortest production key, in characters (a random one that short scores 10^20)."""
MIN_GUESSES_LOG10 = 20.0
"""Least zxcvbn estimate, as log10 of the guesses needed (20: about 66 bits)."""
MIN_KEY_BITS = 64
"""Least Shannon estimate, in bits (``openssl rand -hex 32`` has about 250)."""
CHECKED_CHARS = 128
"""Characters of a key that zxcvbn looks at."""
DEPLOYMENT_WORDS = (
    "vidrec", "video", "recommend", "production", "prod", "staging", "api", "key", "admin",
    "read", "write", "viewer", "dashboard", "secret", "token", "password",
)
"""Words an attacker would try first against this service, as zxcvbn's ``user_inputs``."""
HOW_TO = "generate one with `openssl rand -hex 32`"
"""What every refusal says a good key looks like."""


def key_bits(key: str) -> float:
    """Estimated entropy of ``key`` in bits: its length times the Shannon entropy of
    its characters' frequencies. Repeats and short alphabets score low (16 spaces: 0;
    ``abab...`` of 16: 16), random keys about ``length x log2(alphabet)``."""
    if not key:
        return 0.0
    counts = Counter(key)
    n = len(key)
    per_char = -sum(c / n * math.log2(c / n) for c in counts.values())
    return per_char * n


_PATTERN_NAMES = {
    "dictionary": "dictionary words", "spatial": "a keyboard pattern", "repeat": "a repeat",
    "sequence": "a sequence", "regex": "a common pattern", "date": "a date",
}


def _patterns(sequence: list[dict[str, object]]) -> str:
    """What zxcvbn recognised, e.g. ``a repeat, dictionary words``: pattern names only,
    never a piece of the key (the message goes to logs)."""
    found = dict.fromkeys(
        _PATTERN_NAMES.get(str(m["pattern"]), str(m["pattern"]))
        for m in sequence
        if m["pattern"] != "bruteforce"
    )
    return ", ".join(found) or "too short for a random key"


def key_weakness(key: str) -> str | None:
    """Why ``key`` is guessable (a sentence naming what gives it away), or None."""
    if len(key) < MIN_LENGTH:
        return f"shorter than {MIN_LENGTH} characters"
    bits = key_bits(key)
    if bits < MIN_KEY_BITS:
        return f"too few distinct characters (about {bits:.0f} bits, at least {MIN_KEY_BITS})"
    estimate = zxcvbn(key[:CHECKED_CHARS], user_inputs=list(DEPLOYMENT_WORDS))
    guesses = float(estimate["guesses_log10"])
    if guesses < MIN_GUESSES_LOG10:
        return (
            f"guessable in about 10^{guesses:.0f} tries (at least 10^{MIN_GUESSES_LOG10:.0f}): "
            f"{_patterns(estimate['sequence'])}"
        )
    return None
