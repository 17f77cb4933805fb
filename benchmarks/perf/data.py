"""Clients for the performance suite: a fixed, small number of samples per client.

Every backbone gets data of its own input shape, with ``samples_per_client`` training
samples per client (so cells of different sizes do the same work per client):

* ``fl_logreg``: ``synthetic`` (Synthetic(0.5, 0.5), 60 features);
* ``fl_mlp``: ``mnist5k`` (1x28x28, the 784-200-200-10 MLP of FedLF);
* the CIFAR-shaped models (3x32x32): no source gives CIFAR-shaped images offline (the
  torchvision CIFAR sources need downloaded files), so ``RandomImageData`` fills a
  ``FederatedDataModule`` with seeded N(0, 1) images and uniform labels. Timing does not
  depend on pixel values, so random images measure the same work as CIFAR-10 would;
* the token models (``fl_text_cnn``: MR's 56 tokens of a 20,000-word vocabulary, 2 classes;
  ``fl_lstm_chars``: Shakespeare's 80 characters of 80, 80 classes): seeded uniform token ids,
  since MR, SST and LEAF's files are not offline either.

Real sources use the ``iid`` partition of a random subset of ``num_clients *
samples_per_client`` samples (its ``total_size``) and no local test split, so every client
holds exactly ``samples_per_client`` training samples.
"""

from __future__ import annotations

import torch

from fl_lightning.data.datamodule import FederatedDataModule

IMAGE_SHAPE = (3, 32, 32)
SOURCES = {"fl_logreg": "synthetic", "fl_mlp": "mnist5k", "fl_cnn_mnist": "mnist5k"}
TOKENS = {"fl_text_cnn": ((56,), 20000, 2), "fl_lstm_chars": ((80,), 80, 80)}  # input shape, vocabulary, classes
TEST_SAMPLES_PER_CLIENT = 2  # a client's local test set (never evaluated in the suite)


class RandomImageData(FederatedDataModule):
    """``num_clients`` clients of ``samples_per_client`` random images each.

    A ``FederatedDataModule`` in every respect the federated module uses (the client
    tensors, ``num_classes``, ``input_shape``, ``to``, the round-marker loaders); only
    ``setup`` differs: it draws the tensors instead of loading a source.
    """

    def __init__(
        self,
        num_clients: int,
        samples_per_client: int,
        input_shape: tuple[int, ...] = IMAGE_SHAPE,
        num_classes: int = 10,
        seed: int = 0,
        vocab_size: int | None = None,
    ) -> None:
        # the parent's arguments only pass its checks; setup() never loads the source
        super().__init__(source="digits", num_clients=num_clients, partition="iid", test_mode="local", seed=seed)
        if samples_per_client < 1:
            raise ValueError(f"samples_per_client must be >= 1, got {samples_per_client}")
        self.samples_per_client = samples_per_client
        self.input_shape = tuple(input_shape)
        self.num_classes = num_classes
        self.vocab_size = vocab_size  # token ids in [0, vocab_size) as floats instead of N(0, 1) images

    def setup(self, stage: str | None = None) -> None:
        """Fills the train and test splits once: ``samples_per_client`` training and
        ``TEST_SAMPLES_PER_CLIENT`` test samples per client of seeded N(0, 1) inputs (token
        ids with a ``vocab_size``) and uniform labels, each client a contiguous block."""
        if self.train_x is not None:
            return
        generator = torch.Generator().manual_seed(self.seed)
        k = self.num_clients
        for split, per_client in (("train", self.samples_per_client), ("test", TEST_SAMPLES_PER_CLIENT)):
            n = k * per_client
            x = (torch.randn(n, *self.input_shape, generator=generator) if self.vocab_size is None else
                 torch.randint(self.vocab_size, (n, *self.input_shape), generator=generator).float())
            setattr(self, f"{split}_x", x)
            setattr(self, f"{split}_y", torch.randint(self.num_classes, (n,), generator=generator))
            setattr(self, f"{split}_index", torch.arange(n).view(k, per_client))
            setattr(self, f"{split}_sizes", torch.full((k,), per_client, dtype=torch.int64))


def clients_for(model: str, num_clients: int, samples_per_client: int, seed: int = 0) -> FederatedDataModule:
    """A set-up data module for ``model``: its input shape, ``samples_per_client`` each."""
    source = SOURCES.get(model)
    if model in TOKENS:
        shape, vocab, classes = TOKENS[model]
        data: FederatedDataModule = RandomImageData(num_clients, samples_per_client, shape, classes, seed, vocab)
    elif source is None:
        data = RandomImageData(num_clients, samples_per_client, seed=seed)
    else:
        data = FederatedDataModule(
            source=source, num_clients=num_clients, partition="iid", test_mode="local",
            partition_params={"total_size": num_clients * samples_per_client},
            local_test_fraction=0.0, seed=seed,
        )
    data.setup("fit")
    return data
