"""FedFV (Wang et al., IJCAI 2021, "Federated Learning with Fair Averaging"), Alg. 1-3.

The internal projections (Alg. 2) are done in coefficient space: a projected update is a
combination c_i @ J of the round's updates, so with the Gram matrix G = J Jᵀ every inner
product g'_i · g_j is (C G)_{ij}. One O(m² d) Gram matrix and O(m³) work replace the
paper's m² projections of d-vectors, each needing its own pass over J (the FedLF appendix,
Table 9, reports FedFV's server step as the bottleneck of the reference code). The
external projections (Alg. 3) act on the single vector g^t and read each history row once.

Alg. 3 only reads GH rows of clients last seen within the last τ rounds: a row that falls out
of that window is never read again, so it is zeroed when it does, and a checkpoint holds only
the rows of the window, less those of the clients that answer the next round (they are
replaced before being read). A FedFV run keeps O(τ m d) of history in its checkpoints, not K d.
"""

from __future__ import annotations

import math
from typing import Annotated, Any, Literal

import torch
from pydantic import Field

from fl_lightning.algorithms.registry import register_algorithm
from fl_lightning.core import settings
from fl_lightning.core.gram import combine, gram
from fl_lightning.core.module import FederatedModule, RoundContext, RoundPayload
from fl_lightning.core.simulation import round_generator

ProjectionOrder = Literal["loss", "random", "reverse"]
ExternalRounds = Literal["paper", "reference"]


@register_algorithm
class FedFV(FederatedModule):
    """Federated fair averaging: mitigate internal and external gradient conflicts.

    Per round t (Alg. 1), with g_i = w - w_i and the training losses l_i at w:
      1. GH[i] <- g_i and t_i <- t for every i in S_t (line 4).
      2. PO_t = S_t sorted by the projection order (line 5; the paper: ascending loss).
      3. Internal conflicts (Alg. 2): the ⌈αm⌉ clients with the largest losses keep g_i;
         every other client's copy g'_i is projected, for j in PO_t order (j != i), off
         the ORIGINAL g_j whenever g'_i · g_j < 0. g^t = mean_i g'_i.
      4. External conflicts (Alg. 3, when t >= τ > 0): for each earlier round r, oldest
         first, g_con = Σ GH[k] over clients last seen in round r with g^t · GH[k] < 0;
         if g^t · g_con < 0, g^t is projected off g_con.
      5. g^t <- g^t / ||g^t|| · ||(1/m) Σ_i g_i|| (line 10); w <- w - g^t.

    Args:
        alpha: α in [0, 1]: the ⌈αm⌉ clients with the largest training losses (whatever
            ``order`` is) keep their original update; α = 1 is FedAvg with uniform weights.
            Paper grid {0, .1, .2, 1/3, .5, 2/3}; default 0.1 (the paper's best on CIFAR-10,
            Table 2). The authors' code keeps m - ⌈(m-1)(1-α)⌉ in floating point, one fewer
            for α = 1/3 or 2/3 at m = 10 (none of the paper's reported settings).
        tau: τ >= 0, how many earlier rounds the external step looks back (0 = none).
            Paper grid {0, 1, 3, 10}; default 10 (Table 2's best).
        order: the projection order PO_t: ``"loss"`` (the paper: ascending training loss,
            so the largest-loss clients are the last targets), ``"random"`` or
            ``"reverse"`` (descending loss); the last two are the paper's Table 4 ablation.
        external_rounds: ``"paper"`` visits rounds t-τ, ..., t-1 (Alg. 3 and Definition 3:
            clients not in S_t); ``"reference"`` visits t-τ+1, ..., t as the authors' code
            does (its rounds count from 1, so it includes the current round's clients and
            starts one round earlier, at t + 1 >= τ).
    """

    reads_training_losses = True  # the clients' losses at w before local training

    def __init__(
        self,
        *args: Any,
        alpha: Annotated[settings.Proportion, Field(
            description="in [0, 1] (the share of clients that keep their update)")] = 0.1,
        tau: Annotated[settings.CountOrZero, Field(
            description="an integer >= 0 (rounds of history; 0 = no external step)")] = 10,
        order: ProjectionOrder = "loss",
        external_rounds: ExternalRounds = "paper",
        **kwargs: Any,
    ) -> None:
        super().__init__(*args, **kwargs)
        self.save_hyperparameters()
        # GH: the latest update of every client, and t_k: the round it was sent in (-1: never)
        self.register_client_history()

    # ------------------------------------------------------------------------ Alg. 1
    def aggregate(self, payload: RoundPayload) -> torch.Tensor:
        """Alg. 1 of Wang et al. (IJCAI 2021) for one round: g^t after the internal (Alg. 2) and
        external (Alg. 3) projections, rescaled to ||(1/m) Σ_i g_i|| (line 10); zeros when g^t is 0."""
        t, updates = payload.round, payload.updates
        G = gram(updates)  # G_ij = g_i · g_j
        order = self.projection_order(payload.training_losses(), t)  # line 5: PO_t
        keep = self.keeps_original(payload.training_losses())
        coeffs = self.mitigate_internal(G, order, keep).mean(dim=0)  # Alg. 2: g^t = (1/m) Σ_i g'_i
        gt = self.mitigate_external(combine(coeffs, updates), payload)  # Alg. 3
        target_norm = G.sum().clamp(min=0).sqrt() / updates.shape[0]  # ||(1/m) Σ_i g_i||
        norm = gt.double().norm()  # float64: a float32 norm is inf beyond ~1.8e19
        if not norm > 0:
            return torch.zeros_like(gt)
        return (gt.double() * (target_norm / norm)).to(gt.dtype)  # line 10: ||g^t|| = ||(1/m) Σ_i g_i||

    def on_round_end(self, payload: RoundPayload, server_step: torch.Tensor) -> None:
        previous = int(self.last_seen.max())  # the last round that stored GH rows (-1: none)
        self.store_history(payload.clients, payload.updates, payload.round)  # line 4: GH
        self.forget_history(previous, payload.round)

    # ------------------------------------------------------------------- GH rows still read
    def first_round_read(self, round_index: int) -> int:
        """The oldest t_k whose GH row Alg. 3 may read in round ``round_index`` or later."""
        tau = int(self.hparams.tau)
        if tau == 0:
            return round_index + 1  # no external step: GH is never read
        return round_index - tau if self.hparams.external_rounds == "paper" else round_index + 1 - tau

    def forget_history(self, previous: int, round_index: int) -> None:
        """Zero the GH rows no round after ``round_index`` reads (t_k < ``first_round_read(t+1)``):
        a checkpoint then leaves them out, and a resumed run holds the same state as an
        uninterrupted one. Only the rows that fell out since the ``previous`` round that stored
        GH rows are touched; t_k is kept."""
        older = max(self.first_round_read(previous + 1), 0) if previous >= 0 else 0
        stale = (self.last_seen >= older) & (self.last_seen < self.first_round_read(round_index + 1))
        if bool(stale.any()):
            self.history[stale.to(self.history.device)] = 0

    def history_rows_to_keep(self, next_round: RoundContext | None) -> torch.Tensor:
        """GH rows a checkpoint after ``rounds_completed`` rounds must hold: clients last seen in
        the window of a later round, less the clients that answer the next round (their rows are
        replaced by their new update before Alg. 3 reads them; sampling and dropout are pure
        functions of (seed, round)). With an attacker, which may add clients, or a sampler
        overridden by a subclass (it may depend on state), the whole window."""
        if next_round is None:
            return super().history_rows_to_keep(next_round)
        needed = self.last_seen >= max(self.first_round_read(next_round.round), 0)
        answering = next_round.answering_clients() if bool(needed.any()) else None
        if answering is not None:
            needed[answering.to(needed.device)] = False
        return torch.nonzero(needed).flatten()

    def projection_order(self, losses: torch.Tensor, round_index: int) -> torch.Tensor:
        """PO_t as positions in the round: ascending loss (the paper), random or reverse."""
        if self.hparams.order == "random":
            generator = round_generator(self.hparams.seed, round_index, "projection_order")
            return torch.randperm(losses.shape[0], generator=generator).to(losses.device)
        return torch.sort(losses, descending=self.hparams.order == "reverse", stable=True).indices

    def keeps_original(self, losses: torch.Tensor) -> torch.Tensor:
        """Boolean mask of the ⌈αm⌉ largest-loss clients, which skip the projections."""
        m = losses.shape[0]
        kept = math.ceil(round(self.hparams.alpha * m, 9))  # round(): 0.1 * 30 is 3.0000000000000004
        keep = torch.zeros(m, dtype=torch.bool, device=losses.device)
        keep[torch.sort(losses, descending=True, stable=True).indices[:kept]] = True
        return keep

    # ------------------------------------------------------------------------ Alg. 2
    @staticmethod
    def mitigate_internal(G: torch.Tensor, order: torch.Tensor, keep: torch.Tensor) -> torch.Tensor:
        """Coefficients C (m x m) of the projected updates, g'_i = C[i] @ J.

        For every target j in PO order, each projected row i (i != j, not kept) with
        g'_i · g_j = (C G)_{ij} < 0 becomes g'_i - (g'_i · g_j / ||g_j||²) g_j, i.e.
        C[i, j] -= (C G)_{ij} / G_jj. Rows are independent (targets are the original g_j),
        so all rows are projected at once.
        """
        C = torch.eye(G.shape[0], dtype=G.dtype, device=G.device)
        projected = ~keep
        for j in order.tolist():
            dots = C @ G[:, j]  # g'_i · g_j for every i
            conflict = projected & (dots < 0)
            conflict[j] = False
            C[:, j] -= torch.where(conflict, dots / G[j, j].clamp(min=torch.finfo(G.dtype).tiny), 0.0)
        return C

    # ------------------------------------------------------------------------ Alg. 3
    def external_round_window(self, round_index: int) -> range:
        """The earlier rounds Alg. 3 visits, oldest first (empty before the window is full)."""
        tau, t = int(self.hparams.tau), round_index
        if self.hparams.external_rounds == "paper":
            return range(t - tau, t) if t >= tau else range(0)
        return range(t - tau + 1, t + 1) if t + 1 >= tau else range(0)

    def mitigate_external(self, gt: torch.Tensor, payload: RoundPayload) -> torch.Tensor:
        """Alg. 3 on the vector g^t, reading each history row of the visited rounds once.

        GH as line 4 leaves it: this round's clients hold this round's updates (stored in the
        history's dtype), which ``on_round_end`` writes once the step is applied. The
        projections are sequential in g^t, so working on g^t itself costs O(h d) for h
        history rows: less than any Gram matrix of the history (O(h² d)).
        """
        window = self.external_round_window(payload.round)
        last_seen = self.last_seen.clone()
        last_seen[payload.clients.to(last_seen.device)] = payload.round  # line 4: t_k <- t for k in S_t
        rows = torch.nonzero((last_seen >= window.start) & (last_seen < window.stop)).flatten()
        rows = rows[torch.argsort(last_seen[rows], stable=True)]  # grouped by round, oldest first
        position = torch.full_like(last_seen, -1)
        position[payload.clients.to(last_seen.device)] = torch.arange(payload.num_clients, device=last_seen.device)
        current = position[rows] >= 0
        recent = torch.empty(len(rows), gt.shape[0], dtype=gt.dtype, device=gt.device)
        recent[~current.to(gt.device)] = self.history_rows(rows[~current], gt)  # GH[k], clients last seen in the window
        if bool(current.any()):  # this round's GH rows: its updates, rounded as storing them would
            stored = payload.updates[position[rows][current].to(gt.device)].to(self.history.dtype)
            recent[current.to(recent.device)] = stored.to(recent.dtype)
        per_round = torch.bincount(last_seen[rows] - window.start, minlength=len(window)).tolist()
        for sent in recent.split(per_round):  # line 1: rounds t - i, i = τ, ..., 1; line 4: t_k = t - i
            g_con = ((sent @ gt < 0).to(gt.dtype) @ sent).double()  # lines 5-6: Σ GH[k] with g^t · GH[k] < 0
            dot, squared = gt.double() @ g_con, g_con @ g_con  # float64: no under/overflow for any finite g
            if dot < 0 and squared > 0:  # lines 10-11: project g^t off g_con
                gt = (gt.double() - dot / squared * g_con).to(gt.dtype)
        return gt
