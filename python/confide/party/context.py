"""What a party's rounds read of the job, unpacked once from the :class:`~confide.spec.JobSpec`.

The round loop, the upload and the rejoin path take this small, frozen context instead of the
whole specification, so what each of them depends on is visible in one place.
"""

from __future__ import annotations

from dataclasses import dataclass

from confide.spec import JobSpec, TransportSpec

__all__ = ["PartyContext"]


@dataclass(frozen=True)
class PartyContext:
    """One party's view of the job: who it is, who its peers are, how rounds run and fail."""

    job_id: str
    party_id: str
    #: This party's position in ``parties`` (its seed stream: batches depend on (seed, index, round)).
    index: int
    parties: tuple[str, ...]
    seed: int
    rounds: int
    local_epochs: int
    #: The held-out metrics to report besides the training loss.
    metrics: tuple[str, ...]
    min_parties: int
    on_dropout: str
    #: protection.on_wrong_sum: "fail" or "retry" (on the cluster's next node).
    on_wrong_sum: str
    checkpoint_interval: int | None
    transport: TransportSpec

    @classmethod
    def of(cls, spec: JobSpec, party_id: str) -> PartyContext:
        """The context of ``party_id`` (which must be one of the job's parties)."""
        return cls(
            job_id=spec.job_id,
            party_id=party_id,
            index=spec.parties.index(party_id),
            parties=tuple(spec.parties),
            seed=spec.seed,
            rounds=spec.rounds,
            local_epochs=spec.model.local_epochs,
            metrics=tuple(spec.metrics),
            min_parties=spec.protection.min_parties,
            on_dropout=spec.protection.on_dropout,
            on_wrong_sum=spec.protection.on_wrong_sum,
            checkpoint_interval=spec.checkpoint_interval,
            transport=spec.transport,
        )
