"""Learning-curve report: results/curves/*.json (``scripts/recipe_curves.py``) -> docs/recipe_curves.md + a figure.

    python scripts/recipe_report.py            # writes docs/recipe_curves.md and results/curves/recipe_curves.png

Per method, learning rate and step: training loss, books / code perplexity at C and 8C, the paired ratio of the
books PPL at C to the base's (same documents; 95% paired bootstrap interval), passkey at C..8C (Wilson), and the
convergence gate as ``harness.evals.convergence`` applies it to fine-tuned rows (PPL(C) within 10% of the base and
passkey(C) >= 0.9). Numbers come from the curve files only.
"""
from __future__ import annotations

import json
import sys
from pathlib import Path

import numpy as np

ROOT = Path(__file__).resolve().parents[1]

from harness.evals.convergence import MAX_PPL_RATIO, MIN_PASSKEY  # noqa: E402
from harness.stats import ppl_ratio, wilson  # noqa: E402


def _ppl(nll):
    return float(np.exp(np.mean(nll))) if nll else None


def _acc(xs):
    if not xs:
        return None, None
    return sum(xs) / len(xs), wilson(sum(xs), len(xs))


def rows_of(curve: dict, C: int) -> list[dict]:
    base = curve["points"].get("base", {}).get("records", {})
    losses = curve.get("losses") or []
    out = []
    for label, p in curve["points"].items():
        r = p.get("records") or {}
        row = {"point": label}
        step = int(label) if label.isdigit() else None
        if step and losses and len(losses) >= step:
            row["loss"] = float(np.mean(losses[max(0, step - 16):step]))
        for key in ("ppl_books", "ppl_code"):
            for L in (C, 8 * C):
                row[f"{key}@{L}"] = _ppl((r.get(key) or {}).get(str(L)))
        b, t = (base.get("ppl_books") or {}).get(str(C)), (r.get("ppl_books") or {}).get(str(C))
        row["ratio"] = ppl_ratio(t, b) if b and t and label != "base" else None
        for L in (C, 2 * C, 4 * C, 8 * C):
            row[f"passkey@{L}"] = _acc((r.get("passkey") or {}).get(str(L)))
        pk = row[f"passkey@{C}"][0]
        row["converged"] = None if row["ratio"] is None or pk is None else \
            bool(row["ratio"][0] <= MAX_PPL_RATIO and pk >= MIN_PASSKEY)
        out.append(row)
    return out


def _f(v, d=1):
    return "—" if v is None else f"{v:.{d}f}"


def table(curve: dict, C: int) -> list[str]:
    n_pk = len(((curve["points"].get("base") or {}).get("records") or {}).get("passkey", {}).get(str(C), []))
    n_doc = len(((curve["points"].get("base") or {}).get("records") or {}).get("ppl_books", {}).get(str(C), []))
    lines = ["| step | train loss | books PPL C / 8C | PPL(C) / base [95% CI] | code PPL C / 8C | "
             f"passkey C / 2C / 4C / 8C (n={n_pk} each) | gate |", "|---|---|---|---|---|---|---|"]
    for r in rows_of(curve, C):
        ratio = "—" if r["ratio"] is None else f"{r['ratio'][0]:.2f} [{r['ratio'][1]:.2f}, {r['ratio'][2]:.2f}]"
        pk = " / ".join(_f(r[f"passkey@{L}"][0], 2) for L in (C, 2 * C, 4 * C, 8 * C))
        gate = {None: "—", True: "pass", False: "fail"}[r["converged"]]
        books = f"{_f(r[f'ppl_books@{C}'])} / {_f(r[f'ppl_books@{8 * C}'])}"
        lines.append(f"| {r['point']} | {_f(r.get('loss'), 2)} | {books} "
                     f"| {ratio} | {_f(r[f'ppl_code@{C}'])} / {_f(r[f'ppl_code@{8 * C}'])} | {pk} | {gate} |")
    lines.append(f"\nPPL on {n_doc} held-out plays / source files per length (YaRN protocol); `base` = the model "
                 "before the method is applied, `0` = the method applied, not yet fine-tuned.")
    return lines


def figure(curves: dict, C: int, out: Path) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, axes = plt.subplots(1, 3, figsize=(13, 3.8))
    colours = {"pi": "tab:red", "yarn": "tab:blue", "ntk_32k": "tab:green"}
    for _name, c in sorted(curves.items()):
        m, lr = c["method"]["name"], c["train"]["lr"]
        style = "-" if float(lr) >= 1e-3 else "--"
        rows = [r for r in rows_of(c, C) if r["point"].isdigit() and int(r["point"]) > 0]
        x = [int(r["point"]) for r in rows]
        kw = dict(color=colours.get(m, "black"), ls=style, marker="o", ms=3, label=f"{m} lr {lr:g}")
        ratio = [r["ratio"] for r in rows]
        axes[0].plot(x, [q[0] if q else np.nan for q in ratio], **kw)
        axes[0].fill_between(x, [q[1] if q else np.nan for q in ratio], [q[2] if q else np.nan for q in ratio],
                             color=kw["color"], alpha=0.12)
        nan = lambda v: np.nan if v is None else v  # noqa: E731
        axes[1].plot(x, [nan(r[f"ppl_books@{8 * C}"]) for r in rows], **kw)
        axes[2].plot(x, [nan(r[f"passkey@{C}"][0]) for r in rows], **kw)
        axes[2].plot(x, [nan(r[f"passkey@{8 * C}"][0]) for r in rows], color=kw["color"], ls=style, marker="x", ms=4,
                     alpha=0.5)
    base = next(iter(curves.values()))
    b = rows_of(base, C)[0]
    axes[0].axhline(MAX_PPL_RATIO, color="grey", ls=":", label=f"gate {MAX_PPL_RATIO}")
    axes[0].axhline(1.0, color="black", lw=0.8)
    if b[f"ppl_books@{8 * C}"] is not None:
        axes[1].axhline(b[f"ppl_books@{8 * C}"], color="black", lw=0.8, label="base (plain RoPE)")
        axes[1].axhline(b[f"ppl_books@{C}"], color="black", lw=0.8, ls=":", label="base at C")
    axes[2].axhline(MIN_PASSKEY, color="grey", ls=":")
    axes[0].set(title="books PPL at C / base (paired 95% CI)", xscale="log", xlabel="fine-tuning steps")
    axes[1].set(title=f"books PPL at 8C = {8 * C}", xscale="log", xlabel="fine-tuning steps")
    axes[2].set(title="passkey at C (o) and 8C (x)", xscale="log", xlabel="fine-tuning steps", ylim=(-0.05, 1.05))
    steps = sorted({int(k) for c in curves.values() for k in c["points"] if k.isdigit() and int(k) > 0})
    for ax in axes:
        ax.set_xticks(steps, [str(x) for x in steps])
        ax.minorticks_off()
    axes[0].legend(fontsize=7)
    axes[1].legend(fontsize=7)
    fig.tight_layout()
    out.parent.mkdir(parents=True, exist_ok=True)
    fig.savefig(out, dpi=120)
    plt.close(fig)


def main(argv=None) -> None:
    curves = {p.stem: json.loads(p.read_text()) for p in sorted((ROOT / "results" / "curves").glob("*.json"))}
    curves = {k: c for k, c in curves.items() if c.get("finished")}  # runs still going are left out
    if not curves:
        sys.exit("no curve files in results/curves (run scripts/recipe_curves.py)")
    C = int(next(iter(curves.values()))["suite"]["passkey"]["lengths"][0])
    lines = ["# Learning curves of the fine-tuning recipe (generated by `python scripts/recipe_report.py`)", ""]
    for name, c in curves.items():
        t = c["train"]
        lines += [f"## {c['method']['name']}: lr {t['lr']}, {t['schedule']} after {t['warmup_steps']} warm-up steps, "
                  f"batch {t['global_batch']} x {t['seq_len']}, EMA {t['ema_decay'] if t['ema'] else 'off'}",
                  "", f"`results/curves/{name}.json`; {c.get('train_seconds', '—')} s of fine-tuning, "
                  f"{c.get('tokens_per_second', '—')} tok/s, git {str(c.get('git_sha'))[:8]}.", ""]
        lines += table(c, C) + [""]
    (ROOT / "docs" / "recipe_curves.md").write_text("\n".join(lines) + "\n")
    figure(curves, C, ROOT / "results" / "curves" / "recipe_curves.png")
    print("wrote docs/recipe_curves.md and results/curves/recipe_curves.png")


if __name__ == "__main__":
    main()
