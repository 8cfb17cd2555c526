"""Deterministic demo landing data: seed 002's `user_events`, as JSON lines over several files."""

from __future__ import annotations

import json
import random
from datetime import UTC, datetime, timedelta
from pathlib import Path

EVENT_TYPES = ("view", "click", "purchase", "signup")
COUNTRIES = ("US", "DE", "FR", "IN", "BR", None)
DEVICES = ("ios", "android", "web")
START = datetime(2026, 11, 1, tzinfo=UTC)


def generate_user_events(out_dir: Path, rows: int = 200_000, files: int = 8, seed: int = 42,
                         duplicate_every: int = 97, missing_id_every: int = 1009) -> dict:
    """Write `files` JSONL files; some records are duplicates or lack an id, as real feeds do.

    Returns a summary the tests use as the independent expectation.
    """
    rng = random.Random(seed)
    out_dir.mkdir(parents=True, exist_ok=True)
    per_file = -(-rows // files)
    written = 0
    last: dict | None = None
    for i in range(files):
        path = out_dir / f"user_events_{i:04d}.jsonl"
        with path.open("w", encoding="utf-8") as fh:
            for _ in range(min(per_file, rows - written)):
                n = written
                if last is not None and n % duplicate_every == 0:
                    rec = dict(last)  # an at-least-once delivery duplicate
                else:
                    ts = START + timedelta(seconds=rng.randrange(0, 14 * 86400))
                    rec = {
                        "event_id": None if n % missing_id_every == 0 else f"e{n:09d}",
                        "user_id": rng.randrange(1, 5000),
                        "event_type": rng.choice(EVENT_TYPES).upper() if n % 13 == 0 else rng.choice(EVENT_TYPES),
                        "event_ts": ts.strftime("%Y-%m-%d %H:%M:%S"),
                        "country": rng.choice(COUNTRIES),
                        "context": {"device": rng.choice(DEVICES), "app_version": f"1.{rng.randrange(0, 9)}"},
                    }
                fh.write(json.dumps(rec, separators=(",", ":")) + "\n")
                last = rec
                written += 1
        if written >= rows:
            break
    return {"rows": written, "files": min(files, -(-written // per_file)), "dir": str(out_dir)}


def expected_daily(out_dir: Path) -> dict[str, tuple[int, int]]:
    """Independent gold computation in plain Python: date -> (total events, unique users)."""
    latest: dict[str, dict] = {}
    for path in sorted(out_dir.glob("*.jsonl")):
        for line in path.read_text(encoding="utf-8").splitlines():
            rec = json.loads(line)
            if rec["event_id"] is not None:
                latest[rec["event_id"]] = rec
    days: dict[str, list] = {}
    for rec in latest.values():
        d = rec["event_ts"][:10]
        days.setdefault(d, []).append(rec["user_id"])
    return {d: (len(u), len(set(u))) for d, u in days.items()}
