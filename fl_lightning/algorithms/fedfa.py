"""FedFa (Huang et al. 2020, "Fairness and accuracy in federated learning"): weights from the
information quantity of the clients' training accuracies and participation frequencies, and
momentum on both the clients and the server ("double momentum"). The formulas are those of
the FedFV authors' implementation of FedFa (Wang et al., IJCAI 2021, code release).

The server-momentum sign is NOT settled from Huang et al.'s own paper (arXiv 2012.10069): only
its abstract and introduction could be read here (no equations of its Sec. 3), which say that
clients and server both keep a momentum and that the server treats the model difference of a
round as a gradient, but not with which sign the server's momentum enters the step. The code
keeps the FedFV authors' form (below), which damps the averaged move; a reader with the paper
should check the server update against it."""

from __future__ import annotations

from typing import Annotated, Any

import torch
from pydantic import Field

from fl_lightning.algorithms.registry import register_algorithm
from fl_lightning.core import settings
from fl_lightning.core.module import FederatedModule, RoundPayload, ServerStep


@register_algorithm
class FedFa(FederatedModule):
    """FedFa: favour rarely-sampled and less accurate clients, with server momentum.

    Per round, with acc_i the training accuracy at w and f_i the number of rounds client i
    has taken part in (this one included):
        ACCinf_i = -log2(acc_i / Σ_j acc_j + 1e-6),  Finf_i = -log2(1 - f_i / Σ_j f_j + 1e-5),
        each normalised to sum 1;  p_i = (1 - β) ACCinf_i + β Finf_i
        w_new = Σ_i p_i w_i;  dw = w_new - w;  m <- γ m + (1 - γ) dw;  w <- w_new - η m
    (sums over the round's clients). The clients train with SGD momentum γ: the base
    ``momentum`` defaults to ``gamma`` unless it is given.

    Note: as written (the FedFV authors' code), η m is subtracted from
    w_new, and m follows dw = w_new - w, so the server term damps the averaged move rather
    than accelerating it. The FedLF repository instead uses m <- γ m + dw, w <- w + m, and
    drops the -log2 terms; neither is reproduced here.

    Args:
        beta: β in [0, 1], the weight of participation frequency against accuracy (0.5).
        gamma: γ in [0, 1), the server momentum and the clients' SGD momentum (0.9).
        eta: η > 0, the server momentum step, or None for this round's local lr (as the FedFV
            authors' code). Not named ``server_lr``, which FedAvg configs would carry over.
        momentum: the clients' SGD momentum; None (the default) = γ, as the paper's clients use.
    """

    reads_training_losses = True  # the clients' accuracies at w before local training

    # registered buffers and per-client state (typed for the checker; nn.Module holds them)
    server_momentum: torch.Tensor
    # shared settings whose default is derived from one of the algorithm's own (the run's label
    # shows them only where they differ from it: FedFa(gamma=0.5,momentum=0.9) is not FedFa(gamma=0.5))
    derived_settings = {"momentum": "gamma"}
    participation: torch.Tensor

    def __init__(
        self,
        *args: Any,
        beta: Annotated[settings.Proportion, Field(
            description="in [0, 1] (weight of participation against accuracy)")] = 0.5,
        gamma: Annotated[settings.Probability, Field(description="in [0, 1) (momentum)")] = 0.9,
        eta: Annotated[settings.StepSize | None, Field(
            description="> 0, or null for the local learning rate")] = None,
        momentum: settings.Probability | None = None,
        **kwargs: Any,
    ) -> None:
        momentum = gamma if momentum is None else momentum  # clients: SGD with momentum γ (saved resolved)
        kwargs["momentum"] = momentum
        super().__init__(*args, **kwargs)  # checks gamma (its type) before the momentum it gives
        self.save_hyperparameters()
        self.register_buffer("server_momentum", torch.zeros(self.num_parameters))  # m
        self.register_client_state("participation")  # f_i

    def aggregate(self, payload: RoundPayload) -> ServerStep:
        """The weights p_i from the clients' training accuracies and participation counts, then
        the server momentum: the step w − (w_new − η m), with the counts and m as new state."""
        participation = self.participation.clone()
        participation[payload.clients] += 1  # f_i counts this round too
        weights = self.client_weights(payload.training_accuracies(), participation[payload.clients])  # p_i
        dw = -(weights.to(payload.updates.dtype) @ payload.updates)  # w_new - w = -Σ_i p_i g_i
        gamma = self.hparams.gamma
        # m <- γ m + (1 - γ) dw
        m = self.server_momentum.mul(gamma).add_(dw.to(self.server_momentum.dtype), alpha=1 - gamma)
        eta = self.hparams.eta or payload.context.lr
        return ServerStep(-dw + eta * m.to(dw.dtype),  # w - (w_new - η m)
                          new_state={"participation": participation, "server_momentum": m})

    def client_weights(self, accuracies: torch.Tensor, frequencies: torch.Tensor) -> torch.Tensor:
        """p_i = (1 - β) ACCinf_i + β Finf_i over the round's clients (float64)."""
        acc, freq = accuracies.double(), frequencies.double()
        acc_share = acc / acc.sum() if acc.sum() > 0 else torch.full_like(acc, 1 / acc.numel())
        acc_info = -torch.log2(acc_share + 1e-6)  # ACCinf_i
        freq_info = -torch.log2(1 - freq / freq.sum() + 1e-5)  # Finf_i
        beta = self.hparams.beta
        return (1 - beta) * acc_info / acc_info.sum() + beta * freq_info / freq_info.sum()
