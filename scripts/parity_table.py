"""Write docs/parity.md from the rows the parity tests recorded (tests/_helpers/parity_record.py), one row per family.

Run by scripts/parity.sh. Every registered reward appears: families with a recorded check show the largest
difference over their checks; the others show why they are not compared (no published weights, a rule
with no original code to run, or a check not written yet).
"""

from __future__ import annotations

import argparse
import json
import sys
from collections import defaultdict
from pathlib import Path

# families without a parity row, and why; anything registered and in neither place is listed as "not checked"
NOT_COMPARED = {
    "mock": "a test double, no original",
    "jpeg-compressibility": "DDPO's rule (JPEG size); tested against PIL's encoder directly, no weights",
    "jpeg-incompressibility": "DDPO's rule (JPEG size); tested against PIL's encoder directly, no weights",
    "motion": "our own rule, no original",
    "temporal-consistency": "our own rule, no original",
    "video-frames": "a wrapper: parity is that of the wrapped image reward",
    "shapes-eval": "ShapesWorld's exact checker: ours is the original",
    "shapes-video-eval": "ShapesWorld's exact checker: ours is the original",
    "shapes-edit-eval": "ShapesWorld's exact checker: ours is the original",
    "shapes-vqa": "ShapesWorld's exact answer checker: ours is the original",
    "shapesworld-aesthetic": "ShapesWorld's own model: ours is the original",
    "shapesworld-pref": "ShapesWorld's own model: ours is the original",
    "preference-head": "a head you train with mmreward.train: ours is the original",
}


def _fmt(x: float) -> str:
    return "0" if x == 0 else f"{x:.2g}"


def build(rows: list[dict], registered: list[str]) -> str:
    by_family: dict[str, list[dict]] = defaultdict(list)
    for r in rows:
        by_family[r["family"]].append(r)
    lines = [
        "# Parity with the originals",
        "",
        "Written by `bash scripts/parity.sh` (runs `pytest -m parity`, every test of which compares a reward with",
        "an independent reference that follows the original's code path: its package run on the same tiny random",
        "checkpoint, or its source transcribed with repo@commit in the test's docstring). Max abs / relative",
        "difference over all of a family's checks; relative = max |ours - original| / max |original|.",
        "",
        "| family | original | how checked | max abs diff | max rel diff | inputs | not checked, and why |",
        "|---|---|---|---|---|---|---|",
    ]
    header = lines[-2:]
    is_reward = {f: f.split(" ")[0] in registered or f.startswith(("geneval", "ocr")) for f in by_family}
    ordered = sorted(f for f in by_family if is_reward[f]) + sorted(f for f in by_family if not is_reward[f])
    for i, fam in enumerate(ordered):
        if not is_reward[fam] and (i == 0 or is_reward[ordered[i - 1]]):
            lines += ["", "## Generator adapters and media (against the diffusers pipelines and decoders they "
                      "replace)", "", *header]
        rs = by_family[fam]
        originals = "; ".join(dict.fromkeys(r["original"] for r in rs))
        how = ", ".join(dict.fromkeys(r["how"] for r in rs))
        cases = ", ".join(dict.fromkeys(c for r in rs for c in r.get("cases", [])))
        missing = "; ".join(dict.fromkeys(r["not_checked"] for r in rs if r.get("not_checked")))
        lines.append(f"| {fam} | {originals} | {how} ({len(rs)} checks) | {_fmt(max(r['max_abs'] for r in rs))} | "
                     f"{_fmt(max(r['max_rel'] for r in rs))} | {cases} | {missing or '-'} |")
    covered = {f.split(" ")[0] for f in by_family}
    lines += ["", "## Registered rewards without a parity row", "", "| reward | why |", "|---|---|"]
    for name in registered:
        if name in covered:
            continue
        lines.append(f"| {name} | {NOT_COMPARED.get(name, 'published weights, but no parity test yet')} |")
    return "\n".join(lines) + "\n"


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__)
    p.add_argument("log", help="the JSON-lines file the parity tests wrote (MMREWARD_PARITY_LOG)")
    p.add_argument("--out", default="docs/parity.md")
    args = p.parse_args(argv)
    rows = [json.loads(line) for line in Path(args.log).read_text().splitlines() if line.strip()]
    if not rows:
        print(f"parity_table: {args.log} holds no rows; did the parity tests run?", file=sys.stderr)
        return 2
    import mmreward

    Path(args.out).write_text(build(rows, mmreward.list_rewards()))
    print(f"wrote {args.out}: {len({r['family'] for r in rows})} families, {len(rows)} checks")
    return 0


if __name__ == "__main__":
    sys.exit(main())
