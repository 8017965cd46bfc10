"""Typed reports: a party's report round-trips, refuses drift, and reduces to the controller's result."""

import pytest
from pydantic import ValidationError

from confide.reports import JobReport, PartyReport, PartyResult, RoundReport


def _round(number: int, **extra) -> RoundReport:
    return RoundReport(
        round=number,
        attempts=1,
        participants=["a", "b"],
        seconds=0.5,
        train_loss=0.4,
        local_examples=10,
        bytes_sent=100,
        bytes_received=200,
        **extra,
    )


def test_party_report_round_trips_and_reduces_to_a_result():
    report = PartyReport(
        job_id="j",
        party="a",
        status="completed",
        protection={"mode": "paillier"},
        rounds=[_round(1), _round(2, test_accuracy=0.9, test_auc=0.95)],
        model={"algorithm": "keras", "parameters": 10, "tensors": 2, "layers": 1},
    )
    again = PartyReport.model_validate_json(report.model_dump_json(exclude_none=True))
    assert again == report
    result = PartyResult.of(again)
    assert result.rounds == 2 and result.test_accuracy == 0.9 and result.protection == "paillier"
    assert result.model == "keras"


def test_reports_refuse_unknown_fields_and_wrong_types():
    with pytest.raises(ValidationError, match="test_acuracy"):
        _round(1, test_acuracy=0.5)
    with pytest.raises(ValidationError, match="status"):
        PartyReport(job_id="j", party="a", status="done")
    with pytest.raises(ValidationError, match="rounds"):
        JobReport(
            job_id="j",
            mode="plain",
            mode_requested="plain",
            aggregator_saw="every update",
            protection={},
            parties={},
            rounds=[{"round": 1}],
            wall_seconds=1,
            setup_seconds=0,
            reconnects=0,
            spec={},
        )
