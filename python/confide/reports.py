"""Typed reports: what a party writes each round, what ``confide run`` assembles, what the API serves.

One set of pydantic models, read and written everywhere a report travels:

* the party writes :class:`PartyReport` (``<party>.report.json``) after every round;
* ``confide run`` reads the parties' reports into it and builds a :class:`JobReport`;
* the party agent reduces a completed report to a :class:`PartyResult` for the controller;
* the controller's REST API declares :class:`SessionStatus` as its response model, so
  ``/openapi.json`` describes job status and results, and the web console reads the same.

Fields that are open by nature (a protection mode's own report, per-round protocol stats) are
``dict[str, Any]``; everything the CLI or console reads by name is a typed field.
"""

from __future__ import annotations

from typing import Any, Literal

from pydantic import BaseModel, ConfigDict, Field

__all__ = [
    "Evaluation",
    "Failure",
    "JobReport",
    "JobRound",
    "ModelSummary",
    "ParticipantStatus",
    "PartyReport",
    "PartyResult",
    "METRIC_KEYS",
    "RoundReport",
    "SessionStatus",
    "SessionSummary",
    "VerticalPartyReport",
    "VerticalRound",
    "round_metrics",
]

#: The per-round figures an agent relays to the controller and the console draws (all numbers).
METRIC_KEYS = (
    "loss",
    "test_loss",
    "auc",
    "accuracy",
    "seconds",
    "crypto_s",
    "train_s",
    "bytes_sent",
    "bytes_received",
)


class _Report(BaseModel):
    # Unknown fields are errors: a report's shape drifts only with this file.
    model_config = ConfigDict(extra="forbid")


class ModelSummary(_Report):
    """Which model a party trained (sizes from its :class:`confide.ml.base.WeightLayout`)."""

    algorithm: str
    parameters: int
    tensors: int
    layers: int
    backend: str | None = None
    #: hf: lora or none (full fine-tuning), the pretrained model's parameter count and the SHA-256
    #: of its frozen weights (the same at every party: compared before round 1).
    adapter: str | None = None
    base_parameters: int | None = None
    base_sha256: str | None = None


class RoundReport(_Report):
    """One completed round at one party."""

    round: int
    attempts: int
    participants: list[str]
    seconds: float
    train_s: float = 0.0
    agree_s: float = 0.0
    upload_s: float = 0.0
    wait_s: float = 0.0
    decode_s: float = 0.0
    encode_s: float = 0.0
    encode_cpu_s: float = 0.0
    crypto_s: float = 0.0
    #: What checking the combined slices against the parties' tags (confide.protect.verify) added to the
    #: round's critical path, tag exchange included (the per-slice checks run on a worker while the next
    #: slice is awaited; their work is the verification stats' verify_tag_s).
    verify_s: float = 0.0
    #: Train, protect, aggregate and apply, without the evaluation that follows (BatchCrypt's iteration).
    iteration_s: float = 0.0
    #: Evaluating the new global model (training loss and test metrics).
    eval_s: float = 0.0
    #: Loss of the new global model on this party's training rows.
    train_loss: float
    local_examples: int
    #: What the local fit reported (before aggregation).
    local_metrics: dict[str, float] = {}
    bytes_sent: int
    bytes_received: int
    #: Protocol figures of the round (clipping thresholds, bits, ...).
    stats: dict[str, Any] = {}
    #: The global model on held-out rows, where the job asked for these metrics.
    test_loss: float | None = None
    test_auc: float | None = None
    test_accuracy: float | None = None
    #: The global model's flat vector (small models only).
    weights: list[float] | None = None


class Failure(_Report):
    """Why a party stopped, in a form that may cross sites: names and counts, never values.

    ``stage``: ``data`` (the party's rows do not fit the pipeline), ``model`` (the model cannot be
    built for them), ``privacy`` (the job's privacy budget cannot be met on this party's rows),
    ``access`` (the owner revoked the grant), ``round`` (a round failed), ``internal`` (an
    unexpected error; its details stay in the party's own log).
    """

    stage: Literal["data", "model", "privacy", "access", "round", "internal"]
    error: str
    message: str
    dataset: str | None = None
    step: str | None = None
    columns: list[str] = []
    round: int | None = None
    hint: str | None = None

    def line(self, party: str) -> str:
        """``hospital-c: column 'sex' is text; add an encode step for it, or drop it``."""
        text = f"{party}: {self.message}"
        return f"{text}; {self.hint}" if self.hint else text


class PartyReport(_Report):
    """A party's whole job, rewritten after every round (atomic replace)."""

    job_id: str
    party: str
    status: Literal["starting", "running", "completed", "failed", "stopped"]
    rounds: list[RoundReport] = []
    runtime_job_id: str | None = None
    resumed_after_round: int = 0
    samples: int | None = None
    test_samples: int | None = None
    features: int | None = None
    model: ModelSummary | None = None
    strategy: dict[str, Any] | None = None
    setup_seconds: float | None = None
    protection: dict[str, Any] | None = None
    bootstrap: dict[str, Any] | None = None
    weights: list[float] | None = None
    error: str | None = None
    failed_round: int | None = None
    failure: Failure | None = None
    bytes_setup: dict[str, int] | None = None
    reconnects: int = 0
    #: Where a partitioned dataset's rows were held (engine, Ray address, nodes); None: in the party process.
    compute: dict[str, Any] | None = None
    #: The most memory (resident set, MiB) the party process has held so far.
    peak_rss_mb: float | None = None
    #: Each time a restarted process of this party rejoined: its checkpoint round, the round it
    #: was admitted to, the rounds it missed, and which peer admitted it.
    rejoins: list[dict[str, Any]] = []


class VerticalRound(_Report):
    """One tree (SecureBoost) or epoch (Hetero LR, Hetero NN) of a vertical job at one party.

    The fields every algorithm writes are typed; each algorithm adds its own (a tree's splits
    and depth, an epoch's clipping counts), kept as they are.
    """

    model_config = ConfigDict(extra="allow")
    round: int
    seconds: float
    loss: float | None = None
    crypto_seconds: float | None = None
    bytes_sent: int | None = None
    bytes_received: int | None = None


class VerticalPartyReport(_Report):
    """A party's side of a vertical job (``confide.vertical.runner``), rewritten after every round."""

    job_id: str
    runtime_job_id: str | None = None
    party: str
    role: Literal["guest", "host"]
    algorithm: Literal["hetero_lr", "secureboost", "hetero_nn"]
    status: Literal["starting", "running", "completed", "failed", "stopped"]
    rounds: list[VerticalRound] = []
    resumed_after_round: int = 0
    protection: dict[str, Any] | None = None
    records: int | None = None
    features: int | None = None
    columns: list[str] = []
    data: dict[str, Any] | None = None
    psi: dict[str, Any] | None = None
    samples: int | None = None
    test_samples: int | None = None
    setup_seconds: float | None = None
    #: Test metrics, at the guest only (a host never learns scores or labels).
    metrics: dict[str, float] | None = None
    feature_importance: list[dict[str, Any]] | None = None
    #: SecureBoost with a validation set (guest only): the loss after each boosting round, the
    #: round early stopping kept (None: every round kept) and the trees in the final model.
    validation_loss: list[float] | None = None
    best_round: int | None = None
    trees_kept: int | None = None
    splits_owned: int | None = None
    #: Where a SecureBoost guest encrypted its gradients (engine, workers); None: in the party process.
    compute: dict[str, Any] | None = None
    #: Which engine ran this party's Paillier work (confide.crypto.gpu.engine_report).
    paillier_engine: dict[str, Any] | None = None
    error: str | None = None
    failure: Failure | None = None
    seconds: float | None = None
    bytes: dict[str, int] | None = None
    reconnects: int = 0
    #: "score": a scoring job (``score`` in the spec), which trains nothing; None: training.
    task: Literal["score"] | None = None
    #: A scoring job's trained model: its job id, session and run at the aggregator.
    model_from: dict[str, Any] | None = None
    #: Records both sites hold and the model scored (every party learns the count).
    scored: int | None = None
    #: The guest's scores file, beside its report (a host has none).
    scores: str | None = None
    #: What in the new records the model never saw (unseen categories, values outside the
    #: training range), counted per column, never a value.
    warnings: list[str] = []


class PartyResult(_Report):
    """What a party's agent tells the controller of a completed run."""

    rounds: int
    train_loss: float | None = None
    test_auc: float | None = None
    test_accuracy: float | None = None
    test_samples: int | None = None
    protection: str | None = None
    model: str | None = None

    @classmethod
    def of(cls, report: PartyReport) -> PartyResult:
        """The result of a completed :class:`PartyReport`."""
        last = report.rounds[-1] if report.rounds else None
        return cls(
            rounds=len(report.rounds),
            train_loss=last.train_loss if last else None,
            test_auc=last.test_auc if last else None,
            test_accuracy=last.test_accuracy if last else None,
            test_samples=report.test_samples,
            protection=(report.protection or {}).get("mode"),
            model=report.model.algorithm if report.model else None,
        )

    @classmethod
    def of_vertical(cls, report: VerticalPartyReport) -> PartyResult:
        """The result of a completed vertical report (test metrics at the guest only)."""
        last = report.rounds[-1] if report.rounds else None
        metrics = report.metrics or {}
        return cls(
            rounds=len(report.rounds),
            train_loss=last.loss if last else None,
            test_auc=metrics.get("auc"),
            test_accuracy=metrics.get("accuracy"),
            test_samples=report.test_samples,
            protection=(report.protection or {}).get("ran"),
            model=report.algorithm,
        )


class JobRound(_Report):
    """One round of a job, over its parties."""

    round: int
    participants: list[str]
    attempts: int
    #: Sample-weighted mean of the parties' training losses.
    loss: float
    auc: float | None = None
    accuracy: float | None = None
    bytes_sent: int
    bytes_received: int
    seconds: float
    crypto_s: float
    train_s: float
    #: Mean seconds verifying the round's sums added to the parties' critical path.
    verify_s: float = 0.0
    #: Attempts whose sums failed verification and were refused (each names the node that served them).
    refused: list[dict[str, Any]] = []


class JobReport(_Report):
    """The report ``confide run`` writes (``report.json``) for a horizontal job."""

    job_id: str
    mode: str
    mode_requested: str
    aggregator_saw: str
    protection: dict[str, Any]
    parties: dict[str, dict[str, Any]]
    dropped: dict[str, str] = {}
    rounds: list[JobRound]
    final_auc: float | None = None
    final_accuracy: float | None = None
    model: ModelSummary | None = None
    strategy: dict[str, Any] | None = None
    #: The same model trained on the pooled data (embedded data sets only).
    centralized: dict[str, Any] = {}
    wall_seconds: float
    setup_seconds: float
    reconnects: int
    spec: dict[str, Any]
    files: dict[str, str] = {}
    #: Processes the launcher found dead and started again: which, how it died, at which round.
    restarts: list[dict[str, Any]] = []
    #: ``confide run --resume``: the checkpointed round this run went on from (0: from the start).
    resumed_after_round: int = 0


class ParticipantStatus(_Report):
    """A session participant as the controller tracks it."""

    name: str
    role: str
    status: str
    run: int
    round: int
    applied_seq: int
    error: str | None = None
    failure: Failure | None = None
    result: PartyResult | dict[str, Any] | None = None


class SessionSummary(_Report):
    """One row of ``GET /v1/sessions``."""

    session: str
    job_id: str
    owner: str
    state: str
    run: int


class Evaluation(_Report):
    """The final model on every party's held-out rows (federated evaluation), and aggregated.

    ``aggregate`` weights each party's metric by its held-out rows. For AUC this is the weighted
    mean of the parties' AUCs, not the AUC of the pooled scores (no party's scores leave it).
    """

    parties: dict[str, dict[str, float]]
    aggregate: dict[str, float]


class SessionStatus(_Report):
    """``GET /v1/sessions/{token}``: a session's state, progress per participant, last checkpoint."""

    session: str
    job_id: str
    owner: str
    state: str
    message: str | None = None
    run: int
    resume_round: int
    head_seq: int
    checkpoint: dict[str, Any] | None = Field(None, description="round, Merkle root and log entry of the latest")
    participants: list[ParticipantStatus]
    evaluation: Evaluation | None = None


def round_metrics(report: dict[str, Any]) -> list[dict[str, float | int]]:
    """One compact row per round of a party's report (horizontal or vertical), for the console.

    Reads the report as the party wrote it (a mapping, possibly mid-run); keys are
    :data:`METRIC_KEYS` plus ``round``; a figure a round did not measure is left out.
    """
    rows = []
    for item in report.get("rounds") or []:
        if not isinstance(item, dict) or not isinstance(item.get("round"), int):
            continue
        row: dict[str, float | int] = {"round": item["round"]}
        pairs = {
            "loss": item.get("train_loss", item.get("loss")),
            "test_loss": item.get("test_loss"),
            "auc": item.get("test_auc"),
            "accuracy": item.get("test_accuracy"),
            "seconds": item.get("seconds"),
            "crypto_s": item.get("crypto_s", item.get("crypto_seconds")),
            "train_s": item.get("train_s"),
            "bytes_sent": item.get("bytes_sent"),
            "bytes_received": item.get("bytes_received"),
        }
        row.update({key: value for key, value in pairs.items() if isinstance(value, (int, float))})
        rows.append(row)
    return rows
