"""When two option keys are the same option: compared as a reader sees them, not as their code points differ.

Keys that differ only by Unicode normalization (`café` written as one code point or as `e` + a combining accent),
by width or compatibility forms (`ｆｕｌｌ` and `full`), by case, or by letters of another script that look the same
(Latin `a` and Cyrillic `а`, Latin `H` and Greek `Η`) would be two options to the model and one to a person reading
the answers. Such keys are compared here after NFKC normalization, case folding, and mapping look-alike letters of
Cyrillic and Greek to the Latin letter they are confusable with (Unicode TR39's confusables for the single letters
of those two scripts that have a Latin prototype), so a question that names one option twice is refused.

Invisible characters have no place in a key: a zero-width space or joiner, a bidi control (which can make a key
display as another), a soft hyphen, a BOM (Unicode category Cf, "format"), and control characters (Cc) are refused
naming the character, never silently stripped.
"""

from __future__ import annotations

import unicodedata

# TR39 confusables.txt, the Cyrillic and Greek letters whose prototype is one Latin letter (upper and lower case:
# keys are mapped before they are case-folded, so that Greek capital Eta, which folds to eta, still meets `H`).
LOOKALIKES = str.maketrans({
    # Cyrillic lower case
    "а": "a", "е": "e", "ё": "ë", "һ": "h", "і": "i", "ї": "ï", "ј": "j", "о": "o", "р": "p", "с": "c", "у": "y",
    "х": "x", "ѕ": "s", "ԁ": "d", "ԛ": "q", "ԝ": "w", "ӏ": "l",
    # Cyrillic upper case
    "А": "A", "В": "B", "Е": "E", "Ё": "Ë", "Һ": "H", "І": "I", "Ї": "Ï", "Ј": "J", "К": "K", "М": "M", "Н": "H",
    "О": "O", "Р": "P", "С": "C", "Т": "T", "Х": "X", "Ѕ": "S", "Ԁ": "D", "Ԛ": "Q", "Ԝ": "W", "Ӏ": "l", "Ү": "Y",
    # Greek lower case
    "α": "a", "γ": "y", "ι": "i", "ν": "v", "ο": "o", "ρ": "p", "υ": "u",
    # Greek upper case
    "Α": "A", "Β": "B", "Ε": "E", "Ζ": "Z", "Η": "H", "Ι": "I", "Κ": "K", "Μ": "M", "Ν": "N", "Ο": "O", "Ρ": "P",
    "Τ": "T", "Υ": "Y", "Χ": "X",
    # Latin letters that look like another Latin letter
    "ɡ": "g", "ı": "i",
})


def invisible_character(text: str) -> str | None:
    """The first invisible character of `text` (format or control), described as `U+200B (ZERO WIDTH SPACE)`;
    None when it has none."""
    for char in text:
        if unicodedata.category(char) in ("Cf", "Cc"):
            name = unicodedata.name(char, "a control character")
            return f"U+{ord(char):04X} ({name})"
    return None


def comparable(key: str) -> str:
    """The form two keys are compared in: NFKC, look-alike Cyrillic / Greek letters as Latin, case folded, with
    the spaces around it dropped."""
    return unicodedata.normalize("NFKC", key).translate(LOOKALIKES).casefold().strip()
