"""Sentence classification sources of CGSV (Xu et al., NeurIPS 2021, Sec. 4 and App. B): ``mr``
and ``sst``, read from their published files and given as padded token ids for a Kim-style text
CNN (``fl_text_cnn``).

* ``mr``: the movie-review sentence polarity data v1.0 of Pang & Lee (ACL 2005):
  ``<data_dir>/mr/rt-polarity.pos`` and ``rt-polarity.neg`` (latin-1, one sentence a line;
  label 1 = positive). It has no official test split: a permutation seeded by ``split_seed``
  (not the run's seed, so every run shares it) holds out ``test_fraction`` of the 10,662
  sentences; the default 0.1 leaves CGSV's 9,596 training sentences (App. B.1).
* ``sst``: SST-5, the fine-grained Stanford Sentiment Treebank (Socher et al., EMNLP 2013), as
  CGSV's 8,544 training sentences imply: the PTB-format trees ``<data_dir>/sst/train.txt`` and
  ``test.txt`` of ``trainDevTestTrees_PTB.zip`` (one tree a line; ``dev.txt`` is not read). A
  sentence is the tree's leaves, its label the root's (0 very negative .. 4 very positive).

Tokens: the ``clean_str`` of Kim (EMNLP 2014): characters other than letters, digits and
``( ) , ! ? ' ` `` become spaces, clitics (``'s 've n't 're 'd 'll``) and ``, ! ( ) ?`` are split
off, everything lower-cased. Vocabulary: the training sentences' tokens by count (ties by the
token), the ``max_vocab - 2`` most frequent after ``<pad>`` = 0 and ``<unk>`` = 1. A sentence is
its first ``max_length`` ids, padded with 0 at the end. Ids are stored as float32 (sources give
float inputs; the model casts them back). CGSV's embeddings are trained from scratch here: there
are no pre-trained word vectors offline.
"""

from __future__ import annotations

import os
import re
from collections import Counter

import numpy as np
import torch

from fl_lightning.data.source_registry import SourceData, SourceInfo, register_source

PAD, UNK = 0, 1
MR_OBTAIN = ("the sentence polarity dataset v1.0 of Pang & Lee, "
             "https://www.cs.cornell.edu/people/pabo/movie-review-data/rt-polaritydata.tar.gz "
             "(rt-polaritydata/rt-polarity.pos and .neg, unchanged), into <data_dir>/mr/")
SST_OBTAIN = ("the Stanford Sentiment Treebank's PTB trees, "
              "https://nlp.stanford.edu/sentiment/trainDevTestTrees_PTB.zip "
              "(trees/train.txt and test.txt, unchanged), into <data_dir>/sst/")

_CLITICS = re.compile(r"('s|'ve|n't|'re|'d|'ll)")
_SPLIT = re.compile(r"([,!?()])")
_DROP = re.compile(r"[^A-Za-z0-9(),!?'`]")
_LEAF = re.compile(r"\(\d+ ([^()\s]+)\)")
_PTB_BRACKETS = {"-LRB-": "(", "-RRB-": ")", "-LSB-": "[", "-RSB-": "]", "-LCB-": "{", "-RCB-": "}"}


def tokenize(sentence: str) -> list[str]:
    """Kim's (EMNLP 2014) ``clean_str``, split into tokens."""
    text = _DROP.sub(" ", sentence)
    text = _CLITICS.sub(r" \1", text)
    text = _SPLIT.sub(r" \1 ", text)
    return text.lower().split()


def build_vocabulary(sentences: list[list[str]], max_vocab: int) -> dict[str, int]:
    """Token -> id: ``<pad>`` 0, ``<unk>`` 1, then the most frequent tokens (ties by the token)."""
    counts = Counter(token for tokens in sentences for token in tokens)
    ranked = sorted(counts, key=lambda token: (-counts[token], token))[: max(max_vocab - 2, 0)]
    return {"<pad>": PAD, "<unk>": UNK, **{token: i + 2 for i, token in enumerate(ranked)}}


def encode(sentences: list[list[str]], vocabulary: dict[str, int], max_length: int) -> torch.Tensor:
    """(N, max_length) float32 ids: truncated, or padded with 0 at the end; unknown tokens 1."""
    ids = np.full((len(sentences), max_length), PAD, dtype=np.float32)
    for row, tokens in enumerate(sentences):
        kept = [vocabulary.get(token, UNK) for token in tokens[:max_length]]
        ids[row, : len(kept)] = kept
    return torch.from_numpy(ids)


def parse_ptb_tree(line: str) -> tuple[int, list[str]]:
    """(root label, leaves) of one SST tree such as ``(3 (2 It) (4 (2 's) (3 fine)))``."""
    line = line.strip()
    match = re.match(r"\(\s*(\d+)\s", line)
    if match is None:
        raise ValueError(f"not a PTB tree with a numeric root label: {line[:60]!r}")
    leaves = [_PTB_BRACKETS.get(leaf, leaf) for leaf in _LEAF.findall(line)]
    return int(match.group(1)), leaves


def _check_text_params(name: str, max_vocab: int, max_length: int) -> None:
    for key, value, least in (("max_vocab", max_vocab, 3), ("max_length", max_length, 1)):
        if isinstance(value, bool) or not isinstance(value, int) or value < least:
            raise ValueError(f"{name} {key} must be an integer >= {least}, got {value!r}")


def _require(paths: list[str], name: str, obtain: str) -> None:
    missing = [path for path in paths if not os.path.isfile(path)]
    if missing:
        names = ", ".join(os.path.basename(p) for p in missing)
        raise FileNotFoundError(f"{name} not found: {names} missing in {os.path.dirname(missing[0])!r}; get them from "
                                f"{obtain}")


def _source_data(train: list[list[str]], y_train, test: list[list[str]], y_test,
                 max_vocab: int, max_length: int, info: SourceInfo) -> SourceData:
    vocabulary = build_vocabulary(train, max_vocab)
    return SourceData(encode(train, vocabulary, max_length), torch.as_tensor(y_train, dtype=torch.int64),
                      encode(test, vocabulary, max_length), torch.as_tensor(y_test, dtype=torch.int64), info)


# --------------------------------------------------------------------------- MR


def mr_files(data_dir: str, **_) -> list[str]:
    return [os.path.join(data_dir, "mr", f"rt-polarity.{kind}") for kind in ("pos", "neg")]


def _describe_held_out(name: str, max_vocab: int, max_length: int, test_fraction: float) -> SourceInfo:
    """A 2-class sentence source without an official test split (one held out by ``_held_out_split``)."""
    _check_text_params(name, max_vocab, max_length)
    if not 0 < test_fraction < 1:
        raise ValueError(f"{name} test_fraction must be in (0, 1), got {test_fraction!r}")
    return SourceInfo(name, 2, (int(max_length),), has_official_test=True, natural_clients=False)


def _held_out_split(sentences: list[list[str]], labels: list[int], test_fraction: float, split_seed: int,
                    max_vocab: int, max_length: int, info: SourceInfo) -> SourceData:
    """``test_fraction`` of the sentences held out by a permutation seeded with ``split_seed`` (not
    the run's seed, so every run shares the split); the vocabulary from the rest."""
    order = np.random.default_rng(split_seed).permutation(len(sentences))
    num_test = int(len(sentences) * test_fraction)
    test_rows, train_rows = np.sort(order[:num_test]), np.sort(order[num_test:])
    y = np.asarray(labels)
    return _source_data([sentences[i] for i in train_rows], y[train_rows], [sentences[i] for i in test_rows],
                        y[test_rows], max_vocab, max_length, info)


def _describe_mr(max_vocab: int = 20000, max_length: int = 56, test_fraction: float = 0.1,
                 split_seed: int = 0) -> SourceInfo:
    return _describe_held_out("mr", max_vocab, max_length, test_fraction)


@register_source("mr", info=_describe_mr, files=mr_files, obtain=MR_OBTAIN)
def _load_mr(data_dir: str, download: bool, seed: int, max_vocab: int = 20000, max_length: int = 56,
             test_fraction: float = 0.1, split_seed: int = 0) -> SourceData:
    """MR (Pang & Lee, ACL 2005): 2 classes, a seeded held-out test split (module docstring)."""
    paths = mr_files(data_dir)
    _require(paths, "MR", MR_OBTAIN)
    sentences, labels = [], []
    for path, label in zip(paths, (1, 0)):
        with open(path, encoding="latin-1") as file:
            lines = [line for line in file.read().splitlines() if line.strip()]
        sentences += [tokenize(line) for line in lines]
        labels += [label] * len(lines)
    return _held_out_split(sentences, labels, test_fraction, split_seed, max_vocab, max_length,
                           _describe_mr(max_vocab, max_length, test_fraction))


# --------------------------------------------------------------------------- SST-5


def sst_files(data_dir: str, **_) -> list[str]:
    return [os.path.join(data_dir, "sst", f"{split}.txt") for split in ("train", "test")]


def _describe_sst(max_vocab: int = 20000, max_length: int = 53) -> SourceInfo:
    _check_text_params("sst", max_vocab, max_length)
    return SourceInfo("sst", 5, (int(max_length),), has_official_test=True, natural_clients=False)


def _read_trees(path: str) -> tuple[list[list[str]], list[int]]:
    sentences, labels = [], []
    with open(path, encoding="utf-8", errors="replace") as file:
        for number, line in enumerate(file, 1):
            if not line.strip():
                continue
            try:
                label, leaves = parse_ptb_tree(line)
            except ValueError as error:
                raise ValueError(f"{path}: line {number}: {error}; use the unchanged files from {SST_OBTAIN}") from None
            if not 0 <= label <= 4:
                raise ValueError(f"{path}: line {number} has the root label {label}, not 0..4 (SST-5)")
            sentences.append(tokenize(" ".join(leaves)))
            labels.append(label)
    return sentences, labels


@register_source("sst", info=_describe_sst, files=sst_files, obtain=SST_OBTAIN)
def _load_sst(data_dir: str, download: bool, seed: int, max_vocab: int = 20000, max_length: int = 53) -> SourceData:
    """SST-5 (Socher et al., EMNLP 2013): 5 classes, sentences of the official train/test trees."""
    paths = sst_files(data_dir)
    _require(paths, "SST", SST_OBTAIN)
    (train, y_train), (test, y_test) = (_read_trees(path) for path in paths)
    return _source_data(train, y_train, test, y_test, max_vocab, max_length, _describe_sst(max_vocab, max_length))


# --------------------------------------------------------------------------- pydoc_sentences (offline)

# the help topics that document a statement (The Python Language Reference, chapters 7 and 8)
STATEMENT_TOPICS = frozenset({
    "assert", "assignment", "augassign", "break", "class", "compound", "continue", "del", "for", "function",
    "global", "if", "import", "nonlocal", "pass", "raise", "return", "try", "while", "with", "yield",
})
_SENTENCE_END = re.compile(r"(?<=[.!?])\s+|\n\s*\n")


def _describe_pydoc_sentences(max_vocab: int = 5000, max_length: int = 40, test_fraction: float = 0.1,
                              split_seed: int = 0) -> SourceInfo:
    return _describe_held_out("pydoc_sentences", max_vocab, max_length, test_fraction)


def pydoc_sentences() -> tuple[list[list[str]], list[int]]:
    """Every sentence (at least 4 tokens) of Python's help topics, tokenized, and its label:
    1 when its topic documents a statement (:data:`STATEMENT_TOPICS`), else 0."""
    from pydoc_data.topics import topics

    sentences, labels = [], []
    for name in sorted(topics):
        for text in _SENTENCE_END.split(topics[name]):
            tokens = tokenize(text)
            if len(tokens) >= 4:
                sentences.append(tokens)
                labels.append(int(name in STATEMENT_TOPICS))
    return sentences, labels


@register_source("pydoc_sentences", info=_describe_pydoc_sentences)
def _load_pydoc_sentences(data_dir: str, download: bool, seed: int, max_vocab: int = 5000, max_length: int = 40,
                          test_fraction: float = 0.1, split_seed: int = 0) -> SourceData:
    """OFFLINE-SCALE stand-in for MR (sentence classification with the text CNN, CGSV Sec. 4): the
    sentences of the English help text shipped with Python (``pydoc_data.topics``), 2 classes
    (does the sentence's topic document a statement, or an expression, type or object?), a
    held-out ``test_fraction`` drawn as MR's, Kim's tokens and a training vocabulary. The text
    depends on the Python version only; ``seed`` is not used."""
    sentences, labels = pydoc_sentences()
    return _held_out_split(sentences, labels, test_fraction, split_seed, max_vocab, max_length,
                           _describe_pydoc_sentences(max_vocab, max_length, test_fraction))
