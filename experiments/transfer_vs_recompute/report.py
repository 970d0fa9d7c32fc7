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
        if csv_path.parent.name == "deployment":  # its own section (deployment.py)
            continue
        rows = read_csv(csv_path)
        right = sum(r["right"] == "True" for r in rows) / len(rows)
        err = statistics.median(abs(float(r["rel_error"])) for r in rows)
        lines.append(
            f"\n**{rows[0]['model']}** — {len(rows)} points, decision accuracy {right:.2f}, "
            f"median relative error {err:.2f} (`{csv_path.relative_to(HERE)}`)\n"
        )
        lines.append(
            "| link (configured) | fitted Gbit/s | context | recompute s | transfer+resume s | "
            "predicted recompute s | predicted transfer s | decision | oracle |"
        )
        lines.append("|---|---|---|---|---|---|---|---|---|")
        for r in rows:
            lines.append(
                f"| {r['link']} | {float(r['link_gbps_fitted']):.1f} | {r['context']} "
                f"| {float(r['measured_recompute_s']):.3f} "
                f"| {float(r['measured_transfer_s']):.3f} | {float(r['predicted_recompute_s']):.3f} "
                f"| {float(r['predicted_transfer_s']):.3f} | {r['decision']} | {r['oracle']} |"
            )
    return "\n".join(lines)


MODELED_GBPS = (10, 25, 100, 200, 400)


def modeled() -> str:
    """**Modeled**, not measured: transfer = bytes × 8 ÷ link rate + the resume (cache rebuild)
    measured on loopback; recompute = the prefill curve fitted from this run's calibration. The
    break-even rate is the link rate at which the two are equal."""
    lines = [
        "| model | context | KV MB | recompute s (fitted) | "
        + " | ".join(f"transfer s @ {g} Gbit/s" for g in MODELED_GBPS)
        + " | break-even Gbit/s |",
        "|---" * (len(MODELED_GBPS) + 5) + "|",
    ]
    for csv_path in sorted((HERE / "results").glob("*/sweep.csv")):
        if csv_path.parent.name == "deployment":
            continue
        for r in read_csv(csv_path):
            if not r["link"].endswith("-loopback") or not r["link"].startswith("ucx"):
                continue
            nbytes, resume = int(r["nbytes"]), float(r["measured_resume_s"])
            recompute = float(r["predicted_recompute_s"])
            cells = " | ".join(f"{nbytes * 8 / (g * 1e9) + resume:.3f}" for g in MODELED_GBPS)
            even = nbytes * 8 / (recompute - resume) / 1e9 if recompute > resume else float("inf")
            lines.append(
                f"| {r['model']} | {r['context']} | {nbytes / 1e6:.1f} | {recompute:.3f} | {cells} | {even:.2f} |"
            )
    return "\n".join(lines)


if __name__ == "__main__":
    replace_section(HERE / "README.md", "tables", table())
    replace_section(HERE / "README.md", "modeled", modeled())
