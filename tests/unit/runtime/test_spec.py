"""Job specifications: the example parses; every error names the offending field by its path."""

from __future__ import annotations

import copy
import json
from pathlib import Path

import pytest

from confide.errors import InvalidParameterError
from confide.spec import JobSpec, load_job, parse_job

EXAMPLE = Path(__file__).resolve().parents[3] / "examples" / "breast_cancer.yaml"
BASE = {"job_id": "unit-job", "parties": ["hospital-a", "hospital-b", "hospital-c"]}


def spec(**overrides) -> dict:
    data = copy.deepcopy(BASE)
    for key, value in overrides.items():
        if isinstance(value, dict):
            data[key] = {**data.get(key, {}), **value}
        else:
            data[key] = value
    return data


def error_of(data) -> str:
    with pytest.raises(InvalidParameterError) as info:
        parse_job(data)
    assert isinstance(info.value, ValueError)
    return str(info.value)


def test_example_job_file_parses():
    job = load_job(EXAMPLE)
    assert isinstance(job, JobSpec)
    assert job.job_id == "demo-breast-cancer"
    assert job.rounds == 15
    assert job.parties == ["hospital-a", "hospital-b", "hospital-c"]
    assert job.model.learning_rate == 0.5 and job.model.local_epochs == 2 and job.model.batch_size == 32
    assert job.data.dataset == "breast_cancer" and job.data.split == "iid" and job.data.seed == 7
    assert job.protection.mode == "paillier" and job.protection.key_bits == 2048 and job.protection.bits == 16
    assert job.transport.slice_bytes == 65536 and job.transport.pipeline is True
    assert job.seed == 7


def test_json_job_file_parses(tmp_path):
    path = tmp_path / "job.json"
    path.write_text(json.dumps(spec(protection={"mode": "secagg"})))
    job = load_job(path)
    assert job.protection.mode == "secagg"


def test_defaults():
    job = parse_job(spec())
    assert job.rounds == 10 and job.protection.mode == "paillier" and job.protection.min_parties == 2
    assert job.transport.slice_bytes == 64 * 1024


@pytest.mark.parametrize("mode", ["plain", "secagg", "paillier", "groupmask", "tee", "threshold"])
def test_every_mode_accepted(mode):
    assert parse_job(spec(protection={"mode": mode})).protection.mode == mode


@pytest.mark.parametrize(
    "data,path",
    [
        (spec(protection={"mdoe": "secagg"}), "protection.mdoe"),
        (spec(transport={"slice_byte": 4096}), "transport.slice_byte"),
        (spec(extra_top_level=1), "extra_top_level"),
        (spec(protection={"mode": "homomorphic"}), "protection.mode"),
        (spec(protection={"mode": "none"}), "protection.mode"),
        (spec(rounds=0), "rounds"),
        (spec(rounds=-3), "rounds"),
        (spec(transport={"slice_bytes": 4098}), "transport.slice_bytes"),
        (spec(transport={"slice_bytes": 512}), "transport.slice_bytes"),
        (spec(parties=["hospital-a", "Hospital-B"]), "parties.1"),
        (spec(parties=["hospital a", "hospital-b"]), "parties.0"),
        (spec(parties=["hospital-a", "-b"]), "parties.1"),
        (spec(parties=["only-one"]), "parties"),
        (spec(protection={"key_bits": 1024}), "protection.key_bits"),
        (spec(protection={"bits": 1}), "protection.bits"),
        (spec(model={"learning_rate": 0}), "model.learning_rate"),
        (spec(job_id=""), "job_id"),
    ],
)
def test_errors_name_the_field_path(data, path):
    message = error_of(data)
    assert f"{path}:" in message, message


def test_missing_required_fields_named():
    message = error_of({"rounds": 3})
    assert "job_id:" in message and "parties:" in message


def test_several_errors_are_all_listed():
    message = error_of(spec(rounds=0, protection={"mode": "bad", "bits": 99}))
    assert "rounds:" in message and "protection.mode:" in message and "protection.bits:" in message


def test_duplicate_parties_named():
    message = error_of(spec(parties=["hospital-a", "hospital-b", "hospital-a"]))
    assert "parties" in message and "distinct" in message


def test_min_parties_above_party_count_named():
    message = error_of(spec(protection={"min_parties": 4}))
    assert "protection.min_parties" in message and "3" in message
    assert parse_job(spec(protection={"min_parties": 3})).protection.min_parties == 3


def test_dropout_recovery_is_accepted_for_secagg_and_reaches_the_protocol():
    job = parse_job(spec(protection={"mode": "secagg", "on_dropout": "recover", "neighbours": 2}))
    params = job.protection.params()
    assert params.recover and params.neighbours == 2 and params.min_parties == 2
    assert not parse_job(spec(protection={"mode": "secagg"})).protection.params().recover
    assert parse_job(spec(protection={"mode": "lattice", "on_dropout": "recover"})).protection.params().recover


@pytest.mark.parametrize(
    ("protection", "words"),
    [
        ({"mode": "paillier", "on_dropout": "recover"}, ["protection.on_dropout recover", "mode paillier"]),
        ({"mode": "secagg", "neighbours": 4}, ["protection.neighbours", "on_dropout: recover"]),
        ({"mode": "secagg", "on_dropout": "recover", "mask_bound": None}, ["protection.mask_bound"]),
        (
            {"mode": "secagg", "on_dropout": "recover", "neighbours": 2, "recovery_threshold": 3},
            ["protection.recovery_threshold (3)", "protection.neighbours (2)"],
        ),
        ({"mode": "secagg", "on_dropout": "recover", "recovery_timeout_s": 0}, ["protection.recovery_timeout_s"]),
        (
            {"mode": "lattice", "on_dropout": "recover", "neighbours": 2},
            ["protection.neighbours", "lattice recovers with protection.threshold"],
        ),
    ],
)
def test_dropout_recovery_errors_name_the_field(protection, words):
    message = error_of(spec(protection=protection))
    assert all(w in message for w in words), message


def test_dropout_recovery_is_refused_with_distributed_privacy():
    data = spec(
        protection={"mode": "secagg", "on_dropout": "recover"},
        privacy={"mechanism": "distributed", "epsilon": 5.0},
    )
    assert "on_dropout recover" in error_of(data)


@pytest.mark.parametrize("data", [None, [], ["job"], "job_id: x", 42])
def test_non_mapping_input(data):
    message = error_of(data)
    assert "mapping" in message


@pytest.mark.parametrize("text", ["", "- a\n- b\n", "just text\n"])
def test_non_mapping_file(tmp_path, text):
    path = tmp_path / "job.yaml"
    path.write_text(text)
    with pytest.raises(InvalidParameterError, match="mapping"):
        load_job(path)


def test_invalid_yaml_file_names_the_path(tmp_path):
    path = tmp_path / "broken.yaml"
    path.write_text("job_id: [unclosed\n")
    with pytest.raises(InvalidParameterError, match="broken.yaml"):
        load_job(path)


def test_spec_is_frozen():
    job = parse_job(spec())
    with pytest.raises(ValueError):
        job.rounds = 3  # type: ignore[misc]


def test_boolean_is_not_a_round_count():
    message = error_of(spec(rounds=True))
    assert "rounds:" in message


def _vertical(model: dict) -> dict:
    return {
        "job_id": "v",
        "rounds": 2,
        "parties": ["a", "b"],
        "model": model,
        "data": {"dataset": "breast_cancer"},
        "protection": {"mode": "paillier"},
    }


def test_hetero_nn_job_files_parse_and_bad_layers_name_the_field():
    spec = load_job(EXAMPLE.parent / "breast_cancer_hetero_nn.yaml")
    assert spec.vertical and spec.model.algorithm == "hetero_nn" and spec.model.interactive_units == 8
    from confide.vertical.params import hetero_nn_params

    params = hetero_nn_params(spec)
    assert params.epochs == spec.rounds and params.top_net.layers == ((4, "relu"),)
    with pytest.raises(ValueError, match=r"host_bottom\[0\]\.class_name 'Conv2D'"):
        parse_job(_vertical({"algorithm": "hetero_nn", "host_bottom": [{"class_name": "Conv2D", "config": {}}]}))
    with pytest.raises(ValueError, match=r"top\[0\]\.units"):
        parse_job(_vertical({"algorithm": "hetero_nn", "top": [{"units": 0}]}))
    with pytest.raises(ValueError, match="model.guest_bottom is for model.algorithm hetero_nn"):
        parse_job(_vertical({"algorithm": "hetero_lr", "guest_bottom": [{"units": 3}]}))
    multi = parse_job(_vertical({"algorithm": "hetero_nn", "objective": "multi:softprob", "num_class": 10}))
    assert hetero_nn_params(multi).outputs == 10
    # The batch limit is the protocol's own (ml/netspec.py), named with the field at submit.
    assert hetero_nn_params(parse_job(_vertical({"algorithm": "hetero_nn", "batch_size": 8192}))).batch_size == 8192
    with pytest.raises(ValueError, match=r"model: batch_size must be an integer in 1\.\.8192 for hetero_nn, got 8193"):
        parse_job(_vertical({"algorithm": "hetero_nn", "batch_size": 8193}))
    # Framework forms: validated at submit without importing a framework; own code is found
    # next to the job file.
    with pytest.raises(ValueError, match="host_bottom.backend 'jax'"):
        parse_job(_vertical({"algorithm": "hetero_nn", "host_bottom": {"backend": "jax", "layers": []}}))
    with pytest.raises(ValueError, match=r"top.layers\[0\].class_name: 'Dense2'"):
        parse_job(
            _vertical({"algorithm": "hetero_nn", "top": {"backend": "torch", "layers": [{"class_name": "Dense2"}]}})
        )
    own = load_job(EXAMPLE.parent / "hetero_nn_pytorch" / "job.yaml")
    bottom = hetero_nn_params(own).host_net
    assert bottom.kind == "torch" and bottom.options == {"width": 8}
    assert bottom.entry == f"{(EXAMPLE.parent / 'hetero_nn_pytorch' / 'nets.py').resolve()}:lab_bottom"


def test_parties_come_from_an_fl_data_value_with_lineage_too():
    # What the controller stores once it agreed an encode step's categories: tuning re-parses it.
    from confide.data import FLData

    fl_data = FLData.create({"b": "d", "a": "d"}, "y", [{"name": "s", "op": "encode", "params": {"columns": ["c"]}}])
    spec = parse_job({"job_id": "j", "fl_data": fl_data.to_dict(), "protection": {"mode": "secagg"}})
    assert spec.parties == ["a", "b"]


FIVE = ["h-1", "h-2", "h-3", "h-4", "h-5"]


@pytest.mark.parametrize(
    "data,message",
    [
        (spec(protection={"mode": "threshold", "threshold": 4}), "protection.threshold (4) exceeds the 3 parties"),
        (spec(protection={"mode": "threshold", "threshold": 1}), "protection.threshold"),
        (spec(protection={"mode": "threshold", "threshold": 3}), "at most (parties + 1) // 2 = 2"),
        (spec(protection={"mode": "paillier", "threshold": 2}), "protection.threshold is for modes threshold and"),
        (spec(parties=["a-1", "a-2"], protection={"mode": "threshold"}), "needs at least 3 parties"),
        (spec(parties=FIVE, protection={"mode": "threshold", "min_parties": 2}), "protection.min_parties (2) is below"),
        (spec(protection={"mode": "threshold", "keygen": "trusted"}), "protection.keygen"),
        (spec(protection={"mode": "lattice", "threshold": 4}), "protection.threshold (4) exceeds the 3 parties"),
        (spec(protection={"mode": "lattice", "threshold": 1}), "protection.threshold: Input should be greater than"),
    ],
)
def test_threshold_settings_that_cannot_run_are_refused(data, message):
    assert message in error_of(data)


def test_threshold_defaults_and_the_labelled_dealer():
    job = parse_job(spec(protection={"mode": "threshold"}))
    assert job.protection.threshold is None and job.protection.keygen == "distributed"
    dealt = parse_job(
        spec(parties=["a-1", "a-2"], protection={"mode": "threshold", "keygen": "dealer", "threshold": 2})
    )
    assert dealt.protection.params().keygen == "dealer" and dealt.protection.params().threshold == 2
    five = parse_job(spec(parties=FIVE, protection={"mode": "threshold", "min_parties": 3}))
    assert five.protection.params().threshold is None
    # Left out, min_parties follows the threshold (a smaller round could not be decrypted).
    assert parse_job(spec(parties=FIVE, protection={"mode": "threshold"})).protection.min_parties == 3
    assert (
        parse_job(
            spec(parties=["a-1", "a-2"], protection={"mode": "threshold", "keygen": "dealer"})
        ).protection.min_parties
        == 2
    )


def test_an_hf_model_needs_its_section_and_names_every_party_folder(tmp_path):
    hf = {"algorithm": "hf", "hf": {"pretrained": "models/tiny-bert"}}
    assert "model.algorithm hf needs model.hf" in error_of(spec(model={"algorithm": "hf"}))
    assert "model.hf is for model.algorithm hf, not homo_lr" in error_of(spec(model={"hf": {"pretrained": "m"}}))
    folders = {"hospital-a": "a", "hospital-b": "b", "clinic": "c"}
    message = error_of(spec(model={**hf, "hf": {"pretrained": folders}}))
    assert "missing ['hospital-c']" in message and "not parties ['clinic']" in message
    assert "model.hf.r" in error_of(spec(model={**hf, "hf": {"pretrained": "m", "r": 0}}))
    assert "privacy.mechanism dp_sgd" in error_of(spec(model=hf, privacy={"mechanism": "dp_sgd", "epsilon": 1.0}))
    job = tmp_path / "job.yaml"
    job.write_text(json.dumps(spec(model=hf, data={"dataset": "text", "example_shape": [16]})))
    loaded = load_job(job)
    assert loaded.model.hf.pretrained == str((tmp_path / "models" / "tiny-bert").resolve())
    assert loaded.model.hf.adapter == "lora" and loaded.data.vocabulary == 1000


def test_a_narrow_wire_is_for_the_float_modes_only():
    assert parse_job(spec(protection={"mode": "plain", "wire": "bfloat16"})).protection.params().wire == "bfloat16"
    assert parse_job(spec(protection={"mode": "tee", "wire": "int8"})).protection.params().wire == "int8"
    message = error_of(spec(protection={"mode": "secagg", "wire": "int8"}))
    assert "protection.wire int8 is for modes plain and tee (updates as floats); mode secagg keeps its own" in message
    assert "protection.wire" in error_of(spec(protection={"mode": "plain", "wire": "float8"}))


def test_the_hf_example_parses_and_its_base_folder_is_taken_from_the_file():
    example = load_job(EXAMPLE.parent / "hf_lora.yaml")
    assert example.model.algorithm == "hf" and example.data.dataset == "text"
    assert example.model.hf.pretrained == str((EXAMPLE.parents[1] / "build" / "tiny-bert").resolve())


def test_tracking_names_a_server_and_only_parties_of_the_job():
    tracking = {"mlflow_uri": "http://127.0.0.1:5000", "party_metrics": ["a"], "register_model": "m"}
    assert parse_job(spec(parties=["a", "b"], tracking=tracking)).tracking.when_unreachable == "buffer"
    assert "tracking names ['z'], which are not parties" in error_of(
        spec(parties=["a", "b"], tracking={**tracking, "register_from": "z"})
    )
    assert "tracking.mlflow_uri" in error_of(spec(parties=["a", "b"], tracking={"mlflow_uri": "file:///tmp/x"}))
    assert "tracking.when_unreachable" in error_of(
        spec(parties=["a", "b"], tracking={**tracking, "when_unreachable": "retry"})
    )


def test_tracking_params_are_the_flattened_spec_within_mlflows_limit():
    from confide.tracking import MAX_PARAM_CHARS, _flatten

    flat = _flatten({"model": {"learning_rate": 0.2, "network": {"layers": ["x" * 7000]}}, "rounds": 3})
    assert flat["model.learning_rate"] == "0.2" and flat["rounds"] == "3"
    assert len(flat["model.network.layers"]) <= MAX_PARAM_CHARS and flat["model.network.layers"].endswith("job.json)")


def test_a_scoring_job_names_one_trained_model_of_a_vertical_algorithm():
    vertical = {"algorithm": "secureboost"}
    session = "0123456789abcdef0123456789abcdef"
    assert parse_job(spec(model=vertical, score={"session": session})).score.session == session
    assert parse_job(spec(model=vertical, score={"model_dir": "runs/parties"})).score.model_dir == "runs/parties"
    assert "exactly one of session" in error_of(spec(model=vertical, score={}))
    assert "exactly one of session" in error_of(spec(model=vertical, score={"session": session, "model_dir": "x"}))
    assert "score.session" in error_of(spec(model=vertical, score={"session": "../../etc"}))
    assert "score with 'confide model predict'" in error_of(spec(score={"session": session}))


@pytest.mark.parametrize(
    "protection,verifies",
    [
        ({"mode": "secagg"}, True),
        ({"mode": "plain", "verify": "on"}, True),
        ({"mode": "lattice", "verify": "off"}, False),
        ({"mode": "paillier"}, True),
        ({"mode": "threshold", "verify": "auto"}, False),  # not verifiable yet, and the report says so
    ],
)
def test_verification_defaults_to_the_modes_that_support_it(protection, verifies):
    assert parse_job(spec(protection=protection)).protection.verifies is verifies


@pytest.mark.parametrize(
    "protection,words",
    [
        ({"mode": "threshold", "verify": "on"}, ["protection.verify on", "mode threshold", "verify: auto or off"]),
        ({"mode": "paillier", "verify": "on", "bits": 24}, ["protection.verify on", "protection.bits 23", "got 24"]),
        ({"mode": "secagg", "verify": "yes"}, ["protection.verify"]),
        ({"mode": "secagg", "on_wrong_sum": "ignore"}, ["protection.on_wrong_sum"]),
    ],
)
def test_verification_errors_name_the_field(protection, words):
    message = error_of(spec(protection=protection))
    assert all(w in message for w in words), message


@pytest.mark.parametrize(
    "protection,words",
    [
        ({"mode": "plain", "prove_bound": True}, ["protection.prove_bound", "mode plain", "norm_clip"]),
        ({"mode": "tee", "prove_bound": True}, ["protection.prove_bound", "mode tee", "enclave"]),
        ({"mode": "paillier", "prove_bound": True, "bits": 24}, ["protection.prove_bound", "bits 23"]),
        ({"mode": "threshold", "prove_bound": True, "l2_bound": 1.0}, ["protection.l2_bound", "dACIQ"]),
        ({"mode": "secagg", "prove_bound": True, "mask_bound": None}, ["protection.mask_bound"]),
        ({"mode": "secagg", "prove_bound": True, "mask_bound": 0}, ["protection.mask_bound"]),
        ({"mode": "secagg", "l2_bound": 1.0}, ["protection.l2_bound", "prove_bound: true"]),
        ({"mode": "secagg", "prove_bound": True, "l2_bound": 0}, ["protection.l2_bound", "greater than 0"]),
        ({"mode": "secagg", "prove_bound": True, "l2_bound": float("nan")}, ["protection.l2_bound", "finite"]),
        ({"mode": "secagg", "prove_bound": True, "mask_bound": float("nan")}, ["protection.mask_bound", "finite"]),
    ],
)
def test_bound_proofs_are_refused_where_they_cannot_run_naming_the_field(protection, words):
    message = error_of(spec(protection=protection))
    assert all(w in message for w in words), message


def test_bound_proofs_run_in_the_integer_modes():
    for mode in ("secagg", "groupmask", "lattice", "paillier", "threshold"):
        assert parse_job(spec(protection={"mode": mode, "prove_bound": True})).protection.prove_bound
    for mode in ("secagg", "lattice"):  # a recovered round checks the survivors' sum (test_bounds)
        recovered = {"mode": mode, "prove_bound": True, "on_dropout": "recover", "l2_bound": 2.0}
        assert parse_job(spec(protection=recovered)).protection.on_dropout == "recover"
