"""Partitioners: disjoint, covering where promised, never empty, seeded, as the papers say."""

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from fl_lightning.data.partition import (
    PARTITIONERS,
    class_counts,
    linspace_class_numbers,
    partition,
    power_law_sizes,
    split_train_test,
)

NUM_CLASSES = 10


def balanced_labels(
    per_class: int = 100, num_classes: int = NUM_CLASSES, seed: int = 0
) -> np.ndarray:
    """Shuffled labels with ``per_class`` samples of each class."""
    labels = np.repeat(np.arange(num_classes), per_class)
    return np.random.default_rng(seed).permutation(labels)


LABELS = balanced_labels()  # 1,000 samples
NATURAL_IDS = np.random.default_rng(1).integers(0, 7, size=len(LABELS))

# (name, params, num_clients, covers every sample exactly once?)
CASES = [
    ("iid", {}, 10, True),
    ("iid", {"total_size": 600}, 10, False),
    ("dirichlet", {"alpha": 0.5}, 10, True),
    ("pathological", {"classes_per_client": 2}, 20, True),
    ("shards", {"num_shards": 40, "shards_per_client": 2}, 20, True),
    ("shards", {"shards_per_client": 3}, 7, False),  # 21 shards of 47: 13 samples left out
    ("power_law", {}, 10, True),
    ("linspace_classes", {}, 5, False),
    ("class_assignment", {"assignment": [[0, 1], [1, 2], [3]]}, 3, False),
    ("natural", {"client_ids": NATURAL_IDS}, 7, True),
]
CASE_IDS = [f"{name}-{i}" for i, (name, *_rest) in enumerate(CASES)]


def assert_valid_partition(clients, num_samples, num_clients, exact):
    assert len(clients) == num_clients
    assert all(c.dtype == np.int64 and c.ndim == 1 for c in clients)
    assert all(len(c) > 0 for c in clients), "a client is empty"
    everything = np.concatenate(clients)
    assert len(np.unique(everything)) == len(everything), "clients share a sample"
    assert everything.min() >= 0 and everything.max() < num_samples
    if exact:
        assert len(everything) == num_samples, "not every sample was used"


def same_partition(a, b) -> bool:
    return len(a) == len(b) and all(np.array_equal(x, y) for x, y in zip(a, b, strict=True))


# --------------------------------------------------------------------------- every partitioner


def test_every_registered_partitioner_is_covered():
    assert {name for name, *_ in CASES} == set(PARTITIONERS)


@pytest.mark.parametrize("name,params,num_clients,exact", CASES, ids=CASE_IDS)
def test_partition_is_disjoint_nonempty_and_covers_as_promised(name, params, num_clients, exact):
    clients = partition(name, LABELS, num_clients, seed=0, **params)
    assert_valid_partition(clients, len(LABELS), num_clients, exact)


@pytest.mark.parametrize("name,params,num_clients,exact", CASES, ids=CASE_IDS)
def test_same_seed_same_partition_and_other_seed_differs(name, params, num_clients, exact):
    first = partition(name, LABELS, num_clients, seed=3, **params)
    again = partition(name, LABELS, num_clients, seed=3, **params)
    other = partition(name, LABELS, num_clients, seed=4, **params)
    assert same_partition(first, again)
    if name != "natural":  # the natural clients do not depend on the seed
        assert not same_partition(first, other)


# --------------------------------------------------------------------------- registry and errors


def test_unknown_partitioner_lists_valid_names():
    with pytest.raises(ValueError, match="unknown partitioner 'nope'.*dirichlet.*shards"):
        partition("nope", LABELS, 10)


def test_unknown_parameter_names_the_accepted_ones():
    with pytest.raises(
        ValueError, match=r"unknown parameter.*'beta'.*alpha.*min_size"
    ):
        partition("dirichlet", LABELS, 10, alpha=0.1, beta=1)


def test_missing_required_parameter_is_named():
    with pytest.raises(ValueError, match="needs parameter.*'classes_per_client'"):
        partition("pathological", LABELS, 10)


def test_registry_calls_the_function_with_the_same_result():
    direct = PARTITIONERS["dirichlet"](LABELS, 10, 5, alpha=0.3)
    assert same_partition(direct, partition("dirichlet", LABELS, 10, seed=5, alpha=0.3))


@pytest.mark.parametrize("num_clients", [0, -3, 1001])
def test_bad_num_clients_is_rejected(num_clients):
    with pytest.raises(ValueError, match="num_clients"):
        partition("iid", LABELS, num_clients)


@pytest.mark.parametrize(
    "labels", [np.array([]), np.array([[1, 2]]), np.array([0.5, 1.0]), np.array([-1, 2])]
)
def test_bad_labels_are_rejected(labels):
    with pytest.raises(ValueError, match="labels"):
        partition("iid", labels, 1)


# --------------------------------------------------------------------------- iid


def test_iid_sizes_differ_by_at_most_one():
    sizes = [len(c) for c in partition("iid", LABELS, 7)]
    assert max(sizes) - min(sizes) <= 1 and sum(sizes) == len(LABELS)


def test_iid_total_size_bounds():
    with pytest.raises(ValueError, match="total_size"):
        partition("iid", LABELS, 10, total_size=5000)


# --------------------------------------------------------------------------- dirichlet


def test_dirichlet_honours_min_size():
    # with min_size=1 a quarter of the draws have a client below 52; min_size=52 forbids them
    unconstrained = [
        partition("dirichlet", LABELS, 10, seed=s, alpha=1.0, min_size=1) for s in range(20)
    ]
    assert min(min(len(c) for c in clients) for clients in unconstrained) < 52
    for seed in range(20):
        clients = partition("dirichlet", LABELS, 10, seed=seed, alpha=1.0, min_size=52)
        assert min(len(c) for c in clients) >= 52


def mean_dominant_class_share(clients) -> float:
    counts = class_counts(LABELS, clients, NUM_CLASSES)
    return float((counts.max(axis=1) / counts.sum(axis=1)).mean())


def test_dirichlet_small_alpha_is_more_skewed_than_large_alpha():
    skewed = partition("dirichlet", LABELS, 10, seed=0, alpha=0.05, min_size=1)
    mild = partition("dirichlet", LABELS, 10, seed=0, alpha=100.0, min_size=1)
    assert mean_dominant_class_share(skewed) > 0.5 > 0.2 > mean_dominant_class_share(mild)


def test_dirichlet_unreachable_min_size_fails_after_bounded_tries():
    with pytest.raises(ValueError, match=r"max_tries=5.*min_size=19.*alpha.*num_clients=50"):
        partition("dirichlet", LABELS, 50, alpha=0.05, min_size=19, max_tries=5)


def test_dirichlet_impossible_min_size_fails_at_once():
    with pytest.raises(ValueError, match="min_size=30"):
        partition("dirichlet", LABELS, 50, alpha=1.0, min_size=30)


@pytest.mark.parametrize("alpha", [0, -1.0])
def test_dirichlet_alpha_must_be_positive(alpha):
    with pytest.raises(ValueError, match="alpha must be > 0"):
        partition("dirichlet", LABELS, 10, alpha=alpha)


# --------------------------------------------------------------------------- pathological (Pat-k)


@pytest.mark.parametrize("k,num_clients", [(1, 10), (1, 100), (2, 100), (3, 7), (10, 4)])
def test_pathological_gives_every_client_exactly_k_classes(k, num_clients):
    clients = partition("pathological", LABELS, num_clients, seed=2, classes_per_client=k)
    counts = class_counts(LABELS, clients, NUM_CLASSES)
    assert ((counts > 0).sum(axis=1) == k).all()
    owners = (counts > 0).sum(axis=0)
    assert owners.min() >= 1 and owners.max() - owners.min() <= 1
    for cls in range(NUM_CLASSES):  # each class split evenly among its owners
        shares = counts[counts[:, cls] > 0, cls]
        assert shares.max() - shares.min() <= 1


def test_pathological_k_larger_than_classes():
    with pytest.raises(ValueError, match="classes_per_client must be between 1 and .*10.* got 11"):
        partition("pathological", LABELS, 10, classes_per_client=11)


def test_pathological_too_few_owners():
    with pytest.raises(ValueError, match="some class would have no owner"):
        partition("pathological", LABELS, 4, classes_per_client=2)


# --------------------------------------------------------------------------- shards


@pytest.mark.parametrize(
    "num_clients,num_shards,per_client", [(100, 200, 2), (100, 500, 5), (20, 40, 2)]
)
def test_shards_sizes_and_class_limit(num_clients, num_shards, per_client):
    # McMahan et al. 2017 / FedFV (200 x 2) / FedMGDA+ (500 x 5)
    clients = partition(
        "shards", LABELS, num_clients, seed=0, num_shards=num_shards, shards_per_client=per_client
    )
    shard_size = len(LABELS) // num_shards
    assert all(len(c) == per_client * shard_size for c in clients)
    counts = class_counts(LABELS, clients, NUM_CLASSES)
    assert ((counts > 0).sum(axis=1) <= per_client).all()
    assert (counts % shard_size == 0).all()  # whole shards of one class each


def test_shards_leaves_out_the_remainder_only():
    clients = partition("shards", LABELS, 7, shards_per_client=3)
    assert sum(len(c) for c in clients) == len(LABELS) - len(LABELS) % 21


def test_shards_count_must_match_clients():
    with pytest.raises(
        ValueError, match=r"num_shards \(50\) must equal num_clients \* shards_per_client"
    ):
        partition("shards", LABELS, 20, num_shards=50, shards_per_client=2)


def test_shards_more_shards_than_samples():
    with pytest.raises(ValueError, match=r"num_shards \(1200\) exceeds the number of samples"):
        partition("shards", LABELS, 600, num_shards=1200, shards_per_client=2)


# --------------------------------------------------------------------------- power law (CGSV POW)


def test_power_law_sizes_increase_and_follow_the_quantiles():
    clients = partition("power_law", LABELS, 10)
    sizes = np.array([len(c) for c in clients])
    assert (np.diff(sizes) > 0).all() and sizes.sum() == len(LABELS)
    np.testing.assert_array_equal(sizes, power_law_sizes(len(LABELS), 10))
    # largest / smallest ~ (0.99 / 0.01) ** (1 / alpha) = 15.9 for CGSV's alpha = 1.659
    assert sizes[-1] / sizes[0] == pytest.approx(99 ** (1 / 1.65911332899), rel=0.05)


def test_power_law_smaller_alpha_is_more_unequal():
    steep, flat = power_law_sizes(6000, 10, alpha=0.8), power_law_sizes(6000, 10, alpha=5.0)
    assert steep[-1] / steep[0] > flat[-1] / flat[0]


def test_power_law_total_size_as_in_cgsv():
    clients = partition("power_law", LABELS, 5, total_size=600)  # CGSV: 600 per agent on average
    assert sum(len(c) for c in clients) == 600


def test_power_law_empty_client_names_parameters():
    with pytest.raises(ValueError, match="total_size.*alpha"):
        partition("power_law", LABELS, 100, total_size=120)


# --------------------------------------------------------------------------- linspace classes (CGSV CLA)


def test_linspace_class_numbers_match_the_paper():
    # CGSV: "for MNIST with 5 agents, agents 1, 2, 3, 4, 5 own ... 1, 3, 5, 7, 10 classes"
    assert linspace_class_numbers(5, 10).tolist() == [1, 3, 5, 7, 10]
    assert linspace_class_numbers(10, 10).tolist() == list(range(1, 11))


@pytest.mark.parametrize("random_classes", [False, True])
def test_linspace_classes_counts_follow_linspace(random_classes):
    labels = balanced_labels(per_class=1100)
    clients = partition(
        "linspace_classes", labels, 5, seed=0, samples_per_client=600, random_classes=random_classes
    )
    counts = class_counts(labels, clients, NUM_CLASSES)
    assert ((counts > 0).sum(axis=1) == [1, 3, 5, 7, 10]).all()
    assert (counts.sum(axis=1) == 600).all()
    for row in counts:  # equal share of the client's size per class
        held = row[row > 0]
        assert held.max() - held.min() <= 1
    if not random_classes:  # as in the authors' code: the first k classes
        assert all((row[:k] > 0).all() for row, k in zip(counts, [1, 3, 5, 7, 10], strict=True))


def test_linspace_classes_default_size_is_the_largest_feasible():
    clients = partition("linspace_classes", LABELS, 5)
    size = len(clients[0])
    assert all(len(c) == size for c in clients)
    with pytest.raises(ValueError, match=f"samples_per_client between 10 .* and {size}"):
        partition("linspace_classes", LABELS, 5, samples_per_client=size + 1)


# --------------------------------------------------------------------------- class assignment


def test_class_assignment_fedfv_fashion_mnist_three_clients():
    fake_fmnist = balanced_labels(per_class=60)
    clients = partition(
        "class_assignment", fake_fmnist, 3, assignment=[[6], [2], [0]]
    )  # shirt, pullover, T-shirt
    for client, cls in zip(clients, [6, 2, 0], strict=True):
        assert (fake_fmnist[client] == cls).all() and len(client) == 60


def test_class_assignment_splits_a_shared_class_evenly():
    clients = partition("class_assignment", LABELS, 3, assignment=[[0, 1], [1], [1]])
    counts = class_counts(LABELS, clients, NUM_CLASSES)
    assert counts[:, 1].tolist() == [34, 33, 33] and counts[0, 0] == 100


@pytest.mark.parametrize(
    "assignment,message",
    [
        ([[0], [1]], "has 2 class lists but num_clients=3"),
        ([[0], [1], [12]], "names class 12, which has no samples"),
        ([[0], [1, 1], [2]], "distinct class ids"),
        ([[0], [], [2]], "non-empty list"),
    ],
)
def test_class_assignment_errors(assignment, message):
    with pytest.raises(ValueError, match=message):
        partition("class_assignment", LABELS, 3, assignment=assignment)


# --------------------------------------------------------------------------- natural


def test_natural_groups_by_client_id():
    clients = partition("natural", LABELS, 7, client_ids=NATURAL_IDS)
    for k, client in enumerate(clients):
        np.testing.assert_array_equal(client, np.flatnonzero(NATURAL_IDS == k))


def test_natural_num_clients_must_match():
    with pytest.raises(ValueError, match="set num_clients=7"):
        partition("natural", LABELS, 5, client_ids=NATURAL_IDS)
    with pytest.raises(ValueError, match="one id per sample"):
        partition("natural", LABELS, 7, client_ids=NATURAL_IDS[:10])


# --------------------------------------------------------------------------- split and counts


def test_split_train_test_fractions_and_disjointness():
    clients = partition("power_law", LABELS, 10)
    train, test = split_train_test(clients, 0.2, seed=0)
    for whole, tr, te in zip(clients, train, test, strict=True):
        np.testing.assert_array_equal(np.sort(np.concatenate([tr, te])), whole)
        assert len(te) == round(0.2 * len(whole)) and len(tr) >= 1
    again = split_train_test(clients, 0.2, seed=0)
    assert same_partition(train, again[0]) and same_partition(test, again[1])


def test_split_train_test_keeps_one_training_sample():
    train, test = split_train_test([np.array([4]), np.array([5, 6])], 0.9, seed=0)
    assert [len(t) for t in train] == [1, 1] and [len(t) for t in test] == [0, 1]


@pytest.mark.parametrize("fraction", [-0.1, 1.0, 1.5])
def test_split_train_test_fraction_range(fraction):
    with pytest.raises(ValueError, match=r"test_fraction must be in \[0, 1\)"):
        split_train_test([np.arange(10)], fraction, seed=0)


def test_class_counts_table():
    labels = np.array([0, 1, 1, 2, 2, 2])
    counts = class_counts(labels, [np.array([0, 1]), np.array([2, 3, 4, 5])], 4)
    assert counts.tolist() == [[1, 1, 0, 0], [0, 1, 3, 0]]
    with pytest.raises(ValueError, match="num_classes=2"):
        class_counts(labels, [np.array([0])], 2)


# --------------------------------------------------------------------------- properties


@st.composite
def labels_and_clients(draw):
    num_classes = draw(st.integers(1, 6))
    labels = np.array(draw(st.lists(st.integers(0, num_classes - 1), min_size=1, max_size=300)))
    num_clients = draw(st.integers(1, min(len(labels), 25)))
    return labels, num_clients


@settings(max_examples=50, deadline=None)
@given(
    data=labels_and_clients(),
    seed=st.integers(0, 2**16),
    name=st.sampled_from(["iid", "dirichlet", "pathological"]),
)
def test_property_exact_cover_partitioners(data, seed, name):
    labels, num_clients = data
    params = {
        "iid": {},
        "dirichlet": {"alpha": 0.5, "min_size": 1, "max_tries": 20},
        "pathological": {"classes_per_client": 1},
    }[name]
    try:
        clients = partition(name, labels, num_clients, seed=seed, **params)
    except ValueError as error:  # an infeasible request must say so, never return junk
        assert (
            "num_clients" in str(error)
            or "min_size" in str(error)
            or "classes_per_client" in str(error)
        )
        return
    assert_valid_partition(clients, len(labels), num_clients, exact=True)


@settings(max_examples=50, deadline=None)
@given(data=labels_and_clients(), seed=st.integers(0, 2**16), per_client=st.integers(1, 4))
def test_property_shards_use_each_sample_at_most_once(data, seed, per_client):
    labels, num_clients = data
    if num_clients * per_client > len(labels):
        with pytest.raises(ValueError, match="num_shards"):
            partition("shards", labels, num_clients, seed=seed, shards_per_client=per_client)
        return
    clients = partition("shards", labels, num_clients, seed=seed, shards_per_client=per_client)
    assert_valid_partition(clients, len(labels), num_clients, exact=False)
    shard_size = len(labels) // (num_clients * per_client)
    assert all(len(c) == per_client * shard_size for c in clients)
