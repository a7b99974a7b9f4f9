"""Hand-computed values for the plain metric functions."""

import math

import pytest
import torch

from noulengine.metrics import functional as F

P = torch.tensor([[0.7, 0.2, 0.1], [0.3, 0.6, 0.1]], dtype=torch.float64)
Y = torch.tensor([0, 2])


def test_accuracy_by_hand():
    assert F.accuracy(P, Y).item() == 0.5
    assert F.accuracy(P, Y, reduction="none").tolist() == [1.0, 0.0]


def test_accuracy_ties_go_to_first_candidate():
    p = torch.tensor([[0.5, 0.5]], dtype=torch.float64)
    assert F.accuracy(p, [0]).item() == 1.0
    assert F.accuracy(p, [1]).item() == 0.0


def test_nll_by_hand():
    expected = (-math.log(0.7) - math.log(0.1)) / 2
    assert F.nll(P, Y).item() == pytest.approx(expected, abs=1e-12)


def test_nll_zero_probability_gold_is_floored():
    p = torch.tensor([[1.0, 0.0]], dtype=torch.float64)
    assert F.nll(p, [1]).item() == pytest.approx(-math.log(1e-12), rel=1e-12)
    assert F.nll(p, [1]).item() == pytest.approx(27.631021115928547, rel=1e-12)


def test_nll_does_not_renormalise():
    p = torch.tensor([[0.5, 0.495]], dtype=torch.float64)  # sums to 0.995
    assert F.nll(p, [0]).item() == pytest.approx(-math.log(0.5), abs=1e-15)


def test_brier_by_hand():
    # row 0: 0.3^2 + 0.2^2 + 0.1^2 = 0.14; row 1: 0.3^2 + 0.6^2 + 0.9^2 = 1.26
    assert F.brier(P, Y, reduction="none").tolist() == pytest.approx([0.14, 1.26], abs=1e-12)
    assert F.brier(P, Y).item() == pytest.approx(0.7, abs=1e-12)


def test_brier_extremes():
    p = torch.tensor([[1.0, 0.0], [0.0, 1.0]], dtype=torch.float64)
    assert F.brier(p, [0, 0], reduction="none").tolist() == [0.0, 2.0]


def test_ordinal_mae_by_hand():
    p = torch.tensor([[0.2, 0.5, 0.3]], dtype=torch.float64)  # E = 0.5 + 0.6 = 1.1
    assert F.expected_level(p).item() == pytest.approx(1.1, abs=1e-12)
    assert F.ordinal_mae(p, [2]).item() == pytest.approx(0.9, abs=1e-12)
    assert F.ordinal_mae(p, [0]).item() == pytest.approx(1.1, abs=1e-12)


def test_rps_by_hand_k3():
    p = torch.tensor([[0.2, 0.5, 0.3]], dtype=torch.float64)
    # CDF_pred = [0.2, 0.7], CDF_gold(y=2) = [0, 0] -> (0.04 + 0.49) / 2
    assert F.rps(p, [2], 3).item() == pytest.approx(0.265, abs=1e-12)
    # y=0: CDF_gold = [1, 1] -> (0.64 + 0.09) / 2
    assert F.rps(p, [0], 3).item() == pytest.approx(0.365, abs=1e-12)


def test_rps_k2():
    p = torch.tensor([[0.3, 0.7], [0.3, 0.7]], dtype=torch.float64)
    # one term: (0.3 - 1)^2 = 0.49 for gold 0, (0.3 - 0)^2 = 0.09 for gold 1
    assert F.rps(p, [0, 1], 2, reduction="none").tolist() == pytest.approx([0.49, 0.09], abs=1e-12)


def test_rps_mixed_levels_masks_padding():
    # a K=2 row padded to K=3 whose probabilities do not quite sum to 1: padding must not count
    p = torch.tensor([[0.3, 0.69, 0.0], [0.2, 0.5, 0.3]], dtype=torch.float64)
    got = F.rps(p, [1, 2], torch.tensor([2, 3]), reduction="none").tolist()
    assert got == pytest.approx([0.09, 0.265], abs=1e-12)


def test_rps_perfect_is_zero():
    p = torch.eye(4, dtype=torch.float64)
    assert F.rps(p, [0, 1, 2, 3], 4).item() == 0.0


def test_kl_by_hand():
    q = torch.tensor([[0.5, 0.5, 0.0]], dtype=torch.float64)
    p = torch.tensor([[0.25, 0.5, 0.25]], dtype=torch.float64)
    assert F.kl_divergence(q, p).item() == pytest.approx(0.5 * math.log(2), abs=1e-12)
    assert F.kl_divergence(q, q).item() == 0.0


def test_kl_zero_prediction_is_floored():
    q = torch.tensor([[0.0, 1.0]], dtype=torch.float64)
    p = torch.tensor([[1.0, 0.0]], dtype=torch.float64)
    assert F.kl_divergence(q, p).item() == pytest.approx(-math.log(1e-12), rel=1e-12)


def test_brier_distribution_and_tvd_by_hand():
    q = torch.tensor([[0.5, 0.5, 0.0]], dtype=torch.float64)
    p = torch.tensor([[0.25, 0.5, 0.25]], dtype=torch.float64)
    assert F.brier_distribution(p, q).item() == pytest.approx(0.125, abs=1e-12)
    assert F.total_variation(p, q).item() == pytest.approx(0.25, abs=1e-12)


def test_soft_scores_match_hard_for_one_hot_gold():
    q = torch.nn.functional.one_hot(Y, 3).to(torch.float64)
    assert F.brier_distribution(P, q).item() == pytest.approx(F.brier(P, Y).item(), abs=1e-12)
    assert F.kl_divergence(q, P).item() == pytest.approx(F.nll(P, Y).item(), abs=1e-12)


def test_results_are_float64_even_from_float32_inputs():
    assert F.nll(P.float(), Y).dtype == torch.float64
    assert F.brier([[0.5, 0.5]], [0]).dtype == torch.float64


@pytest.mark.parametrize("call, rule", [
    (lambda: F.nll(torch.zeros(0, 2), torch.zeros(0, dtype=torch.int64)), "at least one row"),
    (lambda: F.nll(torch.ones(3), [0]), "shape (N, K)"),
    (lambda: F.nll(P, [0, 3]), "indices must lie in"),
    (lambda: F.nll(P, [0.0, 1.0]), "integer indices"),
    (lambda: F.nll(P, [0]), "shape (2,)"),
    (lambda: F.nll(P, Y, reduction="sum"), "reduction"),
    (lambda: F.rps(P, Y, 1), "num_levels"),
    (lambda: F.rps(P, [0, 2], [3, 2]), "below its row's num_levels"),
    (lambda: F.total_variation(P, P[:, :2]), "same shape"),
])
def test_argument_checks_name_the_rule(call, rule):
    with pytest.raises(ValueError, match=None) as info:
        call()
    assert rule in str(info.value)


def _pairwise_auc(scores, positive):
    """The definition, pair by pair: P(s_pos > s_neg) + 0.5 P(s_pos = s_neg)."""
    pos = [s for s, y in zip(scores, positive) if y]
    neg = [s for s, y in zip(scores, positive) if not y]
    return sum((p > n) + 0.5 * (p == n) for p in pos for n in neg) / (len(pos) * len(neg))


def test_binary_auc_by_hand_and_against_the_pairwise_definition():
    assert F.binary_auc([0.9, 0.8, 0.3, 0.1], [1, 1, 0, 0]).item() == 1.0
    assert F.binary_auc([0.1, 0.3, 0.8, 0.9], [1, 1, 0, 0]).item() == 0.0
    assert F.binary_auc([0.5, 0.5, 0.5], [True, False, True]).item() == 0.5  # a constant: no information
    # pos {0.8, 0.4}, neg {0.6, 0.4}: pairs 1 + 1 + 0 + 0.5 over 4
    assert F.binary_auc([0.8, 0.4, 0.6, 0.4], [1, 1, 0, 0]).item() == pytest.approx(0.625, abs=1e-15)
    g = torch.Generator().manual_seed(0)
    for n in (2, 7, 50):
        s = torch.randint(0, 5, (n,), generator=g).to(torch.float64) / 4  # many ties
        y = torch.arange(n) % 3 == 0
        assert F.binary_auc(s, y).item() == pytest.approx(_pairwise_auc(s.tolist(), y.tolist()), abs=1e-12)


@pytest.mark.parametrize("scores, positive, rule", [
    ([0.1, 0.2], [1, 1], "positives and negatives"),
    ([0.1, 0.2], [0, 0], "positives and negatives"),
    ([0.1, float("nan")], [0, 1], "finite"),
    ([0.1, 0.2], [0, 2], "0/1"),
    ([0.1, 0.2, 0.3], [0, 1], "one length"),
])
def test_binary_auc_refuses(scores, positive, rule):
    with pytest.raises(ValueError, match=rule):
        F.binary_auc(torch.tensor(scores), torch.tensor(positive))
