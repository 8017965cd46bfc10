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

import math
from pathlib import Path
from typing import Annotated, Any, Literal

import yaml
from pydantic import BaseModel, ConfigDict, Field, ValidationError, model_validator

from confide.errors import InvalidParameterError
from confide.ml import MODELS
from confide.ml.strategies import STRATEGIES
from confide.protect import MODES
from confide.protect.bound import BOUNDED_MODES, L2_MODES

__all__ = [
    "DataSpec",
    "JobSpec",
    "ModelSpec",
    "ProtectionSpec",
    "ScoreSpec",
    "StrategySpec",
    "TransportSpec",
    "load_job",
    "parse_job",
]

Name = Annotated[str, Field(pattern=r"^[a-z0-9][a-z0-9-]{0,63}$")]
MAX_PARTIES = 200


class _Strict(BaseModel):
    # strict: "rounds: yes" is an error, not 1.
    model_config = ConfigDict(extra="forbid", frozen=True, strict=True)


Backend = Literal["jax", "torch", "tensorflow"]
#: Algorithms whose parties hold columns of the same records (confide.vertical); the horizontal
#: ones are the plug-ins of confide.ml.MODELS.
VERTICAL_ALGORITHMS = ("hetero_lr", "secureboost", "hetero_nn")
# The names a job may use, declared once: by the registries (models, modes, strategies) and above.
Algorithm = Literal[(*MODELS, *VERTICAL_ALGORITHMS)]  # type: ignore[valid-type]
Mode = Literal[tuple(MODES)]  # type: ignore[valid-type]
StrategyName = Literal[tuple(STRATEGIES)]  # type: ignore[valid-type]


class HFSpec(_Strict):
    """``model.algorithm: hf``: a pretrained transformers model from each party's own files (docs/models.md)."""

    #: The folder ``save_pretrained`` wrote (config.json and the weights), the same path at every
    #: party or one per party (``{party: path}``); relative paths are taken from the job file's folder.
    pretrained: str | dict[Name, str] = Field(min_length=1)
    task: Literal["sequence_classification"] = "sequence_classification"
    #: lora: only the adapter and the head train and travel; none: every weight does (full fine-tuning).
    adapter: Literal["lora", "none"] = "lora"
    r: int = Field(8, ge=1, le=1024)
    alpha: float = Field(16.0, gt=0, le=1e4)
    dropout: float = Field(0.0, ge=0, lt=1)
    #: Module names LoRA adapts (None: peft's default for the architecture, e.g. query and value).
    target_modules: list[Annotated[str, Field(min_length=1, max_length=128)]] | None = Field(
        None, min_length=1, max_length=256
    )


class ModelSpec(_Strict):
    """The model and its hyper-parameters (docs/models.md).

    Horizontal (parties hold different rows), each a plug-in of :data:`confide.ml.MODELS`:
    ``homo_lr`` (logistic regression), ``keras`` (a Keras 3 network described by ``network``,
    trained on each party's backend), ``custom`` (the party's own code, ``entry``).
    Vertical (parties hold different columns of the same records; docs/vertical.md):
    ``hetero_lr``, ``secureboost`` and ``hetero_nn``; for those, ``rounds`` counts epochs or trees.
    """

    algorithm: Algorithm = "homo_lr"
    learning_rate: float = Field(0.1, gt=0, le=100)
    local_epochs: int = Field(1, ge=1, le=1000)
    #: Rows per mini-batch; 0 (``homo_lr`` only): full batch, one step per local epoch over every
    #: local row (what partitioned data trains with: gradients per partition, summed).
    batch_size: int = Field(64, ge=0, le=1_000_000)
    l2: float = Field(0.0, ge=0, le=100)
    # -- keras: the network (layers, optimizer, loss, metrics) inline or in a YAML/JSON file --
    network: dict[str, Any] | None = None
    network_file: str | None = None
    #: Keras backend of every party, unless ``backends`` names one for it (or the party's own
    #: ``confide party --keras-backend``, which wins).
    backend: Backend = "jax"
    backends: dict[Name, Backend] = {}
    # -- hf: a pretrained Hugging Face transformers model, fine-tuned with LoRA (or fully) --
    hf: HFSpec | None = None
    # -- custom: the party's own object or factory, "package.module:attribute" or "path/file.py:attribute" --
    entry: str | None = Field(None, pattern=r"^[^:]+:[A-Za-z_][A-Za-z0-9_.]*$")
    #: Keyword arguments for a custom factory (free-form, JSON-compatible).
    options: dict[str, Any] = {}
    #: Memory a party's process may use, MiB: a model whose rounds would pass it (the process with
    #: the model built, plus what a round adds: docs/models.md, "Memory") is refused before round 1.
    memory_limit_mb: int | None = Field(None, ge=64, le=1 << 24)
    # -- vertical algorithms (ignored by homo_lr) --
    objective: Literal["binary:logistic", "reg:squarederror", "multi:softprob"] = "binary:logistic"
    #: secureboost with objective multi:softprob: the number of classes (one tree per class per round).
    num_class: int | None = Field(None, ge=3, le=1000)
    optimizer: Literal["sgd", "adam"] = "adam"
    max_depth: int = Field(3, ge=1, le=16)
    reg_lambda: float = Field(1.0, ge=0, le=1e6)
    min_child_weight: float = Field(1.0, ge=0, le=1e9)
    gamma: float = Field(0.0, ge=0, le=1e9)
    n_bins: int = Field(32, ge=3, le=256)
    #: secureboost: training rows held out to measure the validation loss after every round.
    validation_fraction: float = Field(0.0, ge=0, le=0.5)
    #: secureboost: stop when the validation loss has not improved for this many rounds, keeping
    #: the best round's model (needs validation_fraction).
    early_stopping_rounds: int | None = Field(None, ge=1, le=10_000)
    # -- hetero_nn: sub-networks (Dense/Activation layers in numpy, a Keras network on the torch
    #    backend, or {torch: "file.py:factory"}: confide.vertical.netlayers) and the interactive layer --
    guest_bottom: list[dict[str, Any]] | dict[str, Any] | None = None
    host_bottom: list[dict[str, Any]] | dict[str, Any] | None = None
    top: list[dict[str, Any]] | dict[str, Any] | None = None
    interactive_units: int = Field(8, ge=1, le=64)
    interactive_activation: Literal["linear", "relu", "tanh", "sigmoid"] = "relu"
    interactive_learning_rate: float = Field(0.1, gt=0, le=10)


class DataSpec(_Strict):
    """Where each party's rows come from (embedded or generated; nothing is downloaded)."""

    dataset: Literal["breast_cancer", "synthetic", "digits", "tensors", "text"] = "breast_cancer"
    split: Literal["iid", "label_skew"] = "iid"
    skew: float = Field(0.8, ge=0.5, lt=1.0)
    test_fraction: float = Field(0.2, gt=0, le=0.5)
    samples: int = Field(10_000, ge=20, le=10_000_000)
    features: int = Field(100, ge=1, le=10_000_000)
    density: float | None = Field(None, gt=0, le=1)
    alpha: float = Field(1.0, ge=0, le=10)
    beta: float = Field(1.0, ge=0, le=10)
    seed: int = Field(0, ge=0, le=2**32 - 1)
    # -- tensors: random examples of a shape (networks measured at their real sizes) --
    example_shape: list[Annotated[int, Field(ge=1, le=1_000_000)]] = Field(default_factory=lambda: [28, 28])
    classes: int = Field(10, ge=2, le=1_000_000)
    sequence: bool = False
    # -- text: generated documents as token ids (confide.data.text_federation): samples, classes,
    #    example_shape [length] and the vocabulary's size --
    vocabulary: int = Field(1000, ge=10, le=10_000_000)
    # -- vertical algorithms: who holds the labels, who holds which columns (docs/vertical.md) --
    guest: Name | None = None
    columns: dict[str, int] | None = None
    overlap: float = Field(0.95, gt=0, le=1)
    id_type: Literal["int", "str"] = "int"
    #: A vertical job over FL_Data: the column of every party's dataset holding the record ids.
    id_column: str | None = Field(None, min_length=1, max_length=128)


def default_threshold(parties: int) -> int:
    """The threshold when ``protection.threshold`` is unset: a majority, at least 2."""
    return max(2, (parties + 1) // 2)


#: Modes whose combined slices the parties can check (confide.protect: verify_arithmetic set).
VERIFIED_MODES = ("plain", "secagg", "groupmask", "tee", "lattice", "paillier")


class ProtectionSpec(_Strict):
    """Protection mode and its parameters (docs/runtime.md has the threat model of each)."""

    mode: Mode = "paillier"
    key_bits: Literal[2048, 3072, 4096] = 2048
    bits: int = Field(16, ge=2, le=32)
    clipping: Literal["daciq", "max"] = "daciq"
    #: retry: survivors run the round again without the dropout; fail: the job stops; recover
    #: (secagg only): a participant that sent nothing is excluded and the survivors remove its masks
    #: (self masks + Shamir shares, :mod:`confide.protect.recovery`), with no retry.
    on_dropout: Literal["retry", "fail", "recover"] = "retry"
    min_parties: int = Field(2, ge=2, le=MAX_PARTIES)
    share_timeout_s: float = Field(30.0, gt=0, le=3600)
    setup_timeout_s: float = Field(120.0, gt=0, le=3600)
    mask_bound: float | None = Field(8.0, gt=0, le=2**20, allow_inf_nan=False)
    #: threshold, lattice: key shares needed to decrypt; None takes max(2, (parties + 1) // 2).
    threshold: int | None = Field(None, ge=2, le=MAX_PARTIES)
    #: threshold: "distributed" (no one ever holds the key) or "dealer" (the leader deals, and saw the key).
    keygen: Literal["distributed", "dealer"] = "distributed"
    #: secagg, on_dropout recover: neighbours each party masks with (None: all up to 16 parties, else SecAgg+'s
    #: 2 * ceil(1.5 * log2 m)); shares that rebuild a secret (None: a majority of the neighbours); how long the
    #: unmasking waits for a survivor that went quiet.
    neighbours: int | None = Field(None, ge=2, le=MAX_PARTIES)
    recovery_threshold: int | None = Field(None, ge=1, le=MAX_PARTIES)
    recovery_timeout_s: float = Field(10.0, gt=0, le=3600)
    #: plain and tee: how updates travel to the aggregator: float32, or narrower (float16, bfloat16:
    #: half the bytes; int8 with a scale per slice: a quarter), widened before they are summed.
    wire: Literal["float32", "float16", "bfloat16", "int8"] = "float32"
    #: The parties check every combined slice against linear tags (docs/crypto.md, "Verifiable
    #: aggregation"): auto, where the mode supports it (VERIFIED_MODES); on (an error elsewhere); off.
    verify: Literal["auto", "on", "off"] = "auto"
    #: A combined slice that fails its check: fail stops the job naming the aggregator node; retry runs
    #: the round again without that node (an aggregator cluster; with one node the job fails).
    on_wrong_sum: Literal["fail", "retry"] = "fail"
    #: Every party proves each value of its update within the public mask_bound (Bulletproofs range
    #: proofs bound to the fixed-point words it protects; docs/crypto.md, "Bounded updates"): a party
    #: whose proof fails is named and the round runs again without it; a sum that is not of the proven
    #: values is refused. secagg, groupmask and lattice (with on_dropout recover too), and paillier and
    #: threshold on their BatchCrypt codes (bits <= 23); a few thousand values a round (2 ms a value).
    prove_bound: bool = False
    #: With prove_bound: every party also proves the L2 norm of its update at most this (in the
    #: units of mask_bound; an honest party scales its update down to it first). None: no norm proof.
    l2_bound: float | None = Field(None, gt=0, le=2**40, allow_inf_nan=False)

    @property
    def verifies(self) -> bool:
        """Whether the parties check the sums in this job."""
        return self.verify == "on" or (self.verify == "auto" and self.mode in VERIFIED_MODES)

    def params(self):
        """The :class:`confide.protect.ProtectionParams` of this section (the mode's own parameters)."""
        from confide.protect import ProtectionParams

        fields = self.model_dump(include=set(ProtectionParams.__dataclass_fields__))
        return ProtectionParams(**fields, recover=self.on_dropout == "recover")

    @model_validator(mode="after")
    def _verify_where_it_runs(self) -> ProtectionSpec:
        if self.verify == "on" and self.mode not in VERIFIED_MODES:
            raise ValueError(
                f"protection.verify on: the parties cannot yet check the sums of mode {self.mode} (verified modes: "
                f"{', '.join(VERIFIED_MODES)}); use verify: auto or off"
            )
        if self.verify == "on" and self.mode == "paillier" and self.bits > 23:
            raise ValueError(
                f"protection.verify on: mode paillier checks code sums up to protection.bits 23, got {self.bits} (the "
                "decrypted shares are float32); use bits <= 23, or verify: auto or off"
            )
        return self

    @model_validator(mode="after")
    def _bound_proofs_where_they_run(self) -> ProtectionSpec:
        if self.l2_bound is not None and not self.prove_bound:
            raise ValueError(
                "protection.l2_bound is proven with the bound proofs (the norm proof speaks of their commitments); "
                "set protection.prove_bound: true, or leave l2_bound out"
            )
        if not self.prove_bound:
            return self
        if self.mode not in BOUNDED_MODES:
            why = {
                "plain": "its aggregator reads every update: bound them with a robust strategy (norm_clip)",
                "tee": "its enclave reads every update: bound them with a robust strategy (median, trimmed_mean)",
            }.get(self.mode, "its updates are not integers a party can prove ranges of")
            raise ValueError(
                f"protection.prove_bound is for modes {', '.join(BOUNDED_MODES)} (integer updates); mode "
                f"{self.mode}: {why}"
            )
        if self.mode in ("paillier", "threshold"):
            if self.bits > 23:
                raise ValueError(
                    f"protection.prove_bound in mode {self.mode} checks code sums up to protection.bits 23, got "
                    f"{self.bits} (the decrypted shares are float32); use bits <= 23"
                )
            if self.l2_bound is not None:
                raise ValueError(
                    f"protection.l2_bound is for modes {', '.join(L2_MODES)}: mode {self.mode} scales each layer by "
                    "its own dACIQ threshold, so its codes have no one norm to bound; leave l2_bound out"
                )
        elif self.mask_bound is None:
            raise ValueError(
                "protection.prove_bound needs a public protection.mask_bound: the bound every party proves"
            )
        return self

    @model_validator(mode="after")
    def _narrow_wire_is_for_float_modes(self) -> ProtectionSpec:
        if self.wire != "float32" and self.mode not in ("plain", "tee"):
            raise ValueError(
                f"protection.wire {self.wire} is for modes plain and tee (updates as floats); mode {self.mode} "
                f"keeps its own encoding (integers for secagg, groupmask and the Paillier modes)"
            )
        return self

    @model_validator(mode="after")
    def _recover_is_secagg(self) -> ProtectionSpec:
        if self.on_dropout == "recover" and self.mode not in ("secagg", "lattice"):
            raise ValueError(
                f"protection.on_dropout recover is dropout recovery for modes secagg (self masks and Shamir shares) "
                f"and lattice (the survivors' key sum); mode {self.mode} retries (on_dropout: retry) or fails"
            )
        if self.mode == "lattice" and (self.neighbours is not None or self.recovery_threshold is not None):
            raise ValueError(
                "protection.neighbours and protection.recovery_threshold are secagg's recovery; lattice recovers "
                "with protection.threshold of the survivors' summed key shares"
            )
        if self.on_dropout == "recover" and self.mask_bound is None:
            raise ValueError(
                "protection.on_dropout recover needs a public protection.mask_bound: agreeing on the bound every "
                "round is a message a dropout would leave every party waiting for"
            )
        if self.on_dropout != "recover" and (self.neighbours is not None or self.recovery_threshold is not None):
            raise ValueError("protection.neighbours and protection.recovery_threshold apply to on_dropout: recover")
        if self.neighbours is not None and self.recovery_threshold is not None:
            if self.recovery_threshold > self.neighbours:
                raise ValueError(
                    f"protection.recovery_threshold ({self.recovery_threshold}) exceeds protection.neighbours "
                    f"({self.neighbours}): no party would hold enough shares"
                )
        return self


class PrivacySpec(_Strict):
    """Differential privacy with a budget (docs/privacy.md): every epsilon comes from dp-accounting."""

    #: "distributed": each party clips its update and adds its share of discrete Gaussian noise
    #: before protection (party-level DP of the sum); "dp_sgd": per-record clipping and noise in
    #: each party's local training (record-level DP; homo_lr).
    mechanism: Literal["distributed", "dp_sgd"]
    #: The whole job's budget (> 0).
    epsilon: float = Field(gt=0, le=1000)
    delta: float = Field(1e-5, gt=0, lt=0.1)
    #: L2 bound of a party's update (distributed) or of one record's gradient (dp_sgd).
    clip_norm: float = Field(1.0, gt=0, le=1e6)
    #: Fixed noise multiplier; None calibrates the smallest one that meets epsilon over the rounds.
    noise_multiplier: float | None = Field(None, gt=0, le=10_000)
    #: A calibrated multiplier above this is refused (too much noise to learn anything).
    max_noise_multiplier: float = Field(50.0, gt=0, le=10_000)
    accountant: Literal["rdp", "pld"] = "rdp"
    #: What happens when the next round would spend more than epsilon.
    on_budget_spent: Literal["stop", "warn"] = "stop"
    #: distributed: adapt clip_norm to the target quantile of the update norms (Andrew et al. 2021).
    adaptive_clipping: bool = False
    target_quantile: float = Field(0.5, gt=0, lt=1)
    clip_learning_rate: float = Field(0.2, gt=0, le=10)
    #: distributed, adaptive: noise multiplier of the clip count, as a multiple of the update's.
    count_noise_ratio: float = Field(2.0, gt=0, le=1000)
    #: distributed: parties that may subtract their own noise shares with the calibration still holding.
    #: 1 (the default) keeps the guarantee against every participant, who knows its own share.
    tolerate_colluders: int = Field(1, ge=0, le=MAX_PARTIES)


class StrategySpec(_Strict):
    """How the sum of the parties' changes becomes the next global model (:mod:`confide.ml.strategies`)."""

    name: StrategyName = "fedavg"
    #: fedprox: weight of the proximal term.
    mu: float = Field(0.01, gt=0, le=1000)
    #: fedadam: server-side step size and moments.
    server_learning_rate: float = Field(0.01, gt=0, le=100)
    beta1: float = Field(0.9, gt=0, lt=1)
    beta2: float = Field(0.99, gt=0, lt=1)
    tau: float = Field(1e-3, gt=0, le=10)
    #: trimmed_mean: share of each coordinate's values cut at each end.
    trim_fraction: float = Field(0.2, gt=0, lt=0.5, allow_inf_nan=False)
    #: krum, multi_krum: malicious updates tolerated (f, with 2f + 2 < parties); multi_krum averages
    #: ``selected`` updates (None: parties - f).
    byzantine: int = Field(1, ge=0, le=MAX_PARTIES)
    selected: int | None = Field(None, ge=1, le=MAX_PARTIES)
    #: norm_clip: the L2 bound each update is scaled down to (None: the round's median norm).
    norm_bound: float | None = Field(None, gt=0, allow_inf_nan=False)

    @property
    def robust(self) -> bool:
        """Whether the aggregator applies this strategy to every update (it must see them: plain)."""
        return self.name in ("median", "trimmed_mean", "krum", "multi_krum", "norm_clip")

    def build(self):
        """The :class:`confide.ml.strategies.Strategy` this section describes."""
        from confide.ml.strategies import make_strategy

        options = {
            "fedavg": {},
            "fedprox": {"mu": self.mu},
            "fedadam": {
                "server_learning_rate": self.server_learning_rate,
                "beta1": self.beta1,
                "beta2": self.beta2,
                "tau": self.tau,
            },
            "median": {},
            "trimmed_mean": {"trim_fraction": self.trim_fraction},
            "krum": {"byzantine": self.byzantine},
            "multi_krum": {"byzantine": self.byzantine, "selected": self.selected or 0},
            "norm_clip": {"norm_bound": self.norm_bound},
        }[self.name]
        return make_strategy(self.name, **options)


class TransportSpec(_Strict):
    """Slicing, pipelining and the timeouts that decide a dropout."""

    slice_bytes: int = Field(64 * 1024, ge=1024, le=16 * 1024 * 1024, multiple_of=4)
    pipeline: bool = True
    pipeline_depth: int = Field(4, ge=1, le=1024)
    round_timeout_s: float = Field(120.0, gt=0, le=86_400)
    dropout_grace_s: float = Field(5.0, ge=0, le=3600)
    reconnect_timeout_s: float = Field(60.0, gt=0, le=3600)
    message_timeout_s: float = Field(300.0, gt=0, le=86_400)


class TrackingSpec(_Strict):
    """Where the developer's side records the job: MLflow, TensorBoard event files (docs/tracking.md)."""

    #: The tracking server, ``http(s)://host:port`` (``mlflow server``); nothing is sent elsewhere.
    mlflow_uri: str | None = Field(None, pattern=r"^https?://[^\s/]+(/[^\s]*)?$", max_length=2048)
    #: Also write the metrics as TensorBoard event files (no server): ``<workdir>/tensorboard`` for
    #: ``confide run``, ``tensorboard/`` beside the controller's store for a session.
    tensorboard: bool = False
    #: The MLflow experiment (default: the job id).
    experiment: str | None = Field(None, min_length=1, max_length=256)
    #: Register the final model under this name in the model registry (None: no registration).
    register_model: str | None = Field(None, min_length=1, max_length=256)
    #: Whose model file is registered (it holds that party's fitted statistics); default the first party.
    register_from: Name | None = None
    #: Parties whose own per-round metrics may be logged; the others contribute the federated figures only.
    party_metrics: list[Name] = Field(default_factory=list, max_length=MAX_PARTIES)
    #: A server that cannot be reached never fails the job: the record is kept to send later
    #: (``confide tracking replay``) or dropped; a warning says which.
    when_unreachable: Literal["buffer", "drop"] = "buffer"
    timeout_s: float = Field(10.0, gt=0, le=600)

    @model_validator(mode="after")
    def _somewhere(self) -> TrackingSpec:
        if self.mlflow_uri is None and not self.tensorboard:
            raise ValueError(
                "tracking: name an MLflow server (mlflow_uri) or ask for TensorBoard event files (tensorboard)"
            )
        if self.mlflow_uri is None and self.register_model is not None:
            raise ValueError(
                "tracking.register_model registers in MLflow's model registry: it needs tracking.mlflow_uri"
            )
        return self


class ScoreSpec(_Strict):
    """A vertical job that scores new records with a trained vertical model (docs/vertical.md#scoring).

    Each site runs its own part of the model: the new records go through the pipeline with the
    statistics fitted at training, PSI aligns their ids, and the model's prediction protocol
    runs; only the guest learns the scores (``<guest>.scores.csv``, beside its report).
    """

    #: The controller session that trained the model (the controller fills in the model, the
    #: guest, the id column, the label and the pipeline from it; each agent finds its site's part).
    session: str | None = Field(None, pattern=r"^[0-9a-f]{32}$")
    #: Without a controller (``confide run``): the folder holding every site's ``<party>.model.zip``
    #: (a previous run's work folder).
    model_dir: str | None = Field(None, min_length=1, max_length=4096)

    @model_validator(mode="after")
    def _one_source(self) -> ScoreSpec:
        if (self.session is None) == (self.model_dir is None):
            raise ValueError("score: name exactly one of session (a controller session) and model_dir (a folder)")
        return self


class JobSpec(_Strict):
    """A whole job."""

    job_id: str = Field(pattern=r"^[A-Za-z0-9][A-Za-z0-9_.-]{0,127}$")
    rounds: int = Field(10, ge=1, le=100_000)
    parties: list[Name] = Field(min_length=2, max_length=MAX_PARTIES)
    model: ModelSpec = ModelSpec()
    strategy: StrategySpec = StrategySpec()
    data: DataSpec = DataSpec()
    protection: ProtectionSpec = ProtectionSpec()
    transport: TransportSpec = TransportSpec()
    #: Differential privacy (None: none).
    privacy: PrivacySpec | None = None
    seed: int = Field(0, ge=0, le=2**32 - 1)
    #: Data provisioning as FL_Data (participants, label, pipeline); None: the embedded ``data``.
    fl_data: dict[str, Any] | None = None
    #: Parties and aggregator checkpoint every this many rounds (0: never).
    checkpoint_interval: int = Field(5, ge=0, le=100_000)
    metrics: list[Literal["loss", "auc", "accuracy"]] = ["loss", "auc"]
    #: Record the job in MLflow (None: nowhere).
    tracking: TrackingSpec | None = None
    #: Score new records with a trained vertical model instead of training (None: train).
    score: ScoreSpec | None = None

    @model_validator(mode="after")
    def _tracking_names_parties(self) -> JobSpec:
        if self.tracking is not None:
            named = [*self.tracking.party_metrics, self.tracking.register_from or self.parties[0]]
            unknown = sorted({p for p in named if p not in self.parties})
            if unknown:
                raise ValueError(f"tracking names {unknown}, which are not parties of the job {self.parties}")
        return self

    @model_validator(mode="before")
    @classmethod
    def _threshold_min_parties(cls, data: Any) -> Any:
        """In threshold mode, an unset ``protection.min_parties`` is the threshold (fewer cannot decrypt)."""
        if not isinstance(data, dict):
            return data
        protection, parties = data.get("protection"), data.get("parties")
        if isinstance(protection, dict) and protection.get("mode") == "threshold" and "min_parties" not in protection:
            t = protection.get("threshold")
            if t is None and isinstance(parties, list):
                t = default_threshold(len(parties))
            if isinstance(t, int) and not isinstance(t, bool) and t >= 2:
                data = {**data, "protection": {**protection, "min_parties": t}}
        return data

    @model_validator(mode="before")
    @classmethod
    def _parties_from_fl_data(cls, data: Any) -> Any:
        if isinstance(data, dict) and "parties" not in data and isinstance(data.get("fl_data"), dict):
            fl_data = data["fl_data"]
            # Written by hand ({participants, label, pipeline}) or as an FLData value with its
            # lineage ({format, version, state, lineage}: what the controller stores after it
            # agreed the encodings' categories).
            state = fl_data.get("state") if "lineage" in fl_data else fl_data
            participants = state.get("participants") if isinstance(state, dict) else None
            if isinstance(participants, dict):
                data = {**data, "parties": sorted(participants)}
        return data

    @model_validator(mode="before")
    @classmethod
    def _psi_join_in_fl_data(cls, data: Any) -> Any:
        """A vertical job's record join is a step of its FL_Data: the last one, ``psi-join``.

        Given ``data.id_column`` and an FL_Data without a join, the join is appended (one more
        lineage entry, so the session's FL_Data shows how its rows were aligned); given a join
        and no ``data.id_column``, the id column is the join's ``by``.
        """
        if not (isinstance(data, dict) and isinstance(data.get("fl_data"), dict)):
            return data
        model, spec_data = data.get("model"), data.get("data")
        if not (isinstance(model, dict) and model.get("algorithm") in VERTICAL_ALGORITHMS):
            return data
        spec_data = spec_data if isinstance(spec_data, dict) else {}
        try:
            fl_data = _fl_data_of(data["fl_data"])
        except InvalidParameterError:
            return data  # reported by the checks after parsing, with the field
        id_column = spec_data.get("id_column")
        if id_column is None and fl_data.join_column is not None:
            return {**data, "data": {**spec_data, "id_column": fl_data.join_column}}
        if isinstance(id_column, str) and fl_data.join_column is None and not fl_data.frozen:
            step = {"name": "psi-join", "op": "join", "params": {"by": id_column}}
            try:
                return {**data, "fl_data": fl_data.pipeline_shaping(append=[step]).to_dict()}
            except InvalidParameterError:
                return data
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
            join = fl_data.join_column
            if join is not None and not self.vertical:
                raise ValueError(
                    f"fl_data: step {fl_data.pipeline[-1].name!r} (join) aligns the records of a vertical job; "
                    f"model.algorithm {self.model.algorithm} is horizontal"
                )
            if join is not None and self.data.id_column is not None and join != self.data.id_column:
                raise ValueError(f"data.id_column {self.data.id_column!r} differs from the fl_data join's by {join!r}")
        if len(set(self.parties)) != len(self.parties):
            raise ValueError("parties must be distinct")
        if self.score is not None and not self.vertical:
            raise ValueError(
                f"score: scoring through a job is for vertical models (each site holds a part); model.algorithm "
                f"{self.model.algorithm} leaves whole models: score with 'confide model predict'"
            )
        if self.vertical:
            if self.protection.mode != "paillier":
                raise ValueError(
                    f"model.algorithm {self.model.algorithm} runs under protection.mode paillier only, "
                    f"got {self.protection.mode}"
                )
            if self.fl_data is not None and self.data.id_column is None:
                raise ValueError(
                    f"data.id_column: model.algorithm {self.model.algorithm} over fl_data needs the column of every "
                    f"party's dataset that holds the record ids (PSI aligns the parties on it)"
                )
            if self.data.guest is not None and self.data.guest not in self.parties:
                raise ValueError(f"data.guest {self.data.guest!r} is not one of the parties {self.parties}")
        self._check_model()
        self._check_threshold()
        self._check_privacy()
        self._check_robust()
        if self.protection.min_parties > len(self.parties):
            raise ValueError(
                f"protection.min_parties ({self.protection.min_parties}) exceeds the {len(self.parties)} parties"
            )
        return self

    def _check_robust(self) -> None:
        strategy = self.strategy
        if not strategy.robust:
            return
        mode = self.protection.mode
        if mode not in ("plain", "tee"):
            raise ValueError(
                f"strategy.name {strategy.name} is applied by the aggregator to every update: it needs "
                f"protection.mode plain (or tee, inside the enclave), got {mode} (the aggregator cannot order, "
                "compare or measure updates it cannot read)"
            )
        if self.protection.wire != "float32":
            raise ValueError(f"strategy.name {strategy.name} needs protection.wire float32, got {self.protection.wire}")
        if self.privacy is not None:
            raise ValueError(
                f"strategy.name {strategy.name}: privacy noise is calibrated to a sum of updates; a robust rule "
                "is not one"
            )
        if self.protection.verify == "on":
            raise ValueError(
                f"protection.verify on: strategy.name {strategy.name} makes the aggregate a robust estimate, not a "
                "sum the parties can check; use verify: auto"
            )
        try:
            strategy.build().check(len(self.parties))
        except InvalidParameterError as error:
            raise ValueError(str(error)) from None

    def _check_privacy(self) -> None:
        privacy = self.privacy
        if privacy is None:
            return
        if self.vertical:
            raise ValueError(f"privacy: model.algorithm {self.model.algorithm} is vertical; DP covers horizontal jobs")
        if privacy.mechanism == "dp_sgd":
            if self.model.algorithm not in ("homo_lr", "custom", "keras"):
                raise ValueError(
                    f"privacy.mechanism dp_sgd runs inside homo_lr's training, a Keras network's on the jax backend or "
                    f"a PyTorch model's (custom, through Opacus); model.algorithm {self.model.algorithm} is covered by "
                    f"mechanism distributed (update-level)"
                )
            if self.model.algorithm == "keras":
                backends = {self.model.backend, *self.model.backends.values()}
                if backends != {"jax"}:
                    raise ValueError(
                        f"privacy.mechanism dp_sgd runs Keras networks on the jax backend only (per-record gradients "
                        f"by jax.vmap); this job uses {sorted(backends)}"
                    )
            if self.model.batch_size == 0:
                raise ValueError("privacy.mechanism dp_sgd samples records: model.batch_size must be > 0")
            if privacy.adaptive_clipping:
                raise ValueError("privacy.adaptive_clipping is for mechanism distributed")
            return
        if self.protection.on_dropout == "recover":
            raise ValueError(
                "privacy with protection.on_dropout recover: the noise is calibrated to the participants that "
                "start a round; a sum over fewer would carry less noise. Use on_dropout: retry"
            )
        if privacy.tolerate_colluders >= self.protection.min_parties:
            raise ValueError(
                f"privacy.tolerate_colluders ({privacy.tolerate_colluders}) must be below protection.min_parties "
                f"({self.protection.min_parties})"
            )
        from confide.privacy import distributed_plan
        from confide.privacy.distributed import MASKING, PAILLIER

        if self.protection.mode not in MASKING + PAILLIER:
            raise ValueError(
                f"privacy.mechanism distributed needs a protection that hides single updates (secagg, groupmask, "
                f"lattice, paillier, threshold); with protection.mode {self.protection.mode} the aggregator would see "
                f"each party's update with only its share of the noise"
            )
        if self.protection.mode in MASKING and self.protection.mask_bound is None:
            raise ValueError(
                "protection.mask_bound: null makes the parties exchange their largest value every round, which "
                "differential privacy does not cover; set a public bound"
            )
        plan = distributed_plan(privacy, self.rounds)
        from confide.privacy.distributed import grid_bits

        for parties in sorted({self.protection.min_parties, len(self.parties)}):
            # The model's size is not known here (d = 0): the party checks again with it.
            grid_bits(
                self.protection.mode,
                bits=self.protection.bits,
                mask_bound=self.protection.mask_bound,
                parties=parties,
                clip=privacy.clip_norm,
                noise=plan.noise_multiplier / math.sqrt(parties - privacy.tolerate_colluders),
                dimension=0,
                count_noise=(plan.count_noise_multiplier or 0.0) / math.sqrt(parties - privacy.tolerate_colluders),
            )

    def _check_threshold(self) -> None:
        protection, m = self.protection, len(self.parties)
        if protection.mode == "lattice":
            if protection.threshold is not None and protection.threshold > m:
                raise ValueError(f"protection.threshold ({protection.threshold}) exceeds the {m} parties")
            return
        if protection.mode != "threshold":
            if protection.threshold is not None:
                raise ValueError(f"protection.threshold is for modes threshold and lattice, not {protection.mode}")
            return
        t = protection.threshold or default_threshold(m)
        if m < 3 and protection.keygen == "distributed":
            raise ValueError(
                f"protection.mode threshold with keygen distributed needs at least 3 parties (BGW needs an honest "
                f"majority), got {m}; keygen: dealer runs with 2, but the leader then sees the key"
            )
        if t > m:
            raise ValueError(f"protection.threshold ({t}) exceeds the {m} parties")
        if protection.keygen == "distributed" and t > (m + 1) // 2:
            raise ValueError(
                f"protection.threshold ({t}) must be at most (parties + 1) // 2 = {(m + 1) // 2} with keygen "
                f"distributed: the modulus is computed by BGW, which hides its factors from at most "
                f"{(m - 1) // 2} colluders"
            )
        if protection.min_parties < t:
            raise ValueError(
                f"protection.min_parties ({protection.min_parties}) is below protection.threshold ({t}): a round with "
                f"fewer than t parties could not be decrypted (left out, min_parties follows the threshold)"
            )

    def _check_model(self) -> None:
        model = self.model
        if model.batch_size == 0 and model.algorithm != "homo_lr":
            raise ValueError(f"model.batch_size 0 (full batch) is for model.algorithm homo_lr, not {model.algorithm}")
        unknown = sorted(set(model.backends) - set(self.parties))
        if unknown:
            raise ValueError(f"model.backends names {unknown}, which are not parties of the job")
        if model.algorithm == "keras":
            if (model.network is None) == (model.network_file is None):
                raise ValueError("model.algorithm keras needs exactly one of model.network and model.network_file")
            from confide.ml.keras_spec import validate_network

            network = model.network if model.network is not None else _read_network(model.network_file)
            try:
                validate_network(network, where="model.network")
            except InvalidParameterError as error:
                raise ValueError(str(error)) from None
        elif model.network is not None or model.network_file is not None:
            raise ValueError(f"model.network is for model.algorithm keras, not {model.algorithm}")
        if (model.algorithm == "hf") != (model.hf is not None):
            raise ValueError(
                "model.algorithm hf needs model.hf (pretrained: the folder of a saved transformers model)"
                if model.hf is None
                else f"model.hf is for model.algorithm hf, not {model.algorithm}"
            )
        if model.hf is not None and isinstance(model.hf.pretrained, dict):
            missing = [p for p in self.parties if p not in model.hf.pretrained]
            unknown = sorted(set(model.hf.pretrained) - set(self.parties))
            if missing or unknown:
                raise ValueError(
                    f"model.hf.pretrained needs one folder for every party: missing {missing}, not parties {unknown}"
                )
        if model.algorithm == "custom" and model.entry is None:
            raise ValueError("model.algorithm custom needs model.entry ('package.module:attribute' or 'file.py:name')")
        if model.algorithm != "custom" and (model.entry is not None or model.options):
            raise ValueError(f"model.entry and model.options are for model.algorithm custom, not {model.algorithm}")
        if model.objective == "multi:softprob" and (
            model.algorithm not in ("secureboost", "hetero_nn") or model.num_class is None
        ):
            raise ValueError(
                "model.objective multi:softprob is for model.algorithm secureboost or hetero_nn, with model.num_class"
            )
        nn_fields = [f for f in ("guest_bottom", "host_bottom", "top") if getattr(model, f) is not None]
        if model.algorithm == "hetero_nn":
            # The protocol's own parsing (confide.ml.netspec), so what validates here runs there.
            from confide.ml.netspec import MAX_BATCH_SIZE, parse_network

            try:
                for name in ("guest_bottom", "host_bottom", "top"):
                    parse_network(getattr(model, name), name)
            except InvalidParameterError as error:
                raise ValueError(f"model: {error}") from None
            if not 1 <= model.batch_size <= MAX_BATCH_SIZE:
                raise ValueError(
                    f"model: batch_size must be an integer in 1..{MAX_BATCH_SIZE} for hetero_nn, got {model.batch_size}"
                )
        elif nn_fields:
            raise ValueError(f"model.{nn_fields[0]} is for model.algorithm hetero_nn, not {model.algorithm}")
        if model.algorithm != "secureboost" and (model.validation_fraction or model.early_stopping_rounds):
            raise ValueError(
                f"model.validation_fraction and model.early_stopping_rounds are for model.algorithm secureboost, "
                f"not {model.algorithm}"
            )
        if model.early_stopping_rounds is not None and not model.validation_fraction:
            raise ValueError(
                f"model.early_stopping_rounds={model.early_stopping_rounds} needs a validation set: "
                "set model.validation_fraction (e.g. 0.1)"
            )
        if model.num_class is not None and model.objective != "multi:softprob":
            raise ValueError(f"model.num_class is for objective multi:softprob, not {model.objective}")
        if self.data.dataset == "digits" and self.fl_data is None and model.algorithm == "homo_lr":
            raise ValueError("data.dataset digits has 10 classes of images; model.algorithm homo_lr is binary on rows")

    def network(self) -> dict | None:
        """The Keras network description (inline, or read from ``model.network_file``)."""
        if self.model.network is not None:
            return self.model.network
        return _read_network(self.model.network_file) if self.model.network_file else None

    @property
    def vertical(self) -> bool:
        """Whether the parties hold columns (hetero_lr, secureboost, hetero_nn) rather than rows."""
        return self.model.algorithm in VERTICAL_ALGORITHMS

    def vertical_layout(self) -> tuple[str, str] | None:
        """``(guest, id column)`` of a vertical job over FL_Data (for the schema checks), else None."""
        if self.vertical and self.fl_data is not None and self.data.id_column is not None:
            return self.guest, self.data.id_column
        return None

    @property
    def guest(self) -> str:
        """The party holding the labels in a vertical job (data.guest, default the first party)."""
        return self.data.guest or self.parties[0]

    def fl_data_object(self):
        """The :class:`confide.data.fldata.FLData` of ``fl_data`` (None without one)."""
        if self.fl_data is None:
            return None
        try:
            return _fl_data_of(self.fl_data)
        except InvalidParameterError as error:
            raise ValueError(f"fl_data: {error}") from None

    def datasets(self) -> dict[str, str]:
        """Party -> dataset name under FL_Data (empty for the embedded data)."""
        fl_data = self.fl_data_object()
        return fl_data.datasets() if fl_data is not None else {}


def _fl_data_of(value: dict):
    """An FLData from a job's ``fl_data``: an export with its lineage, or {participants, label, pipeline}."""
    from confide.data.fldata import FLData

    if "lineage" in value:
        return FLData.from_dict(value)
    return FLData.create(value.get("participants", {}), value.get("label", ""), value.get("pipeline", ()))


def _read_network(path: str) -> dict:
    try:
        data = yaml.safe_load(Path(path).read_text())
    except (OSError, yaml.YAMLError) as error:
        raise ValueError(f"model.network_file {path!r} cannot be read: {error}") from None
    if not isinstance(data, dict):
        raise ValueError(f"model.network_file {path!r} must hold a mapping, got {type(data).__name__}")
    return data


def _resolve_paths(data: Any, base: Path) -> Any:
    """Make the job's file references (network file, custom code file, pretrained folders) relative to the job file."""
    if not isinstance(data, dict) or not isinstance(data.get("model"), dict):
        return data
    model = dict(data["model"])
    model["network_file"] = _resolve_file(model.get("network_file"), base)
    model["entry"] = _resolve_entry(model.get("entry"), base)
    hf = model.get("hf")
    if isinstance(hf, dict) and isinstance(hf.get("pretrained"), (str, dict)):
        folders = hf["pretrained"]
        if isinstance(folders, dict):
            model["hf"] = {**hf, "pretrained": {k: _resolve_file(v, base) for k, v in folders.items()}}
        else:
            model["hf"] = {**hf, "pretrained": _resolve_file(folders, base)}
    for name in ("guest_bottom", "host_bottom", "top"):  # hetero_nn: {torch: "file.py:factory"}
        net = model.get(name)
        if isinstance(net, dict) and "torch" in net:
            model[name] = {**net, "torch": _resolve_entry(net["torch"], base)}
    return {**data, "model": model}


def _resolve_file(path: Any, base: Path) -> Any:
    """A relative file or folder taken from the job file's folder (anything else as it is)."""
    if isinstance(path, str) and not Path(path).is_absolute():
        return str((base / path).resolve())
    return path


def _resolve_entry(entry: Any, base: Path) -> Any:
    """``file.py:name`` relative to the job file's folder (``package.module:name`` as it is)."""
    if isinstance(entry, str) and ":" in entry:
        location, _, attribute = entry.rpartition(":")
        if location.endswith(".py") and not Path(location).is_absolute():
            return f"{(base / location).resolve()}:{attribute}"
    return entry


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
    return parse_job(_resolve_paths(data, Path(path).resolve().parent))
