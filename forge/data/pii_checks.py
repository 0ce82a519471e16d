"""Checksums and validity rules that separate real card numbers, IBANs and SSNs from look-alikes,
and the folding of disguised text (full-width forms, zero-width characters) before a scan."""
from __future__ import annotations

import re


def luhn_ok(digits: str) -> bool:
    """Luhn (mod 10) check used by every payment-card network."""
    total = 0
    for i, ch in enumerate(reversed(digits)):
        d = ord(ch) - 48
        if i % 2:
            d = d * 2 - 9 if d > 4 else d * 2
        total += d
    return total % 10 == 0


# Issuer prefixes (ISO/IEC 7812 IIN ranges of the major networks) and allowed lengths.
_CARD_RE = re.compile(
    r"4\d{12}(?:\d{3}){0,2}"                                    # Visa 13/16/19
    r"|(?:5[1-5]\d{2}|222[1-9]|22[3-9]\d|2[3-6]\d{2}|27[01]\d|2720)\d{12}"  # Mastercard
    r"|3[47]\d{13}"                                              # Amex
    r"|3(?:0[0-5]|[689]\d)\d{11,16}"                             # Diners
    r"|(?:6011|65\d{2}|64[4-9]\d)\d{12,15}"                      # Discover
    r"|35(?:2[89]|[3-8]\d)\d{12,15}"                             # JCB
    r"|62\d{14,17}"                                              # UnionPay
    r"|(?:5[06-9]|6\d)\d{10,17}"                                 # Maestro
)


def card_ok(digits: str) -> bool:
    return 13 <= len(digits) <= 19 and _CARD_RE.fullmatch(digits) is not None and luhn_ok(digits)


# IBAN length per country (SWIFT IBAN registry).
IBAN_LENGTHS = {
    "AD": 24, "AE": 23, "AL": 28, "AT": 20, "AZ": 28, "BA": 20, "BE": 16, "BG": 22, "BH": 22,
    "BR": 29, "BY": 28, "CH": 21, "CR": 22, "CY": 28, "CZ": 24, "DE": 22, "DK": 18, "DO": 28,
    "EE": 20, "EG": 29, "ES": 24, "FI": 18, "FO": 18, "FR": 27, "GB": 22, "GE": 22, "GI": 23,
    "GL": 18, "GR": 27, "GT": 28, "HR": 21, "HU": 28, "IE": 22, "IL": 23, "IQ": 23, "IS": 26,
    "IT": 27, "JO": 30, "KW": 30, "KZ": 20, "LB": 28, "LC": 32, "LI": 21, "LT": 20, "LU": 20,
    "LV": 21, "MC": 27, "MD": 24, "ME": 22, "MK": 19, "MR": 27, "MT": 31, "MU": 30, "NL": 18,
    "NO": 15, "PK": 24, "PL": 28, "PS": 29, "PT": 25, "QA": 29, "RO": 24, "RS": 22, "SA": 24,
    "SC": 31, "SE": 24, "SI": 19, "SK": 24, "SM": 27, "ST": 25, "SV": 28, "TL": 23, "TN": 24,
    "TR": 26, "UA": 29, "VA": 22, "VG": 24, "XK": 20,
}


def iban_ok(iban: str) -> bool:
    """Country length plus the ISO 13616 mod-97 check (rearranged number mod 97 == 1)."""
    if IBAN_LENGTHS.get(iban[:2]) != len(iban) or not iban[2:4].isdigit():
        return False
    moved = iban[4:] + iban[:4]
    return int("".join(str(int(c, 36)) for c in moved)) % 97 == 1


def ssn_ok(area: str, group: str, serial: str) -> bool:
    """SSA rules: no 000, 666 or 9xx area; no 00 group; no 0000 serial."""
    return area not in ("000", "666") and area[0] != "9" and group != "00" and serial != "0000"


# Zero-width and soft-hyphen characters vanish in display, so they can split an email or a number.
_INVISIBLE = "\u200b\u200c\u200d\u2060\ufeff\u00ad"
_FOLD = {**{ord(c): None for c in _INVISIBLE}, **{c: c - 0xFEE0 for c in range(0xFF01, 0xFF5F)}, 0x3000: 0x20}
_NEEDS_FOLD = re.compile(f"[{_INVISIBLE}\uff01-\uff5e\u3000]")


def fold(text: str) -> tuple[str, list[int] | None]:
    """(text with full-width ASCII forms made ASCII and invisible characters dropped, the original
    index of each kept character or None when no character was dropped)."""
    if text.isascii() or not _NEEDS_FOLD.search(text):
        return text, None
    folded = text.translate(_FOLD)
    if len(folded) == len(text):
        return folded, None
    return folded, [i for i, c in enumerate(text) if c not in _INVISIBLE]

