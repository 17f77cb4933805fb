"""CFFL's round order (Lyu et al. 2020; ``CFFL``'s docstring, deviation 1), pinned on a hand-made
case of 3 parties over two rounds with θ_u = 0.5: upload, aggregate over the R the round started
with, score on V, threshold, then download. A party that falls below κ/|R| in round t is still
aggregated in round t, downloads nothing from then on, and is left out of Δw_g and the scores
from round t + 1, while it keeps training its own model."""

import math

import pytest
import torch

from fl_lightning.algorithms import CFFL
from fl_lightning.core.module import RoundPayload

N_SAMPLES = [2, 1, 1]  # n_j
ROUND_0 = [[4.0, 2.0, 1.0, 0.0], [1.0, 0.0, 2.0, 4.0], [2.0, 4.0, 0.0, 1.0]]  # Δw_j of round 0
ROUND_1 = [[1.0, 0.0, 0.0, 2.0], [0.0, 3.0, 1.0, 0.0], [5.0, 0.0, 6.0, 0.0]]  # Δw_j of round 1
# θ_u = 0.5: each party uploads its 2 largest-magnitude entries of the 4
UPLOADS_0 = [[4.0, 2.0, 0.0, 0.0], [0.0, 0.0, 2.0, 4.0], [2.0, 4.0, 0.0, 0.0]]
UPLOADS_1 = [[1.0, 0.0, 0.0, 2.0], [0.0, 3.0, 1.0, 0.0], [5.0, 0.0, 6.0, 0.0]]
VACC_0 = [0.9, 0.6, 0.15]  # validation accuracies the server measures in round 0
VACC_1 = [0.5, 0.8, 0.99]  # round 1: party 2's is measured but no longer counts


def module():
    """D = 4 parameters (logistic regression 1 -> 2), w_g = w_j = 0, κ = 1/2."""
    cffl = CFFL(backbone="fl_logreg", num_classes=2, input_shape=(1,), fraction=1.0, threshold=0.5,
                upload_fraction=0.5)
    for p in cffl.model.parameters():
        torch.nn.init.zeros_(p)
    cffl.materialise_client_states(3)
    return cffl


def run_round(cffl, monkeypatch, round_index, delta_w, accuracies):
    """The server side of a round, with V's accuracies given; moves w_g by the step as the
    server optimizer would. Returns (Δw_g, the models scored on V)."""
    scored = []

    def validation_accuracy(context, models):
        scored.append(models.clone())
        return torch.tensor(accuracies, dtype=torch.float64)

    monkeypatch.setattr(cffl, "validation_accuracy", validation_accuracy)
    delta_w = torch.tensor(delta_w)
    payload = RoundPayload(round=round_index, clients=torch.arange(3), updates=-delta_w, losses=torch.zeros(3),
                           accuracies=torch.zeros(3), num_samples=torch.tensor(N_SAMPLES))
    step = cffl.server_round(payload)
    with torch.no_grad():  # w_g ← w_g − step
        params = dict(cffl.model.named_parameters())
        for name, piece in cffl.round_engine.layout.unflatten(cffl.round_engine.global_vector() - step).items():
            params[name].copy_(piece)
    assert len(scored) == 1
    return -step, scored[0]


def sinh_normalised(values, alpha=5.0):
    raw = [math.sinh(alpha * v) for v in values]
    return [v / sum(raw) for v in raw]


def test_a_party_below_the_threshold_is_aggregated_in_its_round_and_left_out_after(monkeypatch):
    cffl = module()

    # ---- round 0: R = {0, 1, 2}
    delta_g, scored = run_round(cffl, monkeypatch, 0, ROUND_0, VACC_0)
    # each upload is scored alone on V: w_g + Δw_j^S, w_g = 0 before the round's step
    assert torch.equal(scored, torch.tensor(UPLOADS_0))
    # Δw_g = Σ_R a_j Δw_j^S, a = n / Σ_R n = [1/2, 1/4, 1/4]: party 2 is in it although it leaves below
    expected_g = torch.tensor([0.5 * 4 + 0.25 * 2, 0.5 * 2 + 0.25 * 4, 0.25 * 2, 0.25 * 4])  # [2.5, 2, 0.5, 1]
    assert torch.allclose(delta_g, expected_g)
    assert cffl.round_share.tolist() == [0.5, 0.25, 0.25]
    # s_j = vacc_j / Σ vacc; r_j = sinh(5 · 0.2 s_j), normalised; κ/|R| = 1/6
    s = [v / sum(VACC_0) for v in VACC_0]
    r = sinh_normalised([0.2 * v for v in s])
    assert r[2] < 0.5 / 3 < r[1] < r[0]  # party 2 leaves R in round 0
    assert cffl.reputable.tolist() == [True, True, False]
    r_0 = [r[0] / (r[0] + r[1]), r[1] / (r[0] + r[1]), 0.0]  # normalised again over the new R
    assert cffl.r.tolist() == pytest.approx(r_0)
    # downloads: ⌊4 r_j / max r⌋ largest entries of Δw_g, own model keeps Δw_j − a_j Δw_j^S
    assert math.floor(4 * r_0[1] / r_0[0]) == 2  # party 1: entries 0 and 1 (|2.5|, |2|)
    models = cffl.agent_models.clone()
    assert torch.allclose(models[0], torch.tensor([4.0, 2, 1, 0]) - 0.5 * torch.tensor(UPLOADS_0[0]) + expected_g)
    assert torch.allclose(models[1], torch.tensor([1.0, 0, 2, 4]) - 0.25 * torch.tensor(UPLOADS_0[1])
                          + torch.tensor([2.5, 2, 0, 0]))
    assert torch.equal(models[2], torch.tensor(ROUND_0[2]))  # left R: no download, no subtraction
    assert models.tolist() == [[4.5, 3.0, 1.5, 1.0], [3.5, 2.0, 1.5, 3.0], [2.0, 4.0, 0.0, 1.0]]

    # ---- round 1: R = {0, 1}
    delta_g, scored = run_round(cffl, monkeypatch, 1, ROUND_1, VACC_1)
    assert torch.allclose(scored, expected_g + torch.tensor(UPLOADS_1))  # scored from round 0's w_g
    # Δw_g over R only, a = [2/3, 1/3, 0]: party 2's upload is not in it
    expected_g = torch.tensor([2 / 3 * 1, 1 / 3 * 3, 1 / 3 * 1, 2 / 3 * 2])  # [2/3, 1, 1/3, 4/3]
    assert torch.allclose(delta_g, expected_g)
    assert cffl.round_share.tolist() == pytest.approx([2 / 3, 1 / 3, 0.0])
    # s over R only (party 2's 0.99 does not count), moving average from round 0's r; κ/|R| = 1/4
    s = [VACC_1[0] / (VACC_1[0] + VACC_1[1]), VACC_1[1] / (VACC_1[0] + VACC_1[1])]
    r = sinh_normalised([0.8 * r_0[j] + 0.2 * s[j] for j in (0, 1)])
    assert 0.5 / 2 < r[1] < r[0]  # both stay
    assert cffl.reputable.tolist() == [True, True, False]
    assert cffl.r.tolist() == pytest.approx([r[0], r[1], 0.0])
    assert math.floor(4 * r[1] / r[0]) == 2  # party 1: entries 3 and 1 (|4/3|, |1|)
    moved = cffl.agent_models - models
    assert torch.allclose(moved[0], torch.tensor(ROUND_1[0]) - 2 / 3 * torch.tensor(UPLOADS_1[0]) + expected_g)
    assert torch.allclose(moved[1], torch.tensor(ROUND_1[1]) - 1 / 3 * torch.tensor(UPLOADS_1[1])
                          + torch.tensor([0.0, 1.0, 0.0, 4 / 3]))
    assert torch.equal(moved[2], torch.tensor(ROUND_1[2]))  # outside R: its own training only
    assert cffl.round_engine.global_vector().tolist() == pytest.approx([2.5 + 2 / 3, 3.0, 0.5 + 1 / 3, 1 + 4 / 3])
