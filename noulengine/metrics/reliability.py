"""Reliability diagram (Guo et al. 2017, fig. 1 style): accuracy per confidence bin vs the diagonal.

matplotlib is an optional dependency (``noulengine[plots]``); it is imported only when a diagram
is drawn, and only its Agg canvas is used, so no global backend is switched and no display is
needed.
"""

from __future__ import annotations

from pathlib import Path

from noulengine.metrics.calibration import N_BINS, calibration_bins, expected_calibration_error


def require_matplotlib() -> None:
    """Fail early (before a model loads or any inference runs) when diagrams cannot be drawn.

    Raises:
        ImportError: matplotlib is not installed; the message names the extra to install.
    """
    import importlib.util

    if importlib.util.find_spec("matplotlib") is None:
        raise ImportError("reliability diagrams need matplotlib, which is not installed: "
                          "pip install 'noulengine[plots]' (or run scripts/setup.sh)")


def plot_reliability(confidences, correct, path, title: str = "Reliability", n_bins: int = N_BINS) -> Path:
    """Write a reliability diagram as a PNG.

    Bars show the accuracy of each of ``n_bins`` equal-width confidence bins (same bins as
    :func:`noulengine.metrics.calibration.calibration_bins`), the dashed diagonal is perfect
    calibration, each non-empty bar is labelled with its row count, and the title carries the ECE.

    Args:
        confidences: ``(N,)`` floats in ``[0, 1]``.
        correct: ``(N,)`` booleans or 0/1.
        path: the PNG file to write (parent folders are created).
        title: the plot title.

    Returns:
        The path written.

    Raises:
        ImportError: matplotlib is not installed.
        ValueError: as :func:`calibration_bins`.
        OutputWriteError: the PNG could not be written (a full disk): written through
            ``<path>.tmp`` and a rename, so no half image is left.
    """
    from matplotlib.backends.backend_agg import FigureCanvasAgg
    from matplotlib.figure import Figure

    bins = calibration_bins(confidences, correct, n_bins)
    ece = float(expected_calibration_error(confidences, correct, n_bins))
    edges = bins.edges.tolist()
    width = 1.0 / n_bins
    lefts = edges[:-1]
    counts = bins.counts.tolist()
    acc = [c / n if n else 0.0 for c, n in zip(bins.correct.tolist(), counts)]

    fig = Figure(figsize=(5, 5), dpi=100)
    FigureCanvasAgg(fig)
    ax = fig.add_subplot(1, 1, 1)
    ax.bar(lefts, acc, width=width, align="edge", edgecolor="black", color="tab:blue", label="accuracy")
    ax.plot([0, 1], [0, 1], linestyle="--", color="gray", label="perfect calibration")
    for left, a, n in zip(lefts, acc, counts):
        if n:
            ax.text(left + width / 2, min(a, 0.95) + 0.01, str(int(n)), ha="center", va="bottom", fontsize=6)
    ax.set_xlim(0, 1)
    ax.set_ylim(0, 1.05)
    ax.set_xlabel("confidence (max probability)")
    ax.set_ylabel("accuracy")
    ax.set_title(f"{title}\nECE = {ece:.4f}, N = {int(sum(counts))}")
    ax.legend(loc="upper left", fontsize=8)
    out = Path(path)
    _save_atomic(fig, out)
    return out


def _save_atomic(fig, out: Path) -> None:
    """Draw ``fig`` as a PNG into ``<out>.tmp``, then rename it over ``out``
    (:func:`noulengine.writes.write_atomic`): a failed write leaves no half image.

    Raises:
        OutputWriteError: the folder, the temporary file or the rename failed (a full disk, a
            read-only folder), naming ``out``; the temporary file is removed.
    """
    from noulengine.writes import write_atomic

    write_atomic(out, lambda fh: fig.savefig(fh, format="png"), binary=True, make_parent=True)
