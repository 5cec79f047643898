"""Figures: PNG at 200 dpi with a PDF and an SVG beside it, titles, labelled ε
axes (δ, unit, analysis), log axes where values span decades, no empty panels,
seed bands."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest
from PIL import Image

import dpfl.plotting as plotting
from dpfl.plotting import plot_epsilon_curves, plot_runs, plot_sweep

TERMS = {
    "private": True,
    "delta": 1e-3,
    "unit": "client",
    "neighbouring": "replace-one client's data",
    "adversary": "sees every released global model",
    "analysis": "sound",
    "status": "proven",
    "epsilon": 8.0,
}


def _run(root: Path, name: str, eps: list[float] | None, terms: dict | None) -> Path:
    d = root / name
    d.mkdir(parents=True)
    rows = []
    for i, e in enumerate(eps or [None, None, None], start=1):
        row: dict[str, Any] = {"round": 5 * i, "test_accuracy": 0.2 * i}
        row["epsilon"] = e
        if e is None:
            row["private"] = False
        rows.append(json.dumps(row))
    (d / "metrics.jsonl").write_text("\n".join(rows) + "\n")
    if terms is not None:
        (d / "guarantee.json").write_text(json.dumps(terms))
    return d


@pytest.fixture
def figures(monkeypatch: pytest.MonkeyPatch) -> list[Any]:
    """Capture each figure (its axes) before it is saved and closed."""
    seen: list[Any] = []
    save = plotting.save_figure

    def spy(fig: Any, out: Any) -> list[Path]:
        seen.append(
            {
                "suptitle": fig._suptitle.get_text() if fig._suptitle else "",
                "axes": [
                    {
                        "xlabel": ax.get_xlabel(),
                        "ylabel": ax.get_ylabel(),
                        "xscale": ax.get_xscale(),
                        "yscale": ax.get_yscale(),
                        "title": ax.get_title(),
                        "lines": [ln.get_linestyle() for ln in ax.get_lines()],
                        "bands": len(ax.collections),
                    }
                    for ax in fig.axes
                ],
            }
        )
        return save(fig, out)

    monkeypatch.setattr(plotting, "save_figure", spy)
    return seen


def test_png_at_200_dpi_with_pdf_and_svg(tmp_path: Path) -> None:
    run = _run(tmp_path, "a", [0.5, 2.0, 8.0], TERMS)
    out = plot_runs([run], tmp_path / "fig.png")
    assert out == tmp_path / "fig.png"
    dpi = Image.open(out).info["dpi"]
    assert dpi == pytest.approx((200, 200), abs=0.1)
    assert (tmp_path / "fig.pdf").read_bytes()[:4] == b"%PDF"
    assert b"<svg" in (tmp_path / "fig.svg").read_bytes()[:2000]
    # another format is written as asked, alone
    plot_runs([run], tmp_path / "only.pdf")
    assert (tmp_path / "only.pdf").exists() and not (tmp_path / "only.png").exists()


def test_run_figure_title_terms_and_log_epsilon(tmp_path: Path, figures: list) -> None:
    run = _run(tmp_path, "dp-fedavg", [0.5, 2.0, 8.0], TERMS)
    plot_runs([run], tmp_path / "fig.png")
    (fig,) = figures
    assert fig["suptitle"] == "dp-fedavg: client-level, δ = 0.001, sound analysis"
    rounds, eps = fig["axes"]
    assert rounds["xlabel"] == "round" and "test accuracy" in rounds["ylabel"]
    assert "δ = 0.001" in eps["xlabel"] and "sound analysis" in eps["xlabel"]
    assert "client" in eps["xlabel"]
    assert eps["xscale"] == "log"  # 0.5 .. 8 spans more than a decade


def test_non_private_run_has_no_empty_epsilon_panel(tmp_path: Path, figures: list):
    run = _run(tmp_path, "fedavg", None, None)
    plot_runs([run], tmp_path / "fig.png")
    (fig,) = figures
    assert len(fig["axes"]) == 1
    assert "not private" in fig["suptitle"]


@pytest.mark.slow  # default run under 4 minutes; .ci/run runs it (-m slow)
def test_epsilon_curves_log_axes_and_dashed_invalid(tmp_path: Path, figures: list):
    deltas = [1e-8, 1e-6, 1e-4]
    plot_epsilon_curves(
        tmp_path / "c.png",
        deltas=deltas,
        epsilon_by_delta={"sound": [0.5, 0.4, 0.3], "ols (invalid)": [90, 70, 50]},
        rounds=[1, 10, 100],
        epsilon_by_rounds={"sound": [0.1, 0.3, 0.5], "ols (invalid)": [5, 20, 70]},
        delta_title="after 100 rounds",
        rounds_title="at δ = 1e-06",
        epsilon_label="ε (record-level, upper bound)",
        dashed=["ols (invalid)"],
    )
    (fig,) = figures
    by_delta, by_rounds = fig["axes"]
    assert by_delta["xscale"] == "log" and by_delta["yscale"] == "log"
    assert by_rounds["xscale"] == "log" and by_rounds["yscale"] == "log"
    assert by_delta["title"] == "after 100 rounds"
    assert by_rounds["title"] == "at δ = 1e-06"
    assert by_delta["ylabel"] == "ε (record-level, upper bound)"
    assert by_delta["lines"] == ["-", "--"]
    assert (tmp_path / "c.svg").exists()
    # values within one decade stay on a linear axis
    plot_epsilon_curves(
        tmp_path / "d.png", deltas=deltas, epsilon_by_delta={"a": [3, 2, 1.5]}
    )
    assert figures[-1]["axes"][0]["yscale"] == "linear"


def test_sweep_figure_bands_and_errorbars(tmp_path: Path, figures: list) -> None:
    paths = plot_sweep(
        tmp_path / "s.png",
        curves={
            "epsilon=1": ([5, 10], [0.3, 0.5], [0.02, 0.03], 3),
            "epsilon=100": ([5, 10], [0.6, 0.8], [0.01, 0.01], 3),
        },
        finals={"": ([1.0, 100.0], [0.5, 0.8], [0.03, 0.01])},
        x_label="privacy budget ε (δ = 1e-05, client-level, sound analysis)",
        title="sweep",
    )
    assert [p.suffix for p in paths] == [".png", ".pdf", ".svg"]
    (fig,) = figures
    curves, finals = fig["axes"]
    assert curves["bands"] == 2  # one ±sd band per grid point
    assert finals["xscale"] == "log"  # 1 .. 100
    assert "δ = 1e-05" in finals["xlabel"]
    # one seed: a line without a band; one grid point: no second panel
    plot_sweep(
        tmp_path / "one.png",
        curves={"all": ([5, 10], [0.3, 0.5], [0.0, 0.0], 1)},
        finals={},
        x_label="grid point",
    )
    assert len(figures[-1]["axes"]) == 1 and figures[-1]["axes"][0]["bands"] == 0


@pytest.mark.slow  # default run under 4 minutes; .ci/run runs it (-m slow)
def test_personalised_accuracy_is_labelled(tmp_path: Path, figures: list) -> None:
    run = _run(tmp_path, "pfs", [0.5, 2.0, 8.0], TERMS)
    (run / "config.yaml").write_text("algorithm:\n  name: prifedsync\n")
    plot_runs([run], tmp_path / "fig.png")
    assert figures[-1]["axes"][0]["ylabel"].startswith("personalised test accuracy")
    other = _run(tmp_path, "avg", [0.5, 2.0, 8.0], TERMS)
    (other / "config.yaml").write_text("algorithm:\n  name: dp-fedavg\n")
    plot_runs([other], tmp_path / "fig2.png")
    assert figures[-1]["axes"][0]["ylabel"].startswith("test accuracy")


def test_an_image_path_without_a_suffix_writes_png_pdf_and_svg(tmp_path):
    # `dpfl plot --out NAME` promises a .png with a .pdf and an .svg beside it;
    # a name without a suffix is that PNG (it once wrote NAME.png alone and
    # reported NAME).
    import matplotlib.pyplot as plt

    from dpfl.errors import InvalidParameterError
    from dpfl.plotting import save_figure

    paths = save_figure(plt.figure(), tmp_path / "curves")
    assert [p.name for p in paths] == ["curves.png", "curves.pdf", "curves.svg"]
    assert all(p.is_file() and p.stat().st_size > 0 for p in paths)
    with pytest.raises(InvalidParameterError, match=r"suffix must be one of .*\.png"):
        save_figure(plt.figure(), tmp_path / "curves.bogus")
    assert not (tmp_path / "curves.bogus").exists()
