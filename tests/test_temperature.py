"""Temperature scaling: known answers, bounds, reporting, variable K, grouping."""

import json
import math

import numpy as np
import pytest
import torch
from hypothesis import assume, given, settings
from hypothesis import strategies as st

from noulengine.calibrate.temperature import (
    apply_temperature, calibrated_probabilities, default_parent, fit_grouped, fit_temperature, mean_nll,
    pack_logits, temperature_for,
)

TWO = [torch.tensor([2.0, 0.0])] * 4


def test_known_answer():
    # p(gold 0) = sigmoid(2 / T) must equal 3/4 at the optimum: 2 / T = ln 3
    fit = fit_temperature(TWO, [0, 0, 0, 1])
    assert fit.temperature == pytest.approx(2 / math.log(3), abs=1e-6)
    assert fit.temperature == pytest.approx(1.820478, abs=1e-6)
    assert fit.log_temperature == pytest.approx(math.log(fit.temperature))
    assert fit.converged and not fit.hit_bound and fit.warnings == []
    assert fit.n == 4 and fit.iterations >= 1
    assert fit.nll_after < fit.nll_before
    assert fit.nll_after == pytest.approx(-(3 * math.log(0.75) + math.log(0.25)) / 4, abs=1e-12)
    json.dumps(fit.to_dict(), allow_nan=False)


def test_known_answer_from_other_inits_and_tensor_labels():
    for init in (0.05, 0.3, 7.0, 20.0):
        fit = fit_temperature(TWO, torch.tensor([0, 0, 0, 1]), init=init)
        assert fit.temperature == pytest.approx(2 / math.log(3), abs=1e-6), init


def test_hits_upper_bound_and_says_so():
    fit = fit_temperature(TWO, [1, 1, 1, 1])  # gold is always the lower logit: T -> infinity
    assert fit.hit_bound and fit.temperature == 20.0 and fit.converged
    assert any("upper bound" in w for w in fit.warnings)


def test_hits_lower_bound_and_says_so():
    fit = fit_temperature(TWO, [0, 0, 0, 0], bounds=(0.5, 20.0))
    assert fit.hit_bound and fit.temperature == 0.5
    assert any("lower bound" in w for w in fit.warnings)


def test_not_converged_is_reported():
    fit = fit_temperature(TWO, [0, 0, 0, 1], max_iter=1)
    assert not fit.converged and fit.iterations == 1
    assert any("did not converge" in w for w in fit.warnings)


def test_non_finite_loss_is_an_error_not_a_temperature():
    from noulengine.calibrate.temperature import NonFiniteFitError

    huge = [torch.tensor([1e308, 0.0], dtype=torch.float64)] * 2  # overflows once divided by T < 1
    with pytest.raises(NonFiniteFitError, match="non-finite loss or gradient"):
        fit_temperature(huge, [0, 1], init=0.05)


def test_fit_grouped_names_the_group_of_a_non_finite_fit_and_the_row_of_a_non_finite_logit():
    from noulengine.calibrate.temperature import NonFiniteFitError, fit_grouped

    rows = [(torch.tensor([1e308, -1e308], dtype=torch.float64), 1)] * 3 + [(torch.tensor([2.0, 0.0]), 0)]
    with pytest.raises(NonFiniteFitError, match=r"group '(choice\+2|choice|global)' \(4 rows\)"):
        fit_grouped(rows, ["choice+2"] * 4, min_rows=1)
    bad = [(torch.tensor([1.0, 0.0]), 0), (torch.tensor([float("nan"), 0.0]), 1)]
    with pytest.raises(ValueError, match=r"group 'noul\+2': row 1 has non-finite logits"):
        fit_grouped(bad, ["choice+2", "noul+2"], min_rows=1)


def variable_k_data(seed=0, n=60):
    g = torch.Generator().manual_seed(seed)
    logits, labels = [], []
    for i in range(n):
        k = 2 + i % 4
        z = torch.randn(k, generator=g, dtype=torch.float64) * 3
        logits.append(z)
        # gold is the argmax 60% of the time: the logits are over-confident
        labels.append(int(z.argmax()) if torch.rand(1, generator=g) < 0.6 else int(torch.randint(k, (1,), generator=g)))
    return logits, labels


def test_padding_matches_per_row_loss():
    logits, labels = variable_k_data()
    z, mask = pack_logits(logits)
    assert z.dtype == torch.float64 and z.shape == (60, 5) and mask.sum().item() == sum(len(x) for x in logits)
    t = torch.tensor(1.7, dtype=torch.float64)
    ref = np.mean([torch.nn.functional.cross_entropy((x / 1.7)[None], torch.tensor([y])).item()
                   for x, y in zip(logits, labels)])
    assert mean_nll(z, mask, torch.tensor(labels), t).item() == pytest.approx(ref, abs=1e-12)


def test_variable_k_fit_is_the_grid_minimum():
    logits, labels = variable_k_data()
    fit = fit_temperature(logits, labels)
    assert fit.converged and not fit.hit_bound
    z, mask = pack_logits(logits)
    y = torch.tensor(labels)
    grid = torch.exp(torch.linspace(math.log(0.05), math.log(20), 20001, dtype=torch.float64))
    losses = torch.stack([mean_nll(z, mask, y, t) for t in grid])
    assert fit.nll_after <= losses.min().item() + 1e-12
    assert fit.temperature == pytest.approx(grid[losses.argmin()].item(), rel=1e-3)
    assert fit.temperature > 1  # over-confident logits get softened


@pytest.mark.parametrize("kwargs, rule", [
    (dict(logits=[], labels=[]), "at least one row"),
    (dict(logits=[torch.zeros(2, 2)], labels=[0]), "1-D"),
    (dict(logits=[torch.tensor([math.nan, 0.0])], labels=[0]), "finite"),
    (dict(logits=TWO, labels=[0, 0, 0]), "shape (4,)"),
    (dict(logits=TWO, labels=[0, 0, 0, 2]), "labels[3] = 2"),
    (dict(logits=TWO, labels=[0.0, 0.0, 0.0, 1.0]), "integer"),
    (dict(logits=TWO, labels=[0, 0, 0, 1], init=30.0), "init must lie"),
    (dict(logits=TWO, labels=[0, 0, 0, 1], bounds=(0.0, 1.0)), "bounds"),
    (dict(logits=TWO, labels=[0, 0, 0, 1], max_iter=0), "max_iter"),
])
def test_argument_checks(kwargs, rule):
    with pytest.raises(ValueError) as info:
        fit_temperature(**kwargs)
    assert rule in str(info.value)


@settings(max_examples=300, deadline=None)
@given(st.integers(2, 12).flatmap(lambda k: st.lists(st.floats(-50, 50, allow_subnormal=False), min_size=k, max_size=k)),
       st.floats(0.05, 20.0))
def test_temperature_never_changes_the_argmax(values, t):
    z = torch.tensor(values, dtype=torch.float64)
    top2 = torch.topk(z, 2).values
    assume(top2[0] - top2[1] > 1e-9)  # a unique maximum (float rounding could merge near-ties)
    assert int(apply_temperature(z, t).argmax()) == int(z.argmax())
    assert int(calibrated_probabilities(z, t).argmax()) == int(z.argmax())


def test_apply_temperature_shapes_and_checks():
    out = apply_temperature([torch.tensor([2.0, 0.0]), torch.tensor([1.0, 2.0, 3.0])], 2.0)
    assert [x.tolist() for x in out] == [[1.0, 0.0], [0.5, 1.0, 1.5]]
    p = calibrated_probabilities(torch.tensor([[2.0, 0.0]]), 2 / math.log(3))
    assert p[0, 0].item() == pytest.approx(0.75, abs=1e-6)
    for bad in (0.0, -1.0, math.inf, math.nan):
        with pytest.raises(ValueError, match="finite and positive"):
            apply_temperature(torch.zeros(2), bad)


def test_default_parent_chain():
    assert default_parent("choice+4") == "choice"
    assert default_parent("choice") == "global"
    assert default_parent("global") is None


def test_fit_grouped_fallback():
    items = [(torch.tensor([2.0, 0.0]), int(i % 4 == 3)) for i in range(40)]
    items += [(torch.tensor([1.0, 0.0, 0.0]), 0) for _ in range(5)]
    keys = ["noul+2"] * 40 + ["choice+3"] * 5
    fits = fit_grouped(items, keys, min_rows=10)
    assert set(fits) == {"noul+2", "noul", "choice+3", "choice", "global"}
    assert fits["noul+2"].source == "noul+2" and fits["noul+2"].fallback == ["noul+2"]
    assert fits["noul+2"].temperature == pytest.approx(2 / math.log(3), abs=1e-6)
    small = fits["choice+3"]
    assert small.fit is None and small.n_rows == 5
    assert small.fallback == ["choice+3", "choice", "global"] and small.source == "global"
    assert small.temperature == fits["global"].temperature and fits["global"].n_rows == 45
    json.dumps({k: v.to_dict() for k, v in fits.items()}, allow_nan=False)
    assert temperature_for(fits, "choice+7") == fits["global"].temperature  # unseen key walks up
    assert temperature_for(fits, "noul+2") == fits["noul+2"].temperature


def test_fit_grouped_small_global_is_fitted_with_warning_and_mapping_parent():
    items = [(torch.tensor([2.0, 0.0]), y) for y in (0, 0, 0, 1)]
    fits = fit_grouped(items, ["a"] * 4, min_rows=10, parent={"a": "global"})
    assert fits["a"].source == "global" and any("only 4 rows" in w for w in fits["global"].fit.warnings)


def test_fit_grouped_checks():
    with pytest.raises(ValueError, match="one key per item"):
        fit_grouped([(torch.zeros(2), 0)], ["a", "b"])
    with pytest.raises(ValueError, match="loops"):
        fit_grouped([(torch.zeros(2), 0)], ["a"], parent={"a": "b", "b": "a"})
