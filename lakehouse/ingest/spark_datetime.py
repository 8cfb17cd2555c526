"""Which texts Spark 3.5's JSON and CSV readers accept as a timestamp, a timestamp_ntz or a date.

The probe must quarantine exactly the files Spark cannot read (a file it passes and Spark then refuses
fails its whole batch; a file it refuses and Spark reads is set aside for nothing). Python's
`datetime.fromisoformat` is not Spark's grammar: Spark reads "2024-1-1" and refuses "20240101", and a
timestamp_ntz column refuses any zone ("...Z") and JSON numbers. With no `timestampFormat` or
`dateFormat` option (the platform sets none) Spark parses with the lenient grammar of
`SparkDateTimeUtils.parseTimestampString` / `stringToDate`; this module follows that code step by step
so that tests/test_bad_input_cases.py can hold the two to the same verdicts, spelling by spelling.
"""

from __future__ import annotations

import calendar
import functools
import re
import zoneinfo

_LONG = 2**63
_MICROS_PER_DAY = 86_400_000_000

# java.time.ZoneId.SHORT_IDS, which Spark passes to ZoneId.of
_SHORT_IDS = frozenset("ACT AET AGT ART AST BET BST CAT CNT CST CTT EAT ECT EST HST IET IST JST MIT MST NET NST "
                       "PLT PNT PRT PST SST VST".split())
_OFFSET = re.compile(r"[+-](\d{1,2}|\d{2}:?\d{2}|\d{2}:\d{2}:\d{2}|\d{6})")


def _blank(byte: int) -> bool:
    """UTF8String.isWhitespaceOrISOControl on one byte: Spark trims these from both ends."""
    return byte <= 0x20 or byte == 0x7F


def _trimmed(b: bytes) -> tuple[int, int]:
    start, end = 0, len(b) - 1
    while start < len(b) and _blank(b[start]):
        start += 1
    while end > start and _blank(b[end]):
        end -= 1
    return start, end + 1


def _ts_digits_ok(segment: int, digits: int) -> bool:
    return (segment == 6 or (segment == 0 and 4 <= digits <= 6) or (segment == 7 and digits <= 2)
            or (segment not in (0, 6, 7) and 0 < digits <= 2))


def _timestamp_segments(text: str) -> tuple[list[int], str | None, bool] | None:
    """parseTimestampString: [year, month, day, hour, minute, second, micros, ...], the zone text and
    whether the text is a time without a date; None where Spark returns empty segments."""
    b = text.encode("utf-8")
    j, end = _trimmed(b)
    if j == end:
        return None
    seg = [1, 1, 1, 0, 0, 0, 0, 0, 0]
    i = value = digits = milli_digits = 0
    just_time, sign, zone = False, None, None
    if b[j] in b"+-":
        sign = -1 if b[j] == 0x2D else 1
        j += 1

    def close(segment: int) -> bool:
        nonlocal value, digits
        if not _ts_digits_ok(segment, digits):
            return False
        seg[segment] = value
        value = digits = 0
        return True

    while j < end:
        c = b[j]
        if 0x30 <= c <= 0x39:
            if i == 6:
                milli_digits += 1
            if i != 6 or digits < 6:  # digits past microseconds are dropped
                value = value * 10 + c - 0x30
            digits += 1
        elif j == 0 and c == 0x54:  # "T" first: a time only
            just_time = True
            i += 3
        elif i < 2:
            if c == 0x2D:  # "-"
                if not close(i):
                    return None
                i += 1
            elif i == 0 and c == 0x3A and sign is None:  # "hh:" first: a time only
                just_time = True
                if not close(3):
                    return None
                i = 4
            else:
                return None
        elif i == 2:
            if c not in (0x20, 0x54) or not close(i):  # " " or "T" ends the date
                return None
            i += 1
        elif i in (3, 4):
            if c != 0x3A or not close(i):
                return None
            i += 1
        elif i in (5, 6):
            if c == 0x2E and i == 5:  # "." before the fraction
                if not close(i):
                    return None
                i += 1
            else:  # anything else starts the zone, which runs to the end
                if not close(i):
                    return None
                i += 1
                zone = b[j:end].decode("utf-8", "replace")
                j = end - 1
            if i == 6 and c != 0x2E:
                i += 1
        elif i < len(seg) and c in (0x3A, 0x20):
            if not close(i):
                return None
            i += 1
        else:
            return None
        j += 1
    if not _ts_digits_ok(i, digits):
        return None
    seg[i] = value
    seg[6] *= 10 ** (6 - milli_digits) if milli_digits < 6 else 1
    seg[0] *= sign or 1
    return seg, (zone.strip() if zone is not None else None), just_time


@functools.lru_cache(maxsize=1)
def _regions() -> frozenset[str]:
    return frozenset(zoneinfo.available_timezones())


def zone_ok(name: str) -> bool:
    """java.time.ZoneId.of(name, SHORT_IDS) after Spark's two rewrites of pre-3.0 offsets (getZoneId)."""
    name = re.sub(r"([+-])(\d):", r"\g<1>0\2:", name, count=1)
    name = re.sub(r"([+-])(\d\d):(\d)$", r"\1\2:0\3", name, count=1)
    if name == "Z" or name in _SHORT_IDS or name in ("UTC", "GMT", "UT"):
        return True
    for prefix in ("UTC", "GMT", "UT", ""):
        rest = name[len(prefix):]
        if name.startswith(prefix) and rest[:1] in ("+", "-"):
            return _offset_ok(rest)
    return name in _regions()


def _offset_ok(text: str) -> bool:
    """ZoneOffset.of: ±h, ±hh, ±hh:mm, ±hhmm, ±hh:mm:ss, ±hhmmss, at most ±18:00."""
    if _OFFSET.fullmatch(text) is None:
        return False
    digits = text[1:].replace(":", "")
    h, m, s = int(digits[:2] if len(digits) > 1 else digits), int(digits[2:4] or 0), int(digits[4:6] or 0)
    return h <= 18 and m <= 59 and s <= 59 and h * 3600 + m * 60 + s <= 18 * 3600


def _days_from_civil(y: int, m: int, d: int) -> int:
    """Days since 1970-01-01 in the proleptic Gregorian calendar (java.time's), for any year."""
    y -= m <= 2
    era = y // 400
    yoe = y - era * 400
    doy = (153 * (m + (-3 if m > 2 else 9)) + 2) // 5 + d - 1
    return era * 146097 + yoe * 365 + yoe // 4 - yoe // 100 + doy - 719468


def _date_ok(y: int, m: int, d: int) -> bool:
    """LocalDate.of: a real day of a year within ±999,999,999."""
    return abs(y) <= 999_999_999 and 1 <= m <= 12 and 1 <= d <= calendar.monthrange(2000 if calendar.isleap(y)
                                                                                      else 2001, m)[1]


def _datetime_ok(seg: list[int]) -> bool:
    """LocalDate.of, LocalTime.of, and the micros since the epoch fit a Long."""
    y, mo, d, h, mi, s, us = seg[:7]
    if not (_date_ok(y, mo, d) and h <= 23 and mi <= 59 and s <= 59):
        return False
    micros = _days_from_civil(y, mo, d) * _MICROS_PER_DAY + ((h * 60 + mi) * 60 + s) * 1_000_000 + us
    return -_LONG <= micros < _LONG


def readable_as_timestamp(text: str) -> bool:
    """TimestampType: the default formatter (stringToTimestamp), then Spark's legacy fallback, which
    parses the text again with every "GMT" removed (cleanLegacyTimestampStr)."""
    return any(_timestamp_ok(t) for t in dict.fromkeys((text, text.replace("GMT", ""))))


def _timestamp_ok(text: str) -> bool:
    parsed = _timestamp_segments(text)
    if parsed is None:
        return False
    seg, zone, just_time = parsed
    if zone is not None and not zone_ok(zone):
        return False
    if just_time:  # today's date in the session zone
        return seg[3] <= 23 and seg[4] <= 59 and seg[5] <= 59
    return _datetime_ok(seg)


def readable_as_timestamp_ntz(text: str) -> bool:
    """TimestampNTZType: stringToTimestampWithoutTimeZone(allowTimeZone = false), no fallback — a zone,
    valid or not, or a time without a date is refused."""
    parsed = _timestamp_segments(text)
    if parsed is None:
        return False
    seg, zone, just_time = parsed
    return zone is None and not just_time and _datetime_ok(seg)


def readable_as_date(text: str) -> bool:
    """DateType: stringToDate, then again with every "GMT" removed (the legacy fallback)."""
    return any(_date_text_ok(t) for t in dict.fromkeys((text, text.replace("GMT", ""))))


def readable_as_json_date(text: str) -> bool:
    """DateType in a JSON string: what `readable_as_date` takes, or else (Spark 1.5 stored dates so) an
    Int, taken as days since the epoch — "20240101" loads as the year 57385. CSV has no such fallback."""
    return readable_as_date(text) or (_JAVA_INT.fullmatch(text) is not None and -(2**31) <= int(text) < 2**31)


_JAVA_INT = re.compile(r"[+-]?[0-9]+")  # Integer.parseInt, ASCII digits


def _date_text_ok(text: str) -> bool:
    """stringToDate: `[+-]yyyy*`, `[+-]yyyy*-[m]m`, `[+-]yyyy*-[m]m-[d]d`, then anything after " " or "T"."""
    b = text.encode("utf-8")
    j, end = _trimmed(b)
    if j == end:
        return False
    seg = [1, 1, 1]
    sign = 1
    if b[j] in b"+-":
        sign = -1 if b[j] == 0x2D else 1
        j += 1
    i = value = digits = 0

    def digits_ok(segment: int) -> bool:
        return 4 <= digits <= 7 if segment == 0 else 0 < digits <= 2

    while j < end and i < 3 and b[j] not in (0x20, 0x54):
        c = b[j]
        if i < 2 and c == 0x2D:
            if not digits_ok(i):
                return False
            seg[i] = value
            value = digits = 0
            i += 1
        elif 0x30 <= c <= 0x39:
            value = value * 10 + c - 0x30
            digits += 1
        else:
            return False
        j += 1
    if not digits_ok(i) or (i < 2 and j < end):
        return False
    seg[i] = value
    return _date_ok(sign * seg[0], seg[1], seg[2])
