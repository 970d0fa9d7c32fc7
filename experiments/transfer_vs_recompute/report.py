"""Regenerate this study's README table from the sweep CSVs.

``python -m experiments.transfer_vs_recompute.report``
"""

from __future__ import annotations

import statistics
from pathlib import Path

from experiments.common import read_csv, replace_section

HERE = Path(__file__).parent


def table() -> str:
    lines = []
    for csv_path in sorted((HERE / "results").glob("*/sweep.csv")):
        rows = read_csv(csv_path)
        right = sum(r["right"] == "True" for r in rows) / len(rows)
        err = statistics.median(abs(float(r["rel_error"])) for r in rows)
        lines.append(f"\n**{rows[0]['model']}** — {len(rows)} points, decision accuracy {right:.2f}, "
                     f"median relative error {err:.2f} (`{csv_path.relative_to(HERE)}`)\n")  # fmt: skip
        lines.append("| link (configured) | fitted Gbit/s | context | recompute s | transfer+resume s | "
                     "predicted recompute s | predicted transfer s | decision | oracle |")  # fmt: skip
        lines.append("|---|---|---|---|---|---|---|---|---|")
        for r in rows:
            lines.append(
                f"| {r['link']} | {float(r['link_gbps_fitted']):.1f} | {r['context']} "
                f"| {float(r['measured_recompute_s']):.3f} "
                f"| {float(r['measured_transfer_s']):.3f} | {float(r['predicted_recompute_s']):.3f} "
                f"| {float(r['predicted_transfer_s']):.3f} | {r['decision']} | {r['oracle']} |"
            )
    return "\n".join(lines)


if __name__ == "__main__":
    replace_section(HERE / "README.md", "tables", table())
