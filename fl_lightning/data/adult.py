"""UCI Adult as two natural clients, the PhD and the non-PhD domain (AFL, Mohri et al., ICML 2019;
FedMGDA+, Hu et al., IEEE TNSE 2022, Sec. 6.1.4).

Files: ``<data_dir>/adult/adult.data`` and ``adult.test`` from the UCI Machine Learning Repository
(https://archive.ics.uci.edu/dataset/2/adult), unchanged: comma-separated, ``?`` for a missing
value, ``adult.test`` opening with ``|1x3 Cross validator`` and its labels ending in ``.``.

Features: q-FFL (Li et al., ICLR 2020) and FedMGDA+ use 99 binary features. The 8 categorical
attributes one-hot encoded give exactly 99 (workclass 8, education 16, marital-status 7,
occupation 14, relationship 6, race 5, sex 2, native-country 41), the encoding used here; the
6 numeric attributes are left out and a missing ``?`` is all zeros. Label: income > 50K.
Client 0 is the PhD domain (education = Doctorate: 413 training rows), client 1 the rest
(32,148); each client is tested on its own rows of ``adult.test``. A bias attack on the PhD
domain (FedMGDA+ Fig. 2, Table 7) targets ``attack_client: 0``.
"""

from __future__ import annotations

import os

import numpy as np
import torch

from fl_lightning.data.source_registry import SourceData, SourceInfo, register_source

CATEGORIES = {  # column of adult.data -> its values, in the order of the UCI description
    1: ("Private", "Self-emp-not-inc", "Self-emp-inc", "Federal-gov", "Local-gov", "State-gov",
        "Without-pay", "Never-worked"),
    3: ("Bachelors", "Some-college", "11th", "HS-grad", "Prof-school", "Assoc-acdm", "Assoc-voc",
        "9th", "7th-8th", "12th", "Masters", "1st-4th", "10th", "Doctorate", "5th-6th", "Preschool"),
    5: ("Married-civ-spouse", "Divorced", "Never-married", "Separated", "Widowed",
        "Married-spouse-absent", "Married-AF-spouse"),
    6: ("Tech-support", "Craft-repair", "Other-service", "Sales", "Exec-managerial", "Prof-specialty",
        "Handlers-cleaners", "Machine-op-inspct", "Adm-clerical", "Farming-fishing", "Transport-moving",
        "Priv-house-serv", "Protective-serv", "Armed-Forces"),
    7: ("Wife", "Own-child", "Husband", "Not-in-family", "Other-relative", "Unmarried"),
    8: ("White", "Asian-Pac-Islander", "Amer-Indian-Eskimo", "Other", "Black"),
    9: ("Female", "Male"),
    13: ("United-States", "Cambodia", "England", "Puerto-Rico", "Canada", "Germany",
         "Outlying-US(Guam-USVI-etc)", "India", "Japan", "Greece", "South", "China", "Cuba", "Iran",
         "Honduras", "Philippines", "Italy", "Poland", "Jamaica", "Vietnam", "Mexico", "Portugal",
         "Ireland", "France", "Dominican-Republic", "Laos", "Ecuador", "Taiwan", "Haiti", "Columbia",
         "Hungary", "Guatemala", "Nicaragua", "Scotland", "Thailand", "Yugoslavia", "El-Salvador",
         "Trinadad&Tobago", "Peru", "Hong", "Holand-Netherlands"),
}
EDUCATION, INCOME = 3, 14
NUM_FEATURES = sum(len(values) for values in CATEGORIES.values())  # 99
PHD = "Doctorate"
OBTAIN = ("the UCI Machine Learning Repository, https://archive.ics.uci.edu/dataset/2/adult "
          "(adult.data and adult.test, unchanged), into <data_dir>/adult/")

_OFFSETS = dict(zip(CATEGORIES, np.cumsum([0, *(len(v) for v in CATEGORIES.values())])[:-1].tolist()))
_INDEX = {column: {value: i for i, value in enumerate(values)} for column, values in CATEGORIES.items()}


def adult_files(data_dir: str, num_clients: int = 2) -> list[str]:
    return [os.path.join(data_dir, "adult", name) for name in ("adult.data", "adult.test")]


def encode_rows(lines: list[str], where: str) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """(99 binary features, labels, PhD flags) of the data rows of an Adult file."""
    rows = [line for line in (raw.strip() for raw in lines) if line and not line.startswith("|")]
    x = np.zeros((len(rows), NUM_FEATURES), dtype=np.float32)
    y = np.zeros(len(rows), dtype=np.int64)
    phd = np.zeros(len(rows), dtype=bool)
    for r, row in enumerate(rows):
        fields = [f.strip() for f in row.split(",")]
        if len(fields) != 15:
            raise ValueError(f"{where}: row {r + 1} has {len(fields)} fields, not the 15 of Adult: {row[:80]!r}; "
                             f"use the unchanged files from {OBTAIN}")
        for column, index in _INDEX.items():
            value = fields[column]
            if value == "?":
                continue
            if value not in index:
                raise ValueError(f"{where}: row {r + 1} has the unknown value {value!r} in column {column + 1}; "
                                 f"use the unchanged files from {OBTAIN}")
            x[r, _OFFSETS[column] + index[value]] = 1.0
        label = fields[INCOME].rstrip(".")
        if label not in (">50K", "<=50K"):
            raise ValueError(f"{where}: row {r + 1} has the income {fields[INCOME]!r}, not <=50K or >50K")
        y[r] = label == ">50K"
        phd[r] = fields[EDUCATION] == PHD
    return x, y, phd


def _read(path: str) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    if not os.path.isfile(path):
        folder = os.path.dirname(path)
        raise FileNotFoundError(f"Adult not found: {os.path.basename(path)} is missing in {folder!r}; get "
                                f"adult.data and adult.test from {OBTAIN}")
    with open(path, encoding="utf-8", errors="replace") as file:
        return encode_rows(file.readlines(), path)


_INFO = SourceInfo("adult", 2, (NUM_FEATURES,), has_official_test=True, natural_clients=True)


def _describe(num_clients: int = 2) -> SourceInfo:
    if num_clients != 2:
        raise ValueError(
            f"adult has 2 natural clients (PhD, non-PhD), got num_clients={num_clients}; set num_clients: 2"
        )
    return _INFO


@register_source("adult", info=_describe, files=adult_files, obtain=OBTAIN)
def _load_adult(data_dir: str, download: bool, seed: int, num_clients: int = 2) -> SourceData:
    """Adult, two natural clients: 0 = PhD, 1 = non-PhD (see the module docstring)."""
    train_path, test_path = adult_files(data_dir)
    x, y, phd = _read(train_path)
    x_test, y_test, phd_test = _read(test_path)

    def tensors(features, labels, flags):
        return (torch.from_numpy(features), torch.from_numpy(labels),
                torch.from_numpy((~flags).astype(np.int64)))  # client 0: PhD

    x_train, y_train, client_of_train = tensors(x, y, phd)
    x_t, y_t, client_of_test = tensors(x_test, y_test, phd_test)
    return SourceData(x_train, y_train, x_t, y_t, _INFO, client_of_train=client_of_train,
                      x_client_test=x_t, y_client_test=y_t, client_of_test=client_of_test)
