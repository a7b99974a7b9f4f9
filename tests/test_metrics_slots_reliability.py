"""Slot shares and the reliability diagram."""

import pytest

from noulengine.metrics.reliability import plot_reliability
from noulengine.metrics.slots import slot_shares


def test_slot_shares_flag_never_predicted():
    rows = slot_shares([0, 0, 1, 0], [0, 2, 1, 2], num_slots=4)
    assert [r["predicted"] for r in rows] == [3, 1, 0, 0]
    assert [r["gold"] for r in rows] == [1, 1, 2, 0]
    assert rows[0]["predicted_share"] == 0.75 and rows[0]["gold_share"] == 0.25
    assert rows[0]["difference"] == 0.5
    assert [r["flags"] for r in rows] == [[], [], ["never_predicted"], []]


def test_slot_shares_checks():
    assert slot_shares([], []) == []
    with pytest.raises(ValueError, match="past num_slots"):
        slot_shares([3], [0], num_slots=2)
    with pytest.raises(ValueError, match="shape"):
        slot_shares([0, 1], [0])


def test_plot_reliability_writes_png(tmp_path):
    pytest.importorskip("matplotlib")
    out = plot_reliability([0.0, 1 / 15, 0.5, 0.9, 1.0], [0, 1, 1, 1, 1], tmp_path / "sub" / "rel.png", title="t")
    data = out.read_bytes()
    assert data[:8] == b"\x89PNG\r\n\x1a\n" and len(data) > 1000
