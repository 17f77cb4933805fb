"""CFFL: collaborative fair federated learning (Lyu, Xu, Wang & Yu, "Collaborative Fairness in
Federated Learning", arXiv 2008.12161, 2020), the validation-reputation baseline of CGSV (Xu et
al., NeurIPS 2021, Sec. 4.1).

Every party j keeps its own model w_j; the server keeps w_g and an auxiliary validation set V.
Round t, over the reputable parties R (all N at first):
  1. party j trains from w_j (its model keeps that training: w_j ← w_j + Δw_j) and uploads
     Δw_j^S, the θ_u share of Δw_j with the largest magnitudes (entries clipped to ±c first);
  2. aggregation over R as it stands at the start of the round: w_g ← w_g + Δw_g,
     Δw_g = Σ_{j∈R} a_j Δw_j^S, a_j = n_j / Σ_{i∈R} n_i;
  3. reputations: the server scores each upload on V, either alone (``"validation"``:
     vacc_j = acc(w_g + Δw_j^S), s_j = vacc_j / Σ_{i∈R} vacc_i), or by leaving it out
     (``"leave_one_out"``: acc = acc(w_g + Δw_g), acc_{-j} = acc(w_g + Δw_g − a_j Δw_j^S),
     x_j = acc / (acc + acc_{-j}), s_j = 1 / (1 + exp(−15 (x_j − 0.5))), normalised over R);
     r_j ← φ r_j + (1 − φ) s_j, then r ← sinh(α r) / Σ_{i∈R} sinh(α r_i);
  4. threshold: a party with r_j < κ / |R| leaves R for good (r_j = 0; this round's Δw_g
     already holds its upload, no later one does, and it downloads nothing), and the
     reputations are normalised again over R;
  5. reward: party j ∈ R downloads the ⌊D r_j / max_i r_i⌋ largest-magnitude entries of Δw_g
     less its own share: w_j ← w_j + mask(Δw_g, q_j) − a_j Δw_j^S.

The arXiv text was not reachable from here; the steps follow the authors' code release for it
(github.com/XinyiYS/CollaborativeFairFederatedLearning: per-party validation accuracy, the 0.8 /
0.2 moving average, sinh with α = 5, threshold 1/(3|R|), top-k of the whole model) and, for
``"leave_one_out"``, the accuracy factor and sigmoid of the authors' IJCAI-20 workshop draft
(what CGSV Sec. 4.1 describes). Our choices, where the two differ or are silent: the draft's
(r + f)/2 average is not used (both scores go through the same moving average and sinh); the
downloaded count is not also scaled by n_j / max n, as the release does; α stays constant.
``CFFL``'s docstring lists where we depart from the release.

The validation set is the server's own data, so it must not be test data: ``ValidatedAgents``
holds out ``validation_fraction`` of every agent's training samples (drawn from the module's
seed), and the agents train on the rest; test sets and reported metrics are untouched.
"""

from __future__ import annotations

from typing import Annotated, Any, Literal

import torch
from pydantic import Field

from fl_lightning.algorithms.agents import ValidatedAgents, top_magnitude_mask
from fl_lightning.algorithms.registry import register_algorithm
from fl_lightning.core import settings
from fl_lightning.core.module import RoundContext, RoundPayload, ServerStep
from fl_lightning.records.algorithm_facts import INTERPRETATIONS

Reputation = Literal["validation", "leave_one_out"]


@register_algorithm
class CFFL(ValidatedAgents):
    """Collaborative fair FL: validation reputations decide who stays and how much of the
    aggregate each party downloads (see the module docstring for the round).

    Args:
        reputation: how an upload is scored on V: ``"validation"`` (alone, the code release)
            or ``"leave_one_out"`` (the aggregate without it, the workshop draft; CGSV's
            description).
        alpha: α of r ← sinh(α r) (release: 5).
        fade: φ, the weight of the previous reputation (release: 0.8).
        threshold: κ, a party leaves when r_j < κ / |R| (release: 1/3).
        upload_fraction: θ_u, the share of Δw_j uploaded, largest magnitudes (release: 0.1;
            default 1.0, the whole update, as CGSV's comparison).
        clip: c, each entry of Δw_j is clipped to [−c, c] (release: 0.01 on MNIST); None: no clip.
        **kwargs: ``validation_fraction`` (see ``ValidatedAgents``) and the base class's.

    Logged every round: ``cffl_r/<i>`` and ``cffl_density/<i>`` (N ≤ 20), their min/mean/max,
    and ``cffl_reputable`` (|R|).

    Deviations from Lyu et al. (Algorithm 1 of the authors' workshop draft and their code
    release, the module docstring's sources; the arXiv text was not reachable):
      1. Round order: Δw_g sums over R as it stands at the start of the round and the
         threshold comes after, so a party that leaves R in round t is still aggregated in
         round t (it then downloads nothing and keeps all of its Δw_j). The release thresholds
         first and aggregates only the parties still in R. Ours is the draft's order
         (aggregate, score, remove), which leave-one-out scoring needs.
      2. Aggregation weights: a_j = n_j / Σ_{i∈R} n_i, summing to 1 over R; the release's are
         n_j / Σ_{all i} n_i, so its server step shrinks as parties leave. Ours keeps Δw_g a
         FedAvg of R.
      3. Own share: a party of R subtracts a_j Δw_j^S, exactly its part of Δw_g; the release
         subtracts (n_j / max_i n_i) Δw_j^S, more than that part (the largest party its
         whole upload). Ours: a party that downloads all of Δw_g holds its own update once.
      4. Score at θ_u = 1: always vacc_j = acc(w_g + Δw_j^S). The release, at θ_u = 1 only,
         scores the party's own model, acc(w_j + Δw_j). Ours is one score for every θ_u;
         they differ at our default θ_u = 1 (w_j ≠ w_g after the first round).
      5. V: held out of the agents' training samples after any ``label_noise`` of the data
         module was applied, so V carries the noisy agents' wrong labels in proportion
         (noise 20/40/60 % on 3 of 5 equal agents: (20 + 40 + 60) / 5 = 24 % of V's labels
         wrong in expectation). Lyu et al. hold V out of the training set before partitioning (draft: 10 %;
         release: 20 %), with clean labels, and have no label noise. Ours keeps the test sets
         untouched; the data module keeps no clean copy of noisy labels to score on.
      6. Absent parties (``dropout_prob``, non-finite updates; the release has every party in
         every round): a party of R that does not answer skips the moving average, yet its
         stored r still goes through sinh(α r) and the normalisation with the others', so it
         keeps changing while the party is away, and the party can leave R on it.
    """

    # Shown under CFFL's rows on the leaderboard (logged as the run tag algorithm_interpretation).
    interpretation = INTERPRETATIONS["CFFL"]

    # registered buffers and per-client state (typed for the checker; nn.Module holds them)
    r: torch.Tensor
    reputable: torch.Tensor
    round_share: torch.Tensor

    def __init__(
        self,
        *args: Any,
        reputation: Reputation = "validation",
        alpha: Annotated[settings.Scale, Field(description="> 0 (α in sinh(α r); the release uses 5)")] = 5.0,
        fade: Annotated[
            settings.Probability, Field(description="in [0, 1) (φ, the weight of the previous reputation)")] = 0.8,
        threshold: Annotated[
            settings.Probability, Field(description="in [0, 1) (κ: parties with r < κ/|R| leave)")] = 1 / 3,
        upload_fraction: Annotated[float, Field(gt=0, le=1, description="in (0, 1] (θ_u)")] = 1.0,
        clip: Annotated[settings.Scale | None, Field(description="> 0, or null for no clipping")] = None,
        **kwargs: Any,
    ) -> None:
        super().__init__(*args, **kwargs)
        self.save_hyperparameters()
        self.register_client_state("r", dtype=torch.float64)  # r_j
        self.register_client_state("reputable", dtype=torch.bool, fill=1.0)  # j ∈ R
        self.register_client_state("round_share", dtype=torch.float64)  # a_j of the last round

    # ---------------------------------------------------------------- party side
    def local_updates(self, payload: RoundPayload) -> tuple[torch.Tensor, torch.Tensor]:
        """(Δw_j clipped, its upload Δw_j^S) for the round's parties, rows (m, D)."""
        delta = -payload.updates  # Δw_j = w_j' − w_j
        if self.hparams.clip is not None:
            delta = delta.clamp(-self.hparams.clip, self.hparams.clip)
        if self.hparams.upload_fraction == 1.0:
            return delta, delta
        ratios = torch.full((delta.shape[0],), self.hparams.upload_fraction, device=delta.device)
        return delta, delta * top_magnitude_mask(delta, ratios)

    # ---------------------------------------------------------------- server side
    def aggregate(self, payload: RoundPayload) -> ServerStep:
        """Steps 2-4 of the module docstring's round: the server step −Δw_g (Δw_g = Σ_{j∈R} a_j Δw_j^S),
        and the reputations r and the set R after the moving average, sinh and threshold."""
        _, uploads = self.local_updates(payload)
        R = self.reputable[payload.clients]
        a = self.shares(payload, R)  # a_j = n_j / Σ_R n_i, 0 outside R
        step = (a.to(uploads.dtype) @ uploads)  # Δw_g
        scores = self.scores(payload.context, uploads, a, step, R)  # s_j
        r = self.r.clone()
        reputable = self.reputable.clone()
        ids = payload.clients[R]
        r[ids] = self.hparams.fade * r[ids] + (1 - self.hparams.fade) * scores[R]
        r = torch.where(reputable, torch.sinh(self.hparams.alpha * r), torch.zeros_like(r))
        r = r / r.sum()
        reputable &= r >= self.hparams.threshold / int(reputable.sum())  # r_j < κ/|R|: leaves R
        r = torch.where(reputable, r, torch.zeros_like(r))
        round_share = torch.zeros_like(self.round_share)
        round_share[payload.clients] = a
        return ServerStep(-step, new_state={"r": r / r.sum(), "reputable": reputable,  # w_g ← w_g + Δw_g
                                            "round_share": round_share})

    def shares(self, payload: RoundPayload, reputable: torch.Tensor) -> torch.Tensor:
        """a_j = n_j / Σ_{i∈R} n_i for the round's parties in R, 0 for the others (float64)."""
        n = payload.num_samples.double() * reputable
        return n / n.sum()

    def scores(self, context: RoundContext, uploads: torch.Tensor, a: torch.Tensor, step: torch.Tensor,
               R: torch.Tensor) -> torch.Tensor:
        """s_j, normalised over R, from the validation accuracies of w_g + (uploads)."""
        w_g = context.global_vector
        if self.hparams.reputation == "validation":
            value = self.validation_accuracy(context, w_g + uploads)  # vacc_j
        else:
            without = step - a.unsqueeze(1).to(uploads.dtype) * uploads  # Δw_g − a_j Δw_j^S
            acc = self.validation_accuracy(context, torch.cat([(w_g + step).unsqueeze(0), w_g + without]))
            x = acc[0] / (acc[0] + acc[1:]).clamp(min=1e-12)  # accuracy factor
            value = torch.sigmoid(15 * (x - 0.5))  # f(x)
        value = value * R
        return value / value.sum().clamp(min=1e-12)

    # ------------------------------------------------------------------ reward
    def on_round_end(self, payload: RoundPayload, server_step: torch.Tensor) -> dict[str, float]:
        """Step 5, the reward: each party still in R adds its download of Δw_g (the
        ⌊D r_j / max_i r_i⌋ largest entries) less its own share a_j Δw_j^S to its model; a
        party that left keeps Δw_j. Returns the r_j, download densities and |R| to log."""
        delta, uploads = self.local_updates(payload)
        R = self.reputable[payload.clients]  # after this round's threshold
        a = (self.round_share[payload.clients] * R).to(delta.dtype)  # a_j, for the parties still in R
        ratios = (self.r / self.r.max())[payload.clients]  # q_j / D = r_j / max_i r_i
        keep = top_magnitude_mask(-server_step, ratios) & R.unsqueeze(1)
        own = delta - a.unsqueeze(1) * uploads  # w_j + Δw_j − a_j Δw_j^S (a party that left keeps Δw_j)
        self.agent_models[payload.clients] += own + (-server_step) * keep
        density = keep.double().mean(dim=1)
        return self.per_agent_metrics({"cffl_r": (self.r, range(len(self.r))),
                                       "cffl_density": (density, payload.clients.tolist())},
                                      {"cffl_reputable": float(self.reputable.sum())})

