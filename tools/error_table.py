"""Print, from reports/conformance.json, the measured max abs error of every allclose output.

    python3 tools/error_table.py [reports/conformance.json]

One Markdown row per (case, output): the contract's atol, the max abs error observed and
where, so docs can quote what a kernel actually achieved against each tolerance.
"""

from __future__ import annotations

import json
import sys


def main() -> None:
    path = sys.argv[1] if len(sys.argv) > 1 else "reports/conformance.json"
    data = json.load(open(path))
    print("| case | status | output | contract | max abs error | at index |")
    print("| --- | --- | --- | --- | --- | --- |")
    for c in data["cases"]:
        for o in c["outputs"]:
            if not o["contract"].startswith("allclose"):
                continue
            err = "" if o["max_abs"] is None else f"{o['max_abs']:.3g}"
            print(f"| {c['id']} | {c['status']} | {o['name']} | {o['contract']} | {err} | {o['max_abs_index']} |")


if __name__ == "__main__":
    main()
