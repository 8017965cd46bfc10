"""Job specifications: what to train, on which data, under which protection (YAML or JSON).

Validated with pydantic; every bad field yields an :class:`InvalidParameterError` whose message
lists each offending field by its path with the rule it breaks. Unknown fields are errors (a
typo never silently falls back to a default)::

    job_id: demo-breast-cancer
    rounds: 15
    parties: [hospital-a, hospital-b, hospital-c]
    model: {algorithm: homo_lr, learning_rate: 0.5, local_epochs: 2, batch_size: 32}
    data: {dataset: breast_cancer, split: iid}
    protection: {mode: paillier, key_bits: 2048, bits: 16, on_dropout: retry}

Jobs submitted through the controller provision data as FL_Data (``fl_data``: which dataset
each party contributes, the label column, the preprocessing pipeline; docs/fldata.md) instead
of the embedded ``data`` generator; ``parties`` then defaults to the FL_Data participants::

    fl_data:
      label: diagnosis
      participants: {hospital-a: {dataset: breast-cancer}, hospital-b: {dataset: breast-cancer}}
      pipeline: [{name: scaled, op: scale, params: {method: standard}}]
    checkpoint_interval: 5
    metrics: [loss, auc]
"""

from __future__ import annotations

from pathlib import Path
from typing import Annotated, Any, Literal

import yaml
from pydantic import BaseModel, ConfigDict, Field, ValidationError, model_validator

from confide.errors import InvalidParameterError

__all__ = ["DataSpec", "JobSpec", "ModelSpec", "ProtectionSpec", "TransportSpec", "load_job", "parse_job"]

Name = Annotated[str, Field(pattern=r"^[a-z0-9][a-z0-9-]{0,63}$")]
MAX_PARTIES = 200


class _Strict(BaseModel):
    # strict: "rounds: yes" is an error, not 1.
    model_config = ConfigDict(extra="forbid", frozen=True, strict=True)


class ModelSpec(_Strict):
    """The model and its hyper-parameters."""

    #: homo_lr: horizontal (parties hold different rows). hetero_lr, secureboost: vertical
    #: (parties hold different columns of the same records; docs/vertical.md); for those,
    #: ``rounds`` counts epochs (hetero_lr) or trees (secureboost).
    algorithm: Literal["homo_lr", "hetero_lr", "secureboost"] = "homo_lr"
    learning_rate: float = Field(0.1, gt=0, le=100)
    local_epochs: int = Field(1, ge=1, le=1000)
    batch_size: int = Field(64, ge=1, le=1_000_000)
    l2: float = Field(0.0, ge=0, le=100)
    # -- vertical algorithms (ignored by homo_lr) --
    objective: Literal["binary:logistic", "reg:squarederror"] = "binary:logistic"
    optimizer: Literal["sgd", "adam"] = "adam"
    max_depth: int = Field(3, ge=1, le=16)
    reg_lambda: float = Field(1.0, ge=0, le=1e6)
    min_child_weight: float = Field(1.0, ge=0, le=1e9)
    gamma: float = Field(0.0, ge=0, le=1e9)
    n_bins: int = Field(32, ge=3, le=256)


class DataSpec(_Strict):
    """Where each party's rows come from (embedded or generated; nothing is downloaded)."""

    dataset: Literal["breast_cancer", "synthetic"] = "breast_cancer"
    split: Literal["iid", "label_skew"] = "iid"
    skew: float = Field(0.8, ge=0.5, lt=1.0)
    test_fraction: float = Field(0.2, gt=0, le=0.5)
    samples: int = Field(10_000, ge=20, le=10_000_000)
    features: int = Field(100, ge=1, le=10_000_000)
    density: float | None = Field(None, gt=0, le=1)
    alpha: float = Field(1.0, ge=0, le=10)
    beta: float = Field(1.0, ge=0, le=10)
    seed: int = Field(0, ge=0, le=2**32 - 1)
    # -- vertical algorithms: who holds the labels, who holds which columns (docs/vertical.md) --
    guest: Name | None = None
    columns: dict[str, int] | None = None
    overlap: float = Field(0.95, gt=0, le=1)
    id_type: Literal["int", "str"] = "int"


class ProtectionSpec(_Strict):
    """Protection mode and its parameters (docs/runtime.md has the threat model of each)."""

    mode: Literal["plain", "secagg", "paillier", "groupmask", "tee"] = "paillier"
    key_bits: Literal[2048, 3072, 4096] = 2048
    bits: int = Field(16, ge=2, le=32)
    clipping: Literal["daciq", "max"] = "daciq"
    on_dropout: Literal["retry", "fail"] = "retry"
    min_parties: int = Field(2, ge=2, le=MAX_PARTIES)
    share_timeout_s: float = Field(30.0, gt=0, le=3600)
    setup_timeout_s: float = Field(120.0, gt=0, le=3600)
    mask_bound: float | None = Field(8.0, gt=0, le=2**20)


class TransportSpec(_Strict):
    """Slicing, pipelining and the timeouts that decide a dropout."""

    slice_bytes: int = Field(64 * 1024, ge=1024, le=16 * 1024 * 1024, multiple_of=4)
    pipeline: bool = True
    pipeline_depth: int = Field(4, ge=1, le=1024)
    round_timeout_s: float = Field(120.0, gt=0, le=86_400)
    dropout_grace_s: float = Field(5.0, ge=0, le=3600)
    reconnect_timeout_s: float = Field(60.0, gt=0, le=3600)
    message_timeout_s: float = Field(300.0, gt=0, le=86_400)


class JobSpec(_Strict):
    """A whole job."""

    job_id: str = Field(pattern=r"^[A-Za-z0-9][A-Za-z0-9_.-]{0,127}$")
    rounds: int = Field(10, ge=1, le=100_000)
    parties: list[Name] = Field(min_length=2, max_length=MAX_PARTIES)
    model: ModelSpec = ModelSpec()
    data: DataSpec = DataSpec()
    protection: ProtectionSpec = ProtectionSpec()
    transport: TransportSpec = TransportSpec()
    seed: int = Field(0, ge=0, le=2**32 - 1)
    #: Data provisioning as FL_Data (participants, label, pipeline); None: the embedded ``data``.
    fl_data: dict[str, Any] | None = None
    #: Parties and aggregator checkpoint every this many rounds (0: never).
    checkpoint_interval: int = Field(5, ge=0, le=100_000)
    metrics: list[Literal["loss", "auc", "accuracy"]] = ["loss", "auc"]

    @model_validator(mode="before")
    @classmethod
    def _parties_from_fl_data(cls, data: Any) -> Any:
        if isinstance(data, dict) and "parties" not in data and isinstance(data.get("fl_data"), dict):
            participants = data["fl_data"].get("participants")
            if isinstance(participants, dict):
                data = {**data, "parties": sorted(participants)}
        return data

    @model_validator(mode="after")
    def _consistent(self) -> JobSpec:
        if self.fl_data is not None:
            fl_data = self.fl_data_object()
            if sorted(fl_data.participants) != sorted(self.parties):
                raise ValueError(
                    f"parties {sorted(self.parties)} differ from the fl_data participants "
                    f"{sorted(fl_data.participants)}"
                )
        if len(set(self.parties)) != len(self.parties):
            raise ValueError("parties must be distinct")
        if self.vertical:
            if self.protection.mode != "paillier":
                raise ValueError(
                    f"model.algorithm {self.model.algorithm} runs under protection.mode paillier only, "
                    f"got {self.protection.mode}"
                )
            if self.fl_data is not None:
                raise ValueError(f"model.algorithm {self.model.algorithm} takes the embedded data, not fl_data")
            if self.data.guest is not None and self.data.guest not in self.parties:
                raise ValueError(f"data.guest {self.data.guest!r} is not one of the parties {self.parties}")
        if self.protection.min_parties > len(self.parties):
            raise ValueError(
                f"protection.min_parties ({self.protection.min_parties}) exceeds the {len(self.parties)} parties"
            )
        return self

    @property
    def vertical(self) -> bool:
        """Whether the parties hold columns (hetero_lr, secureboost) rather than rows."""
        return self.model.algorithm in ("hetero_lr", "secureboost")

    @property
    def guest(self) -> str:
        """The party holding the labels in a vertical job (data.guest, default the first party)."""
        return self.data.guest or self.parties[0]

    def fl_data_object(self):
        """The :class:`confide.data.fldata.FLData` of ``fl_data`` (None without one)."""
        if self.fl_data is None:
            return None
        from confide.data.fldata import FLData

        try:
            if "lineage" in self.fl_data:
                return FLData.from_dict(self.fl_data)
            return FLData.create(
                self.fl_data.get("participants", {}),
                self.fl_data.get("label", ""),
                self.fl_data.get("pipeline", ()),
            )
        except InvalidParameterError as error:
            raise ValueError(f"fl_data: {error}") from None

    def datasets(self) -> dict[str, str]:
        """Party -> dataset name under FL_Data (empty for the embedded data)."""
        fl_data = self.fl_data_object()
        return fl_data.datasets() if fl_data is not None else {}


def parse_job(data: dict) -> JobSpec:
    """Validate a job specification given as a mapping."""
    if not isinstance(data, dict):
        raise InvalidParameterError(f"a job specification must be a mapping, got {type(data).__name__}")
    try:
        return JobSpec.model_validate(data)
    except ValidationError as error:
        problems = []
        for item in error.errors():
            where = ".".join(str(part) for part in item["loc"]) or "job"
            problems.append(f"{where}: {item['msg']}")
        raise InvalidParameterError("invalid job specification: " + "; ".join(problems)) from None


def load_job(path: str | Path) -> JobSpec:
    """Read and validate a YAML or JSON job file."""
    text = Path(path).read_text()
    try:
        data = yaml.safe_load(text)
    except yaml.YAMLError as error:
        raise InvalidParameterError(f"{path}: not valid YAML/JSON: {error}") from None
    return parse_job(data)
