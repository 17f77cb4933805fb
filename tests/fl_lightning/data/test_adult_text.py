"""MR and SST (CGSV's text sources) on fixture files in their published formats, and the Kim
text CNN fl_text_cnn (stacked and vmap engines equal to the sequential one, a FedAvg fit).
Adult's fixture tests are in test_adult.py."""

import lightning.pytorch as pl
import pytest
import timm
import torch

from fl_lightning.algorithms import FedAvg
from fl_lightning.core.engines import SequentialEngine, VectorisedEngine
from fl_lightning.core.flat import ParameterLayout
from fl_lightning.core.local import ClientShards, LocalSGD, batch_order, masked_cross_entropy
from fl_lightning.data import FederatedDataModule, load_source, source_info
from fl_lightning.data.sources import missing_files
from fl_lightning.data.text import build_vocabulary, encode, parse_ptb_tree, tokenize
from fl_lightning.models.stacked import why_not_stacked

POSITIVE = [f"a gorgeous , witty film pos{i} that's sure to please\u00e9 !" for i in range(20)]
NEGATIVE = [f"the plot doesn't neg{i} work at all , a mess ." for i in range(20)]
TREES = [
    "(3 (2 It) (4 (4 (2 's) (4 (3 (2 a) (4 (3 lovely) (2 film))) (2 (2 -LRB-) (2 really) (2 -RRB-)))) (2 .)))",
    "(0 (1 (2 The) (1 (0 worst)) (2 movie)) (2 .))",
    "(4 (4 (2 A) (4 masterpiece)) (2 !))",
    "(1 (2 Not) (1 (2 very) (3 good)))",
    "(2 (2 It) (2 (2 is) (2 a) (2 movie)))",
]


@pytest.fixture
def mr_dir(tmp_path):
    (tmp_path / "mr").mkdir()
    (tmp_path / "mr" / "rt-polarity.pos").write_bytes(("\n".join(POSITIVE) + "\n").encode("latin-1"))
    (tmp_path / "mr" / "rt-polarity.neg").write_bytes(("\n".join(NEGATIVE) + "\n").encode("latin-1"))
    return tmp_path


@pytest.fixture
def sst_dir(tmp_path):
    (tmp_path / "sst").mkdir()
    (tmp_path / "sst" / "train.txt").write_text("\n".join(TREES[:4]) + "\n")
    (tmp_path / "sst" / "test.txt").write_text(TREES[4] + "\n")
    return tmp_path


def test_kim_tokens_vocabulary_and_padding():
    assert tokenize("It's (very) good, isn't it? Don't -- 1/2!") == [
        "it", "'s", "(", "very", ")", "good", ",", "is", "n't", "it", "?", "do", "n't", "1", "2", "!"]
    vocabulary = build_vocabulary([["b", "a", "b"], ["c", "a", "b"]], max_vocab=4)
    assert vocabulary == {"<pad>": 0, "<unk>": 1, "b": 2, "a": 3}  # by count, then the token; c cut off
    ids = encode([["a", "c", "b"], ["b", "b", "b", "b", "a"]], vocabulary, max_length=4)
    assert ids.dtype == torch.float32 and ids.tolist() == [[3, 1, 2, 0], [2, 2, 2, 2]]


def test_sst_tree_gives_root_label_and_leaves():
    label, leaves = parse_ptb_tree(TREES[0])
    assert label == 3 and leaves == ["It", "'s", "a", "lovely", "film", "(", "really", ")", "."]
    with pytest.raises(ValueError, match="not a PTB tree"):
        parse_ptb_tree("It 's a lovely film")


def test_mr_seeded_disjoint_split_and_vocabulary_from_training_only(mr_dir):
    data = load_source("mr", str(mr_dir), max_length=12, test_fraction=0.25)
    assert data.info.num_classes == 2 and data.info.input_shape == (12,) and not data.info.natural_clients
    assert data.x_train.shape == (30, 12) and data.x_test.shape == (10, 12)
    assert data.x_train.dtype == torch.float32 and data.y_train.dtype == torch.int64
    assert data.y_train.sum() + data.y_test.sum() == 20  # 20 positive sentences (label 1) in all
    # every sentence has its own token (posN 6th in a positive one, negN 5th in a negative one):
    # known for the training rows, unknown (1) for the held-out rows: the vocabulary is the training data's
    own = lambda x, y: torch.where(y == 1, x[:, 5], x[:, 4])  # noqa: E731
    assert (own(data.x_train, data.y_train) > 1).all() and (own(data.x_test, data.y_test) == 1).all()
    assert len(set(own(data.x_train, data.y_train).tolist())) == 30
    again = load_source("mr", str(mr_dir), max_length=12, test_fraction=0.25, seed=7)  # the run seed: same split
    assert torch.equal(again.x_test, data.x_test) and torch.equal(again.y_test, data.y_test)
    other = load_source("mr", str(mr_dir), max_length=12, test_fraction=0.25, split_seed=1)
    assert not torch.equal(other.y_test, data.y_test) or not torch.equal(other.x_test, data.x_test)
    assert load_source("mr", str(mr_dir)).x_train.shape == (36, 56)  # default: 10% held out (CGSV's 9,596 of 10,662)


def test_sst_five_classes_from_the_trees(sst_dir):
    data = load_source("sst", str(sst_dir), max_length=6)
    assert source_info("sst").num_classes == 5 and data.info.input_shape == (6,)
    assert data.y_train.tolist() == [3, 0, 4, 1] and data.y_test.tolist() == [2]
    # training tokens: "it" x2, "." x2, "'s a lovely film ( really ) the worst movie ! masterpiece not very good"
    vocabulary = build_vocabulary([tokenize(" ".join(parse_ptb_tree(t)[1])) for t in TREES[:4]], 20000)
    assert data.x_train[0].tolist() == [vocabulary[t] for t in ["it", "'s", "a", "lovely", "film", "("]]
    assert data.x_train[3].tolist() == [vocabulary["not"], vocabulary["very"], vocabulary["good"], 0, 0, 0]
    assert data.x_test[0].tolist() == [vocabulary["it"], 1, vocabulary["a"], vocabulary["movie"], 0, 0]  # "is": unk


def test_missing_files_and_bad_parameters_say_what_to_do(tmp_path, sst_dir):
    with pytest.raises(FileNotFoundError, match=r"rt-polarity.pos, rt-polarity.neg missing .*cornell.edu"):
        load_source("mr", str(tmp_path / "none"))
    with pytest.raises(FileNotFoundError, match=r"SST not found: train.txt, test.txt .*trainDevTestTrees_PTB.zip"):
        load_source("sst", str(tmp_path / "none"))
    missing, obtain = missing_files("sst", str(tmp_path / "none"))
    assert [p.rsplit("/", 2)[1:] for p in missing] == [
        ["sst", "train.txt"],
        ["sst", "test.txt"],
    ] and "stanford" in obtain
    assert missing_files("sst", str(sst_dir)) == ([], "")
    with pytest.raises(ValueError, match="max_length must be an integer >= 1"):
        source_info("mr", max_length=0)
    with pytest.raises(ValueError, match="test_fraction must be in"):
        source_info("mr", test_fraction=1.0)
    (sst_dir / "sst" / "test.txt").write_text("not a tree\n")
    with pytest.raises(ValueError, match="test.txt: line 1: not a PTB tree"):
        load_source("sst", str(sst_dir))


def test_text_cnn_shape_parameters_and_stacked_forward():
    model = timm.create_model("fl_text_cnn", num_classes=5, input_shape=(20,), vocab_size=100)
    assert model(torch.randint(0, 100, (3, 20)).float()).shape == (3, 5)
    # Kim: embedding 300, widths 3/4/5 x 100 filters, 300 -> 5
    convs = sum(300 * 100 * k + 100 for k in (3, 4, 5))
    assert sum(p.numel() for p in model.parameters()) == 100 * 300 + convs + 300 * 5 + 5
    assert why_not_stacked(model) is None
    with pytest.raises(ValueError, match="at most max_length"):
        timm.create_model("fl_text_cnn", input_shape=(4,))


def engines_on_three_clients(forward, drop_rate):
    torch.manual_seed(0)
    model = timm.create_model("fl_text_cnn", input_shape=(9,), vocab_size=30, embedding_dim=8,
                              num_filters=4, drop_rate=drop_rate)
    sizes = [5, 2, 7]
    g = torch.Generator().manual_seed(1)
    total = sum(sizes)
    x = torch.randint(0, 30, (total + 1, 9), generator=g).float()
    y = torch.randint(0, 2, (total + 1,), generator=g)
    index = torch.full((len(sizes), max(sizes)), total, dtype=torch.long)
    start = 0
    for k, n in enumerate(sizes):
        index[k, :n] = torch.arange(start, start + n)
        start += n
    shards = ClientShards(x, y, index, torch.tensor(sizes), list(sizes))
    order = batch_order(shards.sizes, max(sizes), 2, torch.Generator().manual_seed(3))
    sgd = LocalSGD(lr=0.5, momentum=0.5, epochs=2, batch_size=3)
    layout = ParameterLayout.of(model)
    params = dict(model.named_parameters())

    def ce(logits, targets, mask, local_params, global_params):
        return masked_cross_entropy(logits, targets, mask)

    engine = VectorisedEngine(forward=forward)
    vec = layout.flatten_stacked(engine.train(model, layout, params, shards, order, sgd, ce))
    assert engine.forward_kind == ("vmap" if forward == "vmap" else "stacked"), engine.forward_reason
    seq = layout.flatten_stacked(SequentialEngine().train(model, layout, params, shards, order, sgd, ce))
    return vec, seq, layout.flatten(params)


@pytest.mark.parametrize("forward", ["auto", "vmap"])
def test_text_cnn_vectorised_equals_sequential(forward):
    vec, seq, start = engines_on_three_clients(forward, drop_rate=0.0)  # dropout off: engines compared exactly
    assert torch.allclose(vec, seq, atol=1e-5), (vec - seq).abs().max()
    assert not torch.allclose(vec, start.expand_as(vec))


@pytest.mark.parametrize("forward", ["auto", "vmap"])
def test_text_cnn_trains_with_dropout_in_both_vectorised_forwards(forward):
    vec, _, _ = engines_on_three_clients(forward, drop_rate=0.5)  # independent masks per client (randomness)
    assert torch.isfinite(vec).all()


@pytest.mark.filterwarnings("ignore")
def test_fedavg_fits_mr_with_the_text_cnn(mr_dir):
    data = FederatedDataModule(source="mr", num_clients=3, partition="iid", test_mode="local", data_dir=str(mr_dir),
                               source_params={"max_length": 12, "max_vocab": 100}, seed=0)
    module = FedAvg(backbone="fl_text_cnn", backbone_kwargs={"vocab_size": 100, "embedding_dim": 16, "num_filters": 8},
                    num_classes=data.num_classes, input_shape=data.input_shape, num_rounds=2,
                    fraction=1.0, batch_size=8, lr=0.1, eval_every=1, seed=0, engine="vectorised")
    trainer = pl.Trainer(accelerator="cpu", logger=False, enable_checkpointing=False,
                         enable_progress_bar=False, enable_model_summary=False, num_sanity_val_steps=0)
    trainer.fit(module, datamodule=data)
    assert module.round_engine.runner.engine_used == "vectorised"
    assert trainer.current_epoch == 2
    assert all(torch.isfinite(p).all() for p in module.model.parameters())


def test_pydoc_sentences_offline_stand_in_is_labelled_by_topic_and_split_once():
    from pydoc_data.topics import topics

    from fl_lightning.data.text import STATEMENT_TOPICS, pydoc_sentences

    assert STATEMENT_TOPICS <= set(topics)  # every statement topic exists in this Python's help
    sentences, labels = pydoc_sentences()
    assert all(len(tokens) >= 4 for tokens in sentences) and set(labels) == {0, 1}
    data = load_source("pydoc_sentences")
    assert len(data.y_train) + len(data.y_test) == len(sentences)
    assert len(data.y_test) == int(len(sentences) * 0.1)
    assert data.x_train.shape[1] == 40 and source_info("pydoc_sentences").num_classes == 2
    assert set(data.y_train.tolist()) == {0, 1} and set(data.y_test.tolist()) == {0, 1}
    again = load_source("pydoc_sentences", seed=7)  # the run's seed does not move the split
    assert torch.equal(again.x_test, data.x_test) and torch.equal(again.y_train, data.y_train)
    other = load_source("pydoc_sentences", split_seed=1)
    assert not torch.equal(other.y_test, data.y_test)
    with pytest.raises(ValueError, match="max_length"):
        source_info("pydoc_sentences", max_length=0)


def test_cgsv_fits_five_power_law_agents_of_pydoc_sentences():
    from fl_lightning.algorithms import CGSV

    data = FederatedDataModule(source="pydoc_sentences", num_clients=5, partition="power_law",
                               partition_params={"total_size": 1000}, test_mode="global", seed=0)
    module = CGSV(backbone="fl_text_cnn", backbone_kwargs={"vocab_size": 5000, "embedding_dim": 8, "num_filters": 4},
                  num_classes=2, input_shape=(40,), num_rounds=2, fraction=1.0, batch_size=32, lr=0.1, gamma=1.0,
                  track_standalone=True, eval_every=1, seed=0)
    trainer = pl.Trainer(accelerator="cpu", logger=False, enable_checkpointing=False, enable_progress_bar=False,
                         enable_model_summary=False, num_sanity_val_steps=0, max_epochs=1000)
    trainer.fit(module, datamodule=data)
    assert sorted(data.train_sizes.tolist()) != [200] * 5 and int(data.train_sizes.sum()) == 1000  # POW sizes
    assert trainer.current_epoch == 2 and 0.0 <= float(trainer.callback_metrics["test_acc_mean"]) <= 1.0
