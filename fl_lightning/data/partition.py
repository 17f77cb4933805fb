"""Partitioners: split a labelled pool of samples among federated clients.

Every partitioner is a pure function

    fn(labels, num_clients, seed, **params) -> list[np.ndarray]

that returns one sorted int64 array of sample positions (into ``labels``) per client.
The same seed always gives the same partition (a ``numpy.random.Generator`` is built
from it), clients never share a sample, and no client is left empty (a ``ValueError``
names the parameter to change instead). Each partitioner's docstring says whether it
*covers* every sample exactly once or uses a disjoint *subset* of the pool.

Use them through the registry:

    >>> clients = partition("dirichlet", labels, num_clients=100, seed=0, alpha=0.1)

Where each input is checked, once: the registry checks the name, the parameters (names,
and values against the types of the partitioner's signature: :func:`check_partition_params`,
which needs no labels), the labels and ``num_clients``, in the function
:func:`register_partitioner` wraps around a partitioner; the partitioner itself checks only
what depends on the labels (e.g. ``classes_per_client`` against the number of classes).
A new partitioner is a decorated function whose keyword parameters are annotated with the
types below (or any type pydantic validates); the annotation is the check:

    >>> @register_partitioner("halves")
    ... def halves(labels, num_clients, seed=0, *, shuffle: bool = True): ...
"""

from __future__ import annotations

from collections.abc import Sequence

import numpy as np

from fl_lightning.data.partition_registry import (
    PARTITIONERS,
    ClassAssignment,
    ClientIds,
    Concentration,
    Count,
    Partitioner,
    check_num_clients,
    check_partition_params,
    check_partition_values,
    check_test_fraction,
    partition,
    partition_param_names,
    register_partitioner,
    resolved_partition_params,
)

__all__ = [  # the registry's names, re-exported: users import them from here
    "CGSV_POWER_LAW_ALPHA", "PARTITIONERS", "ClassAssignment", "ClientIds", "Concentration", "Count",
    "Partitioner", "check_num_clients", "check_partition_params", "check_partition_values",
    "check_test_fraction", "class_assignment", "class_counts", "dirichlet", "iid",
    "linspace_class_numbers", "linspace_classes", "natural", "partition", "partition_param_names",
    "pathological", "power_law", "power_law_sizes", "register_partitioner",
    "resolved_partition_params", "shards", "split_train_test",
]

# The power-law exponent used by the CGSV authors' released code (Data_Prepper.powerlaw).
CGSV_POWER_LAW_ALPHA = 1.65911332899


# --------------------------------------------------------------------------- helpers


def _finish(clients: Sequence[np.ndarray], how_to_fix: str) -> list[np.ndarray]:
    """Sort each client's positions as int64 and reject empty clients."""
    clients = [np.sort(np.asarray(c, dtype=np.int64)) for c in clients]
    empty = [k for k, c in enumerate(clients) if c.size == 0]
    if empty:
        shown = empty[:10] + (["..."] if len(empty) > 10 else [])
        raise ValueError(f"the partition left client(s) {shown} with no samples; {how_to_fix}")
    return clients


def _split_evenly(positions: np.ndarray, parts: int, rng: np.random.Generator) -> list[np.ndarray]:
    """Shuffle ``positions`` and cut them into ``parts`` pieces whose sizes differ by <= 1."""
    return np.array_split(rng.permutation(positions), parts)


def _positions_by_class(labels: np.ndarray) -> dict[int, np.ndarray]:
    return {int(c): np.flatnonzero(labels == c) for c in np.unique(labels)}


def _share_classes_among_owners(
    labels: np.ndarray, owners_of_class: dict[int, list[int]], num_clients: int, rng
) -> list[np.ndarray]:
    """Give each class's samples, split evenly, to the clients that own the class."""
    by_class = _positions_by_class(labels)
    clients: list[list[np.ndarray]] = [[] for _ in range(num_clients)]
    for cls, owners in sorted(owners_of_class.items()):
        for owner, piece in zip(
            owners, _split_evenly(by_class[cls], len(owners), rng), strict=True
        ):
            clients[owner].append(piece)
    return [np.concatenate(parts) if parts else np.empty(0, np.int64) for parts in clients]


def _random_subset(num_samples: int, total_size: int | None, rng) -> np.ndarray:
    """A random order of all positions, or of ``total_size`` of them."""
    if total_size is None:
        return rng.permutation(num_samples)
    if total_size > num_samples:  # >= 1: Count
        raise ValueError(
            f"total_size must be between 1 and the number of samples ({num_samples}), "
            f"got {total_size}; leave it None to use every sample."
        )
    return rng.permutation(num_samples)[:total_size]


# --------------------------------------------------------------------------- partitioners


@register_partitioner("iid")
def iid(labels, num_clients, seed=0, *, total_size: Count | None = None):
    """UNI / IID: a random, equal-sized split (sizes differ by at most one).

    Covers every sample exactly once; with ``total_size`` it splits a random subset of
    that many samples (CGSV's UNI uses 600 per agent, i.e. ``total_size=600*num_clients``).
    """
    rng = np.random.default_rng(seed)
    chosen = _random_subset(len(labels), total_size, rng)
    return _finish(np.array_split(chosen, num_clients), "raise total_size or use fewer clients.")


@register_partitioner("dirichlet")
def dirichlet(
    labels,
    num_clients,
    seed=0,
    *,
    alpha: Concentration = 0.5,
    min_size: Count = 10,
    max_tries: Count = 100,
):
    """Dir(alpha) label skew (Hsu et al., arXiv:1909.06335, 2019; FedLF, Pan et al., AAAI 2024:
    Dir(0.1) / Dir(1.0)); alpha 0.5 by default.

    For every class, proportions p ~ Dir(alpha * 1_K) over the clients decide how that
    class's samples are cut among them. Draws are repeated until every client holds at
    least ``min_size`` samples; after ``max_tries`` failed draws a ``ValueError`` is raised.
    Small alpha: each client is dominated by few classes and sizes vary; large alpha:
    close to IID. Covers every sample exactly once.
    """
    if min_size * num_clients > len(labels):
        raise ValueError(
            f"dirichlet cannot give {num_clients} clients min_size={min_size} samples each "
            f"from {len(labels)} samples; lower min_size or num_clients."
        )
    rng = np.random.default_rng(seed)
    by_class = _positions_by_class(labels)
    smallest = 0
    for _ in range(max_tries):
        clients = _dirichlet_draw(by_class, num_clients, alpha, rng)
        smallest = min(len(c) for c in clients)
        if smallest >= min_size:
            return _finish(clients, "lower min_size or raise alpha.")
    raise ValueError(
        f"dirichlet: after max_tries={max_tries} draws some client still had fewer than "
        f"min_size={min_size} samples (smallest in the last draw: {smallest}). Lower min_size, "
        f"raise alpha (now {alpha}), use fewer clients (num_clients={num_clients}) or raise max_tries."
    )


def _dirichlet_draw(by_class, num_clients, alpha, rng) -> list[np.ndarray]:
    clients: list[list[np.ndarray]] = [[] for _ in range(num_clients)]
    for positions in by_class.values():
        proportions = rng.dirichlet(np.full(num_clients, alpha))
        cuts = (np.cumsum(proportions)[:-1] * len(positions)).astype(int)
        for client, piece in zip(clients, np.split(rng.permutation(positions), cuts), strict=True):
            client.append(piece)
    return [np.concatenate(parts) for parts in clients]


@register_partitioner("pathological")
def pathological(labels, num_clients, seed=0, *, classes_per_client: Count):
    """Pat-k (McMahan et al., AISTATS 2017, Sec. 3; FedLF, Pan et al., AAAI 2024, appendix):
    each client holds exactly k classes.

    Classes are dealt greedily: each client in turn takes the k classes with the fewest
    owners so far (random tie-break), so every class gets an owner and owner counts differ
    by at most one. Each class's samples are split evenly among its owners.
    Covers every sample exactly once.
    """
    classes = np.unique(labels)
    k = classes_per_client
    if k > len(classes):  # k >= 1: Count
        raise ValueError(
            f"classes_per_client must be between 1 and the number of classes "
            f"({len(classes)}), got {k}."
        )
    if num_clients * k < len(classes):
        raise ValueError(
            f"num_clients * classes_per_client = {num_clients * k} is fewer than the "
            f"{len(classes)} classes, so some class would have no owner; raise "
            f"classes_per_client or num_clients."
        )
    rng = np.random.default_rng(seed)
    owner_count = np.zeros(len(classes), dtype=np.int64)
    owners_of_class: dict[int, list[int]] = {int(c): [] for c in classes}
    for client in range(num_clients):
        least_owned_first = np.lexsort((rng.random(len(classes)), owner_count))
        for slot in least_owned_first[:k]:
            owners_of_class[int(classes[slot])].append(client)
            owner_count[slot] += 1
    clients = _share_classes_among_owners(labels, owners_of_class, num_clients, rng)
    return _finish(
        clients, "a class has fewer samples than owners; lower num_clients or classes_per_client."
    )


@register_partitioner("shards")
def shards(
    labels, num_clients, seed=0, *, num_shards: Count | None = None, shards_per_client: Count = 2
):
    """Sort-and-shard (McMahan et al., AISTATS 2017, Sec. 3; FedFV, Wang et al., IJCAI 2021:
    200 shards x 2; FedMGDA+, Hu et al., IEEE TNSE 2022: 500 x 5).

    Samples are sorted by label (random order within a class), cut into ``num_shards``
    equal shards, and each client gets ``shards_per_client`` random shards without
    replacement, so every client has the same size. A client holds at most
    ``shards_per_client`` classes when every class size is a multiple of the shard size
    (otherwise a shard may straddle two classes, as in the original recipe).
    ``num_shards`` defaults to ``num_clients * shards_per_client``.
    Uses a disjoint subset: when the pool size N is not a multiple of num_shards,
    N mod num_shards randomly chosen samples are left out (exact coverage otherwise).
    """
    if num_shards is None:
        num_shards = num_clients * shards_per_client
    if num_shards != num_clients * shards_per_client:
        raise ValueError(
            f"num_shards ({num_shards}) must equal num_clients * shards_per_client "
            f"({num_clients} * {shards_per_client} = {num_clients * shards_per_client}); "
            "change num_shards or shards_per_client, or leave num_shards unset."
        )
    if num_shards > len(labels):
        raise ValueError(
            f"num_shards ({num_shards}) exceeds the number of samples ({len(labels)}); "
            "lower num_shards (i.e. num_clients or shards_per_client)."
        )
    rng = np.random.default_rng(seed)
    shard_size = len(labels) // num_shards
    kept = rng.permutation(len(labels))[: num_shards * shard_size]
    sorted_by_label = kept[np.argsort(labels[kept], kind="stable")]
    shard_table = sorted_by_label.reshape(num_shards, shard_size)
    shards_of_client = rng.permutation(num_shards).reshape(num_clients, shards_per_client)
    return _finish([shard_table[ids].ravel() for ids in shards_of_client], "lower num_shards.")


@register_partitioner("power_law")
def power_law(
    labels,
    num_clients,
    seed=0,
    *,
    alpha: Concentration = CGSV_POWER_LAW_ALPHA,
    total_size: Count | None = None,
):
    """POW quantity skew (CGSV, Xu et al. NeurIPS 2021): IID samples, power-law sizes.

    CGSV: "we follow a power law to partition the entire dataset among the agents ...
    The size of the local dataset increases from the first to the last agent."
    As in the authors' released code, the sizes are proportional to K evenly spaced points
    between the 1% and 99% quantiles of the power-law distribution p(x) = alpha x^(alpha-1)
    on [0, 1] (quantile q -> q^(1/alpha)); the smaller alpha, the more unequal the sizes
    (alpha=1.659: the last client holds ~16x the first). Client 0 is the smallest.
    Covers every sample exactly once (or a random subset of ``total_size`` samples; CGSV
    splits 600 * num_clients samples).
    """
    rng = np.random.default_rng(seed)
    chosen = _random_subset(len(labels), total_size, rng)
    sizes = power_law_sizes(len(chosen), num_clients, alpha)
    pieces = np.split(chosen, np.cumsum(sizes)[:-1])
    return _finish(
        pieces,
        "the smallest client got no samples; raise total_size, raise alpha or use fewer clients.",
    )


def power_law_sizes(
    total: int, num_clients: int, alpha: float = CGSV_POWER_LAW_ALPHA
) -> np.ndarray:
    """Increasing client sizes summing to ``total``, proportional to evenly spaced
    quantiles (1%..99%) of the power law p(x) = alpha x^(alpha-1) on [0, 1]."""
    quantiles = np.linspace(0.01, 0.99, num_clients) if num_clients > 1 else np.array([1.0])
    weights = quantiles ** (1.0 / alpha)
    return _round_preserving_total(weights / weights.sum() * total)


def _round_preserving_total(shares: np.ndarray) -> np.ndarray:
    """Floor ``shares`` and hand the leftover units to the largest remainders."""
    sizes = np.floor(shares).astype(np.int64)
    leftover = int(round(shares.sum())) - int(sizes.sum())
    sizes[np.argsort(-(shares - sizes), kind="stable")[:leftover]] += 1
    return sizes


@register_partitioner("linspace_classes")
def linspace_classes(
    labels,
    num_clients,
    seed=0,
    *,
    samples_per_client: Count | None = None,
    random_classes: bool = False,
):
    """CLA class-number skew (CGSV, Xu et al. NeurIPS 2021): client i holds k_i classes.

    CGSV: "we vary the number of distinct classes in the local datasets of the agents,
    while keeping their sizes fixed at 600 ... partition classes in a 'linspace' manner
    ... for MNIST with 5 agents, agents 1, 2, 3, 4, 5 own local datasets with 1, 3, 5, 7,
    10 classes". So k = floor(linspace(1, C, K)) (floor reproduces the paper's 1,3,5,7,10).
    As in the authors' code, client i owns the first k_i classes (``random_classes=True``:
    k_i random classes instead) and draws ``samples_per_client`` samples split equally over
    them. Unlike the authors' code (sampling with replacement) clients never share a sample.
    ``samples_per_client=None`` picks the largest size the pool can supply.
    Uses a disjoint subset of the pool.
    """
    classes = np.unique(labels)
    class_numbers = linspace_class_numbers(num_clients, len(classes))
    rng = np.random.default_rng(seed)
    if random_classes:
        owned = [rng.choice(classes, size=k, replace=False) for k in class_numbers]
    else:
        owned = [classes[:k] for k in class_numbers]
    by_class = {c: rng.permutation(p) for c, p in _positions_by_class(labels).items()}
    available = {c: len(p) for c, p in by_class.items()}
    feasible = _largest_feasible_size(owned, available, len(labels) // num_clients)
    if samples_per_client is None:
        samples_per_client = feasible
    fewest = int(class_numbers.max())  # every owned class needs at least one sample
    if feasible < fewest:
        raise ValueError(
            f"linspace_classes cannot serve {num_clients} clients from {len(labels)} samples: "
            f"client {num_clients - 1} owns {fewest} classes and needs at least one sample of "
            f"each, but the pool can give every client at most {feasible} samples without "
            "sharing any. Use fewer clients or a larger source."
        )
    if not fewest <= samples_per_client <= feasible:
        raise ValueError(
            f"linspace_classes needs samples_per_client between {fewest} (one sample per "
            f"class) and {feasible} (the most this pool can give every client without "
            f"sharing samples), got {samples_per_client}. Leave it None for the largest, "
            "or use fewer clients."
        )
    taken = dict.fromkeys(by_class, 0)
    clients = []
    for client_classes in owned:
        pieces = []
        for cls, count in zip(
            client_classes, _equal_counts(samples_per_client, len(client_classes)), strict=True
        ):
            cls = int(cls)
            pieces.append(by_class[cls][taken[cls] : taken[cls] + count])
            taken[cls] += count
        clients.append(np.concatenate(pieces))
    return _finish(clients, "raise samples_per_client.")


def linspace_class_numbers(num_clients: int, num_classes: int) -> np.ndarray:
    """CGSV's CLA class numbers: floor(linspace(1, C, K)), e.g. K=5, C=10 -> 1,3,5,7,10."""
    return np.linspace(1, num_classes, num_clients).astype(np.int64)


def _equal_counts(total: int, parts: int) -> np.ndarray:
    """``total`` split into ``parts`` integer counts differing by at most one."""
    return np.full(parts, total // parts) + (np.arange(parts) < total % parts)


def _largest_feasible_size(owned, available: dict[int, int], upper: int) -> int:
    """Largest per-client size whose per-class demand every class can meet (0 if none)."""

    def fits(size: int) -> bool:
        demand = dict.fromkeys(available, 0)
        for client_classes in owned:
            for cls, count in zip(
                client_classes, _equal_counts(size, len(client_classes)), strict=True
            ):
                demand[int(cls)] += int(count)
        return all(demand[c] <= available[c] for c in available)

    low, high = 0, upper  # fits(low) always holds
    while low < high:
        middle = (low + high + 1) // 2
        low, high = (middle, high) if fits(middle) else (low, middle - 1)
    return low


@register_partitioner("class_assignment")
def class_assignment(labels, num_clients, seed=0, *, assignment: ClassAssignment):
    """Explicit classes per client, e.g. FedFV's Fashion-MNIST with 3 clients
    ``[[6], [2], [0]]`` (shirt, pullover, T-shirt; FedFV, Wang et al., IJCAI 2021, following
    q-FFL, Li et al., ICLR 2020).

    Each class's samples are split evenly among the clients listing it; samples of
    classes nobody lists are unused. Uses a disjoint subset of the pool (exact coverage
    when every class is listed).
    """
    if len(assignment) != num_clients:
        raise ValueError(
            f"class_assignment has {len(assignment)} class lists but num_clients={num_clients}; "
            "give exactly one list of classes per client."
        )
    present = set(np.unique(labels).tolist())
    owners_of_class: dict[int, list[int]] = {}
    for client, client_classes in enumerate(assignment):
        client_classes = [int(c) for c in client_classes]
        for cls in client_classes:
            if cls not in present:
                raise ValueError(
                    f"class_assignment[{client}] names class {cls}, which has no samples; "
                    f"classes present: {sorted(present)}."
                )
            owners_of_class.setdefault(cls, []).append(client)
    rng = np.random.default_rng(seed)
    clients = _share_classes_among_owners(labels, owners_of_class, num_clients, rng)
    return _finish(clients, "a class has fewer samples than clients listing it; change assignment.")


@register_partitioner("natural")
def natural(labels, num_clients, seed=0, *, client_ids: ClientIds):
    """The source's own clients (e.g. Synthetic(alpha, beta) of FedProx, LEAF):
    client k gets the samples whose id is the k-th smallest distinct id.
    ``seed`` is unused. Covers every sample exactly once.
    """
    client_ids = np.asarray(client_ids)  # integers: ClientIds
    if client_ids.shape != labels.shape:
        raise ValueError(
            f"client_ids must have one id per sample: shape {client_ids.shape} vs labels "
            f"{labels.shape}."
        )
    ids = np.unique(client_ids)
    if len(ids) != num_clients:
        raise ValueError(
            f"num_clients={num_clients} but the data has {len(ids)} natural clients; "
            f"set num_clients={len(ids)}."
        )
    return _finish([np.flatnonzero(client_ids == i) for i in ids], "check client_ids.")


# --------------------------------------------------------------------------- after partitioning


def split_train_test(
    client_indices: Sequence[np.ndarray], test_fraction: float, seed: int = 0
) -> tuple[list[np.ndarray], list[np.ndarray]]:
    """Split each client's samples at random into (train, test).

    A client with n samples gets round(test_fraction * n) test samples, but always keeps
    at least one training sample (FedFV/FedMGDA+ use 0.2 and 0.1, FedLF 1/6).
    """
    check_test_fraction(test_fraction)
    rng = np.random.default_rng(seed)
    train_lists, test_lists = [], []
    for client, positions in enumerate(client_indices):
        positions = np.asarray(positions, dtype=np.int64)
        if positions.size == 0:
            raise ValueError(f"client {client} has no samples to split into train and test.")
        shuffled = rng.permutation(positions)
        num_test = min(int(np.floor(test_fraction * len(positions) + 0.5)), len(positions) - 1)
        test_lists.append(np.sort(shuffled[:num_test]))
        train_lists.append(np.sort(shuffled[num_test:]))
    return train_lists, test_lists


def class_counts(labels, client_indices: Sequence[np.ndarray], num_classes: int) -> np.ndarray:
    """(K, C) int64 table: samples of class c held by client k."""
    labels = np.asarray(labels)
    if labels.size and labels.max() >= num_classes:
        raise ValueError(f"labels go up to {labels.max()}, but num_classes={num_classes}.")
    rows = [
        np.bincount(labels[np.asarray(idx, dtype=np.int64)], minlength=num_classes)
        for idx in client_indices
    ]
    return np.stack(rows).astype(np.int64) if rows else np.zeros((0, num_classes), np.int64)
