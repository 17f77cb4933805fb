"""UCI Adult in its published files: the 99 binary features, the PhD / non-PhD clients, errors, a fit."""

import lightning.pytorch as pl
import numpy as np
import pytest
import torch

from fl_lightning.algorithms import FedAvg
from fl_lightning.data.adult import NUM_FEATURES, encode_rows
from fl_lightning.data.datamodule import FederatedDataModule
from fl_lightning.data.sources import load_source, missing_files

TRAIN = """39, State-gov, 77516, Bachelors, 13, Never-married, Adm-clerical, Not-in-family, White, Male, 2174, 0, 40, United-States, <=50K
50, Self-emp-not-inc, 83311, Bachelors, 13, Married-civ-spouse, Exec-managerial, Husband, White, Male, 0, 0, 13, United-States, <=50K
52, Private, 287927, Doctorate, 16, Married-civ-spouse, Prof-specialty, Wife, White, Female, 15024, 0, 40, United-States, >50K
54, ?, 180211, Some-college, 10, Married-civ-spouse, ?, Husband, Asian-Pac-Islander, Male, 0, 0, 60, South, >50K
45, Private, 172274, Doctorate, 16, Divorced, Prof-specialty, Unmarried, Black, Female, 0, 3004, 35, United-States, >50K
31, Private, 45781, Masters, 14, Never-married, Prof-specialty, Not-in-family, White, Female, 14084, 0, 50, ?, >50K

"""
TEST = """|1x3 Cross validator
25, Private, 226802, 11th, 7, Never-married, Machine-op-inspct, Own-child, Black, Male, 0, 0, 40, United-States, <=50K.
38, Private, 89814, HS-grad, 9, Married-civ-spouse, Farming-fishing, Husband, White, Male, 0, 0, 50, United-States, <=50K.
44, Private, 160323, Doctorate, 16, Married-civ-spouse, Prof-specialty, Husband, White, Male, 7688, 0, 40, India, >50K.
"""


@pytest.fixture
def adult_dir(tmp_path):
    (tmp_path / "adult").mkdir()
    (tmp_path / "adult" / "adult.data").write_text(TRAIN)
    (tmp_path / "adult" / "adult.test").write_text(TEST)
    return tmp_path


def test_a_row_becomes_the_one_hot_of_its_eight_categorical_attributes():
    x, y, phd = encode_rows(TRAIN.splitlines()[:1], "adult.data")
    assert NUM_FEATURES == 99 and x.shape == (1, 99)
    # workclass State-gov (6th of 8) | education Bachelors (1st of 16, from 8) | marital Never-married
    # (3rd of 7, from 24) | occupation Adm-clerical (9th of 14, from 31) | relationship Not-in-family
    # (4th of 6, from 45) | race White (1st of 5, from 51) | sex Male (2nd of 2, from 56) | country
    # United-States (1st of 41, from 58)
    assert np.flatnonzero(x[0]).tolist() == [5, 8, 26, 39, 48, 51, 57, 58]
    assert y.tolist() == [0] and phd.tolist() == [False]
    x, _, _ = encode_rows(TRAIN.splitlines()[3:4], "adult.data")  # '?' for workclass and occupation
    assert x.sum() == 6


def test_two_natural_clients_phd_first_with_their_own_tests(adult_dir):
    data = load_source("adult", str(adult_dir))
    assert data.x_train.shape == (6, 99) and data.y_train.tolist() == [0, 0, 1, 1, 1, 1]
    assert data.client_of_train.tolist() == [1, 1, 0, 1, 0, 1]  # the Doctorate rows are client 0
    assert data.y_test.tolist() == [0, 0, 1] and data.client_of_test.tolist() == [1, 1, 0]  # '.' dropped
    datamodule = FederatedDataModule(source="adult", num_clients=2, partition="natural", test_mode="local",
                                     local_test_fraction=0.0, data_dir=str(adult_dir), seed=0)
    datamodule.setup()
    assert datamodule.train_sizes.tolist() == [2, 4] and datamodule.test_sizes.tolist() == [1, 2]


def test_missing_or_altered_files_say_what_to_do(tmp_path, adult_dir):
    with pytest.raises(FileNotFoundError, match=r"adult.data is missing in .*archive.ics.uci.edu/dataset/2/adult"):
        load_source("adult", str(tmp_path / "none"))
    missing, obtain = missing_files("adult", str(tmp_path / "none"))
    assert [p.rsplit("/", 2)[1:] for p in missing] == [["adult", "adult.data"], ["adult", "adult.test"]]
    (adult_dir / "adult" / "adult.data").write_text(TRAIN.replace("State-gov", "State-govt"))
    with pytest.raises(ValueError, match=r"row 1 has the unknown value 'State-govt' in column 2"):
        load_source("adult", str(adult_dir))
    with pytest.raises(ValueError, match="adult has 2 natural clients"):
        FederatedDataModule(source="adult", num_clients=3, partition="natural")


@pytest.mark.filterwarnings("ignore")
def test_fedavg_fits_the_two_domains(adult_dir, tmp_path):
    datamodule = FederatedDataModule(source="adult", num_clients=2, partition="natural", test_mode="local",
                                     local_test_fraction=0.0, data_dir=str(adult_dir), seed=0)
    module = FedAvg(backbone="fl_logreg", num_classes=2, input_shape=(99,), num_rounds=2, fraction=1.0,
                    batch_size=2, lr=0.1, eval_every=1, seed=0)
    trainer = pl.Trainer(logger=False, enable_checkpointing=False, enable_progress_bar=False,
                         default_root_dir=str(tmp_path))
    trainer.fit(module, datamodule=datamodule)
    assert torch.isfinite(torch.cat([p.flatten() for p in module.parameters()])).all()
