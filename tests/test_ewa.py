"""EWA: the bias-corrected average matches a hand computation; evaluation under it restores training weights."""

from __future__ import annotations

import pytest
import torch
from torch import nn

from recipetune.trainer.ewa import EWA


def toy() -> nn.Linear:
    model = nn.Linear(2, 1, bias=False)
    with torch.no_grad():
        model.weight.zero_()
    return model


def set_weight(model: nn.Linear, values: list[float]) -> None:
    with torch.no_grad():
        model.weight.copy_(torch.tensor([values]))


def test_average_matches_hand_computed_bias_corrected_mean() -> None:
    model, t = toy(), 0.5
    ewa = EWA(model, t)
    history = [[1.0, -2.0], [3.0, 0.0], [5.0, 4.0]]
    for w in history:
        set_weight(model, w)  # stands in for an optimizer step
        ewa.update()
    # w_avg = sum_i (1 - t) t^(n-i) theta_i = 0.125*th1 + 0.25*th2 + 0.5*th3, divided by 1 - t^3 = 0.875
    expected = [(0.125 * a + 0.25 * b + 0.5 * c) / 0.875 for a, b, c in zip(*history, strict=True)]
    assert ewa.averaged()[0].tolist() == [pytest.approx(expected)]
    assert expected == pytest.approx([(1 * 1 + 2 * 3 + 4 * 5) / 7, (1 * -2 + 2 * 0 + 4 * 4) / 7])


def test_bias_correction_makes_a_constant_weight_its_own_average() -> None:
    model = toy()
    set_weight(model, [0.7, -0.3])
    ewa = EWA(model, 0.999)
    for _ in range(3):  # far fewer steps than the horizon: uncorrected, the average would be ~0.003 * w
        ewa.update()
    assert ewa.averaged()[0].tolist() == [pytest.approx([0.7, -0.3])]


def test_swapped_in_evaluates_average_then_restores_training_weights() -> None:
    model = toy()
    ewa = EWA(model, 0.5)
    set_weight(model, [2.0, 2.0])
    ewa.update()
    set_weight(model, [4.0, 0.0])
    ewa.update()
    weight, ptr = model.weight, model.weight.data_ptr()
    x = torch.tensor([[1.0, 1.0]])
    with ewa.swapped_in():
        averaged = [(0.25 * 2 + 0.5 * 4) / 0.75, (0.25 * 2 + 0.5 * 0) / 0.75]
        assert model.weight.tolist() == [pytest.approx(averaged)]
        assert model(x).item() == pytest.approx(sum(averaged))
    assert model.weight.tolist() == [[4.0, 0.0]]
    # the same tensor object, in place: an optimizer holding it keeps training the right weights
    assert model.weight is weight and model.weight.data_ptr() == ptr and model.weight.requires_grad


def test_swapped_in_restores_after_an_exception_and_is_a_no_op_before_any_step() -> None:
    model = toy()
    set_weight(model, [1.0, 1.0])
    ewa = EWA(model, 0.9)
    with ewa.swapped_in():
        assert model.weight.tolist() == [[1.0, 1.0]]  # step 0: nothing averaged yet
    ewa.update()
    set_weight(model, [9.0, 9.0])
    with pytest.raises(RuntimeError), ewa.swapped_in():
        assert model.weight.tolist() == [[1.0, 1.0]]
        raise RuntimeError("evaluation failed")
    assert model.weight.tolist() == [[9.0, 9.0]]


def test_state_dict_round_trip_continues_the_same_average() -> None:
    model = toy()
    a = EWA(model, 0.8)
    for w in ([1.0, 0.0], [0.0, 1.0]):
        set_weight(model, w)
        a.update()
    b = EWA(toy(), 0.3)
    b.load_state_dict(a.state_dict())
    assert (b.decay, b.step) == (0.8, 2)
    assert torch.equal(b.averaged()[0], a.averaged()[0])


def test_decay_outside_unit_interval_is_refused() -> None:
    for bad in (0.0, 1.0, 1.5):
        with pytest.raises(ValueError, match="ewa decay"):
            EWA(toy(), bad)
