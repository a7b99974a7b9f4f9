"""ECE: bin edges, hand values and an independent numpy loop."""

import numpy as np
import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st

from noulengine.metrics.calibration import bin_index, calibration_bins, expected_calibration_error


def test_bin_edges_exact():
    got = bin_index([0.0, 1 / 15, 1 / 15 + 1e-12, 2 / 15, 0.5, 14 / 15, 1.0]).tolist()
    assert got == [0, 0, 1, 1, 7, 13, 14]


def test_ece_by_hand():
    conf = [0.0, 1 / 15, 1.0, 0.5, 0.5]
    correct = [0, 1, 1, 1, 0]
    # bin 0: {0, 1/15}: acc 1/2, conf 1/30 -> weight 2/5 * |1/2 - 1/30| = (1/5)(14/15)
    # bin 7: {0.5, 0.5}: acc 1/2, conf 1/2 -> 0; bin 14: {1.0}: acc 1, conf 1 -> 0
    assert expected_calibration_error(conf, correct).item() == pytest.approx(14 / 75, abs=1e-12)
    bins = calibration_bins(conf, correct)
    assert bins.counts.tolist() == [2, 0, 0, 0, 0, 0, 0, 2, 0, 0, 0, 0, 0, 0, 1]
    assert bins.correct[0].item() == 1 and bins.correct[14].item() == 1


def test_ece_perfect_and_worst():
    assert expected_calibration_error([1.0, 1.0], [True, True]).item() == 0.0
    assert expected_calibration_error([1.0, 1.0], [False, False]).item() == 1.0
    assert expected_calibration_error([0.0], [True]).item() == 1.0


def test_ece_argument_checks():
    with pytest.raises(ValueError, match="at least one row"):
        expected_calibration_error([], [])
    with pytest.raises(ValueError, match=r"within \[0, 1\]"):
        expected_calibration_error([1.5], [1])
    with pytest.raises(ValueError, match="0/1"):
        expected_calibration_error([0.5], [2])
    with pytest.raises(ValueError, match="shape"):
        expected_calibration_error([0.5, 0.5], [1])


def numpy_loop_ece(conf, correct, n_bins=15):
    """Straightforward reference: one pass per bin, (i/n, (i+1)/n] with 0 in the first bin."""
    conf = np.asarray(conf, dtype=np.float64)
    correct = np.asarray(correct, dtype=np.float64)
    total = 0.0
    for i in range(n_bins):
        lo, hi = i / n_bins, (i + 1) / n_bins
        sel = (conf > lo) & (conf <= hi)
        if i == 0:
            sel |= conf == 0.0
        if sel.any():
            total += sel.sum() / len(conf) * abs(correct[sel].mean() - conf[sel].mean())
    return total


def test_ece_matches_numpy_loop_on_random_data():
    rng = np.random.default_rng(0)
    for _ in range(20):
        n = int(rng.integers(1, 400))
        conf = rng.uniform(0, 1, n)
        edges = rng.integers(0, 16, n) / 15  # many values exactly on bin edges
        conf = np.where(rng.uniform(size=n) < 0.3, edges, conf)
        correct = rng.uniform(size=n) < conf
        got = expected_calibration_error(torch.from_numpy(conf), torch.from_numpy(correct)).item()
        assert got == pytest.approx(numpy_loop_ece(conf, correct), abs=1e-12)


@settings(max_examples=200, deadline=None)
@given(st.lists(st.tuples(st.one_of(st.floats(0, 1), st.integers(0, 15).map(lambda i: i / 15)), st.booleans()),
                min_size=1, max_size=60))
def test_ece_matches_numpy_loop_hypothesis(rows):
    conf = [c for c, _ in rows]
    correct = [k for _, k in rows]
    assert expected_calibration_error(conf, correct).item() == pytest.approx(numpy_loop_ece(conf, correct), abs=1e-12)


def test_expected_correctness_is_accepted_only_when_asked():
    """The pilot's expected correctness (issue #25 item 6): values in [0, 1], same bins and formula."""
    assert expected_calibration_error([0.6, 0.65], [0.5, 0.4], expected=True).item() == pytest.approx(0.175)
    with pytest.raises(ValueError, match="0/1"):
        expected_calibration_error([0.6], [0.5])
    with pytest.raises(ValueError, match=r"expected correctness must be finite and within \[0, 1\]"):
        expected_calibration_error([0.6], [1.5], expected=True)
